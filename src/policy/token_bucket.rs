//! The machinery TA1, TA2 and TA3 share (Y. J. Nam, C. Park, "Token-Bucket-based
//! Performance Control Techniques for Large-Scale Shared Storage Systems", 2005): a
//! token bucket and a queue per tenant in front of one storage queue, with a bypass
//! switch per tenant.
//!
//! A request of a tenant whose switch is on waits in the tenant's queue until its
//! bucket holds a request's worth of tokens; with the switch off it goes straight to
//! the storage queue. The storage queue is served in arrival order. What differs between
//! the three policies is who turns the switches and when ([`SwitchRule`]).
//!
//! Readings chosen where the paper is silent:
//! * Tokens are counted in requests (one token is `size` bytes of the SLO; each request
//!   costs one), in thousandths so refills of `iops / τ` are exact integers. The bucket
//!   refills at ticks `k / τ` of absolute time, starts full, and is at least one request
//!   deep (`σ = 1.5 ρ` is below one request when `iops < τ / 1.5`).
//! * The response time the water marks watch is the storage's: from the moment a request
//!   passes its bucket (or the bypass) to its completion. Time spent waiting for tokens
//!   is the throttling itself and would keep a throttled tenant's switch on forever.
//! * The observed response time of a tenant is the largest storage response time of its
//!   completions among the last `rt_window` completions of all tenants (default 2048:
//!   the window's length is the shared storage's pace). Single completions on a
//!   disk vary by many milliseconds: compared one by one they flip the switch thousands
//!   of times a second and the hysteresis does nothing; a mean lets the tail run past
//!   `rt` while it climbs. The window's maximum reacts to the tail at once; a short
//!   window fell below the low mark between bursts and let a violator flood the storage
//!   (measured: docs/readings.md, `token_bucket.rs`); 2048 (about 0.4 s at 5,000 IOPS)
//!   switches off only when the tail has been inside the low mark for a while.
//! * A bucket's queue holds what passes within `max_wait × rt` (default half of `rt`): a
//!   request arriving to a longer queue could not meet its response time and is
//!   refused instead of queued: the host either answers it with an error (`refuse =
//!   "error"`, the simulator's default) or holds it back and offers it again (`"hold"`,
//!   the live server's: slow I/O, not failed I/O; see [`crate::host::Refuse`]). The
//!   spec's "when that queue is full the host is told explicitly" with "full" read from
//!   the SLO. Without it a violator's backlog made its own compliant requests of the
//!   next phase late (measured: docs/readings.md, `token_bucket.rs`).
//! * TA3 also treats a *predicted* response time above `predict × rt` (default 0.4) as a
//!   breach, checked when a request arrives: requests between passing the bucket and
//!   completing, plus the arriving one, times the storage's recent busy time per
//!   completion. By the time a late completion is observed every request queued since
//!   is late too. Only TA3 uses it by default (TA2's `predict` is 0): it throttles
//!   violators alone, so a rough prediction on a lightly loaded array costs nobody.
//! * **Reading: each tenant is judged by its own response times against its own marks.**
//!   A tenant is *in breach* from a completion of its own above its high water mark
//!   (or a predicted one, TA3) until the largest of its completions among the last
//!   `rt_window` completions of all tenants is below its low water mark, and at least
//!   `rt_window / 4` completions later. TA2's switch is on while any tenant is in
//!   breach; TA3 switches in the tenants above their rate while any is, and all out when
//!   none is. The first reading (the window's largest response time of *any* tenant,
//!   compared at each completion with the completing tenant's marks) flipped the switch
//!   at every completion when SLOs differ, and left a reader worse off than with no
//!   control; the minimum length bounds switching where predicted breaches came and
//!   went (measured: docs/readings.md, `token_bucket.rs`). A breach also lasts at
//!   least `min_breach_ms` (default 100 ms): on a drive completing 50,000 requests a
//!   second, `rt_window / 4` completions are 10 ms, and a burst of late completions
//!   switched the buckets in and out many times a second.
//! * A switch decides the path of each request as it arrives ("subsequent requests" in
//!   the paper). Requests already waiting behind a bucket keep waiting for its tokens
//!   when the switch turns off, while new ones bypass them: releasing the whole backlog
//!   at once would flood the storage queue and break every other tenant's response time
//!   just as it recovered.
//! * TA3 judges a tenant's rate with a token bucket of its own (a conformance test, not
//!   a windowed average): refilled at `iops × (1 + rate_slack)`, as deep as the agreed
//!   rate delivers in `rate_window_ms` (or in the time `rate_window_requests` (100) take
//!   at that rate, when longer), one token per arrival; a tenant exceeds its rate while
//!   that bucket is nearly empty (under a tenth of its depth and under two tokens). A
//!   windowed count judged a paced client by its jitter and a Poisson client by
//!   ordinary bunching, and refused compliant requests (measured: docs/readings.md,
//!   `token_bucket.rs`). The bucket forgives bunching that the rate makes up for (a
//!   drift of 5 % against Poisson's spread keeps it from emptying), and a violator at
//!   twice its rate still empties it within a fraction of the window.
//! * **Reading: buckets that a compliant bursty tenant passes.** The paper's bucket
//!   (`σ = 1.5 ρ`: three requests at 2,000 IOPS) refilled at exactly the agreed rate
//!   makes a tenant arriving Poisson at that rate a queue at full load: alone on an
//!   idle drive, TA1 refused some of its requests (its queue beyond `max_wait`). Two
//!   readings: a bucket is at least `depth_rt` (default 1) response times of the agreed
//!   rate deep (a burst of `iops × rt` requests is what the SLO can absorb if the
//!   storage serves the tenant at its rate); and while the tenant keeps to its rate (the
//!   conformance test below, for every TA policy) its bucket refills `refill_slack`
//!   (default 25 %) faster. A violator refills at exactly its rate: with the slack for
//!   everyone, violators loaded the token-bucket paper's array beyond the sum of the
//!   SLOs it is calibrated to meet. 25 % rather than 5 % for paced clients that catch
//!   up: a client that fell behind after a slow completion and caught up through an
//!   empty bucket refilled at the smaller slack stayed token-bound, its requests
//!   queued for seconds (measured: docs/readings.md, `token_bucket.rs`).
//! * A request the host holds back after a refusal (`refuse = "hold"`) and offers again
//!   is not a new arrival: the rate test and the refusal count take each request once
//!   (request ids grow in arrival order). Counting every offer (one a millisecond)
//!   marked a held-back tenant over its rate, so its bucket lost its slack. A bucket is
//!   also at least `depth_requests` (default 32) requests deep: with several SLO tenants
//!   at their rate the storage serves each in bursts, and a bucket of `iops × rt` tokens
//!   (10 at 2,000 IOPS and 5 ms) refuses the bunching that follows (measured:
//!   docs/readings.md, `token_bucket.rs`).
//!   `depth_rt = 0, refill_slack = 0, depth_requests = 0` is the paper's bucket.
//! * **Reading: a bucket switched in starts no fuller than the paper's depth.** A
//!   tenant whose switch was off saved tokens up to its (deep) bucket; released at the
//!   moment the storage is late, they were a burst of `iops × rt` requests onto it, and
//!   compliant users fell behind their `rt` in the next phase (measured:
//!   docs/readings.md, `token_bucket.rs`). So switching a bucket in clamps it to
//!   `depth_factor × ρ`, or to `depth_requests` when that is more (a burst that small
//!   the storage absorbs).
//! * **Reading: tenants without an SLO are best effort, held to a few requests in the
//!   storage while the SLOs are at risk.** The paper gives every tenant an SLO; a
//!   tenant without one has no bucket and no rate to throttle it to. Letting it bypass
//!   always (the first reading) did not protect compliant readers beside such tenants
//!   (measured: docs/readings.md, `token_bucket.rs`). Now such a tenant has
//!   at most `best_effort_depth` (default 1) requests in the storage queue and on the
//!   device while its switch would be on if it had one (TA1: always; TA2 and TA3:
//!   while any tenant is in breach; it is above any rate it could have agreed), the
//!   rest waiting in its queue, never refused; a compliant request then waits behind a
//!   few best-effort ones instead of a full device queue of them. `best_effort_depth =
//!   0` lets such tenants bypass always.
//! * **Reading: "at risk" is a breach, for TA1 as for the others.** TA1's buckets are
//!   always on, and the first reading held best-effort tenants to `best_effort_depth`
//!   always too: with no SLO tenant anywhere near its `rt`, best-effort tenants on a
//!   64-unit drive got one request at a time each and the drive's throughput collapsed
//!   (measured: docs/readings.md, `token_bucket.rs`). Now every TA policy judges
//!   breaches by the water marks above (TA1 only to decide this: its buckets stay on),
//!   and best-effort tenants are held only while some SLO tenant is in a breach seen in
//!   its completions, or close to one: the largest response time of its window above
//!   `best_effort_mark` (0.25) × its `rt`. TA3's *predicted* breaches switch its
//!   buckets in but do not hold best-effort tenants: a flooder's requests ahead
//!   predicted a breach all the time, and holding the flooder then cost throughput
//!   while the compliant tenant was well within its `rt`. Holding them only from the
//!   high water mark on (0.85 `rt`) was too late for a Poisson reader beside flooders
//!   (measured: docs/readings.md, `token_bucket.rs`). **Reading: a quarter of `rt`,
//!   not half**, since SLOs take bursts: a tenant arriving in on/off bursts beside
//!   flooders on the disk brought its window's slowest response past half its `rt`
//!   only with the burst that was late, and met its `rt` for 97.7 % of requests under
//!   TA1–TA3; from a quarter, 100 %. Over the SLO matrix TA1 went from 181 to 185 of
//!   193 feasible cases, TA2 from 183 to 191 and TA3 from 187 to 193 of 208, at the
//!   price of holding best effort more often: in a few bursty cells TA2 or TA3 then
//!   completes less than TA1 (docs/conformance.md, "SLO conformance").
//! * **Reading: an SLO's burst is what a compliant tenant may send at once** (the
//!   issue on bursts and SLOs; `slo = { …, burst }`, default one second of `iops`, as
//!   QEMU's throttles take one). Compliance is the SLO's own token bucket: exactly
//!   `iops`, `burst` deep, one token an arrival. A compliant request is never refused
//!   (only one beyond rate + burst that would wait past `max_wait`), the throttling
//!   bucket is as deep as the burst so a compliant burst passes at once, TA3's rate
//!   test is as deep too (a bursty tenant under its rate is not a violator), and a
//!   bucket switched in keeps its tokens unless the tenant is over its rate. Before,
//!   a tenant at 0.8 of its rate arriving in bursts had thousands of its requests
//!   refused and met its `rt` for about half of them under TA1–TA3. Two readings keep
//!   bursts from becoming a violator's: every bucket (the throttle, the compliance
//!   test, TA3's rate test) starts at the depth it had before bursts and earns the
//!   rest by the tenant's sending under its rate; and a bypassing tenant spends its
//!   bucket's tokens as if it passed through it. Started full and left full while
//!   bypassed, violators released their whole burst onto the paper's array each time
//!   the switch came on, and four compliant readers beside two violators and two
//!   flooders fell from 99.0–99.3 % to 85.8–93.7 % within `rt` under TA2 and TA3
//!   (measured: docs/conformance.md, "SLO conformance").
//! * Requests waiting behind a bucket are looked at when their bucket has a token
//!   again (a heap by that time), best-effort ones when one of theirs completes or the
//!   breach ends: O(log n) per request at any tenant count.

