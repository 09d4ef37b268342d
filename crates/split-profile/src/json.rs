//! A JavaScript-compatible JSON parser and stringifier.
//!
//! The criteria define every part string as `JSON.stringify` of the value `JSON.parse` gives,
//! so this module reproduces ECMAScript's behaviour exactly where `serde_json` differs:
//!
//! - strings are sequences of UTF-16 code units ([`JsString`]), so lone surrogates written as
//!   `\ud800` survive and are re-escaped by the stringifier (well-formed `JSON.stringify`);
//! - numbers are IEEE doubles: `1e400` parses to Infinity and stringifies as `null`, `-0`
//!   prints as `0`, and every finite number prints as ECMAScript `Number::toString` does;
//! - duplicate keys: the last value wins, at the first key's position;
//! - object key order: array-index keys (`"0"` … `"4294967294"`) first in ascending numeric
//!   order, then every other key in insertion order;
//! - parsing, stringifying and dropping are iterative, so nesting as deep as the body cap
//!   allows can never overflow the stack.
//!
//! The input must be UTF-8 (a JSON text, RFC 8259 §8.1); whitespace is exactly JSON's four
//! characters, as in `JSON.parse`.

use std::collections::HashMap;

/// A JavaScript string: UTF-16 code units, lone surrogates allowed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct JsString(pub Vec<u16>);

impl JsString {
    pub fn from_str_lossless(s: &str) -> Self {
        Self(s.encode_utf16().collect())
    }

    /// `JSON.stringify` of this string (quotes included).
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(self.0.len() + 2);
        quote_into(&self.0, &mut out);
        out
    }

    /// The string as Rust text when it holds no lone surrogate.
    pub fn to_rust_string(&self) -> Option<String> {
        String::from_utf16(&self.0).ok()
    }

    /// Display form: lone surrogates shown as U+FFFD (for human-readable output only).
    pub fn to_string_lossy(&self) -> String {
        String::from_utf16_lossy(&self.0)
    }

    pub fn eq_str(&self, s: &str) -> bool {
        self.0.iter().copied().eq(s.encode_utf16())
    }
}

/// A parsed JSON value, as `JSON.parse` would build it.
#[derive(Debug)]
pub enum JsValue {
    Null,
    Bool(bool),
    Number(f64),
    String(JsString),
    Array(JsArray),
    Object(JsObject),
}

/// An array; dropping is iterative (see [`JsValue`]).
#[derive(Debug, Default)]
pub struct JsArray(pub Vec<JsValue>);

/// An object: entries already in JavaScript property order.
#[derive(Debug, Default)]
pub struct JsObject {
    entries: Vec<(JsString, JsValue)>,
}

impl JsObject {
    /// Build an object from entries in insertion order, applying duplicate-key and
    /// key-order rules exactly as `JSON.parse` followed by property enumeration does.
    pub fn from_insertion_order(entries: Vec<(JsString, JsValue)>) -> Self {
        let mut out: Vec<(JsString, JsValue)> = Vec::with_capacity(entries.len());
        let mut seen: HashMap<Vec<u16>, usize> = HashMap::new();
        for (key, value) in entries {
            match seen.get(&key.0) {
                Some(&i) => {
                    if let Some(slot) = out.get_mut(i) {
                        slot.1 = value;
                    }
                }
                None => {
                    seen.insert(key.0.clone(), out.len());
                    out.push((key, value));
                }
            }
        }
        Self::ordered(out)
    }

    /// Entries without duplicates, in insertion order → JavaScript property order.
    fn ordered(entries: Vec<(JsString, JsValue)>) -> Self {
        if !entries.iter().any(|(k, _)| array_index(&k.0).is_some()) {
            return Self { entries };
        }
        let mut indexed: Vec<(u32, (JsString, JsValue))> = Vec::new();
        let mut rest: Vec<(JsString, JsValue)> = Vec::new();
        for (key, value) in entries {
            match array_index(&key.0) {
                Some(n) => indexed.push((n, (key, value))),
                None => rest.push((key, value)),
            }
        }
        indexed.sort_by_key(|(n, _)| *n);
        let mut out: Vec<(JsString, JsValue)> = indexed.into_iter().map(|(_, e)| e).collect();
        out.extend(rest);
        Self { entries: out }
    }

