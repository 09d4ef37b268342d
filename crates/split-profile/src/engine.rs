//! The pure engine: input contract, part strings, counts, shares, self-check, groups.
//!
//! No I/O and no clock: the check-end time is an argument. Nothing here logs, stores or
//! hashes a submission; a refusal names a rule and, for caps, the cap — never content.
//!
//! # Input contract (criteria `input_contract`, `serialisation_rule`)
//! The request body is `{ catalogue, caller? }`. A body that is a JSON object carrying a
//! `catalogue` key is that envelope; any other body is taken as a bare catalogue (a JSON array
//! of tool entries, or an object carrying a `tools` array), so the CLI and clients that post
//! a `tools/list` result directly get the same report. Every other key — `caller`, the ignored
//! inputs `sessions_per_day`, `daily_ceiling_tokens`, `calls_per_day`, a bare catalogue's
//! `nextCursor`, a tool's `title`, `annotations`, `outputSchema`, `_meta` — is never read.
//!
//! Checks, in this order (the first that fails is the refusal): body over 262,144 bytes;
//! not JSON (including invalid UTF-8); catalogue neither an array nor an object with a `tools`
//! array; zero tools; more than 200 tools; then each entry in submitted order: not an object,
//! `name` present and not a string (`null` included), `description` present and not a string.

use std::collections::HashMap;

use super::derivability::{candidate_box, withheld, Share};
use super::json::{self, JsString, JsValue};
use super::tokenizer;

/// Most tools one catalogue may carry.
pub const MAX_TOOLS: usize = 200;
/// Largest accepted request body, in bytes.
pub const MAX_BODY_BYTES: usize = 262_144;

/// A free refusal: a rule id, a static message, and for caps the cap. Never any content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    BodyOverCap,
    NotJson,
    MalformedCatalogue,
    ZeroTools,
    OverToolCap,
    MalformedToolEntry,
    MalformedName,
    MalformedDescription,
    /// The encoder could not be built (never expected; a server fault, not the caller's).
    TokenizerUnavailable,
}

impl Refusal {
    pub fn rule(self) -> &'static str {
        match self {
            Refusal::BodyOverCap => "body_over_cap",
            Refusal::NotJson => "not_json",
            Refusal::MalformedCatalogue => "malformed_catalogue",
            Refusal::ZeroTools => "zero_tools",
            Refusal::OverToolCap => "over_tool_cap",
            Refusal::MalformedToolEntry => "malformed_tool_entry",
            Refusal::MalformedName => "malformed_name",
            Refusal::MalformedDescription => "malformed_description",
            Refusal::TokenizerUnavailable => "tokenizer_unavailable",
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Refusal::BodyOverCap => {
                "request body over the cap of 262,144 bytes; no partial or truncated profile exists"
            }
            Refusal::NotJson => "request body is not JSON text (UTF-8)",
            Refusal::MalformedCatalogue => {
                "the catalogue must be a JSON array of tool entries, or an object carrying a tools array"
            }
            Refusal::ZeroTools => "a catalogue with zero tools is not assessable",
            Refusal::OverToolCap => {
                "more than 200 tools; no partial or truncated profile exists"
            }
            Refusal::MalformedToolEntry => "every tool entry must be a JSON object",
            Refusal::MalformedName => "name, when present, must be a string",
            Refusal::MalformedDescription => "description, when present, must be a string",
            Refusal::TokenizerUnavailable => "the tokenizer is unavailable in this process",
        }
    }

    /// The cap a refusal names, as a numeric fact.
    pub fn cap(self) -> Option<u64> {
        match self {
            Refusal::BodyOverCap => Some(MAX_BODY_BYTES as u64),
            Refusal::OverToolCap => Some(MAX_TOOLS as u64),
            _ => None,
        }
    }

    /// The HTTP status a route answers this refusal with.
    pub fn status(self) -> u16 {
        match self {
            Refusal::BodyOverCap => 413,
            Refusal::NotJson => 400,
            Refusal::TokenizerUnavailable => 500,
            _ => 422,
        }
    }

    pub const ALL: [Refusal; 9] = [
        Refusal::BodyOverCap,
        Refusal::NotJson,
        Refusal::MalformedCatalogue,
        Refusal::ZeroTools,
        Refusal::OverToolCap,
        Refusal::MalformedToolEntry,
        Refusal::MalformedName,
        Refusal::MalformedDescription,
        Refusal::TokenizerUnavailable,
    ];

    pub fn from_rule(rule: &str) -> Option<Refusal> {
        Self::ALL.into_iter().find(|r| r.rule() == rule)
    }
}

