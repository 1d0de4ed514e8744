//! The engine that serves every declared resource (`crate::resources`): its routes, added to
//! the router from the registry at start ([`routes`]); the record validator ([`body`]); the
//! list query ([`query`]); the access rules ([`access`]); and the handlers ([`handlers`]),
//! one set for every resource. Nothing here is generated per resource: a resource is data
//! these files interpret.
//!
//! It must not talk SQL (the store's record API does) nor know the transport.

pub mod access;
pub mod body;
pub mod handlers;
pub mod query;
pub mod routes;
