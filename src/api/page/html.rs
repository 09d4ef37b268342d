//! The page's HTML, rendered on the server from a [`View`] with maud's `html!` templates:
//! every value spliced into a template is escaped by construction (text and attribute values
//! alike), so no call site can forget to; the only markup spliced as it is comes from maud
//! itself (the [`svg`] plots, typed [`Markup`]). Nothing here reads request content (there is
//! none in a view). Elements that carry a figure also carry it raw (`data-figure`,
//! `data-value`), so tests and scripts compare numbers, not formatting.
//!
//! The page and its sign-in form reference the embedded `page.css` and `page.js` only: no
//! inline script or style (the CSP forbids them).

use std::fmt::{Display, Write};

use maud::{html, Markup, Render, DOCTYPE};
use serde_json::Value;

use super::model::{DecisionLine, EconomicsBrief, KeyLine, Range, View};
use super::session::Scope;
use super::svg;
use crate::api::Listener;
use crate::gatekeeper::HoldView;
use crate::receipt::DecisionId;
use crate::store::{utc_day, HoldState, LedgerTotals};
use tokensaver_core::gate::Verdict;

/// How many hex digits of a fingerprint the page shows.
pub const FINGERPRINT_DIGITS: usize = 12;

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

/// A page: the head (the embedded stylesheet, script and icon), the top bar saying where and
/// who, `body`, and the footer's promise.
fn layout(title: &str, listener: Listener, scope: Option<&Scope>, body: Markup) -> Markup {
    let listener_name = match listener {
        Listener::Admin => "admin listener",
        Listener::Api => "API listener",
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="same-origin";
                title { (title) " · tokensaver" }
                link rel="icon" href="/page/assets/icon.svg" type="image/svg+xml";
                link rel="stylesheet" href="/page/assets/page.css";
                script src="/page/assets/page.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/page/" { "tokensaver" }
                    span.where { "ledger page · " (listener_name) }
                    @if let Some(scope) = scope { (who(scope)) }
                }
                (body)
                footer {
                    "This page never shows prompt or answer text: figures, verdicts, rules, "
                    "finding codes and fingerprints cut to 12 hex digits only."
                }
            }
        }
    }
}

/// Who is signed in, in the top bar.
fn who(scope: &Scope) -> Markup {
    match scope {
        Scope::Admin => html! { span.who { "admin · every key" } },
        Scope::Key(id) => html! { span.who { "key " b { (id) } " · this key's data only" } },
    }
}

/// The sign-in form; `error` is one of our own static messages.
pub fn login(listener: Listener, error: Option<&'static str>) -> Markup {
    let which = match listener {
        Listener::Admin => {
            "the admin key (every key's data) or a tokensaver key (that key's data only)"
        }
        Listener::Api => {
            "your tokensaver key: you will see this key's data only (the admin view is on the \
             admin listener)"
        }
    };
    let body = html! {
        main.narrow #login {
            h1 { "Sign in" }
            p { "Sign in with " (which) "." }
            @if let Some(error) = error {
                p.error role="alert" { (error) }
            }
            form method="post" action="/page/login" {
                label for="key" { "Key" }
                " "
                input type="password" #key name="key" autocomplete="current-password"
                    required autofocus;
                " "
                button type="submit" { "Sign in" }
            }
            p.note {
                "The key is checked once and never stored: the browser keeps an HttpOnly, "
                "SameSite=Strict session cookie for 8 hours. On a shared machine, sign out when "
                "you are done."
            }
        }
    };
    layout("Sign in", listener, None, body)
}

/// A short page with a message (errors, a receipt not kept).
pub fn message(listener: Listener, title: &str, text: &str) -> Markup {
    let body = html! {
        main.narrow {
            h1 { (title) }
            p { (text) }
            p { a href="/page/" { "Back to the ledger page" } }
        }
    };
    layout(title, listener, None, body)
}