/// One tool's part strings, as the criteria define them (`None` = absent, zero-length part).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolParts {
    pub name: Option<JsString>,
    /// name, description, schema part strings.
    pub parts: [Option<String>; 3],
}

/// A catalogue that met the input contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalogue {
    pub tools: Vec<ToolParts>,
}

impl Catalogue {
    /// How many tools carry an inputSchema (the pre-check's R-3 assessability).
    pub fn tools_with_schema(&self) -> usize {
        self.tools.iter().filter(|t| t.parts[2].is_some()).count()
    }
}

/// Apply the input contract to a request body (envelope or bare catalogue).
pub fn parse_request(body: &[u8]) -> Result<Catalogue, Refusal> {
    if body.len() > MAX_BODY_BYTES {
        return Err(Refusal::BodyOverCap);
    }
    let value = json::parse(body).map_err(|_| Refusal::NotJson)?;
    catalogue_from_value(&value)
}

/// Apply the input contract to a parsed request body (envelope or bare catalogue).
pub fn catalogue_from_value(value: &JsValue) -> Result<Catalogue, Refusal> {
    let catalogue = match value {
        JsValue::Object(o) => o.get("catalogue").unwrap_or(value),
        _ => value,
    };
    let entries = match catalogue {
        JsValue::Array(a) => &a.0,
        JsValue::Object(o) => match o.get("tools") {
            Some(JsValue::Array(a)) => &a.0,
            _ => return Err(Refusal::MalformedCatalogue),
        },
        _ => return Err(Refusal::MalformedCatalogue),
    };
    if entries.is_empty() {
        return Err(Refusal::ZeroTools);
    }
    if entries.len() > MAX_TOOLS {
        return Err(Refusal::OverToolCap);
    }
    let mut tools = Vec::with_capacity(entries.len());
    for entry in entries {
        let JsValue::Object(o) = entry else {
            return Err(Refusal::MalformedToolEntry);
        };
        let name = match o.get("name") {
            None => None,
            Some(JsValue::String(s)) => Some(s.clone()),
            Some(_) => return Err(Refusal::MalformedName),
        };
        let description = match o.get("description") {
            None => None,
            Some(JsValue::String(s)) => Some(s.to_json()),
            Some(_) => return Err(Refusal::MalformedDescription),
        };
        let schema = o.get("inputSchema").map(json::stringify);
        let name_part = name.as_ref().map(JsString::to_json);
        tools.push(ToolParts {
            name,
            parts: [name_part, description, schema],
        });
    }
    Ok(Catalogue { tools })
}

/// Why a whole's shares are null.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NullReason {
    EmptyDefinition,
    EmptyCatalogue,
    SharesWithheld,
}

impl NullReason {
    pub fn as_str(self) -> &'static str {
        match self {
            NullReason::EmptyDefinition => "empty_definition",
            NullReason::EmptyCatalogue => "empty_catalogue",
            NullReason::SharesWithheld => "shares_withheld",
        }
    }

    pub fn from_str_id(s: &str) -> Option<Self> {
        [
            NullReason::EmptyDefinition,
            NullReason::EmptyCatalogue,
            NullReason::SharesWithheld,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

/// A whole's three shares (name, description, schema), or null with a reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shares {
    Published([Share; 3]),
    Null(NullReason),
}

/// One R-2 row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub index: usize,
    pub name: Option<JsString>,
    pub shares: Shares,
}

/// One R-3 schema-identity group (two or more tools).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub names: Vec<Option<JsString>>,
    pub indices: Vec<usize>,
}

/// The split-profile report (criteria blocks R-1, R-2, R-3 and the verdict line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub tools: usize,
    /// R-1.
    pub catalogue: Shares,
    /// R-2, in submitted order.
    pub rows: Vec<Row>,
    /// R-3, in order of each group's first tool.
    pub groups: Vec<Group>,
    pub check_end_unix_ms: u64,
    /// A house check (the admin key or the operator's CLI).
    pub house: bool,
}

/// Shares of a whole from its counts, byte lengths and presence, with the rules' precedence:
/// the empty rule first, then the derivability self-check.
fn whole_shares(
    counts: [u64; 3],
    bytes: [u64; 3],
    present: [bool; 3],
    empty: NullReason,
) -> Shares {
    let total = counts[0]
        .saturating_add(counts[1])
        .saturating_add(counts[2]);
    if total == 0 {
        return Shares::Null(empty);
    }
    if withheld(&candidate_box(present, bytes), counts) {
        return Shares::Null(NullReason::SharesWithheld);
    }
    Shares::Published([
        Share::floor_of(counts[0], total),
        Share::floor_of(counts[1], total),
        Share::floor_of(counts[2], total),
    ])
}

