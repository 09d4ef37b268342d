//! split-profile against its corpus (`corpus/split-profile/corpus.json`), whose expected values
//! were derived independently (scripts/split-profile/derive.mjs: Node's JSON.parse/stringify
//! and gpt-tokenizer 4.0.0), plus the routes: allowance, payment, NOT COVERED, methods, and
//! the forbidden-content rules on every response body.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, Method};
use sha2::{Digest, Sha256};

use tokensaver::api::http::{ApiRequest, ApiResponse};
use tokensaver::receipt::{DocumentKind, Envelope, ReceiptSigner};
use tokensaver::split_profile::criteria::{CORPUS_ID, CORPUS_SHA256};
use tokensaver::split_profile::engine::{self, parse_request};
use tokensaver::split_profile::json::{self, JsObject, JsString, JsValue};
use tokensaver::split_profile::report::{
    self, DISCLOSURE_SENTENCE, HONESTY_LINE, SCHEMA_IDENTITY_CAVEAT,
};
use tokensaver::split_profile::{tokenizer, Refusal, SplitProfileService};

const CORPUS: &[u8] = include_bytes!("../corpus/split-profile/corpus.json");
/// 2026-11-03T12:00:00Z
const T0: u64 = 1_793_707_200_000;

// ---- helpers over the JS value type ---------------------------------------------------------

fn get<'a>(v: &'a JsValue, key: &str) -> Option<&'a JsValue> {
    match v {
        JsValue::Object(o) => o.get(key),
        _ => None,
    }
}

fn str_of(v: &JsValue) -> Option<String> {
    match v {
        JsValue::String(s) => s.to_rust_string(),
        _ => None,
    }
}

fn num_of(v: &JsValue) -> Option<f64> {
    match v {
        JsValue::Number(n) => Some(*n),
        _ => None,
    }
}

fn items(v: &JsValue) -> &[JsValue] {
    match v {
        JsValue::Array(a) => &a.0,
        _ => &[],
    }
}

fn corpus() -> JsValue {
    json::parse(CORPUS).expect("corpus parses")
}

struct Case<'a> {
    id: String,
    value: &'a JsValue,
    body: Vec<u8>,
}

fn cases(corpus: &JsValue) -> Vec<Case<'_>> {
    items(get(corpus, "cases").unwrap())
        .iter()
        .map(|c| {
            let id = str_of(get(c, "id").unwrap()).unwrap();
            let body = if let Some(b64) = get(c, "input_base64") {
                base64::engine::general_purpose::STANDARD
                    .decode(str_of(b64).unwrap())
                    .unwrap()
            } else {
                let JsValue::String(s) = get(c, "input").unwrap() else {
                    panic!("{id}: input")
                };
                let mut b = s
                    .to_rust_string()
                    .expect("inputs are valid text")
                    .into_bytes();
                if let Some(pad) = get(c, "pad_to_bytes").and_then(num_of) {
                    b.resize(pad as usize, b' ');
                }
                b
            };
            Case { id, value: c, body }
        })
        .collect()
}

fn sort_keys(v: &JsValue) -> JsValue {
    match v {
        JsValue::Null => JsValue::Null,
        JsValue::Bool(b) => JsValue::Bool(*b),
        JsValue::Number(n) => JsValue::Number(*n),
        JsValue::String(s) => JsValue::String(s.clone()),
        JsValue::Array(a) => JsValue::Array(json::JsArray(a.0.iter().map(sort_keys).collect())),
        JsValue::Object(o) => {
            let mut entries: Vec<(JsString, JsValue)> = o
                .entries()
                .iter()
                .map(|(k, v)| (k.clone(), sort_keys(v)))
                .collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0)); // UTF-16 code units, as Array.prototype.sort
            JsValue::Object(JsObject::from_insertion_order(entries))
        }
    }
}

fn request(method: Method, path: &str, body: &[u8], peer: u8) -> ApiRequest {
    ApiRequest {
        method,
        path: path.to_string(),
        query: None,
        headers: HeaderMap::new(),
        body: Bytes::copy_from_slice(body),
        peer: Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, peer))),
    }
}