/// What `/page/panel` answers once the session has ended: `page.js` reloads on its 401.
pub fn signed_out() -> Markup {
    html! { p { "Signed out: reload the page." } }
}

/// The signed-in page: the bar (live switch, last update, sign out), a notice, and the live
/// panel.
pub fn dashboard(
    listener: Listener,
    view: &View,
    csrf: &str,
    notice: Option<(&'static str, bool)>,
) -> Markup {
    let body = html! {
        div.bar {
            label.live { input type="checkbox" #live checked; " live (every 5 s)" }
            " "
            span #updated .muted { "updated " (clock(view.now_ms)) " UTC" }
            form.signout method="post" action="/page/logout" {
                input type="hidden" name="csrf" value=(csrf);
                button type="submit" { "Sign out" }
            }
        }
        @if let Some((text, ok)) = notice {
            p.notice.error[!ok] role="status" #notice { (text) }
        }
        main #panel data-src=(panel_src(view.range, view.verdict_filter)) {
            (panel(view, csrf))
        }
    };
    layout("Ledger", listener, Some(&view.scope), body)
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
pub fn panel(view: &View, csrf: &str) -> Markup {
    html! {
        div.stamp data-now-ms=(view.now_ms) data-clock=(clock(view.now_ms)) {}
        (budgets(view))
        (savings(view))
        (cache_health(view))
        (verdicts(view))
        (holds(view, csrf))
        (sessions(view))
        (decisions(view))
        @if let Some(e) = &view.economics {
            (economics(e))
        }
    }
}

/// A verdict's name in its colour (the stylesheet's `v-VERDICT` class).
fn verdict_badge(v: Verdict) -> Markup {
    html! { span class={ "v v-" (v.as_str()) } { (v.as_str()) } }
}

/// A figure's cell: its exact value for the tests and scripts, `shown` for people.
fn figure_cell(key: &str, figure: &str, value: impl Display, shown: impl Render) -> Markup {
    html! {
        td.n data-key=(key) data-figure=(figure) data-value=(value) { (shown) }
    }
}

/// A count's cell, shown with thousands separators.
fn count_cell(key: &str, figure: &str, n: u64) -> Markup {
    figure_cell(key, figure, n, num(n))
}

/// A nano-USD figure's cell, shown in dollars.
fn usd_cell(key: &str, figure: &str, nano: u64) -> Markup {
    figure_cell(key, figure, nano, usd(nano))
}

fn budgets(view: &View) -> Markup {
    html! {
        section #budgets {
            h2 { "Spend against budget" }
            table {
                thead {
                    tr {
                        th { "key" } th { "period" } th.n { "ceiling" } th.n { "spent this period" }
                        th.n { "reserved" } th.n { "left" } th.n { "spent today" } th { "used" }
                    }
                }
                tbody {
                    @for k in &view.keys { (budget_row(k)) }
                }
            }
            p.note {
                "Spend is what the provider's reported usage cost at the price table; a "
                "reservation is the worst case of a call still in flight (settled by its usage, "
                "charged in full if none arrives). Periods are UTC."
            }
        }
    }
}

/// One key's budget: without a ceiling there is nothing left to show and no bar.
fn budget_row(k: &KeyLine) -> Markup {
    let b = &k.budget;
    let id = k.key_id.as_str();
    html! {
        tr {
            td { (id) }
            td { (b.period) }
            @match b.ceiling_nano {
                Some(c) => (usd_cell(id, "ceiling_nano", c)),
                None => td.n.muted { "no ceiling" },
            }
            (usd_cell(id, "spend_nano", b.spend_nano))
            (usd_cell(id, "reserved_nano", b.reserved_nano))
            @match (b.ceiling_nano, b.left_nano) {
                (None, _) => td.n.muted { "—" },
                (Some(_), Some(l)) if l >= 0 => {
                    (usd_cell(id, "left_nano", u64::try_from(l).unwrap_or(u64::MAX)))
                }
                (Some(_), _) => td.n.over { "none left" },
            }
            (usd_cell(id, "spend_today_nano", k.today.spend_nano))
            td {
                @if let Some(c) = b.ceiling_nano {
                    @let used = b.spend_nano.saturating_add(b.reserved_nano);
                    (svg::budget_bar(b.spend_nano, b.reserved_nano, c))
                    " "
                    span.muted { (format!("{:.1}%", used as f64 * 100.0 / c.max(1) as f64)) }
                }
            }
        }
    }
}

/// One row of the ledger table: a key's (or every key's) totals, by verdict and by tier.
fn ledger_row(label: &str, key: &str, t: &LedgerTotals) -> Markup {
    let spend = html! {
        (usd(t.spend_nano))
        // Calls at a price the gate does not know have an unknown spend: said, never shown as 0.
        @if t.unpriced_calls > 0 {
            " "
            span.muted data-figure="unpriced_calls" data-value=(t.unpriced_calls) {
                "+ " (t.unpriced_calls) " unpriced"
            }
        }
    };
    html! {
        tr {
            td { (label) }
            (count_cell(key, "requests", t.requests))
            @for v in Verdict::ALL {
                (count_cell(key, v.as_str(), t.count(v)))
            }
            (figure_cell(key, "spend_nano", t.spend_nano, spend))
            (count_cell(key, "tokens_not_bought", t.tokens_not_bought))
            (count_cell(key, "worst_case_tokens_avoided", t.worst_case_tokens_avoided))
            (count_cell(key, "findings_tokens_estimated", t.findings_tokens_estimated))
            @let saving = t.cache_saving_nano;
            (figure_cell(key, "cache_saving", saving, signed_usd(saving)))
        }
    }
}

/// One savings tier's card: its name, how sure its figure is, the figure, what it counts.
struct TierCard {
    figure: &'static str,
    class: &'static str,
    badge: &'static str,
    name: &'static str,
    value: String,
    shown: String,
    text: &'static str,
}

impl Render for TierCard {
    fn render(&self) -> Markup {
        html! {
            div class={ "tier " (self.class) } {
                div.tier-head {
                    span.tier-name { (self.name) }
                    " "
                    span.badge { (self.badge) }
                }
                div.tier-value data-scope="total" data-figure=(self.figure)
                    data-value=(self.value) {
                    (self.shown)
                }
                p { (self.text) }
            }
        }
    }
}

fn tier_cards(total: &LedgerTotals) -> [TierCard; 4] {
    [
        TierCard {
            figure: "tokens_not_bought",
            class: "tier-exact",
            badge: "exact",
            name: "tokens not bought",
            value: total.tokens_not_bought.to_string(),
            shown: num(total.tokens_not_bought),
            text: "The usage the provider itself reported for each answer served from the store. \
                   The only savings total.",
        },
        TierCard {
            figure: "worst_case_tokens_avoided",
            class: "tier-ceiling",
            badge: "a ceiling",
            name: "worst-case tokens avoided",
            value: total.worst_case_tokens_avoided.to_string(),
            shown: num(total.worst_case_tokens_avoided),
            text: "The most each refused (or never-approved) call could have cost. Reported \
                   apart; never added to the savings.",
        },
        TierCard {
            figure: "findings_tokens_estimated",
            class: "tier-estimate",
            badge: "estimated",
            name: "findings tokens",
            value: total.findings_tokens_estimated.to_string(),
            shown: format!("≈ {}", num(total.findings_tokens_estimated)),
            text: "Characters ÷ 4 of the waste named inside requests (old turns, unused tools, \
                   duplicates). An estimate; in no total.",
        },
        // In dollars, not tokens: what the gate's breakpoints changed in the price of the same
        // tokens (SPEC §2.11b).
        TierCard {
            figure: "cache_saving",
            class: "tier-estimate",
            badge: "derived",
            name: "prompt-cache saving",
            value: total.cache_saving_nano.to_string(),
            shown: signed_usd(total.cache_saving_nano),
            text: "Where the gate placed cache breakpoints: what the cached tokens would have \
                   cost uncached, minus what they did cost (read price and write premium). \
                   Counterfactual; in no total.",
        },
    ]
}

fn savings(view: &View) -> Markup {
    let admin = matches!(view.scope, Scope::Admin);
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
    html! {
        section #savings {
            h2 {
                "Savings by tier "
                span.muted {
                    "— " (label) ", since the ledger began; tiers are never added together"
                }
            }
            div.tiers {
                @for card in tier_cards(&total) { (card) }
            }
            table.ledger {
                thead {
                    tr {
                        th { "key" } th.n { "requests" }
                        @for v in Verdict::ALL { th.n { (verdict_badge(v)) } }
                        th.n { "spend" } th.n { "tokens not bought" } th.n { "worst case avoided" }
                        th.n { "findings (est.)" } th.n { "cache saving (derived)" }
                    }
                }
                tbody { (key_rows(view, ledger_row)) }
            }
            p.note {
                "The same figures as " code { "GET /ledger" }
                @if admin {
                    " per key and " code { "GET /stats" } " for all keys"
                }
                ", since the ledger began (UTC days; today is " (view.today) ")."
            }
        }
    }
}