/// Profile a contract-checked catalogue. `house` marks a house check.
pub fn profile_catalogue(
    catalogue: &Catalogue,
    now_unix_ms: u64,
    house: bool,
) -> Result<Report, Refusal> {
    let mut rows = Vec::with_capacity(catalogue.tools.len());
    let mut cat_counts = [0u64; 3];
    let mut cat_bytes = [0u64; 3];
    let mut cat_present = [false; 3];
    for (index, tool) in catalogue.tools.iter().enumerate() {
        let mut counts = [0u64; 3];
        let mut bytes = [0u64; 3];
        let mut present = [false; 3];
        for (i, part) in tool.parts.iter().enumerate() {
            if let Some(text) = part {
                present[i] = true;
                bytes[i] = text.len() as u64;
                counts[i] = tokenizer::count(text).ok_or(Refusal::TokenizerUnavailable)?;
            }
            cat_counts[i] += counts[i];
            cat_bytes[i] += bytes[i];
            cat_present[i] |= present[i];
        }
        rows.push(Row {
            index,
            name: tool.name.clone(),
            shares: whole_shares(counts, bytes, present, NullReason::EmptyDefinition),
        });
    }
    let catalogue_shares = whole_shares(
        cat_counts,
        cat_bytes,
        cat_present,
        NullReason::EmptyCatalogue,
    );
    Ok(Report {
        tools: catalogue.tools.len(),
        catalogue: catalogue_shares,
        rows,
        groups: schema_groups(catalogue),
        check_end_unix_ms: now_unix_ms,
        house,
    })
}

/// R-3: tools whose schema part strings are byte-identical; absent schemas never group.
pub fn schema_groups(catalogue: &Catalogue) -> Vec<Group> {
    let mut by_schema: HashMap<&str, usize> = HashMap::new();
    let mut members: Vec<Vec<usize>> = Vec::new();
    for (index, tool) in catalogue.tools.iter().enumerate() {
        if let Some(schema) = &tool.parts[2] {
            match by_schema.get(schema.as_str()) {
                Some(&g) => {
                    if let Some(m) = members.get_mut(g) {
                        m.push(index);
                    }
                }
                None => {
                    by_schema.insert(schema.as_str(), members.len());
                    members.push(vec![index]);
                }
            }
        }
    }
    members
        .into_iter()
        .filter(|m| m.len() >= 2)
        .map(|indices| Group {
            names: indices
                .iter()
                .map(|&i| catalogue.tools.get(i).and_then(|t| t.name.clone()))
                .collect(),
            indices,
        })
        .collect()
}