use super::depth::DispatchDepth;
use super::floor::Floor;
use super::frame::{ArrivalOrder, Frame, Service};
use super::{
    Admission, Detail, Dispatch, Gauge, Observation, Policy, PolicyError, PolicyParams, Refusal,
    SwitchLog,
};
use crate::device::cost::Currency;
use crate::types::{
    Completion, NANOS_PER_SEC, Nanos, Request, Slo, TenantId, TenantSpec, nanos_to_secs,
};
use rustc_hash::FxHashMap;
use serde_json::json;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};

/// Thousandths of a request: the unit tokens are counted in.
const MILLI: u64 = 1000;
/// TA3 counts a tenant's arrivals over at least this many requests at its agreed rate
/// (`rate_window_requests`; see the module doc).
const RATE_WINDOW_REQUESTS: f64 = 100.0;
/// Switch transitions listed in the stats (all of them go to the switch log).
const MAX_TIMELINE_IN_STATS: usize = 2_000;
/// Switch transitions kept for the switch log (4 MiB; at the ten a second that bounded
/// switching allows, seven hours); later ones are counted, not kept.
const MAX_TIMELINE: usize = 1 << 18;

/// Whether a tenant keeps to an agreed rate (a conformance test): a token bucket
/// refilled at the rate plus a tolerance, as deep as the burst the test forgives, one
/// token an arrival; the tenant is over the rate while the bucket is nearly empty (under
/// a tenth of its depth and under two tokens). TA3 finds its violators with it, and
/// every token-bucket policy and mClock give tenants within their rate some slack.
#[derive(Debug, Clone, PartialEq)]
pub struct RateTest {
    bucket: Bucket,
}

impl RateTest {
    /// A test of `iops × (1 + tolerance)` forgiving bursts of `depth` requests, its
    /// ticks `refill_hz` a second from `now`.
    pub fn new(iops: f64, tolerance: f64, depth: f64, refill_hz: f64, now: Nanos) -> Self {
        let rho = (iops * (1.0 + tolerance) / refill_hz * MILLI as f64).round() as u64;
        let period = (NANOS_PER_SEC as f64 / refill_hz).round() as Nanos;
        let mut bucket = Bucket::new(rho, (depth * MILLI as f64).round() as u64, period);
        bucket.tick = now / bucket.period;
        RateTest { bucket }
    }

    /// A request arrived at `now`; whether it found a token (was within the rate and
    /// the burst the test forgives).
    pub fn arrive(&mut self, now: Nanos) -> bool {
        self.bucket.refill(now);
        // No token left means it arrived above the rate: nothing to take.
        self.bucket.take()
    }

    /// The test with only `requests` of its burst to start with (at most its depth):
    /// the rest is earned by arriving under the rate.
    pub fn starting_with(mut self, requests: f64) -> Self {
        let b = &mut self.bucket;
        b.tokens = b
            .tokens
            .min(((requests * MILLI as f64).round() as u64).max(MILLI));
        self
    }

    /// Whether the tenant is over the rate at `now`.
    pub fn over(&mut self, now: Nanos) -> bool {
        let b = &mut self.bucket;
        b.refill(now);
        b.tokens() < (b.sigma / 10).max(2 * MILLI)
    }
}

/// A token bucket refilled at ticks of a fixed period.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    /// Tokens added per tick, thousandths of a request.
    pub rho: u64,
    /// Capacity, thousandths of a request.
    pub sigma: u64,
    tokens: u64,
    /// Ticks counted so far (the bucket holds what it had at tick `tick`).
    tick: u64,
    period: Nanos,
}

impl Bucket {
    /// A full bucket refilled every `period` with `rho` and holding at most `sigma`
    /// (never less than one request).
    pub fn new(rho: u64, sigma: u64, period: Nanos) -> Self {
        let sigma = sigma.max(MILLI);
        Bucket {
            rho,
            sigma,
            tokens: sigma,
            tick: 0,
            period: period.max(1),
        }
    }

    /// Adds the refills of every tick up to `now`.
    pub fn refill(&mut self, now: Nanos) {
        let tick = now / self.period;
        if tick > self.tick {
            let added = (tick - self.tick).saturating_mul(self.rho);
            self.tokens = self.tokens.saturating_add(added).min(self.sigma);
            self.tick = tick;
        }
    }

    /// Tokens now, thousandths of a request.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Takes one request's worth if there is one.
    pub fn take(&mut self) -> bool {
        if self.tokens >= MILLI {
            self.tokens -= MILLI;
            true
        } else {
            false
        }
    }

    /// The tick at which the bucket will hold one request's worth (`None` if it never
    /// refills).
    pub fn ready_at(&self) -> Option<Nanos> {
        if self.tokens >= MILLI {
            return Some(self.tick * self.period);
        }
        if self.rho == 0 {
            return None;
        }
        let ticks = (MILLI - self.tokens).div_ceil(self.rho);
        Some((self.tick + ticks) * self.period)
    }
}

