//! What each tenant got on the live server: counters and latency histograms written by
//! the engine, read by the periodic terminal line and the `/metrics` endpoint.

use crate::host::{Observer, Status};
use crate::nbd::proto;
use crate::policy::{Gauge, Refusal};
use crate::types::{Completion, Nanos, Op, Request, TenantId};
use hdrhistogram::Histogram;
use std::sync::Mutex;

/// Upper bounds of the exported latency histogram's buckets, nanoseconds (50 µs to 10 s).
pub const LATENCY_BUCKETS_NS: [Nanos; 17] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// The reply errors counted one by one (the NBD protocol's values); any other is
/// counted in one more slot, "other".
pub const REPLY_ERRORS: [u32; 8] = [
    proto::EPERM,
    proto::EIO,
    proto::ENOMEM,
    proto::EINVAL,
    proto::ENOSPC,
    proto::EOVERFLOW,
    proto::ENOTSUP,
    proto::ESHUTDOWN,
];

#[derive(Debug, Clone)]
/// What one tenant got so far on the live server.
pub struct TenantCounters {
    /// Export name.
    pub name: String,
    /// Weight now (a reload may change it).
    pub weight: f64,
    /// Requests offered to the host.
    pub arrived: u64,
    /// Requests the backend finished (failed ones included).
    pub completed: u64,
    /// Requests the backend failed.
    pub errors: u64,
    /// Every request answered with an error, by the error ([`REPLY_ERRORS`] in order,
    /// then any other): refused by the protocol's rules (`EINVAL`: past the end, a
    /// zero length, an unknown command or flag; `EPERM`: a change to a read-only
    /// export; `ENOSPC`: a write past the end), refused at admission, failed by the
    /// backend or timed out.
    pub answered_errors: [u64; REPLY_ERRORS.len() + 1],
    /// Requests answered `EIO` because the backend had not answered within
    /// `server.backend_timeout_s` (counted in `errors` too).
    pub backend_timeouts: u64,
    /// Writes and trims answered `EIO` at once because an older one, answered `EIO`
    /// past the backend timeout, had not come back from the backend (counted in
    /// `errors` too).
    pub fenced: u64,
    /// Requests refused at admission (queue full, or the policy could not meet their `rt`
    /// with `refuse = "error"`).
    pub refused: u64,
    /// Times the policy refused a request and the host held it back to offer it again
    /// (`refuse = "hold"`, the default); the request is not answered with an error.
    pub held_back: u64,
    /// Requests the policy sent to the backend.
    pub dispatched: u64,
    /// Requests answered with an error at shutdown because the drain deadline passed
    /// while the policy still held them.
    pub cancelled: u64,
    /// Bytes read by successful requests.
    pub read_bytes: u64,
    /// Bytes written by successful requests.
    pub written_bytes: u64,
    /// Latency of successful completions, nanoseconds ([`crate::metrics::latency_histogram`]).
    pub latency: Histogram<u64>,
    /// The same latencies counted exactly into [`LATENCY_BUCKETS_NS`] (non-cumulative;
    /// the last slot holds what is above every bound), and their sum.
    pub latency_buckets: [u64; LATENCY_BUCKETS_NS.len() + 1],
    /// Sum of the latencies in `latency_buckets`, nanoseconds.
    pub latency_sum_ns: u128,
    /// `cache = "pdc"`: groups of the export found to hold the guest's journal
    /// (detection events; a group stays marked).
    pub journal_groups: u64,
    /// `cache = "pdc"`: successful writes that bypassed the host cache as journal.
    pub journal_writes: u64,
    /// Their bytes.
    pub journal_bytes: u64,
}