/// The whole op for one request body (or CLI input): contract, then profile. Every report
/// this build issues is a house report (the admin key or the operator's own CLI).
pub fn profile(body: &[u8], now_unix_ms: u64) -> Result<Report, Refusal> {
    let catalogue = parse_request(body)?;
    profile_catalogue(&catalogue, now_unix_ms, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares_of(r: &Report, i: usize) -> Shares {
        r.rows[i].shares
    }

    #[test]
    fn contract_refusals_in_order() {
        let cases: [(&[u8], Refusal); 14] = [
            (b"nope", Refusal::NotJson),
            (b"{}", Refusal::MalformedCatalogue),
            (b"{\"tools\":{}}", Refusal::MalformedCatalogue),
            (b"\"x\"", Refusal::MalformedCatalogue),
            (b"{\"catalogue\":null}", Refusal::MalformedCatalogue),
            (b"[]", Refusal::ZeroTools),
            (b"{\"tools\":[]}", Refusal::ZeroTools),
            (b"{\"catalogue\":[]}", Refusal::ZeroTools),
            (b"[1]", Refusal::MalformedToolEntry),
            (b"[{},null]", Refusal::MalformedToolEntry),
            (b"[{\"name\":null}]", Refusal::MalformedName),
            (b"[{\"name\":5,\"description\":5}]", Refusal::MalformedName),
            (b"[{\"description\":null}]", Refusal::MalformedDescription),
            (
                b"[{\"name\":\"a\",\"description\":[\"x\"]}]",
                Refusal::MalformedDescription,
            ),
        ];
        for (body, want) in cases {
            assert_eq!(
                parse_request(body),
                Err(want),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let many = format!("[{}{{}}]", "{},".repeat(200));
        assert_eq!(parse_request(many.as_bytes()), Err(Refusal::OverToolCap));
        let max = format!("[{}{{}}]", "{},".repeat(199));
        assert_eq!(parse_request(max.as_bytes()).unwrap().tools.len(), 200);
        // over-cap tools is decided before entries are looked at
        let bad_many = format!("[{}1]", "{},".repeat(200));
        assert_eq!(
            parse_request(bad_many.as_bytes()),
            Err(Refusal::OverToolCap)
        );
        let mut at_cap = b"[{}]".to_vec();
        at_cap.resize(MAX_BODY_BYTES, b' ');
        assert!(parse_request(&at_cap).is_ok());
        at_cap.push(b' ');
        assert_eq!(parse_request(&at_cap), Err(Refusal::BodyOverCap));
    }

    #[test]
    fn extra_fields_are_ignored_and_schema_null_is_present() {
        let body = br#"{"tools":[{"name":"a","title":"T","annotations":{"x":1},"outputSchema":{},"_meta":{},"inputSchema":null}],"nextCursor":"c"}"#;
        let c = parse_request(body).unwrap();
        assert_eq!(c.tools[0].parts[2].as_deref(), Some("null"));
        assert_eq!(c.tools[0].parts[0].as_deref(), Some("\"a\""));
        assert_eq!(c.tools[0].parts[1], None);
    }

    #[test]
    fn envelope_and_bare_catalogue_and_ignored_inputs_agree() {
        let bare = br#"[{"name":"search","description":"Search the docs","inputSchema":{"type":"object"}},{"name":"x"}]"#;
        let wrapped = br#"{"tools":[{"name":"search","description":"Search the docs","inputSchema":{"type":"object"}},{"name":"x"}],"nextCursor":"n"}"#;
        let env = br#"{"caller":"w","sessions_per_day":5,"daily_ceiling_tokens":100,"calls_per_day":9,"catalogue":[{"name":"search","description":"Search the docs","inputSchema":{"type":"object"}},{"name":"x"}]}"#;
        let a = profile(bare, 0).unwrap();
        assert_eq!(profile(wrapped, 0).unwrap(), a);
        assert_eq!(profile(env, 0).unwrap(), a);
    }

    #[test]
    fn empty_rules_take_precedence() {
        let r = profile(br#"[{},{"title":"only a title"}]"#, 0).unwrap();
        assert_eq!(r.catalogue, Shares::Null(NullReason::EmptyCatalogue));
        assert_eq!(shares_of(&r, 0), Shares::Null(NullReason::EmptyDefinition));
        assert_eq!(shares_of(&r, 1), Shares::Null(NullReason::EmptyDefinition));
        assert!(r.groups.is_empty());
    }

    #[test]
    fn small_wholes_are_withheld_and_large_ones_published() {
        // name only, "": a 2-byte part, one-candidate box → withheld
        let r = profile(br#"[{"name":""}]"#, 0).unwrap();
        assert_eq!(shares_of(&r, 0), Shares::Null(NullReason::SharesWithheld));
        assert_eq!(r.catalogue, Shares::Null(NullReason::SharesWithheld));
        // any other name alone: box [1, L ≥ 3] → class (1,0,0) has ≥ 2 members → published
        for body in [
            &br#"[{"name":"a"}]"#[..],
            br#"[{"name":"search_documents"}]"#,
        ] {
            let r = profile(body, 0).unwrap();
            assert_eq!(
                shares_of(&r, 0),
                Shares::Published([Share::One, Share::Zero, Share::Zero])
            );
        }
        // name "" and schema 2 bytes: box {1} × {1,2}; [1,0,2] is box-unique → withheld,
        // and so is [1,0,1] (the class of the smallest other candidate)
        let r = profile(
            br#"[{"name":"","inputSchema":{}},{"name":"","inputSchema":[]}]"#,
            0,
        )
        .unwrap();
        assert_eq!(shares_of(&r, 0), Shares::Null(NullReason::SharesWithheld));
        // the catalogue: name bytes 4 → [1,4], schema bytes 4 → [1,4]: nothing box-unique
        assert!(matches!(r.catalogue, Shares::Published(_)));
    }

    #[test]
    fn groups_are_byte_identical_schemas_only() {
        let body = br#"[{"name":"a","inputSchema":{}},{"name":"b"},{"name":"c","inputSchema":{}},
            {"name":"d","inputSchema":{"x":1,"y":2}},{"inputSchema":{"y":2,"x":1}},{"name":"f","inputSchema":{"x":1.0,"y":2}}]"#;
        let r = profile(body, 0).unwrap();
        assert_eq!(r.groups.len(), 2);
        assert_eq!(r.groups[0].indices, vec![0, 2]);
        assert_eq!(r.groups[1].indices, vec![3, 5]);
        assert_eq!(
            r.groups[1].names[1].as_ref().unwrap(),
            &JsString::from_str_lossless("f")
        );
    }
}