    pub fn get(&self, key: &str) -> Option<&JsValue> {
        self.entries
            .iter()
            .find(|(k, _)| k.eq_str(key))
            .map(|(_, v)| v)
    }

    pub fn entries(&self) -> &[(JsString, JsValue)] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A canonical array index per ECMAScript: "0", or no leading zero, value ≤ 2^32 − 2.
fn array_index(key: &[u16]) -> Option<u32> {
    let first = *key.first()?;
    if key.len() > 10 || !(u16::from(b'0')..=u16::from(b'9')).contains(&first) {
        return None;
    }
    if first == u16::from(b'0') && key.len() > 1 {
        return None;
    }
    let mut n: u64 = 0;
    for &u in key {
        if !(u16::from(b'0')..=u16::from(b'9')).contains(&u) {
            return None;
        }
        n = n * 10 + u64::from(u - u16::from(b'0'));
    }
    if n <= 4_294_967_294 {
        u32::try_from(n).ok()
    } else {
        None
    }
}

// ---------------------------------------------------------------------------------------
// Iterative drop: a 262,144-byte body of `[[[[…` must not overflow the stack when freed.

fn drain_children(value: &mut JsValue, stack: &mut Vec<JsValue>) {
    match value {
        JsValue::Array(a) => stack.append(&mut a.0),
        JsValue::Object(o) => stack.extend(std::mem::take(&mut o.entries).into_iter().map(|e| e.1)),
        _ => {}
    }
}

impl Drop for JsArray {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let mut stack = std::mem::take(&mut self.0);
        while let Some(mut v) = stack.pop() {
            drain_children(&mut v, &mut stack);
        }
    }
}

