//! What each tenant got on the live server: counters and latency histograms written by
//! the engine, read by the periodic terminal line and the `/metrics` endpoint.

use crate::host::{Observer, Status};
use crate::nbd::proto;
use crate::policy::{Gauge, Refusal};
use crate::types::{Completion, Nanos, Op, Request, TenantId};
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

/// Buckets of [`Octaves`]: 8 below 8 ns, then 8 per power of two up to 2^64 ns.
const OCTAVE_BUCKETS: usize = 8 * 62;

/// A latency histogram of eighth-octave buckets (each value within 12.5 % of its
/// bucket's bounds), 4 KiB: what the live server's per-interval p99 is read from.
#[derive(Debug, Clone, PartialEq)]
pub struct Octaves(Box<[u64; OCTAVE_BUCKETS]>);

impl Default for Octaves {
    fn default() -> Self {
        Octaves(Box::new([0; OCTAVE_BUCKETS]))
    }
}

impl Octaves {
    fn index(ns: u64) -> usize {
        if ns < 8 {
            return ns as usize;
        }
        let p = 63 - ns.leading_zeros();
        let sub = (ns >> (p - 3)) & 7;
        (p as usize - 2) * 8 + sub as usize
    }

    /// The largest value bucket `i` holds.
    fn upper(i: usize) -> u64 {
        if i < 8 {
            return i as u64;
        }
        let (p, sub) = (i / 8 + 2, (i % 8) as u64);
        let next = (8 + u128::from(sub) + 1) << (p - 3);
        u64::try_from(next - 1).unwrap_or(u64::MAX)
    }

    /// Counts one latency of `ns`.
    pub fn record(&mut self, ns: u64) {
        self.0[Self::index(ns)] += 1;
    }

    /// What was counted since `before` (an earlier copy of this one).
    pub fn since(&self, before: &Octaves) -> Octaves {
        let mut d = Octaves::default();
        for (i, (n, b)) in self.0.iter().zip(before.0.iter()).enumerate() {
            d.0[i] = n.checked_sub(*b).expect("a histogram only grows");
        }
        d
    }

    /// The `q` quantile, as the upper bound of its bucket (0 when empty).
    pub fn quantile(&self, q: f64) -> u64 {
        let total: u64 = self.0.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, n) in self.0.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::upper(i);
            }
        }
        unreachable!("the rank is within the total")
    }
}

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
    /// Successful reads and writes (writes: zeroing included; flushes and trims in
    /// neither).
    pub reads: u64,
    /// See `reads`.
    pub writes: u64,
    /// Time the backend took over `reads` and `writes`, from dispatch to completion,
    /// nanoseconds: what a cluster's fronts tell each other of its speed
    /// ([`super::front`]).
    pub backend_read_ns: u64,
    /// See `backend_read_ns`.
    pub backend_write_ns: u64,
    /// Latency of successful completions, nanoseconds, in eighth-octave buckets: small
    /// enough to copy under the lock the engine records under (an HDR histogram of the
    /// same range is ~440 KiB a tenant; copying one per tenant for each `/metrics` scrape
    /// or control-socket read held the engine up, measured: `bench/ctl-change.sh`).
    pub latency: Octaves,
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
    /// Connections the engine serves for it now.
    pub connections: u64,
    /// Whether its export takes connections ([`TenantState`]).
    pub state: TenantState,
}

/// Whether a tenant's export is served (the control socket changes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TenantState {
    /// Listed and taking connections.
    Serving,
    /// Listed; new connections refused, its connections closed once what they sent is
    /// served (`drain-tenant`), until `resume-tenant`.
    Drained,
    /// Drained and no longer listed (`remove-tenant`); its image and counters stay, and
    /// `resume-tenant` serves it again.
    Removed,
}

impl TenantState {
    /// As the control socket and `/metrics` spell it.
    pub fn name(self) -> &'static str {
        match self {
            TenantState::Serving => "serving",
            TenantState::Drained => "drained",
            TenantState::Removed => "removed",
        }
    }
}

impl TenantCounters {
    /// Nothing counted yet.
    pub fn new(name: &str, weight: f64) -> Self {
        TenantCounters {
            name: name.to_string(),
            weight,
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
            reads: 0,
            writes: 0,
            backend_read_ns: 0,
            backend_write_ns: 0,
            latency: Octaves::default(),
            latency_buckets: [0; LATENCY_BUCKETS_NS.len() + 1],
            latency_sum_ns: 0,
            journal_groups: 0,
            journal_writes: 0,
            journal_bytes: 0,
            connections: 0,
            state: TenantState::Serving,
        }
    }

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
                    .map(|(name, weight)| TenantCounters::new(name, *weight))
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

    /// A tenant joins (`add-tenant`); its id is the number of tenants before it.
    pub fn add_tenant(&self, name: &str, weight: f64) -> TenantId {
        let mut all = self.tenants.lock().expect("stats lock");
        all.push(TenantCounters::new(name, weight));
        (all.len() - 1) as TenantId
    }

    /// Number of tenants counted (added ones included).
    pub fn tenants(&self) -> usize {
        self.tenants.lock().expect("stats lock").len()
    }