/// The maximum of the last `len` values pushed, in O(1) amortised per push (a deque of
/// the values that can still become the maximum, falling from front to back).
#[derive(Debug, Clone)]
struct WindowMax {
    len: u64,
    pushed: u64,
    /// (push number, value), values strictly decreasing.
    candidates: VecDeque<(u64, Nanos)>,
}

impl WindowMax {
    fn new(len: usize) -> Self {
        WindowMax {
            len: len as u64,
            pushed: 0,
            candidates: VecDeque::new(),
        }
    }

    #[cfg(test)]
    fn push(&mut self, value: Nanos) {
        self.push_at(self.pushed, value);
    }

    /// Pushes `value` as the `idx`-th of a count shared with other windows (indices
    /// never decrease); the window holds the values of the last `len` indices.
    fn push_at(&mut self, idx: u64, value: Nanos) {
        while self.candidates.back().is_some_and(|&(_, v)| v <= value) {
            self.candidates.pop_back();
        }
        self.candidates.push_back((idx, value));
        self.pushed = idx + 1;
        self.expire(self.pushed);
    }

    /// Forgets values older than the last `len` indices before `next`.
    fn expire(&mut self, next: u64) {
        while self
            .candidates
            .front()
            .is_some_and(|&(i, _)| i + self.len < next)
        {
            self.candidates.pop_front();
        }
    }

    /// 0 before the first push.
    fn max(&self) -> Nanos {
        self.candidates.front().map_or(0, |&(_, v)| v)
    }

    /// The maximum over the last `len` indices before `next` (0 if none of them is
    /// this window's).
    fn max_before(&mut self, next: u64) -> Nanos {
        self.expire(next);
        self.max()
    }
}

/// Who turns the switches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SwitchRule {
    /// TA1: every bucket always on.
    AlwaysOn,
    /// TA2: one switch for all tenants.
    Global,
    /// TA3: a switch per tenant, turned on only for tenants above their agreed rate.
    PerTenant {
        /// How far back arrivals are counted for a tenant's rate, ns.
        window: Nanos,
        /// The window is at least this many requests at the agreed rate.
        min_requests: f64,
    },
}

#[derive(Debug, Clone)]
struct Tenant {
    queue: VecDeque<Request>,
    /// `None`: no SLO, never throttled.
    bucket: Option<Bucket>,
    /// The SLO's response time (0 without one).
    rt: Nanos,
    hwm: Nanos,
    lwm: Nanos,
    /// The largest storage response time of this tenant's completions among the last
    /// `rt_window` completions of all tenants.
    recent: WindowMax,
    /// Its response time is above its high water mark and has not yet come back below
    /// its low one.
    breach: bool,
    /// The breach was seen in a completion, not only predicted (TA3).
    observed: bool,
    /// The completion count when its breach began: it lasts at least `rt_window / 4`
    /// completions, also when it was only predicted.
    breach_from: u64,
    /// When its breach began: it lasts at least `min_breach_ms`.
    breach_at: Nanos,
    /// Predicted response time that counts as a breach; 0: none.
    predict_mark: Nanos,
    on: bool,
    /// Bucket refill per tick at the agreed rate, and with `refill_slack` (thousandths).
    rho_agreed: u64,
    rho_slack: u64,
    /// The tenant's arrivals tested against its agreed rate (a bucket refilled at
    /// `iops × (1 + rate_slack)`, `rate_window` of that rate deep, one token an
    /// arrival): empty means it has sent more than agreed for a while.
    conformance: Option<RateTest>,
    /// TA3: how long the agreed rate takes to fill the conformance bucket.
    rate_window: Nanos,
    throttled: u64,
    /// The last request id counted as an arrival: one offered again after a refusal
    /// (held back by the host) is not a new arrival.
    last_arrival: Option<u64>,
    /// Requests the bucket queue holds at most: one more would wait for tokens longer
    /// than `max_wait × rt` and could not meet its response time.
    queue_limit: usize,
    refused: u64,
    /// The SLO's own definition of compliance: a bucket refilled at exactly `iops`,
    /// as deep as the SLO's burst, one token an arrival. An arrival that finds no
    /// token is beyond rate + burst (the only kind ever refused).
    policer: Option<RateTest>,
    /// Arrivals beyond rate + burst.
    excess: u64,
}

/// One switch transition, for the timeline (Fig. 8).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transition {
    /// When the switch turned.
    pub time: Nanos,
    /// Whose switch it is.
    pub tenant: TenantId,
    /// Whether the switch turned on (the tenant's bucket throttles it).
    pub on: bool,
}

/// Buckets, switches and the storage queue of TA1/TA2/TA3.
#[derive(Debug, Clone)]
pub struct SwitchedBuckets {
    name: &'static str,
    rule: SwitchRule,
    tenants: Vec<Tenant>,
    /// The storage queue: the requests that passed their bucket (or the bypass), per
    /// tenant, and what they have in the device ([`super::frame`]; no depth of its own,
    /// no floor).
    frame: Frame,
    /// The storage queue's order: first passed, first served.
    order: ArrivalOrder,
    /// When each request in the storage queue or on the device passed its bucket.
    admitted: FxHashMap<u64, Nanos>,
    hwm_fraction: f64,
    lwm_fraction: f64,
    /// Completions of all tenants (the index the tenants' windows share).
    completions: u64,
    /// Completions each tenant's window spans.
    rt_window: usize,
    refill_hz: f64,
    depth_factor: f64,
    /// A bucket is at least this many response times of the agreed rate deep.
    depth_rt: f64,
    /// A bucket is at least this many requests deep.
    depth_requests: f64,
    /// TA3 flags a tenant only above `iops × (1 + rate_slack)`.
    rate_slack: f64,
    /// A bucket refills at `iops × (1 + refill_slack)`.
    refill_slack: f64,
    timeline: Vec<Transition>,
    /// When the timeline reached [`MAX_TIMELINE`] and stopped keeping transitions.
    timeline_full_at: Option<Nanos>,
    transitions: u64,
    breaches: u64,
    /// Busy time the storage spent per completion over the last completions: from the
    /// later of the previous completion and the request's admission to its finish.
    intervals: VecDeque<Nanos>,
    intervals_sum: Nanos,
    last_finish: Nanos,
    /// Fraction of `rt` that the response time predicted for an arriving request may
    /// reach before it counts as a breach; 0: no prediction.
    predict: f64,
    /// Longest wait for tokens a request is queued for, as a fraction of its `rt`.
    max_wait: f64,
    /// Requests a tenant without an SLO may have passed while the switches would
    /// throttle it (0: it always bypasses).
    best_effort_depth: usize,
    /// Some tenant is in breach (kept by `judge`).
    any_breach: bool,
    /// Some tenant is in a breach seen in its completions (kept by `judge`): what holds
    /// best-effort tenants.
    any_observed: bool,
    /// Tenants in breach.
    breached: BTreeSet<usize>,
    /// Tenants with an SLO whose window's largest response time is above
    /// `best_effort_mark` × their `rt`: close to a breach.
    near: BTreeSet<usize>,
    /// `best_effort_mark`.
    near_mark: f64,
    /// The tenants with an SLO (a bucket).
    slo_tenants: Vec<usize>,
    /// A breach lasts at least this long (ns).
    min_breach: Nanos,
    /// Tenants with a bucket and requests waiting in their queue, by when the bucket
    /// next holds a token; an entry is live while it is its tenant's `wake`.
    ready: BinaryHeap<Reverse<(Nanos, TenantId)>>,
    wake: Vec<Option<Nanos>>,
    /// Tenants without a bucket with requests waiting in their queue.
    best_effort_waiting: BTreeSet<TenantId>,
    /// Requests in the tenants' queues (not the storage queue).
    waiting: usize,
}

/// Completions the predicted response time takes the storage's completion rate from.
const RATE_SAMPLES: usize = 64;