fn signer() -> ReceiptSigner {
    ReceiptSigner::from_seed([42; 32])
}

/// Split a signed document `{"<key>": …, "signature": {…}}`, verify it, return the signed value.
fn verify_signed(doc: &[u8], key: &str, signer: &ReceiptSigner) -> JsValue {
    let v = json::parse(doc).expect("signed document parses");
    let sig = get(&v, "signature").expect("signature");
    let envelope = Envelope {
        body: str_of(get(sig, "body").unwrap()).unwrap(),
        sig: str_of(get(sig, "sig").unwrap()).unwrap(),
        kid: str_of(get(sig, "kid").unwrap()).unwrap(),
        kind: Some(DocumentKind::SplitProfileReport),
    };
    assert_eq!(
        str_of(get(sig, "kind").unwrap()).as_deref(),
        Some("split_profile_report"),
        "a report names its kind"
    );
    let signed = signer
        .verify_as(DocumentKind::SplitProfileReport, &envelope)
        .expect("signature verifies");
    // Signed under its own domain: it never passes as a decision receipt.
    assert!(signer.verify(&envelope).is_err());
    let inner = get(&v, key).expect("signed value");
    assert_eq!(
        json::stringify(inner).into_bytes(),
        signed,
        "signed bytes are the value"
    );
    json::parse(&signed).unwrap()
}

// ---- the corpus -----------------------------------------------------------------------------

