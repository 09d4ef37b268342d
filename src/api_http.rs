//! The small request/response pair every API and admin handler speaks, so route logic stays
//! testable without a socket; the pingora shell converts to and from the wire.

use std::net::IpAddr;

use bytes::Bytes;
use http::{HeaderMap, Method};
use serde::Serialize;

/// The API and admin listeners' error body: `{"error": {"code", "message"}}`.
pub fn error_body(code: &str, message: &str) -> serde_json::Value {
    serde_json::json!({"error": {"code": code, "message": message}})
}

#[derive(Debug, Clone)]
pub struct ApiRequest {
    pub method: Method,
    pub path: String,
    pub query: Option<String>,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub peer: Option<IpAddr>,
}

impl ApiRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A query parameter's value, percent- and `+`-decoded as a form value (the first one of
    /// that name).
    pub fn query_param(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_deref()?.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ApiResponse {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl ApiResponse {
    pub fn json<T: Serialize>(status: u16, value: &T) -> Self {
        let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
        Self {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body,
        }
    }

    pub fn text(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            content_type,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_query(query: &str) -> ApiRequest {
        ApiRequest {
            method: Method::GET,
            path: "/ledger/decisions".into(),
            query: Some(query.into()),
            headers: HeaderMap::new(),
            body: Bytes::new(),
            peer: None,
        }
    }

    #[test]
    fn query_values_are_decoded_as_a_browser_encodes_them() {
        let req = with_query("key=team%2Dalpha&note=a+b&format=csv&format=json&empty=&bare");
        assert_eq!(req.query_param("key").as_deref(), Some("team-alpha"));
        assert_eq!(req.query_param("note").as_deref(), Some("a b"));
        assert_eq!(
            req.query_param("format").as_deref(),
            Some("csv"),
            "the first"
        );
        assert_eq!(req.query_param("empty").as_deref(), Some(""));
        assert_eq!(req.query_param("bare").as_deref(), Some(""));
        assert_eq!(req.query_param("missing"), None);
        // An invalid escape stays as sent rather than failing the request.
        assert_eq!(
            with_query("key=%zz").query_param("key").as_deref(),
            Some("%zz")
        );
    }
}