impl SwitchedBuckets {
    /// Reads the parameters every TA policy takes (`refill_hz`, `depth_factor`, and
    /// for the switched ones `hwm`, `lwm`, TA3 also `rate_window_ms`, `rate_slack`).
    pub fn build(
        name: &'static str,
        params: &mut PolicyParams,
        tenants: &[TenantSpec],
        switched: bool,
        per_tenant: bool,
    ) -> Result<Self, PolicyError> {
        let s = Settings::read(params, switched, per_tenant)?;
        let mut p = SwitchedBuckets {
            name,
            rule: s.rule,
            tenants: Vec::new(),
            frame: Frame::new(
                tenants,
                DispatchDepth::fixed(tenants.len(), 0),
                Floor::new(tenants.len(), None),
            )
            .in_release_order(),
            order: ArrivalOrder::default(),
            admitted: FxHashMap::default(),
            hwm_fraction: s.hwm,
            lwm_fraction: s.lwm,
            completions: 0,
            rt_window: s.window,
            refill_hz: s.refill_hz,
            depth_factor: s.depth_factor,
            depth_rt: s.depth_rt,
            depth_requests: s.depth_requests,
            rate_slack: s.rate_slack,
            refill_slack: s.refill_slack,
            timeline: Vec::new(),
            timeline_full_at: None,
            transitions: 0,
            breaches: 0,
            intervals: VecDeque::with_capacity(RATE_SAMPLES),
            intervals_sum: 0,
            last_finish: 0,
            predict: s.predict,
            max_wait: s.max_wait,
            best_effort_depth: s.best_effort_depth as usize,
            any_breach: false,
            any_observed: false,
            breached: BTreeSet::new(),
            near: BTreeSet::new(),
            near_mark: s.near_mark,
            slo_tenants: Vec::new(),
            min_breach: s.min_breach,
            ready: BinaryHeap::new(),
            wake: vec![None; tenants.len()],
            best_effort_waiting: BTreeSet::new(),
            waiting: 0,
        };
        p.tenants = tenants.iter().map(|t| p.tenant(t, 0)).collect();
        p.slo_tenants = (0..p.tenants.len())
            .filter(|&i| p.tenants[i].bucket.is_some())
            .collect();
        Ok(p)
    }

    fn tenant(&self, spec: &TenantSpec, now: Nanos) -> Tenant {
        let period = (NANOS_PER_SEC as f64 / self.refill_hz).round() as Nanos;
        let bucket = spec.slo.map(|slo| {
            // At the agreed rate plus `refill_slack` while the tenant keeps to it (`admit`).
            let rho = self.per_tick(slo.iops, self.refill_slack);
            // A compliant burst passes at once, once earned (module doc).
            let start = self.start_tokens(slo);
            let sigma = start.max((slo.burst_requests() * MILLI as f64).round() as u64);
            let mut b = Bucket::new(rho, sigma, period);
            b.tick = now / b.period;
            b.tokens = start.max(MILLI).min(b.sigma);
            b
        });
        let rt = spec.slo.map_or(0, |s| s.rt_nanos()) as f64;
        let mut tenant = Tenant {
            queue: VecDeque::new(),
            on: bucket.is_some() && self.rule == SwitchRule::AlwaysOn,
            bucket,
            rt: rt as Nanos,
            hwm: (rt * self.hwm_fraction) as Nanos,
            lwm: (rt * self.lwm_fraction) as Nanos,
            recent: WindowMax::new(self.rt_window),
            breach: false,
            observed: false,
            breach_from: 0,
            breach_at: 0,
            predict_mark: (rt * self.predict) as Nanos,
            rho_agreed: spec.slo.map_or(0, |slo| self.per_tick(slo.iops, 0.0)),
            rho_slack: spec
                .slo
                .map_or(0, |slo| self.per_tick(slo.iops, self.refill_slack)),
            conformance: None,
            rate_window: match (self.rule, spec.slo) {
                (
                    SwitchRule::PerTenant {
                        window,
                        min_requests,
                        ..
                    },
                    Some(s),
                ) if s.iops > 0.0 => {
                    window.max((min_requests / s.iops * NANOS_PER_SEC as f64) as Nanos)
                }
                (SwitchRule::PerTenant { window, .. }, _) => window,
                _ => 0,
            },
            throttled: 0,
            last_arrival: None,
            queue_limit: spec.slo.map_or(usize::MAX, |s| {
                if self.max_wait <= 0.0 {
                    usize::MAX
                } else {
                    ((s.iops * self.max_wait * s.rt_nanos() as f64 / NANOS_PER_SEC as f64) as usize)
                        .max(1)
                }
            }),
            refused: 0,
            policer: spec.slo.map(|s| {
                RateTest::new(s.iops, 0.0, s.burst_requests(), self.refill_hz, now)
                    .starting_with(self.start_tokens(s) as f64 / MILLI as f64)
            }),
            excess: 0,
        };
        if let Some(slo) = spec.slo {
            let depth = match self.rule {
                SwitchRule::PerTenant { .. } => slo.iops * nanos_to_secs(tenant.rate_window),
                _ => RATE_WINDOW_REQUESTS,
            };
            // Within its burst a tenant keeps to its rate; the burst beyond the test's
            // own depth is earned by sending under the rate, as the buckets' is.
            tenant.conformance = Some(
                RateTest::new(
                    slo.iops,
                    self.rate_slack,
                    depth.max(slo.burst_requests()),
                    self.refill_hz,
                    now,
                )
                .starting_with(depth),
            );
        }
        tenant
    }

    /// What a bucket holds to start with (thousandths of a request): the depth it had
    /// before SLOs took bursts (`depth_factor` ticks of refill, `depth_rt` response
    /// times of the rate, `depth_requests`), so a tenant flooding from its first
    /// request passes no more at once than that; the rest of its burst it earns by
    /// sending under its rate.
    fn start_tokens(&self, slo: Slo) -> u64 {
        let rho = self.per_tick(slo.iops, self.refill_slack);
        let by_rt = slo.iops * nanos_to_secs(slo.rt_nanos()) * self.depth_rt * MILLI as f64;
        (rho as f64 * self.depth_factor)
            .max(by_rt)
            .max(self.depth_requests * MILLI as f64)
            .round() as u64
    }

    /// Tokens per refill tick (thousandths of a request) for `iops × (1 + slack)`.
    fn per_tick(&self, iops: f64, slack: f64) -> u64 {
        (iops * (1.0 + slack) / self.refill_hz * MILLI as f64).round() as u64
    }

    fn set(&mut self, t: usize, on: bool, now: Nanos) {
        if self.tenants[t].on == on || self.tenants[t].bucket.is_none() {
            return;
        }
        // A compliant tenant keeps its burst: only one over its rate is clamped.
        let over = on && self.over_rate(t, now);
        let tenant = &mut self.tenants[t];
        tenant.on = on;
        if over {
            // Switched in over its rate, a bucket starts no fuller than the paper's
            // depth: the tokens saved while it was bypassed are not a burst to release
            // onto a storage that is already late (module doc).
            let b = tenant.bucket.as_mut().expect("checked above");
            b.refill(now);
            let paper = ((b.rho as f64 * self.depth_factor).round() as u64).max(MILLI);
            let burst = (self.depth_requests * MILLI as f64).round() as u64;
            b.tokens = b.tokens.min(paper.max(burst));
        }
        self.transitions += 1;
        if self.timeline.len() < MAX_TIMELINE {
            self.timeline.push(Transition {
                time: now,
                tenant: t as TenantId,
                on,
            });
        } else if self.timeline_full_at.is_none() {
            self.timeline_full_at = Some(now);
        }
    }

    /// TA3: whether tenant `t` has sent more than its agreed rate: its conformance
    /// bucket is nearly empty at `now` (below a tenth of its depth, and below two
    /// requests' worth: a violator's bucket hovers between none and one, refilled
    /// between its arrivals).
    fn over_rate(&mut self, t: usize, now: Nanos) -> bool {
        self.tenants[t]
            .conformance
            .as_mut()
            .is_some_and(|c| c.over(now))
    }

    /// Response time a request passing its bucket now can expect: what is ahead of it
    /// (and itself) times the storage's recent busy time per completion. 0 before the
    /// first completion.
    fn predicted_rt(&self) -> Nanos {
        if self.intervals.is_empty() {
            return 0;
        }
        let per_completion = self.intervals_sum / self.intervals.len() as u64;
        (self.admitted.len() as u64 + 1) * per_completion
    }