impl Drop for JsObject {
    fn drop(&mut self) {
        if self.entries.is_empty() {
            return;
        }
        let mut stack: Vec<JsValue> = std::mem::take(&mut self.entries)
            .into_iter()
            .map(|e| e.1)
            .collect();
        while let Some(mut v) = stack.pop() {
            drain_children(&mut v, &mut stack);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Parsing.

/// Why a text is not JSON (kept coarse on purpose: errors never echo content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseError;

enum Frame {
    Array(Vec<JsValue>),
    Object {
        entries: Vec<(JsString, JsValue)>,
        seen: HashMap<Vec<u16>, usize>,
        key: Option<JsString>,
    },
}

/// `JSON.parse` over UTF-8 bytes. Invalid UTF-8 is not JSON text.
pub fn parse(bytes: &[u8]) -> Result<JsValue, ParseError> {
    let text = std::str::from_utf8(bytes).map_err(|_| ParseError)?;
    Parser {
        s: text.as_bytes(),
        text,
        i: 0,
    }
    .run()
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while let Some(&b) = self.s.get(self.i) {
            if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn expect_literal(&mut self, lit: &[u8]) -> Result<(), ParseError> {
        if self.s.get(self.i..self.i + lit.len()) == Some(lit) {
            self.i += lit.len();
            Ok(())
        } else {
            Err(ParseError)
        }
    }

    fn run(mut self) -> Result<JsValue, ParseError> {
        let mut stack: Vec<Frame> = Vec::new();
        loop {
            // Parse one value (or open a container).
            self.skip_ws();
            let mut value = match self.peek().ok_or(ParseError)? {
                b'[' => {
                    self.i += 1;
                    self.skip_ws();
                    if self.peek() == Some(b']') {
                        self.i += 1;
                        JsValue::Array(JsArray(Vec::new()))
                    } else {
                        stack.push(Frame::Array(Vec::new()));
                        continue;
                    }
                }
                b'{' => {
                    self.i += 1;
                    self.skip_ws();
                    match self.peek() {
                        Some(b'}') => {
                            self.i += 1;
                            JsValue::Object(JsObject::default())
                        }
                        Some(b'"') => {
                            let key = self.string()?;
                            self.colon()?;
                            stack.push(Frame::Object {
                                entries: Vec::new(),
                                seen: HashMap::new(),
                                key: Some(key),
                            });
                            continue;
                        }
                        _ => return Err(ParseError),
                    }
                }
                b'"' => JsValue::String(self.string()?),
                b't' => {
                    self.expect_literal(b"true")?;
                    JsValue::Bool(true)
                }
                b'f' => {
                    self.expect_literal(b"false")?;
                    JsValue::Bool(false)
                }
                b'n' => {
                    self.expect_literal(b"null")?;
                    JsValue::Null
                }
                b'-' | b'0'..=b'9' => JsValue::Number(self.number()?),
                _ => return Err(ParseError),
            };
            // Attach the value to its parent, closing containers as they end.
            loop {
                let Some(frame) = stack.last_mut() else {
                    self.skip_ws();
                    return if self.i == self.s.len() {
                        Ok(value)
                    } else {
                        Err(ParseError)
                    };
                };
                self.skip_ws();
                match frame {
                    Frame::Array(items) => {
                        items.push(value);
                        match self.peek() {
                            Some(b',') => {
                                self.i += 1;
                                break;
                            }
                            Some(b']') => {
                                self.i += 1;
                                let Some(Frame::Array(items)) = stack.pop() else {
                                    return Err(ParseError);
                                };
                                value = JsValue::Array(JsArray(items));
                            }
                            _ => return Err(ParseError),
                        }
                    }
                    Frame::Object { entries, seen, key } => {
                        let k = key.take().ok_or(ParseError)?;
                        match seen.get(&k.0) {
                            Some(&i) => {
                                if let Some(slot) = entries.get_mut(i) {
                                    slot.1 = value;
                                }
                            }
                            None => {
                                seen.insert(k.0.clone(), entries.len());
                                entries.push((k, value));
                            }
                        }
                        match self.peek() {
                            Some(b',') => {
                                self.i += 1;
                                self.skip_ws();
                                if self.peek() != Some(b'"') {
                                    return Err(ParseError);
                                }
                                let next = self.string()?;
                                self.colon()?;
                                if let Some(Frame::Object { key, .. }) = stack.last_mut() {
                                    *key = Some(next);
                                }
                                break;
                            }
                            Some(b'}') => {
                                self.i += 1;
                                let Some(Frame::Object { entries, .. }) = stack.pop() else {
                                    return Err(ParseError);
                                };
                                value = JsValue::Object(JsObject::ordered(entries));
                            }
                            _ => return Err(ParseError),
                        }
                    }
                }
            }
        }
    }

    fn colon(&mut self) -> Result<(), ParseError> {
        self.skip_ws();
        if self.peek() == Some(b':') {
            self.i += 1;
            Ok(())
        } else {
            Err(ParseError)
        }
    }

    fn hex4(&mut self) -> Result<u16, ParseError> {
        let mut v: u16 = 0;
        for _ in 0..4 {
            let b = self.peek().ok_or(ParseError)?;
            let d = match b {
                b'0'..=b'9' => b - b'0',
                b'a'..=b'f' => b - b'a' + 10,
                b'A'..=b'F' => b - b'A' + 10,
                _ => return Err(ParseError),
            };
            v = (v << 4) | u16::from(d);
            self.i += 1;
        }
        Ok(v)
    }

    /// A string token starting at `"`; returns its UTF-16 code units.
    fn string(&mut self) -> Result<JsString, ParseError> {
        self.i += 1; // opening quote
        let mut out: Vec<u16> = Vec::new();
        loop {
            // Copy a run of plain characters at once.
            let start = self.i;
            while let Some(&b) = self.s.get(self.i) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.i += 1;
            }
            if self.i > start {
                let run = self.text.get(start..self.i).ok_or(ParseError)?;
                out.extend(run.encode_utf16());
            }
            match self.peek().ok_or(ParseError)? {
                b'"' => {
                    self.i += 1;
                    return Ok(JsString(out));
                }
                b'\\' => {
                    self.i += 1;
                    let e = self.peek().ok_or(ParseError)?;
                    self.i += 1;
                    let unit = match e {
                        b'"' => 0x22,
                        b'\\' => 0x5c,
                        b'/' => 0x2f,
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        b'n' => 0x0a,
                        b'r' => 0x0d,
                        b't' => 0x09,
                        b'u' => self.hex4()?,
                        _ => return Err(ParseError),
                    };
                    out.push(unit);
                }
                _ => return Err(ParseError), // raw control character
            }
        }
    }

    /// A number token per the JSON grammar, converted to the nearest double.
    fn number(&mut self) -> Result<f64, ParseError> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                while matches!(self.peek(), Some(b'0'..=b'9')) {
                    self.i += 1;
                }
            }
            _ => return Err(ParseError),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(ParseError);
            }
            while matches!(self.peek(), Some(b'0'..=b'9')) {
                self.i += 1;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(ParseError);
            }
            while matches!(self.peek(), Some(b'0'..=b'9')) {
                self.i += 1;
            }
        }
        let token = self.text.get(start..self.i).ok_or(ParseError)?;
        token.parse::<f64>().map_err(|_| ParseError)
    }
}