/// One row per key in view, then (the admin's view) the row of all keys.
fn key_rows(view: &View, row: fn(&str, &str, &LedgerTotals) -> Markup) -> Markup {
    html! {
        @for k in &view.keys {
            (row(&k.key_id, &k.key_id, &k.total))
        }
        @if let (Scope::Admin, Some(fleet)) = (&view.scope, &view.fleet) {
            (row("all keys", "*", fleet))
        }
    }
}

/// A ledger row of cache health: what the provider billed, then each mechanism's derived
/// saving (SPEC §2.11b).
fn cache_row(label: &str, key: &str, t: &LedgerTotals) -> Markup {
    html! {
        tr {
            td { (label) }
            td.n { (crate::report::percent(t.cache_read_share())) }
            (count_cell(key, "cache_rebuilds", t.cache_rebuilds))
            (usd_cell(key, "cache_rebuild", t.cache_rebuild_nano))
            (usd_cell(key, "cache_premium_1h", t.cache_premium_1h_nano))
            @for (figure, nano) in [
                ("cache_saving", t.cache_saving_nano),
                ("cache_saving_lifetimes", t.cache_saving_lifetimes_nano),
                ("cache_saving_routing", t.cache_saving_routing_nano),
            ] {
                (figure_cell(key, figure, nano, signed_usd(nano)))
            }
        }
    }
}