#[test]
fn corpus_pin_recomputes_and_matches_the_criteria() {
    let corpus = corpus();
    let JsValue::Object(o) = &corpus else {
        panic!()
    };
    let without: Vec<(JsString, JsValue)> = o
        .entries()
        .iter()
        .filter(|(k, _)| !k.eq_str("sha256"))
        .map(|(k, v)| (k.clone(), sort_keys(v)))
        .collect();
    let canonical = json::stringify(&sort_keys(&JsValue::Object(
        JsObject::from_insertion_order(without),
    )));
    let pin: String = Sha256::digest(canonical.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(Some(pin.clone()), get(&corpus, "sha256").and_then(str_of));
    assert_eq!(
        pin, CORPUS_SHA256,
        "criteria.rs CORPUS_SHA256 must be the corpus pin"
    );
    assert_eq!(
        get(&corpus, "id").and_then(str_of).as_deref(),
        Some(CORPUS_ID)
    );
    let reference = get(&corpus, "reference").unwrap();
    assert_eq!(
        get(reference, "data_sha256").and_then(str_of).as_deref(),
        Some(tokenizer::CL100K_DATA_SHA256)
    );
    assert_eq!(
        get(reference, "package").and_then(str_of).as_deref(),
        Some("gpt-tokenizer@4.0.0")
    );
}

#[test]
fn corpus_has_the_required_breadth() {
    let corpus = corpus();
    let cases = cases(&corpus);
    let reports = cases
        .iter()
        .filter(|c| get(get(c.value, "expected").unwrap(), "refusal").is_none())
        .count();
    assert!(reports >= 30, "{reports} report cases");
    let rules: BTreeSet<String> = cases
        .iter()
        .filter_map(|c| get(get(c.value, "expected").unwrap(), "refusal").and_then(str_of))
        .collect();
    for r in Refusal::ALL {
        if r != Refusal::TokenizerUnavailable {
            assert!(rules.contains(r.rule()), "no case for {}", r.rule());
        }
    }
    let text = String::from_utf8_lossy(CORPUS);
    for reason in ["empty_definition", "empty_catalogue", "shares_withheld"] {
        assert!(text.contains(reason), "{reason}");
    }
}

/// Every case through the engine: refusal rule, or R-1, R-2, R-3 and the pre-check's R-3
/// assessability byte-for-byte as the independent derivation wrote them; and every part's
/// token count and byte length equal to the reference tokenizer's.
#[test]
fn engine_agrees_with_every_corpus_case() {
    let corpus = corpus();
    let mut checked = 0;
    for case in cases(&corpus) {
        let expected = get(case.value, "expected").unwrap();
        let result = engine::profile(&case.body, T0);
        if let Some(rule) = get(expected, "refusal").and_then(str_of) {
            assert_eq!(
                result.map(|_| ()).map_err(|r| r.rule()),
                Err(rule.as_str()),
                "{}",
                case.id
            );
            checked += 1;
            continue;
        }
        let report = result.unwrap_or_else(|r| panic!("{}: refused {}", case.id, r.rule()));
        let wire = json::parse(&report::report_bytes(&report)).unwrap();
        for key in ["tools", "R-1", "R-2"] {
            assert_eq!(
                json::stringify(get(&wire, key).unwrap()),
                json::stringify(get(expected, key).unwrap()),
                "{}: {key}",
                case.id
            );
        }
        for key in ["group_count", "groups"] {
            assert_eq!(
                json::stringify(get(get(&wire, "R-3").unwrap(), key).unwrap()),
                json::stringify(get(get(expected, "R-3").unwrap(), key).unwrap()),
                "{}: R-3 {key}",
                case.id
            );
        }
        let catalogue = parse_request(&case.body).unwrap();
        let r3 = if catalogue.tools_with_schema() >= 2 {
            "ASSESSABLE"
        } else {
            "NOT-ASSESSABLE"
        };
        assert_eq!(
            Some(r3.to_string()),
            get(expected, "precheck_r3").and_then(str_of),
            "{}",
            case.id
        );
        // exact agreement of every part's count and byte length with the reference
        let figures = get(case.value, "figures").unwrap();
        let tokens = items(get(figures, "part_tokens").unwrap());
        let bytes = items(get(figures, "part_bytes").unwrap());
        assert_eq!(tokens.len(), catalogue.tools.len());
        for (t, tool) in catalogue.tools.iter().enumerate() {
            for (p, part) in tool.parts.iter().enumerate() {
                let want_tokens = items(&tokens[t])[p].clone_number();
                let want_bytes = items(&bytes[t])[p].clone_number();
                let got_tokens = part.as_ref().map(|s| tokenizer::count(s).unwrap() as f64);
                let got_bytes = part.as_ref().map(|s| s.len() as f64);
                assert_eq!(
                    got_tokens, want_tokens,
                    "{}: tool {t} part {p} tokens",
                    case.id
                );
                assert_eq!(
                    got_bytes, want_bytes,
                    "{}: tool {t} part {p} bytes",
                    case.id
                );
            }
        }
        checked += 1;
    }
    assert!(checked >= 40, "{checked}");
}

trait CloneNumber {
    fn clone_number(&self) -> Option<f64>;
}

impl CloneNumber for JsValue {
    fn clone_number(&self) -> Option<f64> {
        num_of(self)
    }
}

/// `same_report_as` cases, and every bare catalogue of the corpus re-submitted inside an
/// envelope carrying the ignored inputs: the report bytes are identical.
#[test]
fn ignored_inputs_never_change_the_report() {
    let corpus = corpus();
    let all = cases(&corpus);
    for case in &all {
        if let Some(other) = get(case.value, "same_report_as").and_then(str_of) {
            let other = all.iter().find(|c| c.id == other).unwrap();
            assert_eq!(
                report::report_bytes(&engine::profile(&case.body, T0).unwrap()),
                report::report_bytes(&engine::profile(&other.body, T0).unwrap()),
                "{}",
                case.id
            );
        }
    }
    let mut wrapped_count = 0;
    for case in &all {
        let Ok(bare) = engine::profile(&case.body, T0) else {
            continue;
        };
        let Ok(text) = std::str::from_utf8(&case.body) else {
            continue;
        };
        if text.contains("\"catalogue\"") {
            continue;
        }
        for wrapped in [
            format!("{{\"sessions_per_day\":1e400,\"catalogue\":{text},\"daily_ceiling_tokens\":-1,\"calls_per_day\":\"x\",\"caller\":\"w\"}}"),
            format!("{{\"catalogue\":{text},\"sessions_per_day\":12,\"daily_ceiling_tokens\":100000,\"calls_per_day\":[1,2]}}"),
        ] {
            if wrapped.len() > engine::MAX_BODY_BYTES {
                continue;
            }
            let report = engine::profile(wrapped.as_bytes(), T0).unwrap();
            assert_eq!(report::report_bytes(&report), report::report_bytes(&bare), "{}", case.id);
            wrapped_count += 1;
        }
    }
    assert!(wrapped_count >= 40, "{wrapped_count}");
}

// ---- forbidden content ----------------------------------------------------------------------

const JUDGEMENT_WORDS: [&str; 10] = [
    "bloated",
    "wasteful",
    "inefficient",
    "redundant",
    "bad design",
    "grade",
    "score",
    "worth",
    "band",
    "estimate",
];

/// Walk a response body and fail on anything outside the closed forms: every number must be a
/// structural fact (a share on the grid, a row or group index, a group's tool count, the tool
/// count N, the group count G, a cap); every string a constant, a tool name the catalogue
/// carries, the verdict line or the check-end time. So no token count, byte or character count,
/// per-tool share of the catalogue or grade can appear as a figure.
struct Forbidden<'a> {
    names: &'a [Option<JsString>],
    case: &'a str,
}