// ---------------------------------------------------------------------------------------
// Stringifying.

/// `JSON.stringify(value)` with no indentation.
pub fn stringify(value: &JsValue) -> String {
    let mut out = String::new();
    stringify_into(value, &mut out);
    out
}

enum Work<'a> {
    Value(&'a JsValue),
    Raw(&'static str),
    Key(&'a JsString),
}

/// Iterative `JSON.stringify`: an explicit work stack instead of recursion.
pub fn stringify_into(value: &JsValue, out: &mut String) {
    let mut work: Vec<Work<'_>> = vec![Work::Value(value)];
    while let Some(item) = work.pop() {
        match item {
            Work::Raw(s) => out.push_str(s),
            Work::Key(k) => {
                quote_into(&k.0, out);
                out.push(':');
            }
            Work::Value(v) => match v {
                JsValue::Null => out.push_str("null"),
                JsValue::Bool(true) => out.push_str("true"),
                JsValue::Bool(false) => out.push_str("false"),
                JsValue::Number(n) => {
                    if n.is_finite() {
                        out.push_str(&number_to_string(*n));
                    } else {
                        out.push_str("null");
                    }
                }
                JsValue::String(s) => quote_into(&s.0, out),
                JsValue::Array(a) => {
                    out.push('[');
                    work.push(Work::Raw("]"));
                    for (i, item) in a.0.iter().enumerate().rev() {
                        work.push(Work::Value(item));
                        if i > 0 {
                            work.push(Work::Raw(","));
                        }
                    }
                }
                JsValue::Object(o) => {
                    out.push('{');
                    work.push(Work::Raw("}"));
                    for (i, (k, item)) in o.entries.iter().enumerate().rev() {
                        work.push(Work::Value(item));
                        work.push(Work::Key(k));
                        if i > 0 {
                            work.push(Work::Raw(","));
                        }
                    }
                }
            },
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn push_u_escape(unit: u16, out: &mut String) {
    out.push_str("\\u");
    for shift in [12u16, 8, 4, 0] {
        out.push(char::from(HEX[usize::from((unit >> shift) & 0xf)]));
    }
}

/// ECMAScript QuoteJSONString (ES2019 well-formed JSON.stringify).
fn quote_into(units: &[u16], out: &mut String) {
    out.push('"');
    let mut i = 0;
    while i < units.len() {
        let u = units[i];
        match u {
            0x08 => out.push_str("\\b"),
            0x09 => out.push_str("\\t"),
            0x0a => out.push_str("\\n"),
            0x0c => out.push_str("\\f"),
            0x0d => out.push_str("\\r"),
            0x22 => out.push_str("\\\""),
            0x5c => out.push_str("\\\\"),
            0x00..=0x1f => push_u_escape(u, out),
            0xd800..=0xdbff => match units.get(i + 1) {
                Some(&lo @ 0xdc00..=0xdfff) => {
                    let cp = 0x10000 + ((u32::from(u) - 0xd800) << 10) + (u32::from(lo) - 0xdc00);
                    match char::from_u32(cp) {
                        Some(c) => out.push(c),
                        None => push_u_escape(u, out),
                    }
                    i += 1;
                }
                _ => push_u_escape(u, out),
            },
            0xdc00..=0xdfff => push_u_escape(u, out),
            _ => match char::from_u32(u32::from(u)) {
                Some(c) => out.push(c),
                None => push_u_escape(u, out),
            },
        }
        i += 1;
    }
    out.push('"');
}

/// ECMAScript `Number::toString(x)` for a finite double (radix 10).
///
/// Rust's `{:e}` formatting yields the shortest digit string that round-trips (closest to the
/// exact value on ties), which is the `k`-minimal `s` the specification asks for; the
/// exponent rules below are the specification's steps 6–12.
pub fn number_to_string(x: f64) -> String {
    if x.is_nan() {
        return "NaN".to_string();
    }
    if x == 0.0 {
        return "0".to_string(); // +0 and -0 alike
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    let sign = if x < 0.0 { "-" } else { "" };
    let sci = format!("{:e}", x.abs()); // e.g. "1.2345e-7", "1e21"
    let (mantissa, exp) = match sci.split_once('e') {
        Some(parts) => parts,
        None => (sci.as_str(), "0"),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let e: i64 = exp.parse().unwrap_or(0);
    let k = digits.len() as i64;
    let n = e + 1;
    let body = if k <= n && n <= 21 {
        let mut s = digits.clone();
        for _ in 0..(n - k) {
            s.push('0');
        }
        s
    } else if 0 < n && n <= 21 {
        let (a, b) = digits.split_at(n as usize);
        format!("{a}.{b}")
    } else if -6 < n && n <= 0 {
        let mut s = String::from("0.");
        for _ in 0..(-n) {
            s.push('0');
        }
        s.push_str(&digits);
        s
    } else {
        let exp_sign = if n > 0 { "+" } else { "-" };
        let exp_abs = (n - 1).abs();
        if k == 1 {
            format!("{digits}e{exp_sign}{exp_abs}")
        } else {
            let (a, b) = digits.split_at(1);
            format!("{a}.{b}e{exp_sign}{exp_abs}")
        }
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(input: &str) -> String {
        stringify(&parse(input.as_bytes()).unwrap())
    }

    #[test]
    fn numbers_print_as_javascript_does() {
        let cases = [
            ("1.0", "1"),
            ("1e2", "100"),
            ("1E2", "100"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("123456789012345678901", "123456789012345680000"),
            ("1e-7", "1e-7"),
            ("1e-6", "0.000001"),
            ("0.000001234", "0.000001234"),
            ("1.5e-7", "1.5e-7"),
            ("1e400", "null"),
            ("-1e400", "null"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("0", "0"),
            ("-5", "-5"),
            ("0.1", "0.1"),
            ("0.30000000000000004", "0.30000000000000004"),
            ("9007199254740993", "9007199254740992"),
            ("12345678901234567890", "12345678901234567000"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("5e-324", "5e-324"),
            ("2e-323", "2e-323"),
            ("1e-400", "0"),
            ("123.456", "123.456"),
            ("-123.456e3", "-123456"),
            ("1.25e+25", "1.25e+25"),
            ("100", "100"),
            ("4.35", "4.35"),
            ("0.5", "0.5"),
        ];
        for (input, want) in cases {
            assert_eq!(rt(input), want, "input {input}");
        }
    }

    #[test]
    fn strings_are_re_escaped_as_json_stringify_does() {
        let cases = [
            (r#""a\/b""#, r#""a/b""#),
            (r#""\u0041\u00e9""#, "\"Aé\""),
            (r#""\ud83d\ude00""#, "\"😀\""),
            (r#""\ud800""#, r#""\ud800""#),
            (r#""\uDC00x""#, r#""\udc00x""#),
            (r#""\ude00\ud83d""#, r#""\ude00\ud83d""#),
            (r#""\u0000\u001F\u007f""#, "\"\\u0000\\u001f\u{7f}\""),
            (r#""\b\f\n\r\t\"\\""#, r#""\b\f\n\r\t\"\\""#),
            (r#""\u000b""#, r#""\u000b""#),
            ("\"\u{2028}\u{2029}\"", "\"\u{2028}\u{2029}\""),
            ("\"<|endoftext|>\"", "\"<|endoftext|>\""),
        ];
        for (input, want) in cases {
            assert_eq!(rt(input), want, "input {input}");
        }
    }

    #[test]
    fn objects_follow_javascript_key_order_and_duplicates() {
        assert_eq!(rt(r#"{"b":1,"a":2,"b":3}"#), r#"{"b":3,"a":2}"#);
        assert_eq!(
            rt(r#"{"b":1,"2":0,"a":2,"1":0,"01":5,"-1":6,"4294967295":7,"4294967294":8}"#),
            r#"{"1":0,"2":0,"4294967294":8,"b":1,"a":2,"01":5,"-1":6,"4294967295":7}"#
        );
        assert_eq!(
            rt(r#"{"x":{"y":[1,{"z":null}]}}"#),
            r#"{"x":{"y":[1,{"z":null}]}}"#
        );
        assert_eq!(rt(" {\t\"a\" :\r\n[ ] } "), r#"{"a":[]}"#);
        assert_eq!(rt(r#"{"__proto__":1}"#), r#"{"__proto__":1}"#);
        // duplicate key whose first value was an object: replaced in place
        assert_eq!(rt(r#"{"a":{"x":1},"b":0,"a":[2]}"#), r#"{"a":[2],"b":0}"#);
        // keys equal after escape decoding are duplicates
        assert_eq!(rt(r#"{"a":1,"\u0061":2}"#), r#"{"a":2}"#);
    }

    #[test]
    fn invalid_json_is_refused() {
        for bad in [
            "",
            " ",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            ".5",
            "+1",
            "1e",
            "NaN",
            "Infinity",
            "'a'",
            "\"a",
            "\"\t\"",
            "\"\\x\"",
            "\"\\u12\"",
            "[1 2]",
            "{\"a\" 1}",
            "{a:1}",
            "\u{feff}[]",
            "[] x",
            "tru",
            "[",
            "{",
            "{\"a\":",
        ] {
            assert!(parse(bad.as_bytes()).is_err(), "should refuse {bad:?}");
        }
        assert!(parse(&[b'"', 0xff, b'"']).is_err());
    }

    #[test]
    fn deep_nesting_neither_overflows_parse_stringify_nor_drop() {
        let depth = 262_144 / 2;
        let mut s = "[".repeat(depth);
        s.push_str(&"]".repeat(depth));
        let v = parse(s.as_bytes()).unwrap();
        assert_eq!(stringify(&v), s);
        drop(v);
        let mut o = String::new();
        for _ in 0..40_000 {
            o.push_str("{\"a\":");
        }
        o.push('1');
        o.push_str(&"}".repeat(40_000));
        let v = parse(o.as_bytes()).unwrap();
        assert_eq!(stringify(&v), o);
    }

    #[test]
    fn array_index_is_canonical() {
        let idx = |s: &str| array_index(&JsString::from_str_lossless(s).0);
        assert_eq!(idx("0"), Some(0));
        assert_eq!(idx("4294967294"), Some(4_294_967_294));
        assert_eq!(idx("4294967295"), None);
        assert_eq!(idx("00"), None);
        assert_eq!(idx("1a"), None);
        assert_eq!(idx(""), None);
        assert_eq!(idx("99999999999"), None);
    }
}