fn cache_health(view: &View) -> Markup {
    html! {
        section #cache {
            h2 { "Cache health " span.muted { "— since the ledger began" } }
            table.ledger {
                thead {
                    tr {
                        th { "key" } th.n { "read from cache" } th.n { "rebuilds" }
                        th.n { "rebuild cost" } th.n { "one-hour premium" }
                        th.n { "breakpoints (derived)" } th.n { "lifetimes (derived)" }
                        th.n { "routing (derived)" }
                    }
                }
                tbody { (key_rows(view, cache_row)) }
            }
            p.note {
                code { "read from cache" } ": cache reads over every prompt token billed. "
                code { "rebuilds" } ": calls that wrote the cache after their session paused, "
                "and what those writes cost. " code { "one-hour premium" } ": what one-hour "
                "entries cost above five-minute ones. The three savings are derived and "
                "counterfactual, one per mechanism (breakpoints placed, lifetimes, routing "
                "keys): what the same tokens would have cost without it; in no total."
            }
        }
    }
}

fn verdicts(view: &View) -> Markup {
    let (bucket_ms, n) = view.range.buckets();
    let chart = svg::Chart::build(
        &view.verdict_counts,
        view.range.first_ms(view.now_ms),
        bucket_ms,
        n,
    );
    let range = view.range;
    let title = format!("Decisions by verdict and rule, {} (UTC)", range.title());
    html! {
        section #verdicts {
            h2 { "Verdicts over time" }
            nav.ranges {
                @for r in Range::ALL {
                    a href=(page_link(r, view.verdict_filter))
                        aria-current=[(r == range).then_some("page")] {
                        (r.title())
                    }
                    " "
                }
            }
            (svg::stacked_bars(&chart, &title, |ms| label_for(range, ms)))
            ul.legend {
                @for s in &chart.series {
                    li data-verdict=(s.verdict.as_str()) data-reason=(s.reason)
                        data-count=(s.total()) {
                        (svg::swatch(&s.colour))
                        " "
                        (verdict_badge(s.verdict))
                        " " (s.reason) " "
                        b { (num(s.total())) }
                    }
                }
            }
        }
    }
}

