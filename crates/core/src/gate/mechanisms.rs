//! The gate's saving mechanisms, each of which a key can go without (`[[keys]] without`): an
//! operator turning one off for a key, and the evidence's ablation arms, which run the gate
//! with one mechanism off at a time so that every saving is attributed to what made it.

use serde::{Deserialize, Serialize};

/// One mechanism by which the gate saves (or may save) a caller money.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// SERVE: an identical reproducible request answered from store.
    Serve,
    /// DOWNGRADE: an earned request sent to the configured cheaper model.
    Downgrade,
    /// Pacing and the stop: the rules on literal repeats and repeated steps (SPEC §2.3) —
    /// a repeated step held until its window admits it, a runaway stopped — and the score's
    /// waste signals (loop, burst, grind), which hold an agent that repeats too fast. The
    /// score's spend signals and the budget rules are not part of it: they guard risk and a
    /// ceiling, not waste.
    Stop,
    /// Prompt-cache breakpoints placed on a caller's unmarked request (Anthropic).
    Breakpoints,
    /// One-hour cache lifetimes placed after a session's pause (Anthropic).
    Lifetimes,
    /// `prompt_cache_key` routing and 24-hour retention placed (OpenAI).
    Routing,
}

impl Mechanism {
    pub const ALL: [Mechanism; 6] = [
        Mechanism::Serve,
        Mechanism::Downgrade,
        Mechanism::Stop,
        Mechanism::Breakpoints,
        Mechanism::Lifetimes,
        Mechanism::Routing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::Serve => "serve",
            Mechanism::Downgrade => "downgrade",
            Mechanism::Stop => "stop",
            Mechanism::Breakpoints => "breakpoints",
            Mechanism::Lifetimes => "lifetimes",
            Mechanism::Routing => "routing",
        }
    }

    pub fn parse(s: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.as_str() == s)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of mechanisms (a key's `without`). Empty: the gate as built, every mechanism on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Mechanisms(u8);

impl Mechanisms {
    pub fn has(self, m: Mechanism) -> bool {
        self.0 & m.bit() != 0
    }

    pub fn with(self, m: Mechanism) -> Mechanisms {
        Mechanisms(self.0 | m.bit())
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Mechanism> {
        Mechanism::ALL.into_iter().filter(move |m| self.has(*m))
    }
}

impl FromIterator<Mechanism> for Mechanisms {
    fn from_iter<I: IntoIterator<Item = Mechanism>>(iter: I) -> Self {
        iter.into_iter()
            .fold(Mechanisms::default(), Mechanisms::with)
    }
}

impl Serialize for Mechanisms {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Mechanisms {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Vec::<Mechanism>::deserialize(d)?.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_names_its_mechanisms_in_one_order_and_reads_back() {
        let set: Mechanisms = [Mechanism::Routing, Mechanism::Serve].into_iter().collect();
        assert!(set.has(Mechanism::Serve) && set.has(Mechanism::Routing));
        assert!(!set.has(Mechanism::Stop));
        let text = serde_json::to_string(&set).unwrap();
        assert_eq!(text, r#"["serve","routing"]"#);
        assert_eq!(serde_json::from_str::<Mechanisms>(&text).unwrap(), set);
        assert!(serde_json::from_str::<Mechanisms>(r#"["cache"]"#).is_err());
        for m in Mechanism::ALL {
            assert_eq!(Mechanism::parse(m.as_str()), Some(m));
        }
    }
}
