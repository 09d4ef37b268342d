//! Named upstreams routed by model, and addresses that follow DNS (issue 21, points 1 and 2):
//! the real binary in front of several mock providers on 127.0.0.x, one of them
//! OpenAI-compatible under another name and base path, one Azure-shaped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;
use tokensaver_mock_provider::{MockProvider, ProviderOptions};

fn provider() -> MockProvider {
    provider_on("127.0.0.1:0".parse().unwrap())
}

fn provider_on(addr: SocketAddr) -> MockProvider {
    MockProvider::start_background_on(
        addr,
        ProviderOptions {
            expected_credential: Some(PROVIDER_CREDENTIAL.into()),
            ..ProviderOptions::default()
        },
    )
    .unwrap()
}

fn header<'r>(r: &'r tokensaver_mock_provider::ReceivedRequest, name: &str) -> Option<&'r str> {
    r.headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

const PRICED: &str = "\n[prices.\"llama-3.3-70b\"]\ninput = 590_000\ncache_write = 590_000\n\
    cache_read = 590_000\noutput = 790_000\nmax_output = 32_768\n\n\
    [prices.\"gpt-4.1\"]\ninput = 2_000_000\ncache_write = 2_000_000\ncache_read = 500_000\n\
    output = 8_000_000\nmax_output = 32_768\n";