    /// Moves tenant `k` into breach (its response time `rt` above its high water mark)
    /// or out of it (below its low one), clears breaches whose windows have emptied of
    /// late completions, and turns the switches: TA2 all of them while any tenant is in
    /// breach, TA3 those of tenants above their rate; every switch off when nobody is.
    fn judge(&mut self, k: usize, rt: Nanos, now: Nanos, observed: bool) {
        let next = self.completions;
        // A breach, real or predicted, lasts at least a quarter of the window.
        let window = self.rt_window as u64 / 4;
        if self.tenants[k].bucket.is_some() {
            let t = &mut self.tenants[k];
            if !t.breach && rt > t.hwm {
                t.breach = true;
                t.observed = observed;
                t.breach_from = next;
                t.breach_at = now;
                self.breaches += 1;
                self.breached.insert(k);
            } else if t.breach && rt > t.hwm && observed {
                t.observed = true;
            } else if t.breach
                && rt < t.lwm
                && next >= t.breach_from + window
                && now >= t.breach_at + self.min_breach
            {
                t.breach = false;
                self.breached.remove(&k);
            }
            if observed {
                if rt as f64 > self.near_mark * t.rt as f64 {
                    self.near.insert(k);
                } else {
                    self.near.remove(&k);
                }
            }
        }
        // Another tenant's late completions have left the window (it completed nothing
        // since): its breach, and its being near one, end.
        let mut cleared = Vec::new();
        for &i in &self.breached {
            let t = &mut self.tenants[i];
            if i != k
                && next >= t.breach_from + window
                && now >= t.breach_at + self.min_breach
                && t.recent.max_before(next) < t.lwm
            {
                t.breach = false;
                cleared.push(i);
            }
        }
        for i in cleared {
            self.breached.remove(&i);
        }
        let mut far = Vec::new();
        for &i in &self.near {
            let t = &mut self.tenants[i];
            if i != k && (t.recent.max_before(next) as f64) <= self.near_mark * t.rt as f64 {
                far.push(i);
            }
        }
        for i in far {
            self.near.remove(&i);
        }
        let any_breach = !self.breached.is_empty();
        self.any_breach = any_breach;
        self.any_observed = self.breached.iter().any(|&i| self.tenants[i].observed);
        if self.rule == SwitchRule::AlwaysOn {
            // The buckets stay on; the breach decides only the best-effort tenants.
            return;
        }
        for idx in 0..self.slo_tenants.len() {
            let i = self.slo_tenants[idx];
            let on = match self.rule {
                SwitchRule::AlwaysOn => unreachable!("returned above"),
                SwitchRule::Global => any_breach,
                SwitchRule::PerTenant { .. } => {
                    any_breach && (self.tenants[i].on || self.over_rate(i, now))
                }
            };
            self.set(i, on, now);
        }
    }

    /// Whether a tenant without an SLO is held to `best_effort_depth` now: while some
    /// tenant is in breach.
    fn best_effort_held(&self) -> bool {
        self.best_effort_depth > 0 && (self.any_observed || !self.near.is_empty())
    }

    /// Puts `request` in its tenant's queue, to wait for its bucket (or, best effort,
    /// for its turn).
    fn wait(&mut self, request: Request) {
        let t = request.tenant as usize;
        if self.tenants[t].bucket.is_none() {
            self.best_effort_waiting.insert(request.tenant);
        }
        self.tenants[t].queue.push_back(request);
        self.waiting += 1;
    }

    /// Takes the head of tenant `t`'s queue.
    fn unwait(&mut self, t: usize) -> Option<Request> {
        let r = self.tenants[t].queue.pop_front()?;
        self.waiting -= 1;
        if self.tenants[t].queue.is_empty() {
            self.best_effort_waiting.remove(&(t as TenantId));
        }
        Some(r)
    }

    /// Looks at tenant `t`'s queue again when its bucket next holds a token.
    fn schedule(&mut self, t: usize) {
        let at = if self.tenants[t].queue.is_empty() {
            None
        } else {
            self.tenants[t].bucket.as_ref().and_then(Bucket::ready_at)
        };
        if self.wake[t] != at {
            self.wake[t] = at;
            if let Some(at) = at {
                self.ready.push(Reverse((at, t as TenantId)));
            }
        }
    }

    /// Sends `r` to the storage queue: it has passed its bucket (or the bypass).
    fn pass(&mut self, r: Request, now: Nanos) {
        self.admitted.insert(r.id, now);
        self.order.push(r.tenant);
        let _ = self.frame.arrive(r, now, false);
    }

    /// Tenant `t`'s requests that passed and have not completed: in the storage queue
    /// or on the device.
    fn passed(&self, t: usize) -> usize {
        let q = self.frame.queues();
        q.queued_of(t as TenantId) + q.in_flight_of(t as TenantId) as usize
    }

    /// Moves tenant `t`'s requests that have a token into the storage queue (a tenant
    /// without an SLO: those within `best_effort_depth`, or all when not held).
    fn admit(&mut self, t: usize, now: Nanos) {
        if self.tenants[t].queue.is_empty() {
            return;
        }
        let held = self.best_effort_held();
        if self.tenants[t].bucket.is_some() {
            // A tenant within its agreed rate refills `refill_slack` faster (module doc).
            let over = self.over_rate(t, now);
            let tenant = &mut self.tenants[t];
            let rho = if over {
                tenant.rho_agreed
            } else {
                tenant.rho_slack
            };
            let b = tenant.bucket.as_mut().expect("checked above");
            b.refill(now);
            b.rho = rho;
        }
        loop {
            let passed = self.passed(t);
            let tenant = &mut self.tenants[t];
            if tenant.queue.is_empty() {
                break;
            }
            let may = match tenant.bucket.as_mut() {
                Some(b) => b.take(),
                None => !held || passed < self.best_effort_depth,
            };
            if !may {
                break;
            }
            let r = self.unwait(t).expect("not empty");
            if r.arrival < now {
                self.tenants[t].throttled += 1;
            }
            self.pass(r, now);
        }
        self.schedule(t);
    }
}