impl Forbidden<'_> {
    fn allowed_strings() -> BTreeSet<String> {
        let mut s: BTreeSet<String> = [
            "token-efficiency/v1",
            "1.2.0",
            "split-profile",
            "cl100k_base",
            "tiktoken-rs",
            tokenizer::TIKTOKEN_RS_VERSION,
            tokenizer::CL100K_DATA_SHA256,
            "special-token spellings counted as ordinary text (empty allowed-special set)",
            "gpt-tokenizer 4.0.0 semantics",
            "empty_definition",
            "empty_catalogue",
            "shares_withheld",
            "ASSESSABLE",
            SCHEMA_IDENTITY_CAVEAT,
            HONESTY_LINE,
            DISCLOSURE_SENTENCE,
        ]
        .into_iter()
        .map(String::from)
        .collect();
        s.insert(tokenizer::tokenizer_id());
        s.insert(format!(
            "NOT-ASSESSABLE — {}",
            report::R3_NOT_ASSESSABLE_REASON
        ));
        for r in Refusal::ALL {
            s.insert(r.rule().to_string());
            s.insert(r.message().to_string());
        }
        s
    }

    fn check_body(&self, body: &[u8], expected_tools: Option<usize>) {
        let lower = String::from_utf8_lossy(body).to_lowercase();
        for w in JUDGEMENT_WORDS {
            assert!(!lower.contains(w), "{}: judgement word {w}", self.case);
        }
        let v = json::parse(body).unwrap_or_else(|_| panic!("{}: body is JSON", self.case));
        let JsValue::Object(o) = &v else {
            panic!("{}: body is an object", self.case)
        };
        for (k, item) in o.entries() {
            let key = k.to_rust_string().unwrap();
            // a signed document's value is walked from its own root
            let mut path = if key == "report" || key == "precheck" {
                Vec::new()
            } else {
                vec![key]
            };
            self.walk(item, &mut path, expected_tools);
        }
    }

    fn is_time(s: &str) -> bool {
        let b = s.as_bytes();
        b.len() == 20
            && b.iter().enumerate().all(|(i, c)| match i {
                4 | 7 => *c == b'-',
                10 => *c == b'T',
                13 | 16 => *c == b':',
                19 => *c == b'Z',
                _ => c.is_ascii_digit(),
            })
    }

    fn walk(&self, v: &JsValue, path: &mut Vec<String>, n_tools: Option<usize>) {
        let here = path.join(".");
        let last = path.last().map(String::as_str).unwrap_or("");
        match v {
            JsValue::Null | JsValue::Bool(_) => {}
            JsValue::Number(x) => {
                let ok = match last {
                    "name_share" | "description_share" | "schema_share" => {
                        [0.0, 0.5, 1.0].contains(x)
                    }
                    "index" => {
                        // R-2.<i>.index == i
                        path.len() >= 2 && path[path.len() - 2].parse::<f64>().ok() == Some(*x)
                    }
                    "group" => {
                        path.len() >= 2 && path[path.len() - 2].parse::<f64>().ok() == Some(*x)
                    }
                    "tools" => {
                        if path.len() == 1 {
                            n_tools.map(|n| n as f64) == Some(*x)
                        } else {
                            true // a group's size, checked against its indices below
                        }
                    }
                    "group_count" => true, // checked against groups below
                    "cap" => [200.0, 262_144.0].contains(x),
                    _ => {
                        // R-3 group indices
                        path.len() >= 2
                            && path[path.len() - 2] == "indices"
                            && n_tools.is_some_and(|n| *x >= 0.0 && *x < n as f64)
                    }
                };
                assert!(ok, "{}: figure {x} at {here}", self.case);
            }
            JsValue::String(s) => {
                let text = s.to_rust_string();
                let allowed = Self::allowed_strings();
                let ok = match last {
                    "name" => self.names.iter().flatten().any(|n| n == s),
                    "check_end_utc" => text.as_deref().is_some_and(Self::is_time),
                    "verdict" => text.as_deref().is_some_and(|t| self.verdict_ok(t, n_tools)),
                    "body" | "sig" | "kid"
                        if path.first().map(String::as_str) == Some("signature") =>
                    {
                        true
                    }
                    // The signed document's kind (a closed word, never the caller's).
                    "kind" if path.first().map(String::as_str) == Some("signature") => {
                        text.as_deref() == Some("split_profile_report")
                    }
                    _ if path.len() >= 2 && path[path.len() - 2] == "names" => {
                        self.names.iter().flatten().any(|n| n == s)
                    }
                    _ => text.is_some_and(|t| allowed.contains(&t)),
                };
                assert!(
                    ok,
                    "{}: string at {here}: {}",
                    self.case,
                    s.to_string_lossy()
                );
            }
            JsValue::Array(a) => {
                for (i, item) in a.0.iter().enumerate() {
                    path.push(i.to_string());
                    self.walk(item, path, n_tools);
                    path.pop();
                }
            }
            JsValue::Object(o) => {
                if let (Some(JsValue::Number(g)), Some(groups)) =
                    (o.get("group_count"), o.get("groups"))
                {
                    assert_eq!(*g as usize, items(groups).len(), "{}", self.case);
                }
                if let (Some(JsValue::Number(t)), Some(ix)) = (o.get("tools"), o.get("indices")) {
                    assert_eq!(*t as usize, items(ix).len(), "{}", self.case);
                    assert!(items(ix).len() >= 2);
                }
                for (k, item) in o.entries() {
                    let key = k.to_rust_string().unwrap();
                    path.push(key);
                    self.walk(item, path, n_tools);
                    path.pop();
                }
            }
        }
    }

    fn verdict_ok(&self, t: &str, n_tools: Option<usize>) -> bool {
        let Some(n) = n_tools else { return false };
        let prefix =
            format!("TOOL-CATALOGUE SPLIT PROFILE — tools: {n} — schema-identity groups: ");
        let Some(rest) = t.strip_prefix(&prefix) else {
            return false;
        };
        let Some((g, time)) = rest.split_once(" — ") else {
            return false;
        };
        g.parse::<usize>().is_ok() && Self::is_time(time)
    }
}

