//! The report's wire form (signed JSON), the pre-check's, the verdict line, and a text render.
//!
//! Report bytes are produced by the JavaScript-compatible stringifier, so tool names appear
//! exactly as `JSON.stringify` prints them (a name holding a lone surrogate stays `\ud800`).
//! Shares print as `0`, `0.5` or `1`. The signed form is
//! `{"report": <the exact report bytes>, "signature": {"body", "sig", "kid"}}`, where the
//! envelope's `body` is the base64 of those same report bytes.

use super::derivability::Share;
use super::engine::{Group, Refusal, Report, Row, Shares};
use super::json::{self, JsObject, JsString, JsValue};
use super::tokenizer;
use tokensaver_core::receipt::{DocumentKind, ReceiptSigner};

pub const CRITERIA_ID: &str = "token-efficiency/v1";
pub const CRITERIA_REVISION: &str = "1.2.0";
pub const OP: &str = "split-profile";
pub const VERDICT_PREFIX: &str = "TOOL-CATALOGUE SPLIT PROFILE";

pub const HONESTY_LINE: &str = "The counts underlying this profile are exact under the published tokenizer; another model's tokenizer will count the same text differently, and no figure in this report is a promised bill reduction on any specific provider.";
pub const DISCLOSURE_SENTENCE: &str = "Submitting a catalogue to any third party, this service included, gives its contents to a new holder however briefly; the check is processed in memory only and never stored, but it does not undo the disclosure.";
pub const SCHEMA_IDENTITY_CAVEAT: &str = "Identity is judged under the published serialisation (keys in submitted order); two schemas that differ only in key order are NOT identical under this rule — the rule is stricter than sorted-key equivalence, and says so on its face.";
pub const R3_NOT_ASSESSABLE_REASON: &str = "fewer than two tools carry a schema";

/// RFC 3339 UTC, second precision: `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339_utc(unix_ms: u64) -> String {
    tokensaver_core::utc::rfc3339(unix_ms)
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian.
#[cfg(test)]
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let (y, m, d) = tokensaver_core::utc::civil_from_days(i64::try_from(days).unwrap_or(i64::MAX));
    (y.unsigned_abs(), u64::from(m), u64::from(d))
}

/// The verdict line, exactly the criteria's grammar.
pub fn verdict_line(report: &Report) -> String {
    format!(
        "{VERDICT_PREFIX} — tools: {} — schema-identity groups: {} — {}",
        report.tools,
        report.groups.len(),
        rfc3339_utc(report.check_end_unix_ms)
    )
}

// -- tiny builders over the JS value type ------------------------------------------------

fn s(text: &str) -> JsValue {
    JsValue::String(JsString::from_str_lossless(text))
}

fn n(v: usize) -> JsValue {
    JsValue::Number(v as f64)
}

fn obj(entries: Vec<(&str, JsValue)>) -> JsValue {
    JsValue::Object(JsObject::from_insertion_order(
        entries
            .into_iter()
            .map(|(k, v)| (JsString::from_str_lossless(k), v))
            .collect(),
    ))
}

fn arr(items: Vec<JsValue>) -> JsValue {
    JsValue::Array(json::JsArray(items))
}

fn name_value(name: &Option<JsString>) -> JsValue {
    match name {
        Some(n) => JsValue::String(n.clone()),
        None => JsValue::Null,
    }
}

fn share_value(share: Share) -> JsValue {
    JsValue::Number(match share {
        Share::Zero => 0.0,
        Share::Half => 0.5,
        Share::One => 1.0,
    })
}

fn shares_entries(shares: &Shares) -> Vec<(&'static str, JsValue)> {
    match shares {
        Shares::Published([a, b, c]) => vec![
            ("name_share", share_value(*a)),
            ("description_share", share_value(*b)),
            ("schema_share", share_value(*c)),
        ],
        Shares::Null(reason) => vec![
            ("name_share", JsValue::Null),
            ("description_share", JsValue::Null),
            ("schema_share", JsValue::Null),
            ("reason", s(reason.as_str())),
        ],
    }
}

fn tokenizer_value() -> JsValue {
    obj(vec![
        ("id", s(&tokenizer::tokenizer_id())),
        ("encoding", s("cl100k_base")),
        ("implementation", s("tiktoken-rs")),
        ("version", s(tokenizer::TIKTOKEN_RS_VERSION)),
        ("data_sha256", s(tokenizer::CL100K_DATA_SHA256)),
        (
            "counting",
            s(&format!(
                "{} {} semantics",
                tokenizer::REFERENCE_PACKAGE,
                tokenizer::REFERENCE_VERSION
            )),
        ),
        (
            "special_tokens",
            s("special-token spellings counted as ordinary text (empty allowed-special set)"),
        ),
    ])
}