impl Policy for SwitchedBuckets {
    fn name(&self) -> &'static str {
        self.name
    }

    fn enqueue(&mut self, request: Request, now: Nanos) -> Admission {
        let k = request.tenant as usize;
        let t = &mut self.tenants[k];
        // Ids grow in arrival order (both drivers number requests as they arrive); a
        // request the host held back and offers again has been counted already.
        let first_offer = t.last_arrival.is_none_or(|last| request.id > last);
        // Within rate + burst (the SLO's definition): never refused. One offered again
        // was refused before, so it was beyond.
        let mut compliant = false;
        if first_offer {
            t.last_arrival = Some(request.id);
            if let Some(c) = t.conformance.as_mut() {
                let _ = c.arrive(now);
            }
            compliant = t.policer.as_mut().is_none_or(|p| p.arrive(now));
            if !compliant {
                t.excess += 1;
            }
        }
        let (on, mark, hwm) = (t.on, t.predict_mark, t.hwm);
        // Catch the breach before it is observed: by the time a late completion shows
        // it, every request queued since is late too.
        if first_offer && !on && mark > 0 && self.predicted_rt() > mark {
            self.judge(k, hwm + 1, now, false);
        }
        let held = self.best_effort_held();
        let passed = self.passed(k);
        let t = &mut self.tenants[k];
        if t.bucket.is_none() && held && (!t.queue.is_empty() || passed >= self.best_effort_depth) {
            // Best effort while the SLOs are at risk: it waits its turn (module doc).
            self.wait(request);
            return Admission::Queued;
        }
        if t.on {
            self.wait(request);
            self.admit(k, now);
            let t = &mut self.tenants[k];
            if t.queue.len() > t.queue_limit && !compliant {
                // The queue was within its limit before: the one over it is this one.
                let r = t.queue.pop_back().expect("over the limit");
                assert_eq!(r.id, request.id, "only the request offered is refused");
                if first_offer {
                    t.refused += 1;
                }
                self.waiting -= 1;
                self.schedule(k);
                return Admission::Refused(r, Refusal::Policy);
            }
        } else {
            // Bypassing, a tenant still spends its bucket's tokens: what it saves is
            // what it did not send, not what it sent while the switch was off (module
            // doc).
            if let Some(b) = t.bucket.as_mut() {
                b.refill(now);
                let _ = b.take();
            }
            self.pass(request, now);
        }
        Admission::Queued
    }

    fn dispatch(&mut self, now: Nanos) -> Dispatch {
        // Buckets that hold a token again.
        while let Some(&Reverse((at, t))) = self.ready.peek() {
            if at > now {
                break;
            }
            self.ready.pop();
            if self.wake[t as usize] == Some(at) {
                self.wake[t as usize] = None;
                self.admit(t as usize, now);
            }
        }
        // Best-effort tenants no longer held (the breach ended).
        if !self.best_effort_held() && !self.best_effort_waiting.is_empty() {
            for t in std::mem::take(&mut self.best_effort_waiting) {
                self.admit(t as usize, now);
            }
        }
        if let Some(t) = self.order.pop() {
            return Dispatch::Request(self.frame.take(t, now, Service::Share(0.0)).0);
        }
        let next = loop {
            let Some(&Reverse((at, t))) = self.ready.peek() else {
                break None;
            };
            if self.wake[t as usize] == Some(at) {
                break Some(at);
            }
            self.ready.pop();
        };
        match next {
            Some(at) => Dispatch::Wait(at.max(now + 1)),
            None => Dispatch::Idle,
        }
    }

    fn complete(&mut self, c: &Completion, now: Nanos) {
        let k = c.request.tenant as usize;
        let admitted = match self.admitted.remove(&c.request.id) {
            Some(at) => {
                let _ = self.frame.complete(c, now);
                at
            }
            None => c.request.arrival,
        };
        let idx = self.completions;
        self.completions += 1;
        self.tenants[k]
            .recent
            .push_at(idx, c.finish.saturating_sub(admitted));
        if self.predict > 0.0 {
            if self.intervals.len() == RATE_SAMPLES {
                self.intervals_sum -= self.intervals.pop_front().expect("full");
            }
            let busy = c.finish.saturating_sub(self.last_finish.max(admitted));
            self.intervals.push_back(busy);
            self.intervals_sum += busy;
            self.last_finish = self.last_finish.max(c.finish);
        }
        let rt = self.tenants[k].recent.max();
        self.judge(k, rt, now, true);
        if self.tenants[k].bucket.is_none() {
            // A best-effort tenant's turn may have come.
            self.admit(k, now);
        }
    }

    fn add_tenant(&mut self, spec: &TenantSpec, now: Nanos) -> TenantId {
        let id = self.tenants.len();
        let t = self.tenant(spec, now);
        if t.bucket.is_some() {
            self.slo_tenants.push(id);
        }
        self.tenants.push(t);
        self.wake.push(None);
        let in_frame = self.frame.add(spec, now);
        assert_eq!(
            in_frame as usize, id,
            "the frame numbers tenants as the policy does"
        );
        id as TenantId
    }

    fn update_tenant(&mut self, tenant: TenantId, spec: &TenantSpec, now: Nanos) {
        let fresh = self.tenant(spec, now);
        if fresh.bucket.is_none() {
            // No SLO any more: no bucket to throttle with; what waited goes on as best
            // effort (`admit`).
            self.set(tenant as usize, false, now);
        }
        let t = &mut self.tenants[tenant as usize];
        let on = t.on && fresh.bucket.is_some() || fresh.on;
        *t = Tenant {
            queue: std::mem::take(&mut t.queue),
            last_arrival: t.last_arrival,
            throttled: t.throttled,
            refused: t.refused,
            excess: t.excess,
            on,
            ..fresh
        };
        let k = tenant as usize;
        if !self.tenants[k].breach {
            self.breached.remove(&k);
        }
        self.near.remove(&k);
        self.slo_tenants = (0..self.tenants.len())
            .filter(|&i| self.tenants[i].bucket.is_some())
            .collect();
        if self.tenants[k].bucket.is_none() && !self.tenants[k].queue.is_empty() {
            self.best_effort_waiting.insert(tenant);
        } else {
            self.best_effort_waiting.remove(&tenant);
        }
        self.wake[k] = None;
        self.schedule(k);
    }

    fn queued(&self) -> usize {
        self.frame.queued() + self.waiting
    }

    fn withdraw_all(&mut self) -> Vec<Request> {
        let withdrawn = self.frame.withdraw_all();
        let mut all = self.order.order(withdrawn, self.tenants.len());
        for r in &all {
            self.admitted.remove(&r.id);
        }
        for t in &mut self.tenants {
            all.extend(t.queue.drain(..));
        }
        self.waiting = 0;
        self.ready.clear();
        self.wake.iter_mut().for_each(|w| *w = None);
        self.best_effort_waiting.clear();
        all
    }

    fn currency(&self) -> Currency {
        Currency::Requests
    }

    fn check(&self) -> Result<(), String> {
        let waiting: usize = self.tenants.iter().map(|t| t.queue.len()).sum();
        if waiting != self.waiting {
            return Err(format!(
                "{waiting} in the tenants' queues, {} counted",
                self.waiting
            ));
        }
        self.frame.check()?;
        if self.order.len() != self.frame.queued() {
            return Err(format!(
                "{} in the storage queue's order, {} in the storage queue",
                self.order.len(),
                self.frame.queued()
            ));
        }
        for t in self.frame.queues().ids() {
            if let Some(r) = self
                .frame
                .queues()
                .iter_of(t)
                .find(|r| !self.admitted.contains_key(&r.id))
            {
                return Err(format!(
                    "request {} in the storage queue, never admitted",
                    r.id
                ));
            }
        }
        for (i, t) in self.tenants.iter().enumerate() {
            if t.breach != self.breached.contains(&i) {
                return Err(format!(
                    "tenant {i}: breach {} but listed {}",
                    t.breach, !t.breach
                ));
            }
        }
        if let Some(&i) = self
            .near
            .iter()
            .find(|&&i| self.tenants[i].bucket.is_none())
        {
            return Err(format!("tenant {i} has no SLO yet counts as near a breach"));
        }
        let passed = self.frame.queued() as u64 + self.frame.queues().in_flight();
        if passed != self.admitted.len() as u64 {
            return Err(format!(
                "{passed} passed and not completed, {} admitted",
                self.admitted.len()
            ));
        }
        for (i, t) in self.tenants.iter().enumerate() {
            if let Some(b) = &t.bucket
                && b.tokens() > b.sigma
            {
                return Err(format!(
                    "tenant {i}: bucket holds {} of {}",
                    b.tokens(),
                    b.sigma
                ));
            }
            let best_effort = t.bucket.is_none() && !t.queue.is_empty();
            if best_effort != self.best_effort_waiting.contains(&(i as TenantId)) {
                return Err(format!("tenant {i}: best-effort waiting set is wrong"));
            }
            if t.bucket.is_some()
                && !t.queue.is_empty()
                && self.wake[i].is_none()
                && t.bucket.as_ref().and_then(Bucket::ready_at).is_some()
            {
                return Err(format!(
                    "tenant {i}: requests wait for a bucket nobody looks at"
                ));
            }
        }
        Ok(())
    }

    fn observe(&self, detail: Detail) -> Observation {
        Observation {
            switches: (detail == Detail::Full).then(|| self.switch_log()),
            ..Observation::of(detail, self.gauges(), || self.report())
        }
    }
}

impl SwitchedBuckets {
    /// Switch states over the run, for per-phase on-time.
    fn switch_log(&self) -> SwitchLog {
        SwitchLog {
            initially_on: self
                .tenants
                .iter()
                .map(|t| t.bucket.as_ref().map(|_| self.rule == SwitchRule::AlwaysOn))
                .collect(),
            transitions: self
                .timeline
                .iter()
                .map(|x| (x.time, x.tenant, x.on))
                .collect(),
            complete_until: self.timeline_full_at,
        }
    }

    /// The gauges of [`Policy::observe`].
    fn gauges(&self) -> Vec<Gauge> {
        let mut g = vec![
            Gauge::policy(
                "breaches_total",
                "Response times above the high water mark",
                self.breaches as f64,
            ),
            Gauge::policy(
                "transitions_total",
                "Switch transitions",
                self.transitions as f64,
            ),
        ];
        for (i, t) in self.tenants.iter().enumerate() {
            g.push(Gauge::tenant(
                "switch_on",
                "1 while the tenant's requests go through its bucket",
                i,
                f64::from(u8::from(t.on)),
            ));
            g.push(Gauge::tenant(
                "throttled_total",
                "Requests that waited in the tenant's bucket",
                i,
                t.throttled as f64,
            ));
            g.push(Gauge::tenant(
                "refused_total",
                "Requests refused because they could not meet the response time",
                i,
                t.refused as f64,
            ));
            g.push(Gauge::tenant(
                "excess_total",
                "Arrivals beyond the SLO's rate and burst",
                i,
                t.excess as f64,
            ));
            if let Some(b) = &t.bucket {
                g.push(Gauge::tenant(
                    "bucket_tokens",
                    "Tokens in the tenant's bucket, in requests",
                    i,
                    b.tokens() as f64 / MILLI as f64,
                ));
            }
        }
        g
    }