/// Whether a hold id is safe in a form's action path (holds are decided by URL).
fn safe_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// What can be done with a hold: for a pending one, the form that approves or denies it.
fn hold_actions(view: &View, h: &HoldView, csrf: &str) -> Markup {
    if h.state != HoldState::Pending || !safe_id(&h.hold_id) {
        return html! {
            span.muted {
                "approved: the key's next identical request passes once, until "
                (clock(h.expires_ms)) " UTC"
            }
        };
    }
    // A key's session decides its own holds with the owner secret (the routes' rule).
    let needs_owner_secret = match &view.scope {
        Scope::Admin => false,
        Scope::Key(id) => {
            if !view.keys.iter().any(|k| &k.key_id == id && k.has_owner) {
                return html! {
                    span.muted {
                        "no owner secret is configured for this key: the admin approves it"
                    }
                };
            }
            true
        }
    };
    let id = h.hold_id.as_str();
    // One form, two buttons: the owner secret is typed once for either decision.
    html! {
        form.decide method="post" action={ "/page/holds/" (id) "/approve" } {
            input type="hidden" name="csrf" value=(csrf);
            @if needs_owner_secret {
                input type="password" name="owner_secret" placeholder="owner secret"
                    autocomplete="off" required aria-label="owner secret";
            }
            select name="attend_minutes" aria-label="attend the key" {
                option value="" { "release this request once" }
                option value="15" { "and attend the key 15 min" }
                option value="60" { "and attend the key 1 h" }
                option value="240" { "and attend the key 4 h" }
            }
            " "
            button.approve-btn type="submit" data-hold=(id) { "Approve" }
            " "
            button.deny-btn type="submit" formaction={ "/page/holds/" (id) "/deny" }
                data-hold=(id) { "Deny" }
        }
    }
}

fn hold_row(view: &View, h: &HoldView, csrf: &str) -> Markup {
    html! {
        tr.hold data-hold=(h.hold_id) {
            td { code { (h.hold_id) } }
            td { (h.key_id) }
            td { (h.reason.unwrap_or("—")) }
            td.n { (num(h.worst_case_tokens)) }
            td { (clock(h.created_ms)) }
            td { span.countdown data-expires-ms=(h.expires_ms) { (clock(h.expires_ms)) } }
            td { (h.state.as_str()) }
            td.actions { (hold_actions(view, h, csrf)) }
        }
    }
}

fn holds(view: &View, csrf: &str) -> Markup {
    html! {
        section #holds {
            h2 {
                "Open holds "
                @let open = view.holds.len();
                span.count data-figure="open_holds" data-value=(open) { (open) }
            }
            @if view.holds.is_empty() {
                p.muted { "No CHALLENGE is waiting for a person." }
            } @else {
                table {
                    thead {
                        tr {
                            th { "hold" } th { "key" } th { "reason" }
                            th.n { "worst case (tokens)" }
                            th { "opened" } th { "expires" } th { "state" } th { "decide" }
                        }
                    }
                    tbody {
                        @for h in &view.holds { (hold_row(view, h, csrf)) }
                    }
                }
            }
            @if !view.leases.is_empty() {
                p { "Attending leases (requests that declare nothing are scored as attended):" }
                ul.leases {
                    @for l in &view.leases {
                        li {
                            "key " b { (l.key_id) } " until "
                            span.countdown data-expires-ms=(l.until_ms) { (clock(l.until_ms)) }
                            " (approved hold " code { (l.hold_id) } ")"
                        }
                    }
                }
            }
            p.note {
                "Approving releases the key's next identical request once before the hold "
                "expires (the agent needs no header); the admin approves any hold, a key's owner "
                "its own with the owner secret. Denying counts the worst case as avoided."
            }
        }
    }
}