/// Every corpus case through the routes (house check, pre-check, and for refused cases the
/// refusal bodies): signatures verify and no body carries forbidden content.
#[test]
fn every_response_body_of_the_corpus_is_closed_form() {
    let corpus = corpus();
    let signer = signer();
    for case in cases(&corpus) {
        let names: Vec<Option<JsString>> = parse_request(&case.body)
            .map(|c| c.tools.iter().map(|t| t.name.clone()).collect())
            .unwrap_or_default();
        let n_tools = parse_request(&case.body).ok().map(|c| c.tools.len());
        let forbidden = Forbidden {
            names: &names,
            case: &case.id,
        };
        let svc = SplitProfileService::new();

        let check = svc
            .handle(
                &request(Method::POST, "/split-profile/check", &case.body, 1),
                true,
                &signer,
                T0,
            )
            .unwrap();
        let expected = get(case.value, "expected").unwrap();
        match get(expected, "refusal").and_then(str_of) {
            Some(rule) => {
                let r = Refusal::from_rule(&rule).unwrap();
                assert_eq!(check.status, r.status(), "{}", case.id);
                let v = json::parse(&check.body).unwrap();
                assert_eq!(
                    get(get(&v, "error").unwrap(), "code").and_then(str_of),
                    Some(rule)
                );
                forbidden.check_body(&check.body, None);
            }
            None => {
                assert_eq!(check.status, 200, "{}", case.id);
                let report = verify_signed(&check.body, "report", &signer);
                assert!(matches!(get(&report, "house"), Some(JsValue::Bool(true))));
                forbidden.check_body(&check.body, n_tools);
                // the report's blocks equal the corpus's
                for key in ["R-1", "R-2"] {
                    assert_eq!(
                        json::stringify(get(&report, key).unwrap()),
                        json::stringify(get(expected, key).unwrap()),
                        "{}",
                        case.id
                    );
                }
            }
        }

        let pre = svc
            .handle(
                &request(Method::POST, "/split-profile/precheck", &case.body, 2),
                false,
                &signer,
                T0,
            )
            .unwrap();
        if case.body.len() > engine::MAX_BODY_BYTES {
            assert_eq!(pre.status, 413, "{}", case.id);
            forbidden.check_body(&pre.body, None);
            continue;
        }
        assert_eq!(pre.status, 200, "{}", case.id);
        let doc = verify_signed(&pre.body, "precheck", &signer);
        // the pre-check never carries a tool count, a share or a group
        forbidden.check_body(&pre.body, None);
        let text = String::from_utf8_lossy(&pre.body).to_string();
        for absent in ["R-2\":[", "share", "groups", "verdict"] {
            assert!(
                !text.contains(absent),
                "{}: pre-check carries {absent}",
                case.id
            );
        }
        let in_contract = matches!(get(&doc, "in_contract"), Some(JsValue::Bool(true)));
        assert_eq!(
            in_contract,
            get(expected, "refusal").is_none(),
            "{}",
            case.id
        );
        if in_contract {
            let r3 = get(get(&doc, "assessability").unwrap(), "R-3")
                .and_then(str_of)
                .unwrap();
            let want = get(expected, "precheck_r3").and_then(str_of).unwrap();
            assert!(r3.starts_with(&want), "{}", case.id);
        }
    }
}

