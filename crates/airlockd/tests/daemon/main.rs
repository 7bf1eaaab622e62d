//! The daemon tested through real HTTP against a started `airlockd`.

mod common;

mod api;
mod dashboard;
mod drain;
mod mcp;
mod network;
mod openapi;
mod recovery;
mod security;
mod serve;
mod sessions;
mod spawner;
mod store;
mod tls;
mod warm;
mod workers;
