//! Wisp's integration tests: the real server on 127.0.0.1:0, real sockets, real models.
//! One binary (`mod` lines below) so it links once.

mod common;
mod corpus;
mod edge;
mod embed;
mod ensembles;
mod fake_caller;
mod first_response;
mod hardening;
mod http_api;
mod management;
mod models;
mod plugins;
mod protocols;
mod reliability;
mod routes;
mod scheduling;
mod streams;
mod systemd;