/// The checker itself has teeth: a stray figure, a count-bearing string or a judgement word fails.
#[test]
fn forbidden_content_checker_rejects_figures_and_words() {
    let names = [Some(JsString::from_str_lossless("a"))];
    let f = Forbidden {
        names: &names,
        case: "negative",
    };
    let ok = br#"{"report":{"tools":1,"R-2":[{"index":0,"name":"a","name_share":1,"description_share":0,"schema_share":0}]}}"#;
    f.check_body(ok, Some(1));
    for bad in [
        &br#"{"report":{"tools":1,"tokens":17}}"#[..],
        br#"{"report":{"tools":2}}"#,
        br#"{"report":{"R-2":[{"index":3}]}}"#,
        br#"{"report":{"R-1":{"name_share":0.25}}}"#,
        br#"{"report":{"note":"17 tokens"}}"#,
        br#"{"report":{"R-2":[{"index":0,"name":"b"}]}}"#,
        br#"{"error":{"code":"x","message":"this catalogue is bloated"}}"#,
        br#"{"error":{"cap":1000}}"#,
    ] {
        let result = std::panic::catch_unwind(|| f.check_body(bad, Some(1)));
        assert!(result.is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

// ---- routes ---------------------------------------------------------------------------------

fn status(
    svc: &SplitProfileService,
    method: Method,
    path: &str,
    body: &[u8],
    admin: bool,
    now: u64,
) -> ApiResponse {
    svc.handle(&request(method, path, body, 9), admin, &signer(), now)
        .unwrap()
}

fn error_code(resp: &ApiResponse) -> String {
    let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
    v["error"]["code"].as_str().unwrap().to_string()
}

#[test]
fn precheck_allowance_interval_daily_cap_and_reset() {
    let svc = SplitProfileService::new();
    let body = br#"{"caller":"wallet-a","catalogue":[{"name":"x","inputSchema":{}}]}"#;
    let other = br#"{"caller":"wallet-b","catalogue":[{"name":"x"}]}"#;
    let pre =
        |b: &[u8], now: u64| status(&svc, Method::POST, "/split-profile/precheck", b, false, now);
    assert_eq!(pre(body, T0).status, 200);
    // inside the 5,000 ms interval: 402, rule free_precheck_interval, retry-after
    let r = pre(body, T0 + 4_999);
    assert_eq!(r.status, 402);
    assert_eq!(error_code(&r), "free_precheck_interval");
    assert!(r
        .headers
        .iter()
        .any(|(k, v)| *k == "retry-after" && v == "1"));
    // another caller is independent
    assert_eq!(pre(other, T0 + 1).status, 200);
    // at exactly 5,000 ms: served
    assert_eq!(pre(body, T0 + 5_000).status, 200);
    // use up the day's 100
    let mut now = T0 + 5_000;
    for _ in 2..100 {
        now += 5_000;
        assert_eq!(pre(body, now).status, 200);
    }
    now += 5_000;
    let r = pre(body, now);
    assert_eq!(r.status, 402);
    assert_eq!(error_code(&r), "free_precheck_exhausted");
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["per_day"], 100);
    assert_eq!(v["error"]["min_interval_ms"], 5000);
    // the admin key's pre-checks are house pre-checks, not counted
    assert_eq!(
        status(
            &svc,
            Method::POST,
            "/split-profile/precheck",
            body,
            true,
            now
        )
        .status,
        200
    );
    // over the body cap: refused before the allowance, nothing counted
    let mut big = body.to_vec();
    big.resize(engine::MAX_BODY_BYTES + 1, b' ');
    let r = pre(&big, now);
    assert_eq!(r.status, 413);
    assert_eq!(error_code(&r), "body_over_cap");
    // a new UTC day: the allowance resets and past days are dropped
    let next_day = (T0 / 86_400_000 + 1) * 86_400_000;
    assert_eq!(pre(body, next_day).status, 200);
    assert_eq!(svc.tracked_callers(), 1);
}

#[test]
fn precheck_caller_falls_back_to_the_peer_address() {
    let svc = SplitProfileService::new();
    let signer = signer();
    let no_caller = br#"[{"name":"x"}]"#;
    let non_string_caller = br#"{"caller":5,"catalogue":[{"name":"x"}]}"#;
    let send = |b: &[u8], peer: u8, now: u64| {
        svc.handle(
            &request(Method::POST, "/split-profile/precheck", b, peer),
            false,
            &signer,
            now,
        )
        .unwrap()
        .status
    };
    assert_eq!(send(no_caller, 1, T0), 200);
    assert_eq!(send(non_string_caller, 1, T0 + 10), 402); // same peer, no string caller
    assert_eq!(send(no_caller, 2, T0 + 10), 200); // another peer
    assert_eq!(send(b"not json", 3, T0), 200); // refused in-contract check is still served
    assert_eq!(send(b"not json", 3, T0 + 1), 402);
}

#[test]
fn check_without_the_admin_key_is_payment_required() {
    let svc = SplitProfileService::new();
    let r = status(
        &svc,
        Method::POST,
        "/split-profile/check",
        br#"[{"name":"x"}]"#,
        false,
        T0,
    );
    assert_eq!(r.status, 402);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "payment_required");
    assert_eq!(v["error"]["price"]["usdc_units_per_call"], 20000);
    assert_eq!(v["error"]["price"]["label"], "$0.02");
    assert_eq!(v["error"]["price"]["basis"], "per catalogue");
    assert!(r
        .headers
        .iter()
        .any(|(k, v)| *k == "x-should-retry" && v == "false"));
    // malformed bodies are not even read without payment
    assert_eq!(
        status(
            &svc,
            Method::POST,
            "/split-profile/check",
            b"nope",
            false,
            T0
        )
        .status,
        402
    );
    // over the cap: the free pre-gate refusal comes first
    let big = vec![b' '; engine::MAX_BODY_BYTES + 1];
    assert_eq!(
        status(&svc, Method::POST, "/split-profile/check", &big, false, T0).status,
        413
    );
}

#[test]
fn house_check_signs_the_report() {
    let svc = SplitProfileService::new();
    let signer = signer();
    let r = svc
        .handle(
            &request(Method::POST, "/split-profile/check", br#"{"catalogue":[{"name":"read","description":"Read a file.","inputSchema":{"type":"object"}},{"name":"stat","inputSchema":{"type":"object"}}]}"#, 1),
            true,
            &signer,
            T0,
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type, "application/json");
    let report = verify_signed(&r.body, "report", &signer);
    assert_eq!(
        get(&report, "verdict").and_then(str_of).as_deref(),
        Some("TOOL-CATALOGUE SPLIT PROFILE — tools: 2 — schema-identity groups: 1 — 2026-11-03T12:00:00Z")
    );
    assert_eq!(
        get(&report, "criteria_revision")
            .and_then(str_of)
            .as_deref(),
        Some("1.2.0")
    );
    // the signed bytes are what serde_json sees too (no lone surrogates here)
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let env: Envelope = serde_json::from_value(v["signature"].clone()).unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(
            &signer
                .verify_as(DocumentKind::SplitProfileReport, &env)
                .unwrap()
        )
        .unwrap(),
        v["report"]
    );
}

#[test]
fn not_covered_methods_and_unknown_paths() {
    let svc = SplitProfileService::new();
    for op in ["budget", "catalogue", "audit"] {
        for method in [Method::POST, Method::GET] {
            let r = status(
                &svc,
                method,
                &format!("/split-profile/{op}"),
                b"{}",
                true,
                T0,
            );
            assert_eq!(r.status, 404);
            assert_eq!(error_code(&r), "not_covered");
            assert!(String::from_utf8_lossy(&r.body).contains("NOT COVERED"));
        }
    }
    for (method, path, allow) in [
        (Method::POST, "/split-profile/criteria", "GET"),
        (Method::GET, "/split-profile/precheck", "POST"),
        (Method::GET, "/split-profile/check", "POST"),
        (Method::PUT, "/split-profile/check", "POST"),
    ] {
        let r = status(&svc, method, path, b"", true, T0);
        assert_eq!(r.status, 405, "{path}");
        assert!(r.headers.iter().any(|(k, v)| *k == "allow" && v == allow));
    }
    assert_eq!(
        status(&svc, Method::GET, "/split-profile/metrics", b"", true, T0).status,
        404
    );
    let signer = signer();
    for path in ["/split-profile", "/spec", "/split-profilex/check", "/"] {
        assert!(
            svc.handle(&request(Method::GET, path, b"", 1), true, &signer, T0)
                .is_none(),
            "{path}"
        );
    }
}

#[test]
fn criteria_route_serves_this_build() {
    let svc = SplitProfileService::new();
    let r = status(&svc, Method::GET, "/split-profile/criteria", b"", false, T0);
    assert_eq!(r.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["criteria_revision"], "1.2.0");
    assert_eq!(v["tokenizer"]["implementation"], "tiktoken-rs");
    assert_eq!(v["tokenizer"]["data_sha256"], tokenizer::CL100K_DATA_SHA256);
    assert_eq!(v["corpus"]["id"], CORPUS_ID);
    assert_eq!(v["corpus"]["sha256"], CORPUS_SHA256);
    assert!(v["deviations"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["topic"] == "reference tokenizer package"));
}

#[test]
fn refusal_bodies_name_rules_and_caps_only() {
    for r in Refusal::ALL {
        let resp = tokensaver::split_profile::service::refusal_response(r);
        let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
        assert_eq!(v["error"]["code"], r.rule());
        let keys: Vec<&String> = v["error"].as_object().unwrap().keys().collect();
        assert!(keys.len() <= 3);
        if let Some(cap) = r.cap() {
            assert_eq!(v["error"]["cap"], cap);
        }
    }
}
