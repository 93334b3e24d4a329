//! Limits someone else enforces, and the allocators that set them: the per-period
//! governor (`governor.rs`: device time by weight among the tenants that want it, SLOs,
//! reservations and limits, the total found from the device's latency), the kernel's
//! cgroup throttle it drives (`throttle.rs`: its enforcement as a gate, and as policies,
//! `govern` and `limited`) and the reports several hosts' fronts exchange to keep one
//! set of limits over a shared cluster (`share.rs`). The schedulers that order requests
//! themselves are in [`crate::policy`].

pub mod governor;
pub mod share;
pub mod throttle;
