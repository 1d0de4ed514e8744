//! The handlers: one file per resource or endpoint group, each registering its routes
//! (`routes`) and answering them with a [`crate::app::Reply`]. A handler gets a parsed
//! request and the worker's services; it never sees a socket, a codec or framing, and it
//! runs after the phases (`crate::app::phases`) have let the request through.

pub(crate) mod acme;
pub(crate) mod assets;
pub(crate) mod auth;
pub(crate) mod chat;
pub(crate) mod csp_report;
pub(crate) mod debug;
pub(crate) mod download;
pub(crate) mod events;
pub(crate) mod health;
pub(crate) mod homepage;
pub mod metrics;
pub(crate) mod openapi;
pub(crate) mod pages;
pub(crate) mod redirect;
pub(crate) mod users;
pub mod ws;