/// Four upstreams of the OpenAI shape and one of Anthropic's: each call reaches the one its
/// model names, with the path and the credential header that upstream takes; a DOWNGRADE goes
/// where the cheaper model routes; the ledger records each provider's usage exactly.
#[test]
fn each_model_reaches_the_upstream_that_names_it() {
    let (groq, azure, cheap) = (provider(), provider(), provider());
    let tables = format!(
        "[upstreams.groq]\napi = \"openai\"\nbase_url = \"{}/openai/v1\"\n\
         credential_env = \"OPENAI_API_KEY\"\nmodels = [\"llama-*\"]\n\n\
         [upstreams.azure]\napi = \"openai\"\nbase_url = \"{}\"\ncredential_env = \"OPENAI_API_KEY\"\n\
         credential_header = \"api-key\"\napi_version = \"2024-10-21\"\nmodels = [\"gpt-4.1\"]\n\
         deployments = {{ \"gpt-4.1\" = \"prod-41\" }}\n\n\
         [upstreams.cheap]\napi = \"openai\"\nbase_url = \"{}\"\ncredential_env = \"OPENAI_API_KEY\"\n\
         models = [\"gpt-4o-mini\"]\n",
        groq.base_url(),
        azure.base_url(),
        cheap.base_url()
    );
    let h = Harness::start(Opts {
        extra_config: format!("{PRICED}\n{tables}"),
        ..Opts::default()
    });
    // What the providers reported, from their answers: the ledger must hold exactly this.
    let mut reported = 0u64;
    let mut count = |answer: &Value| {
        let u = &answer["usage"];
        reported += [
            "prompt_tokens",
            "completion_tokens",
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        ]
        .iter()
        .map(|k| u[k].as_u64().unwrap_or(0))
        .sum::<u64>();
    };

    // An OpenAI-compatible provider under its own name and base path, bearer credential.
    let r = h.post(
        CHAT,
        KEY_A,
        &chat("llama-3.3-70b", "Name a river.", json!({})),
        &[HUMAN],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    count(&r.json());
    let seen = groq.last_request().unwrap();
    assert_eq!(seen.target, "/openai/v1/chat/completions");
    assert_eq!(
        header(&seen, "authorization"),
        Some(format!("Bearer {PROVIDER_CREDENTIAL}").as_str())
    );

    // Azure: the deployment's path, its api-version, the credential in `api-key` only.
    let r = h.post(
        CHAT,
        KEY_A,
        &chat("gpt-4.1", "Name a lake.", json!({})),
        &[HUMAN],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    count(&r.json());
    let seen = azure.last_request().unwrap();
    assert_eq!(
        seen.target,
        "/openai/deployments/prod-41/chat/completions?api-version=2024-10-21"
    );
    assert_eq!(header(&seen, "api-key"), Some(PROVIDER_CREDENTIAL));
    assert_eq!(header(&seen, "authorization"), None);

    // A DOWNGRADE goes where the served model routes: gpt-4o → gpt-4o-mini at `cheap`.
    let r = h.post(
        CHAT,
        KEY_A,
        &chat("gpt-4o", "Say hello in French.", json!({"max_tokens": 100})),
        &[HUMAN],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.verdict(), Some("DOWNGRADE"));
    count(&r.json());
    assert_eq!(
        cheap.last_request().unwrap().body_json().unwrap()["model"],
        "gpt-4o-mini"
    );

    // The unnamed default upstream of a shape takes the rest of it.
    let messages = json!({"model": "claude-haiku-4-5", "max_tokens": 50,
        "messages": [{"role": "user", "content": "Name a sea."}]});
    let r = h.post(MESSAGES, KEY_A, &messages, &[HUMAN]);
    assert_eq!(r.status, 200, "{}", r.text());
    count(&r.json());
    assert_eq!(h.mock.calls(MESSAGES), 1);
    assert_eq!(
        [groq.calls(CHAT), azure.calls(CHAT), cheap.calls(CHAT)],
        [1, 1, 1]
    );

    // Exact: the ledger's usage is the providers' reported usage, summed over all four.
    settle();
    let usage = &h.ledger(KEY_A)["total"]["usage"];
    let recorded: u64 = ["input", "cache_write", "cache_read", "output"]
        .iter()
        .map(|p| usage[p].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(recorded, reported, "{usage}");

    // `GET /v1/models`: the union, each id from the upstream it routes to, once.
    let r = keyed_get(&h.proxy_url("/v1/models"), Some(KEY_A));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-tokensaver-upstreams-missing"), None);
    let ids: Vec<String> = r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "{ids:?}");
    // The mocks list the same models; none is named by groq, azure or cheap, so every one
    // routes to the default and is listed from it alone.
    assert_eq!(ids.len(), tokensaver_mock_provider::MODELS.len(), "{ids:?}");
    for m in [&h.mock, &groq, &azure, &cheap] {
        assert_eq!(m.calls("/v1/models"), 1);
    }
}

/// A model no upstream takes is a 404 that names it, decided nothing and sent nowhere.
#[test]
fn a_model_no_upstream_takes_is_refused_before_it_is_decided() {
    let mock_url = MockProvider::start_background(ProviderOptions::default())
        .map(|m| {
            let url = m.base_url();
            std::mem::forget(m);
            url
        })
        .unwrap();
    let h = Harness::start(Opts {
        upstreams_toml: Some(format!(
            "[upstreams.openai]\nbase_url = \"{mock_url}\"\ncredential_env = \"OPENAI_API_KEY\"\n\
             models = [\"gpt-4o\", \"gpt-4o-mini\"]\n\n\
             [upstreams.anthropic]\nbase_url = \"{mock_url}\"\ncredential_env = \"ANTHROPIC_API_KEY\"\n"
        )),
        ..Opts::default()
    });
    let r = h.post(
        CHAT,
        KEY_A,
        &chat("mistral-large", "Hi.", json!({})),
        &[HUMAN],
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "unknown_model");
    assert!(r.text().contains("mistral-large"));
    // A model string that is not an id is not echoed.
    let r = h.post(CHAT, KEY_A, &chat("<b>x y</b>", "Hi.", json!({})), &[HUMAN]);
    assert_eq!(r.status, 404);
    assert!(!r.text().contains("<b>"));
    settle();
    assert_eq!(h.ledger(KEY_A)["total"]["requests"], 0);
}

/// Wait until `f` holds (the resolver runs every second here).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The upstream's host is resolved again every `dns_refresh_secs`: a changed address is
/// followed, every address is used, a refused one is skipped for the next (gated and
/// pass-through alike), and `/readyz` shows what the host resolves to now.
#[test]
fn upstream_addresses_follow_dns() {
    // Two providers on one port of two loopback addresses; nothing listens on a third.
    let first = provider_on("127.0.0.2:0".parse().unwrap());
    let port = first.addr().port();
    let second = provider_on(SocketAddr::from(([127, 0, 0, 3], port)));
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "provider.test 127.0.0.2\n").unwrap();
    let tables = |name: &str| {
        format!(
            "[upstreams.{name}]\nbase_url = \"http://provider.test:{port}\"\n\
             credential_env = \"OPENAI_API_KEY\"\ndns_refresh_secs = 1\n\n"
        )
    };
    let h = Harness::start(Opts {
        upstreams_toml: Some(tables("openai") + &tables("anthropic")),
        env: vec![("TOKENSAVER_HOSTS_FILE".into(), hosts.display().to_string())],
        ..Opts::default()
    });
    const TOPICS: [&str; 11] = [
        "rivers", "lakes", "tides", "reefs", "storms", "ports", "ships", "gulls", "coves", "dunes",
        "cliffs",
    ];
    let ask = |i: usize| {
        let body = chat(
            "gpt-4o",
            &format!("Tell me about {}.", TOPICS[i]),
            json!({"max_tokens": 60}),
        );
        let r = h.post(CHAT, KEY_A, &body, &[HUMAN]);
        assert_eq!(r.status, 200, "{}", r.text());
    };
    ask(0);
    assert_eq!((first.calls(CHAT), second.calls(CHAT)), (1, 0));

    // The record changes: the next calls go to the new address.
    std::fs::write(&hosts, "provider.test 127.0.0.3\n").unwrap();
    eventually("the new address in /readyz", || {
        let r = call(client::get(&h.admin_url("/readyz")), None);
        r.json()["upstreams"][0]["addresses"] == json!([format!("127.0.0.3:{port}")])
    });
    ask(1);
    assert_eq!((first.calls(CHAT), second.calls(CHAT)), (1, 1));

    // Two addresses, one refusing: every call lands on the one that answers.
    std::fs::write(&hosts, "provider.test 127.0.0.4 127.0.0.3\n").unwrap();
    eventually("two addresses", || {
        let r = call(client::get(&h.admin_url("/readyz")), None);
        r.json()["upstreams"][0]["addresses"]
            .as_array()
            .map(Vec::len)
            == Some(2)
    });
    for i in 2..6 {
        ask(i);
    }
    assert_eq!(second.calls(CHAT), 5);
    for _ in 0..2 {
        let r = keyed_get(&h.proxy_url("/v1/models"), Some(KEY_A));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(second.calls("/v1/models"), 2);

    // Both providers answering: both are used.
    std::fs::write(&hosts, "provider.test 127.0.0.2 127.0.0.3\n").unwrap();
    eventually("both live addresses", || {
        let r = call(client::get(&h.admin_url("/readyz")), None);
        r.json()["upstreams"][0]["addresses"]
            == json!([format!("127.0.0.2:{port}"), format!("127.0.0.3:{port}")])
    });
    let before = (first.calls(CHAT), second.calls(CHAT));
    for i in 6..10 {
        ask(i);
    }
    assert!(first.calls(CHAT) > before.0 && second.calls(CHAT) > before.1);

    // A host that stops resolving keeps its last addresses, marked stale.
    std::fs::write(&hosts, "provider.test not-an-address\n").unwrap();
    eventually("stale", || {
        let r = call(client::get(&h.admin_url("/readyz")), None);
        r.json()["upstreams"][0]["stale"] == json!(true)
    });
    let r = call(client::get(&h.admin_url("/readyz")), None);
    assert_eq!(r.status, 200, "{}", r.text());
    ask(10);
}