    /// `tenant`'s export is now `state`.
    pub fn set_state(&self, tenant: TenantId, state: TenantState) {
        self.tenants.lock().expect("stats lock")[tenant as usize].state = state;
    }

    /// A connection of `tenant` is served by the engine (`true`) or closed (`false`).
    pub fn connection(&self, tenant: TenantId, open: bool) {
        let t = &mut self.tenants.lock().expect("stats lock")[tenant as usize];
        if open {
            t.connections += 1;
        } else {
            t.connections = t
                .connections
                .checked_sub(1)
                .expect("a connection closes once");
        }
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
        let backend = c
            .finish
            .checked_sub(c.start)
            .expect("a request finishes after its dispatch");
        match c.request.op {
            Op::Read => {
                t.read_bytes += c.request.len as u64;
                t.reads += 1;
                t.backend_read_ns += backend;
            }
            Op::Write => {
                t.written_bytes += c.request.len as u64;
                t.writes += 1;
                t.backend_write_ns += backend;
            }
            Op::Flush | Op::Trim | Op::Status => {}
        }
        let latency = c.latency();
        t.latency.record(latency);
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

/// What a tenant got in one interval of the terminal line.
#[derive(Debug, Clone, PartialEq)]
pub struct Interval {
    /// The tenant.
    pub tenant: String,
    /// Bandwidth, MB/s.
    pub mb_s: f64,
    /// Requests completed per second.
    pub iops: f64,
    /// p99 of the interval's successful requests, µs (an eighth-octave bucket's bound).
    pub p99_us: u64,
    /// Its share of the interval's bytes, %.
    pub share_pct: f64,
    /// Its weight's share among the tenants that moved data, %.
    pub ideal_pct: f64,
    /// Requests answered with an error so far.
    pub errors: u64,
    /// Requests refused at admission so far.
    pub refused: u64,
    /// The line as the human log writes it.
    pub text: String,
}

/// One line per tenant for the interval between two snapshots: bandwidth, IOPS, p99 of
/// the interval, and the tenant's share of the bandwidth against its weight's share
/// among the tenants that moved data in the interval. A tenant added since `before`
/// counts from zero.
pub fn interval_lines(
    before: &[TenantCounters],
    now: &[TenantCounters],
    secs: f64,
) -> Vec<Interval> {
    let fresh: Vec<TenantCounters> = now[before.len().min(now.len())..]
        .iter()
        .map(|n| TenantCounters::new(&n.name, n.weight))
        .collect();
    let before: Vec<&TenantCounters> = before.iter().chain(&fresh).collect();
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
            let (mb_s, iops) = (bytes as f64 / secs / 1e6, ios as f64 / secs);
            let p99_us = n.latency.since(&b.latency).quantile(0.99) / 1000;
            let (errors, refused) = (n.answered_error_total(), n.refused);
            Interval {
                text: format!(
                    "{:<12} {:>9.1} MB/s {:>8.0} IOPS  p99 {:>8} µs  share {:>5.1}% (ideal {:>5.1}%)  errors {}{} refused {}",
                    n.name,
                    mb_s,
                    iops,
                    p99_us,
                    share,
                    ideal,
                    errors,
                    reasons(&n.errors_by_reason()),
                    refused
                ),
                tenant: n.name.clone(),
                mb_s,
                iops,
                p99_us,
                share_pct: share,
                ideal_pct: ideal,
                errors,
                refused,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value lands in a bucket whose bounds hold it within 12.5 %, buckets are
    /// ordered, and a quantile is read from the counts since an earlier copy.
    #[test]
    fn octaves_hold_values_within_an_eighth_and_quantiles_come_from_differences() {
        let mut last_upper = None;
        for i in 0..OCTAVE_BUCKETS {
            let u = Octaves::upper(i);
            assert!(last_upper.is_none_or(|l| u > l), "bucket {i}");
            last_upper = Some(u);
        }
        for v in (0..64)
            .map(|p| 1u64 << p)
            .chain([3, 9, 1000, 999_999, 123_456_789, u64::MAX])
        {
            let i = Octaves::index(v);
            assert!(Octaves::upper(i) >= v, "{v}");
            assert!(i == 0 || Octaves::upper(i - 1) < v, "{v}");
            assert!(Octaves::upper(i) as f64 <= v as f64 * 1.125 + 1.0, "{v}");
        }
        let mut h = Octaves::default();
        for us in 1..=100u64 {
            h.record(us * 1000);
        }
        let before = h.clone();
        for _ in 0..99 {
            h.record(50_000);
        }
        h.record(5_000_000);
        let p99 = h.quantile(0.99);
        assert!((100_000..=112_500).contains(&p99), "{p99}");
        let interval = h.since(&before);
        assert_eq!(
            interval.quantile(0.5),
            Octaves::upper(Octaves::index(50_000))
        );
        assert_eq!(
            interval.quantile(1.0),
            Octaves::upper(Octaves::index(5_000_000))
        );
        assert_eq!(Octaves::default().quantile(0.99), 0);
    }

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