impl TenantCounters {
    /// The errors it was answered with, by name, those that happened only, in
    /// [`REPLY_ERRORS`] order.
    pub fn errors_by_reason(&self) -> Vec<(String, u64)> {
        let names = REPLY_ERRORS
            .iter()
            .map(|&e| proto::error_name(e).into_owned())
            .chain(std::iter::once("other".to_string()));
        names
            .zip(self.answered_errors)
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    /// All the errors it was answered with.
    pub fn answered_error_total(&self) -> u64 {
        self.answered_errors.iter().sum()
    }

    /// Requests held by the policy: arrived, not yet dispatched, refused or cancelled.
    pub fn queued(&self) -> u64 {
        self.arrived - self.refused - self.cancelled - self.dispatched
    }

    /// Requests on the backend.
    pub fn in_flight(&self) -> u64 {
        self.dispatched - self.completed
    }
}

/// Shared between the engine (writer) and the reporting loop.
#[derive(Debug)]
pub struct LiveStats {
    tenants: Mutex<Vec<TenantCounters>>,
    /// The policy's state as of its last publication by the engine.
    policy: Mutex<Vec<Gauge>>,
}

impl LiveStats {
    /// Counters for tenants given as (name, weight).
    pub fn new(tenants: &[(String, f64)]) -> Self {
        LiveStats {
            tenants: Mutex::new(
                tenants
                    .iter()
                    .map(|(name, weight)| TenantCounters {
                        name: name.clone(),
                        weight: *weight,
                        arrived: 0,
                        completed: 0,
                        errors: 0,
                        answered_errors: [0; REPLY_ERRORS.len() + 1],
                        backend_timeouts: 0,
                        fenced: 0,
                        refused: 0,
                        held_back: 0,
                        dispatched: 0,
                        cancelled: 0,
                        read_bytes: 0,
                        written_bytes: 0,
                        latency: crate::metrics::latency_histogram(),
                        latency_buckets: [0; LATENCY_BUCKETS_NS.len() + 1],
                        latency_sum_ns: 0,
                        journal_groups: 0,
                        journal_writes: 0,
                        journal_bytes: 0,
                    })
                    .collect(),
            ),
            policy: Mutex::new(Vec::new()),
        }
    }

    /// A request of `tenant` went to the backend.
    pub fn dispatched(&self, tenant: TenantId) {
        self.tenants.lock().expect("stats lock")[tenant as usize].dispatched += 1;
    }

    /// A request of `tenant` was answered `ESHUTDOWN` (the drain deadline passed).
    pub fn cancelled(&self, tenant: TenantId) {
        self.tenants.lock().expect("stats lock")[tenant as usize].cancelled += 1;
    }

    /// A request of `tenant` was answered with `error` (non-zero).
    pub fn answered_error(&self, tenant: TenantId, error: u32) {
        let slot = REPLY_ERRORS
            .iter()
            .position(|&e| e == error)
            .unwrap_or(REPLY_ERRORS.len());
        self.tenants.lock().expect("stats lock")[tenant as usize].answered_errors[slot] += 1;
    }

    /// The journal detector marked one more group of `tenant`'s export.
    pub fn journal_group(&self, tenant: TenantId) {
        self.tenants.lock().expect("stats lock")[tenant as usize].journal_groups += 1;
    }

    /// A journal write of `bytes` by `tenant` bypassed the host cache.
    pub fn journal_write(&self, tenant: TenantId, bytes: u64) {
        let mut all = self.tenants.lock().expect("stats lock");
        let t = &mut all[tenant as usize];
        t.journal_writes += 1;
        t.journal_bytes += bytes;
    }

    /// A reload changed `tenant`'s weight.
    pub fn set_weight(&self, tenant: TenantId, weight: f64) {
        self.tenants.lock().expect("stats lock")[tenant as usize].weight = weight;
    }

    /// The policy's state as of now, for `/metrics`.
    pub fn publish_policy(&self, gauges: Vec<Gauge>) {
        *self.policy.lock().expect("stats lock") = gauges;
    }

    /// The policy's state as last published.
    pub fn policy_gauges(&self) -> Vec<Gauge> {
        self.policy.lock().expect("stats lock").clone()
    }

    /// A request of `tenant` was offered to the host.
    pub fn arrived(&self, tenant: TenantId) {
        self.tenants.lock().expect("stats lock")[tenant as usize].arrived += 1;
    }

    /// A request of `tenant` was refused at admission.
    pub fn refused(&self, tenant: TenantId) {
        self.tenants.lock().expect("stats lock")[tenant as usize].refused += 1;
    }

    /// A request of `tenant` refused by the policy was held back by the host.
    pub fn held_back(&self, tenant: TenantId) {
        self.tenants.lock().expect("stats lock")[tenant as usize].held_back += 1;
    }

    /// A request of `tenant` was answered `EIO` past the backend timeout.
    pub fn backend_timed_out(&self, tenant: TenantId) {
        self.tenants.lock().expect("stats lock")[tenant as usize].backend_timeouts += 1;
    }

    /// Requests of `tenant` answered `EIO` past the backend timeout or fenced behind one.
    pub fn timed_out_or_fenced(&self, tenant: TenantId) -> u64 {
        let all = self.tenants.lock().expect("stats lock");
        all[tenant as usize].backend_timeouts + all[tenant as usize].fenced
    }

    /// A write of `tenant` was failed at once behind an unanswered one.
    pub fn fenced(&self, tenant: TenantId) {
        self.tenants.lock().expect("stats lock")[tenant as usize].fenced += 1;
    }