/// A decision's tokens, one line per tier that has any.
fn decision_tokens(d: &DecisionLine) -> Markup {
    let r = &d.listing.row;
    let mut lines = Vec::new();
    if r.tokens_not_bought > 0 {
        lines.push(html! {
            span.tier-exact title="tokens not bought (exact)" {
                (num(r.tokens_not_bought)) " not bought"
            }
        });
    }
    if r.worst_case_tokens_avoided > 0 {
        lines.push(html! {
            span.tier-ceiling title="worst case avoided (a ceiling)" {
                "≤ " (num(r.worst_case_tokens_avoided)) " avoided"
            }
        });
    }
    if r.findings_tokens > 0 {
        lines.push(html! {
            span.tier-estimate title="findings tokens (estimated)" {
                "≈ " (num(r.findings_tokens)) " in findings"
            }
        });
    }
    html! {
        @for (i, line) in lines.into_iter().enumerate() {
            @if i > 0 { br; }
            (line)
        }
    }
}

/// A decision's finding codes, as its receipt (still kept in memory, or not) names them.
fn decision_findings(d: &DecisionLine) -> Markup {
    match &d.finding_codes {
        Some(codes) if codes.is_empty() => html! { span.muted { "none" } },
        Some(codes) => html! {
            @for (i, code) in codes.iter().enumerate() {
                @if i > 0 { " " }
                span.finding { (code) }
            }
        },
        None => html! {
            span.muted title="the receipt is no longer kept in memory" { "—" }
        },
    }
}

fn decision_row(d: &DecisionLine) -> Markup {
    let r = &d.listing.row;
    let v = r.verdict.as_str();
    let score = if r.score.is_finite() {
        format!("{:.2}", r.score)
    } else {
        "—".to_string()
    };
    // The model served, shown only when it is not the one requested.
    let served = r.model_served.as_ref().filter(|s| **s != r.model_requested);
    let spend = d
        .listing
        .spend_nano
        .map(usd)
        .unwrap_or_else(|| match r.verdict {
            Verdict::Allow | Verdict::Downgrade => "pending".to_string(),
            _ => "—".to_string(),
        });
    html! {
        tr.decision data-verdict=(v) {
            td title={ (datetime(r.decided_at_ms)) " UTC" } { (clock(r.decided_at_ms)) }
            td { (r.key_id) }
            td { (verdict_badge(r.verdict)) }
            td { (r.reason) }
            td.n { (score) }
            td {
                (r.model_requested)
                @if let Some(served) = served {
                    " → " (served)
                }
            }
            td {
                @match &r.fingerprint {
                    Some(fp) => code { (fp.hex_prefix(FINGERPRINT_DIGITS)) "…" },
                    None => span.muted { "forgotten" },
                }
            }
            td { (decision_tokens(d)) }
            td.n { (spend) }
            td { (decision_findings(d)) }
            td {
                @if d.finding_codes.is_some() {
                    a.verify href={ "/page/receipt/" (r.decision_id) } { "verify" }
                } @else {
                    span.muted
                        title="receipts are kept in memory for the latest 1024 decisions since start" {
                        "not kept"
                    }
                }
            }
        }
    }
}

