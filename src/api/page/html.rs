//! The page's HTML, rendered on the server from a [`View`]. Every value goes through [`esc`];
//! nothing here reads request content (there is none in a view). Elements that carry a figure
//! also carry it raw (`data-figure`, `data-value`), so tests and scripts compare numbers, not
//! formatting.

use std::fmt::Write;

use serde_json::Value;

use super::model::{DecisionLine, EconomicsBrief, Range, View};
use super::session::Scope;
use super::svg;
use crate::api::Listener;
use crate::gatekeeper::HoldView;
use crate::receipt::DecisionId;
use crate::store::{utc_day, HoldState, LedgerTotals};
use tokensaver_core::gate::Verdict;

const LAYOUT: &str = include_str!("assets/layout.html");
const LOGIN: &str = include_str!("assets/login.html");

/// How many hex digits of a fingerprint the page shows.
pub const FINGERPRINT_DIGITS: usize = 12;

pub use tokensaver_core::html::esc;

/// Fill `{{name}}` slots in one pass, so a value can never open another slot.
pub fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find("}}") {
            Some(end) => {
                let name = &after[..end];
                match values.iter().find(|(n, _)| *n == name) {
                    Some((_, v)) => out.push_str(v),
                    None => out.push_str(&rest[start..start + 4 + end]),
                }
                rest = &after[end + 2..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// `1234567` → `1,234,567`.
pub fn num(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Nano-USD as dollars with six decimals (as `tokensaver ledger` prints them).
pub fn usd(nano: u64) -> String {
    format!(
        "${}.{:06}",
        num(nano / 1_000_000_000),
        (nano % 1_000_000_000) / 1_000
    )
}

/// A signed nano-USD figure in dollars (a cache saving is negative when writes cost more than
/// the reads gave back).
pub fn signed_usd(nano: i64) -> String {
    let sign = if nano < 0 { "−" } else { "" };
    format!("{sign}{}", usd(nano.unsigned_abs()))
}

/// `HH:MM:SS` (UTC) of a unix-ms time.
pub fn clock(ms: u64) -> String {
    let s = (ms / 1000) % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

/// `YYYY-MM-DD HH:MM:SS` (UTC).
pub fn datetime(ms: u64) -> String {
    format!("{} {}", utc_day(ms), clock(ms))
}

fn label_for(range: Range, ms: u64) -> String {
    match range {
        Range::Hour | Range::Day => clock(ms)[..5].to_string(),
        Range::Month => utc_day(ms)[5..].to_string(),
    }
}

/// A page: the layout around `body`.
pub fn layout(title: &str, listener: Listener, who: &str, body: &str) -> String {
    let listener_name = match listener {
        Listener::Admin => "admin listener",
        Listener::Api => "API listener",
    };
    fill(
        LAYOUT,
        &[
            ("title", &esc(title)),
            ("listener", listener_name),
            ("who", who),
            ("body", body),
        ],
    )
}

/// The sign-in form; `error` is one of our own static messages.
pub fn login(listener: Listener, error: Option<&'static str>) -> String {
    let which = match listener {
        Listener::Admin => "the admin key (every key's data) or a tokensaver key (that key's data only)",
        Listener::Api => "your tokensaver key: you will see this key's data only (the admin view is on the admin listener)",
    };
    let error = error
        .map(|e| format!(r#"<p class="error" role="alert">{}</p>"#, esc(e)))
        .unwrap_or_default();
    let body = fill(LOGIN, &[("which", which), ("error", &error)]);
    layout("Sign in", listener, "", &body)
}

/// A short page with a message (errors, a receipt not kept).
pub fn message(listener: Listener, title: &str, text: &str) -> String {
    let body = format!(
        r#"<main class="narrow"><h1>{}</h1><p>{}</p><p><a href="/page/">Back to the ledger page</a></p></main>"#,
        esc(title),
        esc(text)
    );
    layout(title, listener, "", &body)
}

fn who(scope: &Scope) -> String {
    match scope {
        Scope::Admin => r#"<span class="who">admin · every key</span>"#.to_string(),
        Scope::Key(id) => format!(
            r#"<span class="who">key <b>{}</b> · this key's data only</span>"#,
            esc(id)
        ),
    }
}

/// The signed-in page: the bar (who, live switch, sign out), a notice, and the live panel.
pub fn dashboard(
    listener: Listener,
    view: &View,
    csrf: &str,
    notice: Option<(&'static str, bool)>,
) -> String {
    let mut body = String::new();
    let _ = write!(
        body,
        r#"<div class="bar"><label class="live"><input type="checkbox" id="live" checked> live (every 5 s)</label> <span id="updated" class="muted">updated {} UTC</span><form method="post" action="/page/logout" class="signout"><input type="hidden" name="csrf" value="{}"><button type="submit">Sign out</button></form></div>"#,
        clock(view.now_ms),
        esc(csrf)
    );
    if let Some((text, ok)) = notice {
        let class = if ok { "notice" } else { "notice error" };
        let _ = write!(
            body,
            r#"<p class="{class}" role="status" id="notice">{}</p>"#,
            esc(text)
        );
    }
    let _ = write!(
        body,
        r#"<main id="panel" data-src="{}">{}</main>"#,
        esc(&panel_src(view.range, view.verdict_filter)),
        panel(view, csrf)
    );
    layout("Ledger", listener, &who(&view.scope), &body)
}

fn panel_src(range: Range, verdict: Option<Verdict>) -> String {
    let mut src = format!("/page/panel?range={}", range.as_str());
    if let Some(v) = verdict {
        let _ = write!(src, "&verdict={}", v.as_str());
    }
    src
}

fn page_link(range: Range, verdict: Option<Verdict>) -> String {
    let mut href = format!("/page/?range={}", range.as_str());
    if let Some(v) = verdict {
        let _ = write!(href, "&verdict={}", v.as_str());
    }
    href
}

/// The live part of the page (what `page.js` fetches again every few seconds).
pub fn panel(view: &View, csrf: &str) -> String {
    let mut out = format!(
        r#"<div class="stamp" data-now-ms="{}" data-clock="{}"></div>"#,
        view.now_ms,
        clock(view.now_ms)
    );
    budgets(&mut out, view);
    savings(&mut out, view);
    verdicts(&mut out, view);
    holds(&mut out, view, csrf);
    sessions(&mut out, view);
    decisions(&mut out, view);
    if let Some(e) = &view.economics {
        economics(&mut out, e);
    }
    out
}

fn budgets(out: &mut String, view: &View) {
    out.push_str(r#"<section id="budgets"><h2>Spend against budget</h2><table><thead><tr><th>key</th><th>period</th><th class="n">ceiling</th><th class="n">spent this period</th><th class="n">reserved</th><th class="n">left</th><th class="n">spent today</th><th>used</th></tr></thead><tbody>"#);
    for k in &view.keys {
        let b = &k.budget;
        let id = esc(&k.key_id);
        let cell = |figure: &str, value: u64| {
            format!(
                r#"<td class="n" data-key="{id}" data-figure="{figure}" data-value="{value}">{}</td>"#,
                usd(value)
            )
        };
        let (ceiling, left, bar) = match b.ceiling_nano {
            Some(c) => (
                cell("ceiling_nano", c),
                match b.left_nano {
                    Some(l) if l >= 0 => cell("left_nano", u64::try_from(l).unwrap_or(u64::MAX)),
                    _ => r#"<td class="n over">none left</td>"#.to_string(),
                },
                format!(
                    r#"{} <span class="muted">{:.1}%</span>"#,
                    svg::budget_bar(b.spend_nano, b.reserved_nano, c),
                    b.spend_nano.saturating_add(b.reserved_nano) as f64 * 100.0 / (c.max(1)) as f64
                ),
            ),
            None => (
                r#"<td class="n muted">no ceiling</td>"#.to_string(),
                r#"<td class="n muted">—</td>"#.to_string(),
                String::new(),
            ),
        };
        let _ = write!(
            out,
            "<tr><td>{id}</td><td>{}</td>{ceiling}{}{}{left}{}<td>{bar}</td></tr>",
            esc(b.period),
            cell("spend_nano", b.spend_nano),
            cell("reserved_nano", b.reserved_nano),
            cell("spend_today_nano", k.today.spend_nano),
        );
    }
    out.push_str(r#"</tbody></table><p class="note">Spend is what the provider's reported usage cost at the price table; a reservation is the worst case of a call still in flight (settled by its usage, charged in full if none arrives). Periods are UTC.</p></section>"#);
}

fn figure_cell(key: &str, figure: &str, value: u64) -> String {
    shown_cell(key, figure, value, &num(value))
}

/// A figure's cell: its exact value for the tests and scripts, `shown` (already HTML) for people.
fn shown_cell(key: &str, figure: &str, value: impl std::fmt::Display, shown: &str) -> String {
    format!(
        r#"<td class="n" data-key="{}" data-figure="{figure}" data-value="{value}">{shown}</td>"#,
        esc(key)
    )
}

fn ledger_row(out: &mut String, label: &str, key: &str, t: &LedgerTotals) {
    let _ = write!(out, "<tr><td>{}</td>", esc(label));
    out.push_str(&figure_cell(key, "requests", t.requests));
    for v in Verdict::ALL {
        out.push_str(&figure_cell(key, v.as_str(), t.count(v)));
    }
    // Calls at a price the gate does not know have an unknown spend: said, never shown as 0.
    let unpriced = match t.unpriced_calls {
        0 => String::new(),
        n => format!(
            r#" <span class="muted" data-figure="unpriced_calls" data-value="{n}">+ {n} unpriced</span>"#
        ),
    };
    let spend = format!("{}{unpriced}", usd(t.spend_nano));
    out.push_str(&shown_cell(key, "spend_nano", t.spend_nano, &spend));
    out.push_str(&figure_cell(key, "tokens_not_bought", t.tokens_not_bought));
    out.push_str(&figure_cell(
        key,
        "worst_case_tokens_avoided",
        t.worst_case_tokens_avoided,
    ));
    out.push_str(&figure_cell(
        key,
        "findings_tokens_estimated",
        t.findings_tokens_estimated,
    ));
    let saving = signed_usd(t.cache_saving_nano);
    out.push_str(&shown_cell(
        key,
        "cache_saving",
        t.cache_saving_nano,
        &saving,
    ));
    out.push_str("</tr>");
}

fn savings(out: &mut String, view: &View) {
    let (label, total) = match (&view.scope, &view.fleet) {
        (Scope::Admin, Some(fleet)) => ("every key", fleet.clone()),
        _ => (
            "this key",
            view.keys
                .first()
                .map(|k| k.total.clone())
                .unwrap_or_default(),
        ),
    };
    let _ = write!(
        out,
        r#"<section id="savings"><h2>Savings by tier <span class="muted">— {label}, since the ledger began; tiers are never added together</span></h2><div class="tiers">"#
    );
    let cards = [
        ("tokens_not_bought", "tier-exact", "exact", total.tokens_not_bought, "tokens not bought",
         "The usage the provider itself reported for each answer served from the store. The only savings total."),
        ("worst_case_tokens_avoided", "tier-ceiling", "a ceiling", total.worst_case_tokens_avoided, "worst-case tokens avoided",
         "The most each refused (or never-approved) call could have cost. Reported apart; never added to the savings."),
        ("findings_tokens_estimated", "tier-estimate", "estimated", total.findings_tokens_estimated, "findings tokens",
         "Characters ÷ 4 of the waste named inside requests (old turns, unused tools, duplicates). An estimate; in no total."),
    ];
    for (figure, class, badge, value, title, text) in cards {
        let approx = if figure == "findings_tokens_estimated" {
            "≈ "
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<div class="tier {class}"><div class="tier-head"><span class="tier-name">{title}</span> <span class="badge">{badge}</span></div><div class="tier-value" data-scope="total" data-figure="{figure}" data-value="{value}">{approx}{}</div><p>{text}</p></div>"#,
            num(value)
        );
    }
    // In dollars, not tokens: what the gate's breakpoints changed in the price of the same
    // tokens (SPEC §2.11b).
    let _ = write!(
        out,
        r#"<div class="tier tier-estimate"><div class="tier-head"><span class="tier-name">prompt-cache saving</span> <span class="badge">derived</span></div><div class="tier-value" data-scope="total" data-figure="cache_saving" data-value="{}">{}</div><p>Where the gate placed cache breakpoints: what the cached tokens would have cost uncached, minus what they did cost (read price and write premium). Counterfactual; in no total.</p></div>"#,
        total.cache_saving_nano,
        signed_usd(total.cache_saving_nano)
    );
    out.push_str("</div>");
    out.push_str(r#"<table class="ledger"><thead><tr><th>key</th><th class="n">requests</th>"#);
    for v in Verdict::ALL {
        let _ = write!(
            out,
            r#"<th class="n"><span class="v v-{0}">{0}</span></th>"#,
            v.as_str()
        );
    }
    out.push_str(r#"<th class="n">spend</th><th class="n">tokens not bought</th><th class="n">worst case avoided</th><th class="n">findings (est.)</th><th class="n">cache saving (derived)</th></tr></thead><tbody>"#);
    for k in &view.keys {
        ledger_row(out, &k.key_id, &k.key_id, &k.total);
    }
    if let (Scope::Admin, Some(fleet)) = (&view.scope, &view.fleet) {
        ledger_row(out, "all keys", "*", fleet);
    }
    let _ = write!(
        out,
        r#"</tbody></table><p class="note">The same figures as <code>GET /ledger</code>{}, since the ledger began (UTC days; today is {}).</p></section>"#,
        if matches!(view.scope, Scope::Admin) {
            " per key and <code>GET /stats</code> for all keys"
        } else {
            ""
        },
        esc(&view.today)
    );
}

fn verdicts(out: &mut String, view: &View) {
    let (bucket_ms, n) = view.range.buckets();
    let chart = svg::Chart::build(
        &view.verdict_counts,
        view.range.first_ms(view.now_ms),
        bucket_ms,
        n,
    );
    out.push_str(r#"<section id="verdicts"><h2>Verdicts over time</h2><nav class="ranges">"#);
    for r in Range::ALL {
        let current = if r == view.range {
            r#" aria-current="page""#
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<a href="{}"{current}>{}</a> "#,
            esc(&page_link(r, view.verdict_filter)),
            r.title()
        );
    }
    out.push_str("</nav>");
    let range = view.range;
    out.push_str(&svg::stacked_bars(
        &chart,
        &format!("Decisions by verdict and rule, {} (UTC)", range.title()),
        |ms| label_for(range, ms),
    ));
    out.push_str(r#"<ul class="legend">"#);
    for s in &chart.series {
        let _ = write!(
            out,
            r#"<li data-verdict="{v}" data-reason="{r}" data-count="{t}"><svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" fill="{c}"/></svg> <span class="v v-{v}">{v}</span> {r} <b>{}</b></li>"#,
            num(s.total()),
            v = s.verdict.as_str(),
            r = esc(&s.reason),
            t = s.total(),
            c = s.colour
        );
    }
    out.push_str("</ul></section>");
}

fn safe_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn hold_actions(view: &View, h: &HoldView, csrf: &str) -> String {
    if h.state != HoldState::Pending || !safe_id(&h.hold_id) {
        return format!(
            r#"<span class="muted">approved: the key's next identical request passes once, until {} UTC</span>"#,
            clock(h.expires_ms)
        );
    }
    let owner_field = match &view.scope {
        Scope::Admin => String::new(),
        Scope::Key(id) => {
            let has_owner = view.keys.iter().any(|k| &k.key_id == id && k.has_owner);
            if !has_owner {
                return r#"<span class="muted">no owner secret is configured for this key: the admin approves it</span>"#.to_string();
            }
            r#"<input type="password" name="owner_secret" placeholder="owner secret" autocomplete="off" required aria-label="owner secret">"#.to_string()
        }
    };
    let id = esc(&h.hold_id);
    let csrf = esc(csrf);
    // One form, two buttons: the owner secret is typed once for either decision.
    format!(
        r#"<form method="post" action="/page/holds/{id}/approve" class="decide"><input type="hidden" name="csrf" value="{csrf}">{owner_field}<select name="attend_minutes" aria-label="attend the key"><option value="">release this request once</option><option value="15">and attend the key 15 min</option><option value="60">and attend the key 1 h</option><option value="240">and attend the key 4 h</option></select> <button type="submit" class="approve-btn" data-hold="{id}">Approve</button> <button type="submit" formaction="/page/holds/{id}/deny" class="deny-btn" data-hold="{id}">Deny</button></form>"#
    )
}

fn holds(out: &mut String, view: &View, csrf: &str) {
    let _ = write!(
        out,
        r#"<section id="holds"><h2>Open holds <span class="count" data-figure="open_holds" data-value="{0}">{0}</span></h2>"#,
        view.holds.len()
    );
    if view.holds.is_empty() {
        out.push_str(r#"<p class="muted">No CHALLENGE is waiting for a person.</p>"#);
    } else {
        out.push_str(r#"<table><thead><tr><th>hold</th><th>key</th><th>reason</th><th class="n">worst case (tokens)</th><th>opened</th><th>expires</th><th>state</th><th>decide</th></tr></thead><tbody>"#);
        for h in &view.holds {
            let _ = write!(
                out,
                r#"<tr class="hold" data-hold="{id}"><td><code>{id}</code></td><td>{key}</td><td>{reason}</td><td class="n">{wc}</td><td>{opened}</td><td><span class="countdown" data-expires-ms="{exp}">{expires}</span></td><td>{state}</td><td class="actions">{actions}</td></tr>"#,
                id = esc(&h.hold_id),
                key = esc(&h.key_id),
                reason = esc(h.reason.unwrap_or("—")),
                wc = num(h.worst_case_tokens),
                opened = clock(h.created_ms),
                exp = h.expires_ms,
                expires = clock(h.expires_ms),
                state = h.state.as_str(),
                actions = hold_actions(view, h, csrf),
            );
        }
        out.push_str("</tbody></table>");
    }
    if !view.leases.is_empty() {
        out.push_str(r#"<p>Attending leases (requests that declare nothing are scored as attended):</p><ul class="leases">"#);
        for l in &view.leases {
            let _ = write!(
                out,
                r#"<li>key <b>{}</b> until <span class="countdown" data-expires-ms="{}">{}</span> (approved hold <code>{}</code>)</li>"#,
                esc(&l.key_id),
                l.until_ms,
                clock(l.until_ms),
                esc(&l.hold_id)
            );
        }
        out.push_str("</ul>");
    }
    out.push_str(r#"<p class="note">Approving releases the key's next identical request once before the hold expires (the agent needs no header); the admin approves any hold, a key's owner its own with the owner secret. Denying counts the worst case as avoided.</p></section>"#);
}

fn decision_row(out: &mut String, d: &DecisionLine) {
    let r = &d.listing.row;
    let model = match &r.model_served {
        Some(served) if served != &r.model_requested => {
            format!("{} → {}", esc(&r.model_requested), esc(served))
        }
        _ => esc(&r.model_requested),
    };
    let mut tokens = Vec::new();
    if r.tokens_not_bought > 0 {
        tokens.push(format!(
            r#"<span class="tier-exact" title="tokens not bought (exact)">{} not bought</span>"#,
            num(r.tokens_not_bought)
        ));
    }
    if r.worst_case_tokens_avoided > 0 {
        tokens.push(format!(
            r#"<span class="tier-ceiling" title="worst case avoided (a ceiling)">≤ {} avoided</span>"#,
            num(r.worst_case_tokens_avoided)
        ));
    }
    if r.findings_tokens > 0 {
        tokens.push(format!(
            r#"<span class="tier-estimate" title="findings tokens (estimated)">≈ {} in findings</span>"#,
            num(r.findings_tokens)
        ));
    }
    let findings = match &d.finding_codes {
        Some(codes) if codes.is_empty() => r#"<span class="muted">none</span>"#.to_string(),
        Some(codes) => codes
            .iter()
            .map(|c| format!(r#"<span class="finding">{}</span>"#, esc(c)))
            .collect::<Vec<_>>()
            .join(" "),
        None => r#"<span class="muted" title="the receipt is no longer kept in memory">—</span>"#
            .to_string(),
    };
    // A decision id is 64 hex digits: safe in a URL and in HTML as it is.
    let receipt = if d.finding_codes.is_some() {
        format!(
            r#"<a class="verify" href="/page/receipt/{0}">verify</a>"#,
            r.decision_id
        )
    } else {
        r#"<span class="muted" title="receipts are kept in memory for the latest 1024 decisions since start">not kept</span>"#.to_string()
    };
    let fingerprint = match &r.fingerprint {
        // Hex digits: nothing to escape.
        Some(fp) => format!("<code>{}…</code>", fp.hex_prefix(FINGERPRINT_DIGITS)),
        None => r#"<span class="muted">forgotten</span>"#.to_string(),
    };
    let score = if r.score.is_finite() {
        format!("{:.2}", r.score)
    } else {
        "—".to_string()
    };
    let spend = d
        .listing
        .spend_nano
        .map(usd)
        .unwrap_or_else(|| match r.verdict {
            Verdict::Allow | Verdict::Downgrade => "pending".to_string(),
            _ => "—".to_string(),
        });
    let _ = write!(
        out,
        r#"<tr class="decision" data-verdict="{v}"><td title="{dt} UTC">{time}</td><td>{key}</td><td><span class="v v-{v}">{v}</span></td><td>{reason}</td><td class="n">{score}</td><td>{model}</td><td>{fingerprint}</td><td>{tokens}</td><td class="n">{spend}</td><td>{findings}</td><td>{receipt}</td></tr>"#,
        v = r.verdict.as_str(),
        dt = datetime(r.decided_at_ms),
        time = clock(r.decided_at_ms),
        key = esc(&r.key_id),
        reason = esc(&r.reason),
        tokens = tokens.join("<br>"),
    );
}

fn sessions(out: &mut String, view: &View) {
    out.push_str(r#"<section id="sessions"><h2>Agent sessions <span class="muted">— active in the last 24 hours</span></h2>"#);
    if view.sessions.is_empty() {
        out.push_str(r#"<p class="muted">No sessions yet.</p></section>"#);
        return;
    }
    out.push_str(r#"<table class="sessions"><thead><tr><th>session</th><th>key</th><th>first (UTC)</th><th>last (UTC)</th><th class="n">calls</th><th class="n">spend</th><th>verdicts</th><th class="n">steps repeated</th><th class="n">paced</th><th>last progress (UTC)</th><th>ended by</th></tr></thead><tbody>"#);
    for s in &view.sessions {
        let verdicts: Vec<String> = s
            .by_verdict
            .iter()
            .map(|(v, n)| format!("{v} {n}"))
            .collect();
        let _ = write!(
            out,
            r#"<tr><td><code>{session}</code></td><td>{key}</td><td>{first}</td><td>{last}</td><td class="n">{calls}</td><td class="n">{spend}</td><td>{verdicts}</td><td class="n">{repeated}</td><td class="n">{paced} s</td><td>{progress} <span class="muted">(then {after} calls)</span></td><td>{ended}</td></tr>"#,
            session = &s.session.to_hex()[..12],
            key = esc(&s.key_id),
            first = datetime(s.first_ms),
            last = datetime(s.last_ms),
            calls = num(s.calls),
            spend = usd(s.spend_nano),
            verdicts = esc(&verdicts.join(", ")),
            repeated = num(s.steps_repeated),
            paced = num(s.paced_ms / 1_000),
            progress = datetime(s.last_progress_ms),
            after = num(s.decisions_since_progress),
            ended = esc(s.ended_by.as_deref().unwrap_or("—")),
        );
    }
    out.push_str(r#"</tbody></table><p class="note">A session is the client's own session id where it sends one (Claude Code, Codex), else the same system, tools and first prompt; a keyed hash, never content. <code>steps repeated</code>: tool calls that returned what they returned before; <code>paced</code>: time the gate held repeated steps; <code>last progress</code>: the last new step.</p></section>"#);
}

fn decisions(out: &mut String, view: &View) {
    out.push_str(r#"<section id="decisions"><h2>Latest decisions</h2><nav class="filters">"#);
    let all = std::iter::once(None).chain(Verdict::ALL.into_iter().map(Some));
    for v in all {
        let current = if v == view.verdict_filter {
            r#" aria-current="page""#
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<a href="{}"{current}>{}</a> "#,
            esc(&page_link(view.range, v)),
            v.map(Verdict::as_str).unwrap_or("all")
        );
    }
    out.push_str("</nav>");
    if view.decisions.is_empty() {
        out.push_str(r#"<p class="muted">No decisions yet.</p>"#);
    } else {
        out.push_str(r#"<table class="decisions"><thead><tr><th>time (UTC)</th><th>key</th><th>verdict</th><th>rule</th><th class="n">score</th><th>model</th><th>fingerprint</th><th>tokens</th><th class="n">spend</th><th>findings</th><th>receipt</th></tr></thead><tbody>"#);
        for d in &view.decisions {
            decision_row(out, d);
        }
        out.push_str("</tbody></table>");
    }
    out.push_str(r#"<p class="note">The newest 50. Rules: <code>runaway_*</code> stop automation that repeats itself, <code>budget_*</code> and <code>exceeds_remaining_budget</code> protect the ceiling, <code>score_*</code> come from the signals (open the receipt to see each one).</p></section>"#);
}

fn economics(out: &mut String, e: &EconomicsBrief) {
    out.push_str(r#"<section id="economics"><h2>Does the gate pay for itself?</h2>"#);
    if e.simulation {
        out.push_str(r#"<p><span class="badge sim" id="simulation">SIMULATION</span> This evidence comes from a scripted provider, not a real one: it shows how the harness measures, not what a real workload saves.</p>"#);
    }
    let _ = write!(
        out,
        r#"<blockquote class="statement" data-publishable="{}">{}</blockquote>"#,
        e.publishable,
        esc(&e.statement)
    );
    if let Some(metric) = &e.metric {
        let value = e
            .value
            .map(|v| format!("{:.1}%", v * 100.0))
            .unwrap_or_else(|| "not measured".into());
        let _ = write!(
            out,
            r#"<p>Primary metric <code>{}</code>: <b>{value}</b> ({})"#,
            esc(metric),
            esc(e.status.as_deref().unwrap_or("—"))
        );
        if let Some((low, high, level_bp)) = e.interval {
            let _ = write!(
                out,
                ", {}% interval {:.1}% to {:.1}%.</p>",
                level_bp as f64 / 100.0,
                low * 100.0,
                high * 100.0
            );
            out.push_str(&svg::interval(e.value, low, high));
        } else {
            out.push_str(", no interval yet.</p>");
        }
    }
    let _ = write!(
        out,
        r#"<p class="note">{} The full report: <code>GET /economics</code> or <code>tokensaver economics summary</code>.</p></section>"#,
        if e.publishable {
            "The publication rule is met."
        } else {
            "The publication rule is not met: no quantitative claim may rest on this."
        }
    );
}

/// A receipt, verified by the gate's own key: every field but the fingerprint, which is cut.
pub fn receipt(
    listener: Listener,
    scope: &Scope,
    decision_id: &DecisionId,
    kid: &str,
    body: &Value,
    id_matches: bool,
) -> String {
    let mut rows = String::new();
    if let Some(fields) = body.as_object() {
        // What explains the verdict first, then the rest in the receipt's own order.
        let mut names: Vec<&String> = RECEIPT_ORDER
            .iter()
            .filter_map(|n| fields.get_key_value(*n).map(|(k, _)| k))
            .collect();
        names.extend(
            fields
                .keys()
                .filter(|k| !RECEIPT_ORDER.contains(&k.as_str())),
        );
        for (name, value) in names
            .into_iter()
            .filter_map(|n| fields.get(n.as_str()).map(|v| (n, v)))
        {
            let _ = write!(
                rows,
                r#"<tr><th>{}</th><td>{}</td></tr>"#,
                esc(name),
                receipt_value(name, value)
            );
        }
    }
    let body_html = format!(
        r#"<main class="narrow" id="receipt"><h1>Receipt</h1><p class="ok" id="verified">Signature valid: Ed25519, key <code>{kid}</code> (listed by <code>GET /spec</code>).</p><p class="{idc}">Decision id <code>{id}</code> {idm} the BLAKE3 hash of the signed bytes.</p><table class="receipt">{rows}</table><p class="note">Your client received this receipt in the <code>x-tokensaver-receipt</code> header; <code>POST /verify</code> on the API listener or <code>tokensaver verify</code> checks it without this page. The fingerprint is cut to {FINGERPRINT_DIGITS} hex digits here.</p><p><a href="/page/">Back to the ledger page</a></p></main>"#,
        kid = esc(kid),
        id = decision_id,
        idc = if id_matches { "ok" } else { "error" },
        idm = if id_matches { "is" } else { "is NOT" },
    );
    layout("Receipt", listener, &who(scope), &body_html)
}

/// The order a person reads a receipt in: why, then what, then the figures.
const RECEIPT_ORDER: &[&str] = &[
    "verdict",
    "reason",
    "rule",
    "band",
    "score",
    "signals",
    "findings",
    "key_id",
    "model_requested",
    "model_served",
    "decided_at_ms",
    "hold_id",
    "approved_hold",
    "attending_lease",
    "worst_case",
    "tokens_not_bought",
    "worst_case_tokens_avoided",
    "fingerprint",
];

/// One receipt field: the fingerprint cut, times readable, objects (signals, worst case) as
/// a small table, numbers with at most three decimals.
fn receipt_value(name: &str, value: &Value) -> String {
    match (name, value) {
        ("fingerprint", Value::String(fp)) => format!(
            "<code>{}…</code>",
            esc(&fp.chars().take(FINGERPRINT_DIGITS).collect::<String>())
        ),
        ("decided_at_ms", Value::Number(n)) => match n.as_u64() {
            Some(ms) => format!("<code>{ms}</code> ({} UTC)", datetime(ms)),
            None => format!("<code>{n}</code>"),
        },
        (_, Value::Object(fields)) => {
            let mut out = String::from(r#"<table class="sub">"#);
            for (k, v) in fields {
                let _ = write!(
                    out,
                    "<tr><th>{}</th><td>{}</td></tr>",
                    esc(k),
                    receipt_value(k, v)
                );
            }
            out.push_str("</table>");
            out
        }
        (_, Value::Number(n)) if n.is_f64() => {
            format!(
                "<code>{}</code>",
                n.as_f64().map(|f| format!("{f:.3}")).unwrap_or_default()
            )
        }
        (_, Value::String(s)) => format!("<code>{}</code>", esc(s)),
        (_, other) => format!("<code>{}</code>", esc(&other.to_string())),
    }
}

/// The notice after an action, from its fixed code (never echoing anything sent).
pub fn notice(code: Option<&str>) -> Option<(&'static str, bool)> {
    Some(match code? {
        "approved" => (
            "Approved: the key's next identical request passes once before the hold expires.",
            true,
        ),
        "attending" => (
            "Approved, and the key is attended for the minutes chosen.",
            true,
        ),
        "denied" => (
            "Denied: the hold is closed and its worst case counts as avoided.",
            true,
        ),
        "unknown" => ("No such hold (or not this key's).", false),
        "expired" => ("The hold has expired.", false),
        "not_pending" => ("The hold is no longer pending.", false),
        "owner_secret" => ("Wrong owner secret.", false),
        "attend_minutes" => ("Choose 15 min, 1 h or 4 h.", false),
        "unavailable" => (
            "The holds could not be read or changed now; try again.",
            false,
        ),
        "unpriced" => (
            "The held request's model has no price, so its spend has no bound: set its price first.",
            false,
        ),
        "fleet_holds" => (
            "In a fleet, decide holds with 'tokensaver holds' or POST /holds/{id}/approve.",
            false,
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