    /// Water marks, switch states and the transition timeline.
    fn report(&self) -> serde_json::Value {
        let tenants: Vec<_> = self
            .tenants
            .iter()
            .map(|t| {
                json!({
                    "bucket": t.bucket.is_some(),
                    "on": t.on,
                    "throttled": t.throttled,
                    "refused": t.refused,
                    "excess": t.excess,
                    "queue_limit": (t.queue_limit != usize::MAX).then_some(t.queue_limit),
                    "hwm_us": t.hwm / 1000,
                    "lwm_us": t.lwm / 1000,
                })
            })
            .collect();
        let timeline: Vec<_> = self
            .timeline
            .iter()
            .take(MAX_TIMELINE_IN_STATS)
            .map(|x| json!([x.time as f64 / 1e6, x.tenant, x.on]))
            .collect();
        json!({
            "rule": match self.rule {
                SwitchRule::AlwaysOn => "always-on",
                SwitchRule::Global => "global",
                SwitchRule::PerTenant { .. } => "per-tenant",
            },
            "max_wait": self.max_wait,
            "best_effort_depth": self.best_effort_depth,
            "predict": self.predict,
            "hwm": self.hwm_fraction,
            "lwm": self.lwm_fraction,
            "rt_window": self.rt_window,
            "min_breach_ms": self.min_breach as f64 / 1e6,
            "refill_hz": self.refill_hz,
            "breaches": self.breaches,
            "transitions": self.transitions,
            "tenants": tenants,
            "switch_timeline_ms": timeline,
            "switch_log_complete_until_ms": self.timeline_full_at.map(|t| t as f64 / 1e6),
        })
    }
}

/// The parameters a token-bucket policy reads, checked.
struct Settings {
    refill_hz: f64,
    depth_factor: f64,
    depth_rt: f64,
    depth_requests: f64,
    rate_slack: f64,
    refill_slack: f64,
    best_effort_depth: u64,
    near_mark: f64,
    max_wait: f64,
    predict: f64,
    min_breach: Nanos,
    window: usize,
    hwm: f64,
    lwm: f64,
    rule: SwitchRule,
}

impl Settings {
    /// Reads and checks every parameter (defaults where not given).
    fn read(
        params: &mut PolicyParams,
        switched: bool,
        per_tenant: bool,
    ) -> Result<Settings, PolicyError> {
        let refill_hz = params.f64_or("refill_hz", 1000.0)?;
        if refill_hz <= 0.0 || refill_hz > 1e9 {
            return Err(params.invalid("refill_hz", "must be in (0, 1e9]"));
        }
        let depth_factor = params.f64_in("depth_factor", 1.5, 0.0..=1e6, "must be in [0, 1e6]")?;
        let depth_rt = params.f64_in(
            "depth_rt",
            1.0,
            0.0..=100.0,
            "must be in [0, 100] (0: the paper's depth)",
        )?;
        let depth_requests = params.f64_in(
            "depth_requests",
            32.0,
            0.0..=1e6,
            "must be in [0, 1e6] (0: none)",
        )?;
        let rate_slack = params.f64_in("rate_slack", 0.05, 0.0..=1.0, "must be in [0, 1]")?;
        let refill_slack = params.f64_in("refill_slack", 0.25, 0.0..=1.0, "must be in [0, 1]")?;
        let best_effort_depth = params.u64_or("best_effort_depth", 1)?;
        let near_mark =
            params.f64_in("best_effort_mark", 0.25, 0.0..=10.0, "must be in [0, 10]")?;
        if best_effort_depth > 1 << 20 {
            return Err(params.invalid(
                "best_effort_depth",
                "must be ≤ 1048576 (0: tenants without an SLO always bypass)",
            ));
        }
        let max_wait = params.f64_in(
            "max_wait",
            0.5,
            0.0..=1000.0,
            "must be in [0, 1000] (0: no bound)",
        )?;
        let mut predict = 0.0;
        if switched {
            // Only TA3 can act on a prediction without hurting anyone: it throttles
            // violators alone, and a prediction is rough when the storage is idle.
            let default = if per_tenant { 0.4 } else { 0.0 };
            predict = params.f64_in(
                "predict",
                default,
                0.0..=10.0,
                "must be in [0, 10] (0: off)",
            )?;
        }
        // Every TA policy judges breaches (TA1 only to hold best-effort tenants).
        let min_breach_ms = params.f64_in(
            "min_breach_ms",
            100.0,
            0.0..=60_000.0,
            "must be in [0, 60000]",
        )?;
        let min_breach = (min_breach_ms * 1e6) as Nanos;
        let window = params.u64_or("rt_window", 2048)? as usize;
        if !(1..=4096).contains(&window) {
            return Err(params.invalid("rt_window", "must be 1 ..= 4096 (completions)"));
        }
        let hwm = params.f64_or("hwm", 0.85)?;
        let lwm = params.f64_or("lwm", 0.80)?;
        if !(lwm > 0.0 && lwm <= hwm) {
            return Err(params.invalid("lwm", format!("must be in (0, hwm = {hwm}]")));
        }
        let rule = switch_rule(params, switched, per_tenant)?;
        Ok(Settings {
            refill_hz,
            depth_factor,
            depth_rt,
            depth_requests,
            rate_slack,
            refill_slack,
            best_effort_depth,
            near_mark,
            max_wait,
            predict,
            min_breach,
            window,
            hwm,
            lwm,
            rule,
        })
    }
}