    /// A request finished on the backend; `ok`: it succeeded (its bytes and latency count).
    pub fn completed(&self, c: &Completion, ok: bool) {
        let mut all = self.tenants.lock().expect("stats lock");
        let t = &mut all[c.request.tenant as usize];
        t.completed += 1;
        if !ok {
            t.errors += 1;
            return;
        }
        match c.request.op {
            Op::Read => t.read_bytes += c.request.len as u64,
            Op::Write => t.written_bytes += c.request.len as u64,
            Op::Flush | Op::Trim => {}
        }
        let latency = c.latency();
        t.latency.saturating_record(latency.max(1));
        t.latency_buckets[LATENCY_BUCKETS_NS.partition_point(|&b| b < latency)] += 1;
        t.latency_sum_ns += latency as u128;
    }

    /// A copy of the counters now.
    pub fn snapshot(&self) -> Vec<TenantCounters> {
        self.tenants.lock().expect("stats lock").clone()
    }
}

/// Errors by reason as a summary shows them: ` (EINVAL 2, EIO 1)`, or nothing for none.
pub fn reasons(by: &[(String, u64)]) -> String {
    if by.is_empty() {
        return String::new();
    }
    let each: Vec<String> = by.iter().map(|(r, n)| format!("{r} {n}")).collect();
    format!(" ({})", each.join(", "))
}

/// The engine's host records into the counters (the lock is uncontended: only the
/// engine thread writes, readers copy a snapshot now and then).
impl Observer for std::sync::Arc<LiveStats> {
    fn arrived(&mut self, request: &Request) {
        LiveStats::arrived(self, request.tenant);
    }

    fn refused(&mut self, request: &Request, reason: Refusal, _now: Nanos) {
        match reason {
            Refusal::Stopping => LiveStats::cancelled(self, request.tenant),
            Refusal::QueueFull | Refusal::Policy => LiveStats::refused(self, request.tenant),
        }
    }

    fn held_back(&mut self, request: &Request, _now: Nanos) {
        LiveStats::held_back(self, request.tenant);
    }

    fn dispatched(&mut self, request: &Request, _now: Nanos) {
        LiveStats::dispatched(self, request.tenant);
    }

    fn completed(&mut self, completion: &Completion, status: Status) {
        LiveStats::completed(self, completion, status == Status::Ok);
    }
}

/// One line per tenant for the interval between two snapshots: bandwidth, IOPS, p99 of
/// the whole run so far, and the tenant's share of the bandwidth against its weight's
/// share among the tenants that moved data in the interval.
pub fn interval_lines(before: &[TenantCounters], now: &[TenantCounters], secs: f64) -> Vec<String> {
    let bytes: Vec<u64> = before
        .iter()
        .zip(now)
        .map(|(b, n)| (n.read_bytes + n.written_bytes) - (b.read_bytes + b.written_bytes))
        .collect();
    let total: u64 = bytes.iter().sum();
    let active_weight: f64 = now
        .iter()
        .zip(&bytes)
        .filter(|(_, b)| **b > 0)
        .map(|(t, _)| t.weight)
        .sum();
    now.iter()
        .zip(before)
        .zip(&bytes)
        .map(|((n, b), &bytes)| {
            let ios = n.completed - b.completed;
            let share = if total > 0 { 100.0 * bytes as f64 / total as f64 } else { 0.0 };
            let ideal = if bytes > 0 && active_weight > 0.0 { 100.0 * n.weight / active_weight } else { 0.0 };
            format!(
                "{:<12} {:>9.1} MB/s {:>8.0} IOPS  p99 {:>8} µs  share {:>5.1}% (ideal {:>5.1}%)  errors {}{} refused {}",
                n.name,
                bytes as f64 / secs / 1e6,
                ios as f64 / secs,
                n.latency.value_at_quantile(0.99) / 1000,
                share,
                ideal,
                n.answered_error_total(),
                reasons(&n.errors_by_reason()),
                n.refused
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_counted_by_reason_and_said_in_order() {
        let stats = LiveStats::new(&[("a".into(), 1.0)]);
        for e in [proto::EIO, proto::EINVAL, proto::EINVAL, 999] {
            stats.answered_error(0, e);
        }
        let t = &stats.snapshot()[0];
        assert_eq!(t.answered_error_total(), 4);
        let by = t.errors_by_reason();
        assert_eq!(
            by,
            vec![
                ("EIO".to_string(), 1),
                ("EINVAL".to_string(), 2),
                ("other".to_string(), 1)
            ]
        );
        assert_eq!(reasons(&by), " (EIO 1, EINVAL 2, other 1)");
        assert_eq!(reasons(&[]), "");
    }
}
