//! The bodies fixed for a configuration's life — the OpenAPI document, the `/api/docs` page,
//! the `/api/config` answer, the embedded `/static/*` files — with each one's strong `ETag`
//! and its compressed forms ([`Precompressed`]: every coding at the best level).
//!
//! The supervisor builds them once per configuration, before it forks the workers, which
//! inherit them copy-on-write: no worker renders or compresses them, and no request waits
//! for either. A reload builds them again for the new configuration, taking the forms of the
//! bodies whose bytes did not change (the embedded files always, the documents when the
//! configuration did not touch them); workers forked before it keep their own copy.
//!
//! It renders and compresses; it must not touch sockets, pick routes or answer requests.

use crate::app::handlers::{assets, health, openapi};
use crate::app::phases::compress::{Plan, Precompressed};
use crate::config::Config;
use crate::http::request::Request;
use crate::http::response::{Body, Response};

/// A body fixed for a configuration's life, with its strong `ETag`.
pub struct Doc {
    /// The identity bytes.
    pub body: Box<[u8]>,
    /// A strong `ETag` (a hash of `body`).
    pub etag: Box<str>,
}

impl Doc {
    fn new(body: Vec<u8>) -> Doc {
        let etag = format!("\"{:016x}\"", health::fnv1a(&body)).into_boxed_str();
        Doc { body: body.into_boxed_slice(), etag }
    }

    /// The answer to a `GET` of this body: 200 with it and its `ETag`, or 304 when
    /// `If-None-Match` names it (in any coding's form), with the `ETag` and `Vary` the 200
    /// would carry (the compression phase codes a 200's; `forms` are `config`'s).
    pub fn answer(
        &'static self,
        (config, forms): (&Config, &'static Precompressed),
        req: &Request<'_>,
        content_type: &'static str,
        cache_control: &'static str,
    ) -> Response {
        let fresh = req.header("if-none-match").is_some_and(|v| health::etag_matches(v, self.etag.as_bytes()));
        let mut r = Response::new(if fresh { 304 } else { 200 });
        r.content_type = content_type;
        r.cache_control = cache_control;
        r.header("ETag", &*self.etag);
        if fresh {
            Plan::new(config, req.path, req.headers).not_modified(&mut r, &self.body, config, forms);
        } else {
            r.body = Body::Static(&self.body);
        }
        r
    }
}

/// The fixed bodies of one configuration and their compressed forms.
pub struct Fixed {
    /// `GET /api/openapi.json`.
    pub openapi: Doc,
    /// `GET /api/docs`.
    pub docs: Doc,
    /// `GET /api/config`.
    pub client_config: Doc,
    /// Each body above and each embedded file, in every coding.
    pub forms: Precompressed,
}

impl Fixed {
    /// Render and compress everything for `config`; `old`, the set of the configuration
    /// before it (a reload), lends the forms of bodies that did not change.
    pub fn build(config: &Config, old: Option<&Fixed>) -> Fixed {
        let started = std::time::Instant::now();
        let document = openapi::document(config);
        let openapi = Doc::new(serde_json::to_vec(&document).unwrap_or_default());
        let docs = Doc::new(openapi::render_page(&document).into_bytes());
        let client_config = Doc::new(health::render_client_config(config));
        let mut bodies: Vec<(&[u8], &str)> = vec![
            (&openapi.body, "application/json"),
            (&docs.body, "text/html; charset=utf-8"),
            (&client_config.body, "application/json"),
        ];
        bodies.extend(assets::all().iter().map(|a| (a.bytes, a.content_type)));
        let forms = Precompressed::build(config, &bodies, old.map(|f| &f.forms));
        log::debug!("fixed bodies rendered and compressed in {:?}", started.elapsed());
        Fixed { openapi, docs, client_config, forms }
    }
}