/// The fields every signed split-profile document opens with.
fn common_fields(house: bool, unix_ms: u64) -> Vec<(&'static str, JsValue)> {
    vec![
        ("criteria_id", s(CRITERIA_ID)),
        ("criteria_revision", s(CRITERIA_REVISION)),
        ("op", s(OP)),
        ("tokenizer", tokenizer_value()),
        ("house", JsValue::Bool(house)),
        ("check_end_utc", s(&rfc3339_utc(unix_ms))),
    ]
}

fn row_value(row: &Row) -> JsValue {
    let mut entries = vec![("index", n(row.index)), ("name", name_value(&row.name))];
    entries.extend(shares_entries(&row.shares));
    obj(entries)
}

fn group_value(i: usize, g: &Group) -> JsValue {
    obj(vec![
        ("group", n(i)),
        ("names", arr(g.names.iter().map(name_value).collect())),
        ("indices", arr(g.indices.iter().map(|&x| n(x)).collect())),
        ("tools", n(g.indices.len())),
    ])
}

/// The report as the JS value that is serialised and signed.
pub fn report_value(report: &Report) -> JsValue {
    let mut entries = common_fields(report.house, report.check_end_unix_ms);
    entries.push(("verdict", s(&verdict_line(report))));
    entries.push(("tools", n(report.tools)));
    entries.push(("R-1", obj(shares_entries(&report.catalogue))));
    entries.push(("R-2", arr(report.rows.iter().map(row_value).collect())));
    entries.push((
        "R-3",
        obj(vec![
            ("group_count", n(report.groups.len())),
            (
                "groups",
                arr(report
                    .groups
                    .iter()
                    .enumerate()
                    .map(|(i, g)| group_value(i, g))
                    .collect()),
            ),
            ("caveat", s(SCHEMA_IDENTITY_CAVEAT)),
        ]),
    ));
    entries.push(("honesty_line", s(HONESTY_LINE)));
    entries.push(("disclosure_sentence", s(DISCLOSURE_SENTENCE)));
    obj(entries)
}

/// The exact report bytes that are signed.
pub fn report_bytes(report: &Report) -> Vec<u8> {
    json::stringify(&report_value(report)).into_bytes()
}

/// The pre-check outcome: assessability only (no tool count, no share, no group existence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrecheckOutcome {
    InContract { r3_assessable: bool },
    Refused(Refusal),
}

/// The pre-check document that is signed.
pub fn precheck_bytes(outcome: PrecheckOutcome, house: bool, unix_ms: u64) -> Vec<u8> {
    let mut entries = common_fields(house, unix_ms);
    match outcome {
        PrecheckOutcome::InContract { r3_assessable } => {
            entries.push(("in_contract", JsValue::Bool(true)));
            let r3 = if r3_assessable {
                "ASSESSABLE".to_string()
            } else {
                format!("NOT-ASSESSABLE — {R3_NOT_ASSESSABLE_REASON}")
            };
            entries.push((
                "assessability",
                obj(vec![
                    ("R-1", s("ASSESSABLE")),
                    ("R-2", s("ASSESSABLE")),
                    ("R-3", s(&r3)),
                ]),
            ));
        }
        PrecheckOutcome::Refused(refusal) => {
            entries.push(("in_contract", JsValue::Bool(false)));
            entries.push(("refusal", refusal_value(refusal)));
        }
    }
    json::stringify(&obj(entries)).into_bytes()
}

/// A refusal as a closed-form object: rule id, static message, the cap when one is named.
pub fn refusal_value(refusal: Refusal) -> JsValue {
    let mut entries = vec![
        ("rule", s(refusal.rule())),
        ("message", s(refusal.message())),
    ];
    if let Some(cap) = refusal.cap() {
        entries.push(("cap", JsValue::Number(cap as f64)));
    }
    obj(entries)
}

/// `{"<key>": <signed bytes>, "signature": <envelope>}`: the signed bytes appear verbatim.
pub fn signed_document(key: &str, signed: &[u8], signer: &ReceiptSigner) -> Vec<u8> {
    let envelope = signer.sign_as(DocumentKind::SplitProfileReport, signed);
    let mut out = Vec::with_capacity(signed.len() * 2 + 200);
    out.extend_from_slice(b"{");
    out.extend_from_slice(JsString::from_str_lossless(key).to_json().as_bytes());
    out.extend_from_slice(b":");
    out.extend_from_slice(signed);
    out.extend_from_slice(b",\"signature\":");
    out.extend_from_slice(envelope.to_json().as_bytes());
    out.extend_from_slice(b"}");
    out
}

/// The signed report response body.
pub fn signed_report(report: &Report, signer: &ReceiptSigner) -> Vec<u8> {
    signed_document("report", &report_bytes(report), signer)
}

fn shares_text(shares: &Shares) -> String {
    match shares {
        Shares::Published([a, b, c]) => format!(
            "name {} · description {} · schema {}",
            a.as_str(),
            b.as_str(),
            c.as_str()
        ),
        Shares::Null(reason) => format!("shares null ({})", reason.as_str()),
    }
}

