//! `GET /v1/models` when several upstreams speak the caller's API shape: the union of their
//! lists, each upstream contributing the models that route to it (so every id listed is one a
//! call would reach), in upstream order, an id once. An upstream that does not answer is left
//! out and named in `x-tokensaver-upstreams-missing`: the list is never passed off as whole.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::proxy::Session;
use pingora::Result;
use serde_json::{json, Value};

use super::respond;
use crate::http_client::{exchange, ClientError};
use crate::upstreams::{ProviderPeer, Upstreams};
use tokensaver_core::request::Provider;

/// The most of one upstream's list that is read.
const LIST_CAP: usize = 4 * 1024 * 1024;
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) async fn answer_union(
    connector: &Connector,
    upstreams: &Upstreams,
    session: &mut Session,
    api: Provider,
) -> Result<()> {
    let mut data = Vec::new();
    let mut seen = HashSet::new();
    let mut missing = Vec::new();
    for upstream in upstreams.of_api(api) {
        let Some(list) = fetch(connector, &upstream, api).await else {
            missing.push(upstream.name().to_string());
            continue;
        };
        for model in list {
            let Some(id) = model.get("id").and_then(Value::as_str) else {
                continue;
            };
            if upstreams.routes_to(&upstream.upstream, id) && seen.insert(id.to_string()) {
                data.push(model);
            }
        }
    }
    let body = match api {
        Provider::OpenAi => json!({"object": "list", "data": data}),
        Provider::Anthropic => json!({
            "data": data,
            "has_more": false,
            "first_id": data.first().and_then(|m| m.get("id")).cloned(),
            "last_id": data.last().and_then(|m| m.get("id")).cloned(),
        }),
    };
    let mut headers = Vec::new();
    if !missing.is_empty() {
        headers.push(("x-tokensaver-upstreams-missing", missing.join(",")));
    }
    let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    respond(session, 200, "application/json", body, &headers).await
}

/// One upstream's list (`data`), or `None` if it did not answer 200 with one.
async fn fetch(
    connector: &Connector,
    upstream: &ProviderPeer,
    api: Provider,
) -> Option<Vec<Value>> {
    let sent = match api {
        Provider::OpenAi => "/v1/models",
        // Anthropic pages its list; one page of its largest size holds every model.
        Provider::Anthropic => "/v1/models?limit=1000",
    };
    let path = upstream.path(None, sent, "");
    let mut header = RequestHeader::build("GET", path.as_bytes(), None).ok()?;
    header
        .insert_header("host", upstream.host_header.as_str())
        .ok()?;
    if api == Provider::Anthropic {
        header
            .insert_header("anthropic-version", "2023-06-01")
            .ok()?;
    }
    upstream.set_credential(&mut header, None).ok()?;
    for peer in upstream.candidates() {
        // A list is a small, quick answer: its own timeouts, not the forwarded calls'.
        let mut peer = peer.clone();
        peer.options.read_timeout = Some(LIST_TIMEOUT);
        peer.options.write_timeout = Some(LIST_TIMEOUT);
        let answer = match exchange(connector, &peer, &header, None, LIST_CAP).await {
            Ok(answer) => answer,
            // This address does not take connections: the next one may.
            Err(ClientError::Connect(_)) => continue,
            Err(_) => return None,
        };
        if answer.status != 200 {
            return None;
        }
        let mut parsed: Value = serde_json::from_slice(&answer.body).ok()?;
        return match parsed.get_mut("data").map(Value::take) {
            Some(Value::Array(list)) => Some(list),
            _ => None,
        };
    }
    None
}
