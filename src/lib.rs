//! ioshare: a storage-QoS engine. Tenants share one device; policies (sans-I/O state
//! machines) decide who is served; a deterministic simulator runs them against device
//! models, and reports say what each tenant got.
//!
//! Layout follows the flow of a request: [`workload`] (frontends that make requests) and
//! [`nbd`] + [`server`] (the live frontend), [`host`] (admission, dispatch and drain, the
//! one core both drivers run), [`policy`] (the scheduler inside it), [`device`]
//! (simulated devices), [`sim`] (the event loop and its checker), [`metrics`] and
//! [`report`] (what tenants got), [`scenario`] and [`config`] (experiments and settings
//! as data), [`cluster`] (several hosts' fronts sharing one cluster).
//! `docs/architecture.md` draws the flow and lists the invariants.

#![warn(missing_docs)]
#![deny(unsafe_code)]
#![deny(unused_must_use)]

pub mod buffer;
pub mod calibrate;
pub mod characterize;
pub mod cluster;
pub mod config;
pub mod conformance;
pub mod device;
pub mod govern;
pub mod host;
pub mod io;
pub mod iolog;
pub mod journal;
pub mod limits;
pub mod metrics;
pub mod nbd;
pub mod output;
pub mod owned_file;
pub mod policy;
pub mod report;
pub mod scenario;
pub mod server;
pub mod sim;
pub mod slab;
pub mod target;
pub mod trace;
pub mod types;
pub mod units;
pub mod workload;

/// The demo scenario shipped inside the binary.
pub const DEMO_SCENARIO: &str = include_str!("../scenarios/demo.toml");