fn name_text(name: &Option<JsString>) -> String {
    match name {
        Some(n) => n.to_json(), // quoted and escaped: safe on a terminal
        None => "(no name)".to_string(),
    }
}

/// A human-readable rendering of a report (the CLI's default output).
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    out.push_str(&verdict_line(report));
    out.push('\n');
    out.push_str(&format!(
        "criteria {CRITERIA_ID} revision {CRITERIA_REVISION} · op {OP} · tokenizer cl100k_base (tiktoken-rs {} data, {} {} counting) · house {}\n\n",
        tokenizer::TIKTOKEN_RS_VERSION,
        tokenizer::REFERENCE_PACKAGE,
        tokenizer::REFERENCE_VERSION,
        if report.house { "yes" } else { "no" }
    ));
    out.push_str("R-1 catalogue-wide split shares\n");
    out.push_str(&format!("  {}\n\n", shares_text(&report.catalogue)));
    out.push_str("R-2 per-tool split shares (submitted order; ordering is not a ranking)\n");
    for row in &report.rows {
        out.push_str(&format!(
            "  [{}] {}: {}\n",
            row.index,
            name_text(&row.name),
            shares_text(&row.shares)
        ));
    }
    out.push_str(&format!(
        "\nR-3 schema-identity groups: {}\n",
        report.groups.len()
    ));
    for (i, g) in report.groups.iter().enumerate() {
        let members: Vec<String> = g
            .indices
            .iter()
            .zip(&g.names)
            .map(|(idx, name)| format!("[{idx}] {}", name_text(name)))
            .collect();
        out.push_str(&format!(
            "  group {i} ({} tools): {}\n",
            g.indices.len(),
            members.join(", ")
        ));
    }
    out.push_str(&format!("  {SCHEMA_IDENTITY_CAVEAT}\n\n{HONESTY_LINE}\n"));
    out
}

/// A refusal as text (the CLI's output for a refused input).
pub fn render_refusal_text(refusal: Refusal) -> String {
    match refusal.cap() {
        Some(cap) => format!(
            "refused ({}): {} [cap {cap}]\n",
            refusal.rule(),
            refusal.message()
        ),
        None => format!("refused ({}): {}\n", refusal.rule(), refusal.message()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::engine::profile;
    use super::*;

    #[test]
    fn rfc3339_from_unix_millis() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(1_709_251_199_999), "2024-02-29T23:59:59Z");
        assert_eq!(rfc3339_utc(1_793_664_000_000), "2026-11-03T00:00:00Z");
        assert_eq!(rfc3339_utc(4_102_444_800_000), "2100-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(1_234_567_890_123), "2009-02-13T23:31:30Z");
        // every day for 600 years against a day-by-day walk
        let (mut y, mut m, mut d) = (1970u64, 1u64, 1u64);
        for days in 0..(600 * 366) {
            assert_eq!(civil_from_days(days), (y, m, d));
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let len = [
                31,
                if leap { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ];
            d += 1;
            if d > len[(m - 1) as usize] {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }

    #[test]
    fn verdict_line_and_signed_report() {
        let r = profile(
            br#"[{"name":"read_file","description":"Read a file from disk","inputSchema":{"type":"object"}},
                {"name":"write_file","description":"Write a file to disk","inputSchema":{"type":"object"}}]"#,
            1_793_664_000_000,
        )
        .unwrap();
        assert_eq!(
            verdict_line(&r),
            "TOOL-CATALOGUE SPLIT PROFILE — tools: 2 — schema-identity groups: 1 — 2026-11-03T00:00:00Z"
        );
        let signer = ReceiptSigner::from_seed([3; 32]);
        let doc = signed_report(&r, &signer);
        let v: serde_json::Value = serde_json::from_slice(&doc).unwrap();
        let env: tokensaver_core::receipt::Envelope =
            serde_json::from_value(v["signature"].clone()).unwrap();
        let signed = signer
            .verify_as(DocumentKind::SplitProfileReport, &env)
            .unwrap();
        // A report never passes as a receipt.
        assert_eq!(
            signer.verify(&env),
            Err(tokensaver_core::receipt::VerifyError::WrongKind)
        );
        assert_eq!(signed, report_bytes(&r));
        let reparsed: serde_json::Value = serde_json::from_slice(&signed).unwrap();
        assert_eq!(reparsed, v["report"]);
        assert_eq!(
            v["report"]["R-3"]["groups"][0]["indices"],
            serde_json::json!([0, 1])
        );
        let text = render_text(&r);
        assert!(text.starts_with("TOOL-CATALOGUE SPLIT PROFILE — tools: 2"));
        assert!(text.contains("\"write_file\""));
    }

    #[test]
    fn shares_print_on_the_grid() {
        let v = obj(vec![
            ("a", share_value(Share::Zero)),
            ("b", share_value(Share::Half)),
            ("c", share_value(Share::One)),
        ]);
        assert_eq!(json::stringify(&v), r#"{"a":0,"b":0.5,"c":1}"#);
    }
}
