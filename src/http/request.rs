//! The parsed request handlers see: borrowed views into the connection's
//! read buffer, valid for the duration of one dispatch. A handler that
//! finishes its work later (on the pool) copies what it needs.

/// Request methods the service knows; anything else is `Other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// HEAD
    Head,
    /// POST
    Post,
    /// PUT
    Put,
    /// PATCH
    Patch,
    /// DELETE
    Delete,
    /// OPTIONS
    Options,
    /// A syntactically valid method the service has no route for.
    Other,
}

impl Method {
    /// Classify a method token.
    pub fn parse(s: &str) -> Method {
        match s {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "PATCH" => Method::Patch,
            "DELETE" => Method::Delete,
            "OPTIONS" => Method::Options,
            _ => Method::Other,
        }
    }

    /// The method's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
            Method::Options => "OPTIONS",
            Method::Other => "OTHER",
        }
    }

    /// Safe methods (no side effects by contract).
    pub fn is_safe(self) -> bool {
        matches!(self, Method::Get | Method::Head | Method::Options)
    }
}

/// One request, borrowed from the connection's buffer.
pub struct Request<'a> {
    /// The method.
    pub method: Method,
    /// The path (origin form, undecoded, without the query).
    pub path: &'a str,
    /// The query string without `?` (empty when absent).
    pub query: &'a str,
    /// `true` for HTTP/1.0.
    pub http10: bool,
    /// The header fields as received.
    pub headers: super::fields::Fields<'a>,
    /// The whole body (de-chunked).
    pub body: &'a [u8],
    /// The request id answered in `x-request-id`.
    pub request_id: &'a str,
    /// The client's address.
    pub peer: std::net::IpAddr,
    /// It came over TLS (the `tls.listen` listener).
    pub secure: bool,
}

impl<'a> Request<'a> {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers.get(name)
    }

    /// The first value of query parameter `key`, raw (not percent-decoded).
    pub fn query_param(&self, key: &str) -> Option<&'a str> {
        query_pairs(self.query).find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

/// Iterate `k=v` pairs of a query string (raw, not decoded).
pub fn query_pairs(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query.split('&').filter(|p| !p.is_empty()).map(|p| p.split_once('=').unwrap_or((p, "")))
}
