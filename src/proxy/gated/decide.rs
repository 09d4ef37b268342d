//! Deciding a gated call in the gate's home, and what the proxy does with the decision.

use super::Gone;
use super::{Action, CacheTermsPlaced, Decided, Gated, Issued, Refusal, Terms};
use crate::error::GateError;
use crate::gatekeeper::{AdmitError, GateRequest, RecordSource};
use crate::now_ms;
use crate::proxy::{access, GateProxy};
use crate::receipt::DecisionId;
use tokensaver_core::gate::Verdict;

impl GateProxy {
    /// The decision, from the gate's home: this process (SQLite), a fleet's PostgreSQL, or in
    /// digest mode the central gate. Each fails closed: no decision, nothing upstream.
    pub(super) async fn decide(
        &self,
        g: &Gated<'_>,
        access: &mut access::Access,
        gone: Gone<'_>,
    ) -> std::result::Result<Decided, Refusal> {
        let request = GateRequest {
            key: g.key,
            shape: &g.parsed.shape,
            human: g.human,
            held: g.stored.is_some(),
            hold_id: g.hold_id.as_deref(),
            now_ms: now_ms(),
            recorded_by: RecordSource::Proxy,
        };
        // A repeated step may be held here until its window admits it (SPEC §2.3), or at the
        // central gate.
        let holding = crate::gatekeeper::Holding {
            bytes: g.body.len(),
            gone,
        };
        let outcome = match self.gatekeeper.admit(&request, holding).await {
            Ok(outcome) => outcome,
            Err(AdmitError::CallerGone) => return Err(Refusal::CallerGone),
            Err(AdmitError::Unavailable(_)) => return Err(GateError::fleet_unavailable().into()),
            Err(AdmitError::GateUnreachable) => return Err(GateError::GateUnreachable.into()),
        };
        let d = &outcome.decision;
        let terms = Terms {
            verdict: d.verdict,
            status: d.status(),
            reason: d.reason(),
            // A worst case without a cost is one without a price (`rules::worst_case`).
            unpriced: d.rule == Some(tokensaver_core::gate::Rule::ExceedsRemainingBudget)
                && d.worst_case.cost_nano.is_none(),
            hold_id: d.hold_id.clone(),
            model_served: d.model_served.clone(),
            cache: CacheTermsPlaced {
                breakpoints: d.cache_breakpoints.clone(),
                one_hour: d.cache_ttl_1h,
                routing_key: d.cache_routing_key.clone(),
                retention: d.cache_retention,
            },
        };
        access.decided(
            &terms.verdict,
            terms.reason,
            outcome.decision_id,
            &terms.model_served,
        );
        Ok(self.decided(g, terms, &outcome.envelope, outcome.decision_id))
    }

    /// A decision's terms and receipt, as the proxy enforces them.
    pub(super) fn decided(
        &self,
        g: &Gated<'_>,
        terms: Terms,
        envelope: &crate::receipt::Envelope,
        decision_id: DecisionId,
    ) -> Decided {
        let headers = receipt_headers(terms.verdict, envelope);
        Decided {
            action: self.action(g, terms),
            receipt: Issued {
                decision_id,
                headers,
            },
        }
    }

    /// What the proxy does with a verdict: serve the answer held for it, forward, or refuse.
    pub(super) fn action(&self, g: &Gated<'_>, t: Terms) -> Action {
        // A refusal for want of a price says so, whatever the verdict.
        // A CHALLENGE stays a CHALLENGE (SPEC §2.11, §2.12): its hold id in the body and the
        // `x-tokensaver-hold` header, like every hold.
        if t.unpriced {
            let model = &g.parsed.shape.model;
            let held = t.verdict == Verdict::Challenge;
            let hold_id = t.hold_id.filter(|_| held);
            return Action::Refuse(GateError::unpriced_model(t.status, model, held, hold_id));
        }
        match t.verdict {
            // The local gate serves only what `stored` holds; a central gate that says SERVE
            // for an answer this instance does not hold breaks the protocol.
            Verdict::Serve => match &g.stored {
                Some(answer) => Action::Serve(answer.clone()),
                None => Action::Refuse(GateError::AnswerMissing),
            },
            Verdict::Challenge => {
                let ttl = self.gatekeeper.hold_ttl_ms();
                Action::Refuse(GateError::held(t.reason, t.hold_id, ttl))
            }
            Verdict::Block => Action::Refuse(GateError::Blocked {
                status: t.status,
                reason: t.reason,
            }),
            Verdict::Allow | Verdict::Downgrade => Action::Forward {
                downgrade: t.verdict == Verdict::Downgrade,
                model_served: t.model_served,
                cache: t.cache,
            },
        }
    }
}

fn receipt_headers(
    verdict: Verdict,
    envelope: &crate::receipt::Envelope,
) -> Vec<(&'static str, String)> {
    vec![
        ("x-tokensaver-verdict", verdict.as_str().to_string()),
        ("x-tokensaver-receipt", envelope.to_header_value()),
    ]
}