/// When the buckets hold requests back: always (TA1), on the storage's response time
/// (TA2), per tenant on its own arrival rate (TA3, with the window it is measured over).
fn switch_rule(
    params: &mut PolicyParams,
    switched: bool,
    per_tenant: bool,
) -> Result<SwitchRule, PolicyError> {
    Ok(match (switched, per_tenant) {
        (false, _) => SwitchRule::AlwaysOn,
        (true, false) => SwitchRule::Global,
        (true, true) => {
            let window_ms = params.f64_in(
                "rate_window_ms",
                0.0,
                0.0..=60_000.0,
                "must be in [0, 60000]",
            )?;
            let min_requests = params.f64_in(
                "rate_window_requests",
                RATE_WINDOW_REQUESTS,
                0.0..=1e6,
                "must be in [0, 1e6]",
            )?;
            if window_ms == 0.0 && min_requests < 1.0 {
                return Err(params.invalid(
                    "rate_window_requests",
                    "must be ≥ 1 when rate_window_ms is 0 (the test needs a depth)",
                ));
            }
            SwitchRule::PerTenant {
                min_requests,
                window: (window_ms * 1e6) as Nanos,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_switch_log_stops_keeping_and_says_from_when() {
        let tenants = [crate::policy::test_slo_tenant("a", 1000.0, 10_000)];
        let mut params = crate::policy::test_params("ta2", toml::Table::new());
        let mut p = SwitchedBuckets::build("ta2", &mut params, &tenants, true, false).unwrap();
        for i in 0..(MAX_TIMELINE as u64 + 10) {
            p.set(0, i % 2 == 0, i * 1000);
        }
        assert_eq!(p.timeline.len(), MAX_TIMELINE);
        assert_eq!(p.transitions, MAX_TIMELINE as u64 + 10);
        let full_at = MAX_TIMELINE as u64 * 1000;
        assert_eq!(p.timeline_full_at, Some(full_at));
        let log = p.switch_log();
        // On for one µs in every two before the log filled; unknown after.
        assert_eq!(log.on_fraction(0, 0, 2000), Some(0.5));
        assert_eq!(log.on_fraction(0, 0, full_at + 1), None);
    }

    /// TA1 with the SLO's default burst (one second of its 1,000 IOPS): bursts of a
    /// tenant within rate + burst pass the bucket at once and are never refused; of a
    /// burst beyond it, what is beyond is the only thing refused.
    #[test]
    fn a_compliant_burst_passes_at_once_and_only_what_is_beyond_rate_and_burst_is_refused() {
        use crate::policy::test_request;
        let tenants = [TenantSpec {
            slo: Some(crate::types::Slo::new(1000.0, 4096, 10_000)),
            ..TenantSpec::weighted("db", 1.0)
        }];
        let mut params = crate::policy::test_params("ta1", toml::Table::new());
        let mut p = SwitchedBuckets::build("ta1", &mut params, &tenants, false, false).unwrap();
        let mut id = 0;
        let mut burst = |p: &mut SwitchedBuckets, n: u64, at: Nanos| {
            let mut refused = 0;
            for _ in 0..n {
                id += 1;
                if let Admission::Refused(..) = p.enqueue(test_request(id, 0, 4096, at), at) {
                    refused += 1;
                }
            }
            (refused, dispatched(p, at).len())
        };
        // The bucket starts with the depth it had before bursts (32 requests) and earns
        // the rest by the tenant's sending less: after a quiet second, 500 at once and
        // 500 more half a second later (a mean of 1,000 a second, in bursts) pass the
        // bucket as they arrive.
        // 37 at once: 32 pass, five (beyond) wait for tokens within half of rt.
        assert_eq!(burst(&mut p, 37, 0), (0, 32));
        assert_eq!(dispatched(&mut p, 100_000_000).len(), 5);
        assert_eq!(p.tenants[0].excess, 5);
        assert_eq!(burst(&mut p, 500, 1_000_000_000), (0, 500));
        assert_eq!(burst(&mut p, 500, 1_500_000_000), (0, 500));
        assert_eq!(p.tenants[0].excess, 5);
        // 2,000 at once half a second on: the burst (refilled to 1,000) passes, the
        // other 1,000 are beyond it; five wait for tokens (half of rt at the rate),
        // the rest are refused.
        assert_eq!(burst(&mut p, 2_000, 2_000_000_000), (995, 1_000));
        assert_eq!((p.tenants[0].excess, p.tenants[0].refused), (1_005, 995));
    }

    /// The requests `p` dispatches at `now`, in order.
    fn dispatched(p: &mut SwitchedBuckets, now: Nanos) -> Vec<u64> {
        let mut got = Vec::new();
        while let Dispatch::Request(r) = p.dispatch(now) {
            got.push(r.id);
        }
        got
    }

    #[test]
    fn a_tenant_without_an_slo_is_held_to_its_best_effort_depth_while_slos_are_at_risk() {
        use crate::policy::{TestPolicy, test_request, test_slo_tenant};
        let tenants = [
            test_slo_tenant("a", 1000.0, 10_000),
            TenantSpec::weighted("b", 1.0),
        ];
        let build = |policy: &'static str, switched: bool, table: toml::Table| {
            let mut params = crate::policy::test_params(policy, table);
            SwitchedBuckets::build(policy, &mut params, &tenants, switched, false).unwrap()
        };
        // TA1 with nobody in breach: b is not held (its buckets are on, its
        // best-effort tenants free).
        let mut p = build("ta1", false, toml::Table::new());
        for id in 1..=3 {
            p.put(test_request(id, 1, 4096, 0), 0);
        }
        assert_eq!(dispatched(&mut p, 0), vec![1, 2, 3]);
        // a completes a request 9 ms after it passed: above its high water mark (8.5
        // ms of 10): in breach, b is held to one request in the storage at a time, the
        // rest wait in its queue (never refused) and pass one per completion.
        let mut p = build("ta1", false, toml::Table::new());
        p.put(test_request(100, 0, 4096, 0), 0);
        assert_eq!(dispatched(&mut p, 0), vec![100]);
        let late = Completion {
            request: test_request(100, 0, 4096, 0),
            start: 0,
            finish: 9_000_000,
        };
        p.complete(&late, 9_000_000);
        assert!(p.any_observed);
        let t0 = 9_000_000;
        for id in 1..=3 {
            p.put(test_request(id, 1, 4096, t0), t0);
        }
        assert_eq!(dispatched(&mut p, t0), vec![1]);
        assert_eq!(p.queued(), 2);
        for id in 2..=3 {
            let r = test_request(id - 1, 1, 4096, t0);
            let c = Completion {
                request: r,
                start: t0,
                finish: t0 + 1000 * id,
            };
            p.complete(&c, t0 + 1000 * id);
            assert_eq!(dispatched(&mut p, t0 + 1000 * id), vec![id]);
        }
        assert_eq!(p.queued(), 0);
        assert_eq!(p.report_json()["tenants"][1]["throttled"], 2);
        p.check().unwrap();
        // `best_effort_depth = 2`: two at a time; 0: it always bypasses.
        for (depth, want) in [(2, vec![1, 2]), (0, vec![1, 2, 3])] {
            let mut p = build("ta1", false, toml::toml! { best_effort_depth = depth });
            p.any_observed = true;
            for id in 1..=3 {
                p.put(test_request(id, 1, 4096, 0), 0);
            }
            assert_eq!(dispatched(&mut p, 0), want, "depth {depth}");
        }
        // TA2 with no tenant in breach: b bypasses.
        let mut p = build("ta2", true, toml::Table::new());
        for id in 1..=3 {
            p.put(test_request(id, 1, 4096, 0), 0);
        }
        assert_eq!(dispatched(&mut p, 0), vec![1, 2, 3]);
    }

    #[test]
    fn a_request_offered_again_after_a_refusal_is_not_a_new_arrival() {
        use crate::policy::test_request;
        // TA1, 1,000 IOPS, rt 10 ms, buckets one rt deep: a burst of 16 passes 10,
        // queues 5 and refuses the last. The host holds it back and offers it again
        // every millisecond (`Refuse::Hold`): 500 offers of one request are one arrival
        // for the rate test and one refusal in the counts.
        let tenants = [crate::policy::test_slo_tenant("a", 1000.0, 10_000)];
        let mut params = crate::policy::test_params("ta1", toml::toml! { depth_requests = 0.0 });
        let mut p = SwitchedBuckets::build("ta1", &mut params, &tenants, false, false).unwrap();
        for id in 1..=15 {
            assert_eq!(
                p.enqueue(test_request(id, 0, 4096, 0), 0),
                Admission::Queued
            );
        }
        for _ in 0..500 {
            assert!(matches!(
                p.enqueue(test_request(16, 0, 4096, 0), 0),
                Admission::Refused(r, Refusal::Policy) if r.id == 16
            ));
        }
        assert_eq!(p.tenants[0].refused, 1);
        assert!(!p.over_rate(0, 0), "16 arrivals against a test 100 deep");
        // A new request is a new arrival.
        assert!(matches!(
            p.enqueue(test_request(17, 0, 4096, 0), 0),
            Admission::Refused(..)
        ));
        assert_eq!(p.tenants[0].refused, 2);
    }

    #[test]
    fn window_max_forgets_values_older_than_the_window() {
        let mut w = WindowMax::new(3);
        assert_eq!(w.max(), 0);
        let mut got = Vec::new();
        for v in [5, 1, 2, 3, 9, 4, 4, 1, 0] {
            w.push(v);
            got.push(w.max());
        }
        assert_eq!(got, vec![5, 5, 5, 3, 9, 9, 9, 4, 4]);
    }

    #[test]
    fn bucket_refills_at_ticks_up_to_its_depth() {
        // 3.5 requests per 1 ms tick, 5.25 deep, full at the start.
        let mut b = Bucket::new(3500, 5250, 1_000_000);
        assert_eq!(b.tokens(), 5250);
        for _ in 0..5 {
            assert!(b.take());
        }
        assert!(!b.take());
        assert_eq!(b.tokens(), 250);
        // No refill before the first tick; 3.75 requests at it, 5.25 (capped) after two.
        b.refill(999_999);
        assert_eq!(b.tokens(), 250);
        assert_eq!(b.ready_at(), Some(1_000_000));
        b.refill(1_000_000);
        assert_eq!(b.tokens(), 3750);
        b.refill(2_500_000);
        assert_eq!(b.tokens(), 5250);
        // Empty, slow bucket: 0.4 per tick needs three ticks for a request.
        let mut slow = Bucket::new(400, 600, 1_000_000);
        assert_eq!(slow.sigma, 1000, "at least one request deep");
        assert!(slow.take());
        assert_eq!(slow.ready_at(), Some(3_000_000));
        slow.refill(3_000_000);
        assert!(slow.take());
    }
}