fn sessions(view: &View) -> Markup {
    html! {
        section #sessions {
            h2 { "Agent sessions " span.muted { "— active in the last 24 hours" } }
            @if view.sessions.is_empty() {
                p.muted { "No sessions yet." }
            } @else {
                table.sessions {
                    thead {
                        tr {
                            th { "session" } th { "key" } th { "first (UTC)" } th { "last (UTC)" }
                            th.n { "calls" } th.n { "spend" } th.n { "read from cache" }
                            th.n { "rebuilds" } th { "verdicts" }
                            th.n { "steps repeated" } th.n { "paced" }
                            th { "last progress (UTC)" } th { "ended by" }
                        }
                    }
                    tbody {
                        @for s in &view.sessions {
                            tr {
                                td { code { (s.session.hex_prefix(12)) } }
                                td { (s.key_id) }
                                td { (datetime(s.first_ms)) }
                                td { (datetime(s.last_ms)) }
                                td.n { (num(s.calls)) }
                                td.n { (usd(s.spend_nano)) }
                                td.n { (crate::report::percent(s.cache.cache_read_share)) }
                                td.n {
                                    (num(s.cache.cache_rebuilds))
                                    @if s.cache.cache_rebuilds > 0 {
                                        " " span.muted { "(" (usd(s.cache.cache_rebuild_nano)) ")" }
                                    }
                                }
                                td {
                                    @for (i, (v, n)) in s.by_verdict.iter().enumerate() {
                                        @if i > 0 { ", " }
                                        (v) " " (n)
                                    }
                                }
                                td.n { (num(s.steps_repeated)) }
                                td.n { (num(s.paced_ms / 1_000)) " s" }
                                td {
                                    (datetime(s.last_progress_ms)) " "
                                    span.muted {
                                        "(then " (num(s.decisions_since_progress)) " calls)"
                                    }
                                }
                                td { (s.ended_by.as_deref().unwrap_or("—")) }
                            }
                        }
                    }
                }
                p.note {
                    "A session is the client's own session id where it sends one (Claude Code, "
                    "Codex), else the same system, tools and first prompt; a keyed hash, never "
                    "content. " code { "steps repeated" } ": tool calls that returned what they "
                    "returned before; " code { "paced" } ": time the gate held repeated steps; "
                    code { "last progress" } ": the last new step."
                }
            }
        }
    }
}

fn decisions(view: &View) -> Markup {
    let filters = std::iter::once(None).chain(Verdict::ALL.into_iter().map(Some));
    html! {
        section #decisions {
            h2 { "Latest decisions" }
            nav.filters {
                @for v in filters {
                    a href=(page_link(view.range, v))
                        aria-current=[(v == view.verdict_filter).then_some("page")] {
                        (v.map(Verdict::as_str).unwrap_or("all"))
                    }
                    " "
                }
            }
            @if view.decisions.is_empty() {
                p.muted { "No decisions yet." }
            } @else {
                table.decisions {
                    thead {
                        tr {
                            th { "time (UTC)" } th { "key" } th { "verdict" } th { "rule" }
                            th.n { "score" } th { "model" } th { "fingerprint" } th { "tokens" }
                            th.n { "spend" } th { "findings" } th { "receipt" }
                        }
                    }
                    tbody {
                        @for d in &view.decisions { (decision_row(d)) }
                    }
                }
            }
            p.note {
                "The newest 50. Rules: " code { "runaway_*" } " stop automation that repeats "
                "itself, " code { "budget_*" } " and " code { "exceeds_remaining_budget" }
                " protect the ceiling, " code { "score_*" } " come from the signals (open the "
                "receipt to see each one)."
            }
        }
    }
}

