//! The ledger page as a browser drives it: signing in, form posts with an origin, the CSRF
//! field.

use std::time::Duration;

use super::client;
use super::Resp;

pub fn get(url: &str, cookie: Option<&str>) -> Resp {
    let mut r = client::get(url)
        .no_redirects()
        .timeout(Duration::from_secs(30));
    if let Some(c) = cookie {
        r = r.set("cookie", c);
    }
    r.call()
}

/// A form post as a browser on `origin` sends it.
pub fn post_form(
    url: &str,
    cookie: Option<&str>,
    origin: Option<&str>,
    form: &[(&str, &str)],
) -> Resp {
    let mut r = client::post(url)
        .no_redirects()
        .timeout(Duration::from_secs(30))
        .set("content-type", "application/x-www-form-urlencoded");
    if let Some(c) = cookie {
        r = r.set("cookie", c);
    }
    if let Some(o) = origin {
        r = r.set("origin", o).set("sec-fetch-site", "same-origin");
    }
    let body: String = form
        .iter()
        .map(|(k, v)| {
            format!(
                "{k}={}",
                v.bytes()
                    .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    })
                    .collect::<String>()
            )
        })
        .collect::<Vec<_>>()
        .join("&");
    r.send(body.as_bytes())
}

pub fn origin(url_base: &str) -> String {
    url_base.trim_end_matches('/').to_string()
}

/// Sign in on the listener at `base` (`http://host:port`); the `name=value` cookie.
pub fn sign_in(base: &str, key: &str) -> String {
    let r = post_form(
        &format!("{base}/page/login"),
        None,
        Some(base),
        &[("key", key)],
    );
    assert_eq!(r.status, 303, "sign-in: {}", r.text());
    assert_eq!(r.header("location"), Some("/page/"));
    let set = r
        .header("set-cookie")
        .expect("a session cookie")
        .to_string();
    set.split(';').next().unwrap().to_string()
}

pub fn csrf_of(html: &str) -> String {
    let at = html.find(r#"name="csrf" value=""#).expect("a csrf field") + 19;
    html[at..at + 64].to_string()
}