fn economics(e: &EconomicsBrief) -> Markup {
    let pct = |v: f64| format!("{:.1}%", v * 100.0);
    html! {
        section #economics {
            h2 { "Does the gate pay for itself?" }
            @if e.simulation {
                p {
                    span.badge.sim #simulation { "SIMULATION" }
                    " This evidence comes from a scripted provider, not a real one: it shows how "
                    "the harness measures, not what a real workload saves."
                }
            }
            blockquote.statement data-publishable=(e.publishable) { (e.statement) }
            @if let Some(metric) = &e.metric {
                p {
                    "Primary metric " code { (metric) } ": "
                    b { (e.value.map(pct).unwrap_or_else(|| "not measured".into())) }
                    " (" (e.status.as_deref().unwrap_or("—")) ")"
                    @match e.interval {
                        Some((low, high, level_bp)) => {
                            ", " (level_bp as f64 / 100.0) "% interval "
                            (pct(low)) " to " (pct(high)) "."
                        }
                        None => ", no interval yet.",
                    }
                }
                @if let Some((low, high, _)) = e.interval {
                    (svg::interval(e.value, low, high))
                }
            }
            p.note {
                @if e.publishable {
                    "The publication rule is met."
                } @else {
                    "The publication rule is not met: no quantitative claim may rest on this."
                }
                " The full report: " code { "GET /economics" } " or "
                code { "tokensaver economics summary" } "."
            }
        }
    }
}

/// A receipt, verified by the gate's own key: every field but the fingerprint, which is cut.
pub fn receipt(
    listener: Listener,
    scope: &Scope,
    decision_id: &DecisionId,
    kid: &str,
    body: &Value,
    id_matches: bool,
) -> Markup {
    let body = html! {
        main.narrow #receipt {
            h1 { "Receipt" }
            p.ok #verified {
                "Signature valid: Ed25519, key " code { (kid) }
                " (listed by " code { "GET /spec" } ")."
            }
            p class=(if id_matches { "ok" } else { "error" }) {
                "Decision id " code { (decision_id) } " "
                (if id_matches { "is" } else { "is NOT" })
                " the BLAKE3 hash of the signed bytes."
            }
            table.receipt {
                @for (name, value) in receipt_fields(body) {
                    tr { th { (name) } td { (receipt_value(name, value)) } }
                }
            }
            p.note {
                "Your client received this receipt in the " code { "x-tokensaver-receipt" }
                " header; " code { "POST /verify" } " on the API listener or "
                code { "tokensaver verify" } " checks it without this page. The fingerprint is "
                "cut to " (FINGERPRINT_DIGITS) " hex digits here."
            }
            p { a href="/page/" { "Back to the ledger page" } }
        }
    };
    layout("Receipt", listener, Some(scope), body)
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

/// A receipt's fields: what explains the verdict first ([`RECEIPT_ORDER`]), then the rest in
/// the receipt's own order.
fn receipt_fields(body: &Value) -> Vec<(&str, &Value)> {
    let Some(fields) = body.as_object() else {
        return Vec::new();
    };
    let first = RECEIPT_ORDER
        .iter()
        .filter_map(|n| fields.get_key_value(*n));
    let rest = fields
        .iter()
        .filter(|(k, _)| !RECEIPT_ORDER.contains(&k.as_str()));
    first.chain(rest).map(|(k, v)| (k.as_str(), v)).collect()
}

/// One receipt field: the fingerprint cut, times readable, objects (signals, worst case) as
/// a small table, numbers with at most three decimals.
fn receipt_value(name: &str, value: &Value) -> Markup {
    match (name, value) {
        ("fingerprint", Value::String(fp)) => html! {
            code { (fp.chars().take(FINGERPRINT_DIGITS).collect::<String>()) "…" }
        },
        ("decided_at_ms", Value::Number(n)) => match n.as_u64() {
            Some(ms) => html! { code { (ms) } " (" (datetime(ms)) " UTC)" },
            None => html! { code { (n) } },
        },
        (_, Value::Object(fields)) => html! {
            table.sub {
                @for (k, v) in fields {
                    tr { th { (k) } td { (receipt_value(k, v)) } }
                }
            }
        },
        (_, Value::Number(n)) if n.is_f64() => html! {
            code { (n.as_f64().map(|f| format!("{f:.3}")).unwrap_or_default()) }
        },
        (_, Value::String(s)) => html! { code { (s) } },
        (_, other) => html! { code { (other) } },
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
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
