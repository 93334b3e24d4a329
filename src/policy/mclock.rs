//! `mclock`: reservation, weight and limit per tenant with the three tags of mClock
//! (Gulati, Merchant, Varman, "mClock: Handling Throughput Variability for Hypervisor IO
//! Scheduling", OSDI 2010), with the tag adjustments and per-request costs of its
//! distributed form dmClock (same paper, §4; Ceph's `dmclock` library).
//!
//! Each request carries three tags: `R = max(R' + 1/r, t)`, `L = max(L' + 1/l, t)` in
//! nanoseconds of real time, where the primes are the previous request's tags and `t`
//! its arrival, and a proportional tag `P = P' + c / w` in virtual time, `c` the
//! request's cost. Dispatch first serves, among tenants whose head has `R ≤ now`, the
//! smallest `R` (the constraint phase: reservations are met first); otherwise, among
//! tenants whose head has `L ≤ now`, the smallest `P` (the weight phase), and then takes
//! `1/r` back off that tenant's reservation tags, so service by weight does not count
//! against the reservation. Nothing eligible: wait for the earliest `R` or `L` to come
//! due.
//!
//! Readings chosen:
//! * Tags are computed when a request reaches the head of its tenant's queue, from the
//!   previous request's tags and its own arrival time; the queues are FIFO, so this is
//!   the paper's arrival-time tagging, and the reduction after a weight-phase dispatch
//!   applies to the next head only (the later ones derive from it).
//! * **Reading: `P` advances by the request's cost in device time, and weights are
//!   scale-free.** The paper's `1/w` per request shares requests: beside 512 B, 4 KiB
//!   and 1 MiB tenants, or a replayed trace, the worst tenant got 0.06–0.10 of what its
//!   slice of the device gives it alone, where the policies sharing device time got
//!   0.78–1.49. dmClock gives each request a cost; here it is the device time the host's
//!   cost model stamps on it ([`crate::types::Request::cost`]), the currency every other
//!   proportional policy shares. The step is `c × (Σw / n) / w` with `Σw / n` the mean
//!   weight of the tenants the policy was built with (fixed after): multiplying every
//!   weight by the same factor gives the same steps (exactly, for integer weights: both
//!   are the correctly rounded quotient of the same number), so the same dispatches. In
//!   the paper's tags `P = max(P' + 1/w, t)` virtual and real time meet at `t`, and the
//!   outcome depended on the weights' scale: at 41 k IOPS a weight-2 tenant's `P` ran
//!   seconds ahead of real time, and with weights ×10⁴ a backlogged reader stalled for
//!   5 s where ×10⁵ did not. Reservations and limits stay in requests a second (IOPS,
//!   as users write them).
//! * **Reading: a tenant that becomes backlogged starts at the virtual time of all
//!   active tenants**, queued or in the device: `P = max(P', v) + c / w`, with `v` the
//!   start (`max(P', v)`) of the last request dispatched by weight (SFQ's virtual time,
//!   which dmClock's idle-tag adjustment approximates with the smallest tag among the
//!   active clients). The paper lifts a newcomer to the smallest `P` among the
//!   requests *queued in the host*; with a busy tenant's requests all in the device, a
//!   returning tenant kept a stale tag and won every pick, and a weight-2 reader
//!   backlogged all the time got nothing for the 5 s of a weight-1 writer's burst. So an
//!   idle spell earns nothing and costs nothing, and a tenant sending less than its
//!   share is served at `v`, ahead of backlogged tenants whose tags ran past it.
//!   dmClock's anticipation window is `anticipation_ms` (default 0, as dmClock's): a
//!   tenant whose queue emptied less than that long ago keeps `P'`, for clients that
//!   send their next request as the last completes.
//! * A backlogged tenant is served at least once every `max_wait_ms` (500) by the
//!   service floor ([`super::floor`]), which charges its `P` nothing (the floor's
//!   reading is mClock's own: a reservation of two requests a second for every
//!   tenant). With 1,024 tenants of weights 1–1000 exact shares left tenants unserved
//!   for 1.0–1.2 s. A tenant held by its limit is not owed the floor: its wait counts
//!   from when the limit lets it go.
//! * A tenant without a reservation never enters the constraint phase; one without a
//!   limit is never held by `L`.
//! * The paper schedules into ESX's fixed-depth device queue and adapts that depth
//!   separately (PARDA); tags order only what the host still holds, so in a deep device
//!   queue a weight or a reservation arrives behind everyone's requests. The dispatch
//!   depth is [`super::depth::DispatchDepth`]: `depth = 0` (the engine's device queue
//!   only, the paper's scheduler alone; the default with turns on one disk), an
//!   integer for a fixed one, or `"auto"` (the default otherwise), with
//!   a tenant counted as *behind* when its last `P` is below virtual time (others were
//!   dispatched by weight past it), and a completion of a *timed* tenant
//!   (one with an SLO that keeps to its reservation) later than `late` × its `rt`
//!   counted as late: both shorten the device queue, and while a timed tenant is
//!   active the depth grows only after its completions came in time (the depth's
//!   module doc).
//! * **Reading: lateness is judged at `late` = 0.6 × `rt`, on tenants that keep to
//!   their reservation.** The first reading judged every tenant with an SLO at 0.85 ×
//!   `rt` (the token buckets' high water mark) and let the depth grow at every binding
//!   window without a late completion. A violator's requests beyond its reservation
//!   are owed no `rt`, yet its many completions judged the depth; a disk completes a
//!   compliant tenant's request about once per 10 ms window, so the depth grew between
//!   the evidence; and at 0.85 × `rt` the signal came only from the tail. Judging
//!   earlier, and only the tenants that keep to their reservation, brought the reserved
//!   readers on the disk and the RAID 0 array closer to their `rt`, and a live SLO
//!   tenant's tail closer to its `rt` too (measured: docs/readings.md, `mclock.rs`;
//!   docs/conformance.md).
//! * **Reading: reservations go out past the dispatch depth, and lateness is judged in
//!   the device.** The depth limits the weight phase only: a request due by its
//!   reservation tag is dispatched whatever the depth (the device then holds at most
//!   the depth plus what the reservations let out), so a reservation never waits
//!   behind a queue the depth holds back for it, and a shorter depth drains the
//!   weight-phase backlog in front of it. Lateness counts from dispatch to completion:
//!   a request that waited in the host for its tag was held by the reservation or the
//!   weights, which a shorter device queue does not cure. The first reading (depth over
//!   both phases, lateness from arrival) collapsed the depth on a disk array, where a
//!   shorter queue makes the array slower and completions stay late, and cost
//!   throughput on NVMe beside flooders; now `"auto"` keeps a reserved reader within
//!   its `rt` on the aged and clean NVMe drive in every mix of the SLO conformance
//!   matrix at close to `none`'s throughput, where with no depth of its own it missed
//!   every mix with a flooder or a violator (measured: docs/readings.md, `mclock.rs`;
//!   docs/conformance.md, "SLO conformance"). So `"auto"` is the default (decided
//!   when the policy is built), but with turns on one disk, where the turn keeps the
//!   queue. It was the default only beside a tenant with an SLO while the matrix held
//!   throughput against `none` (a tenant sending less than its share with a request
//!   always in flight also looks behind, and shortening the queue for it cost
//!   throughput there); judged by insulation, `"auto"` kept 35 of the proportional
//!   matrix's 105 cells where `0` kept 25, more on every SSD, and mClock became the
//!   default policy. Poisson arrivals at exactly the reservation rate on the RAID 0
//!   array were often late (the reservation queue is critically loaded and shrinking
//!   the depth takes the surplus the weight phase served it with) until the reading
//!   below.
//! * **Reading: an SLO without a reservation reserves its `iops`.** `{iops, size, rt}`
//!   promises `iops` requests within `rt`; mClock keeps a response time only for the
//!   requests its reservation lets out, so a tenant with an SLO and no
//!   `reservation_iops` is reserved its SLO's `iops` (as every scenario here writes
//!   them in pairs). Without it, the `db` tenant of `scenarios/three-vms-disk.toml` met
//!   its `rt` for 82.4 % of requests (99.7 % with the reservation written): mClock is
//!   the default policy, which keeps every promise a configuration writes.
//! * **Reading: a reservation kept to is served with `reservation_slack` (default 25
//!   %) to spare.** While a tenant's arrivals keep to its reservation (TA3's rate test:
//!   a bucket refilled at `r` + 5 %, 100 requests deep, one token an arrival; see
//!   [`super::token_bucket::RateTest`]), `R` advances by `1 / (r × (1 +
//!   reservation_slack))`; above it, by `1 / r`. Served at exactly `r`, a tenant
//!   arriving Poisson at its reservation rate is a queue at full load: its waits grow
//!   without bound between the bursts the weight phase happens to serve. On the RAID 0
//!   array of the SLO conformance matrix the slack is what brought the reserved reader
//!   within `rt`; on the NVMe drive and the HDD it changed nothing that mattered. With
//!   the slack for everyone, a backlogged tenant got its reservation plus the whole
//!   slack and the tenants sharing by weight lost the difference; with the rate test a
//!   backlogged tenant gets its reservation plus the test's 5 % (measured:
//!   docs/readings.md, `mclock.rs`; `scenarios/mclock-reservations.toml`). So the slack
//!   costs others only what a compliant tenant's bursts need.
//!   `reservation_slack = 0` is the paper's tag.
//! * **Reading: a reservation is a floor, not a pace** (`reservation_burst_ms`, default
//!   16 ms). A tenant within its reservation may have its `R` tag up to that much time
//!   behind its arrival: `R = max(R' + 1/r, t − burst)`, so reservation it did not use
//!   in the last moments (`r × burst` requests' worth: 32 at 2,000 IOPS, 2 at 125) lets
//!   a burst go at once instead of one request per `1 / r`. Paced, an SLO tenant beside
//!   weighted best-effort tenants that kept the device queue full left only by
//!   reservation and queued behind its own pacing, worse off than under `none`. The
//!   bound is in time, not requests, so that what all tenants together may bank is the
//!   sum of their reservations over 16 ms whatever their number: banked as requests,
//!   many small SLO tenants beside flooders fell further from their `rt`, and on the
//!   disk a reader's banked requests cost throughput where 16 ms, less than one request
//!   at 60 IOPS, costs nothing (measured: docs/readings.md, `mclock.rs`;
//!   `docs/conformance.md`). Over any window a tenant's reserved service stays within
//!   `r × (window + burst)`.
//!   `reservation_burst_ms = 0` is the paper's tag. **A tenant with an SLO banks its
//!   SLO's `burst` instead** (default one second of its rate, `R = max(R' + 1/r, t −
//!   burst / r)`): an SLO tenant arriving in bursts at 0.8 of its rate beside flooders
//!   weighted 1:4 on the aged NVMe drive met its `rt` for 46 % of requests with 16 ms
//!   banked, every one with its burst (docs/conformance.md, "SLO conformance"). Its
//!   rate test (below) deepens to the burst too, as the tenant earns it: it starts 100
//!   requests deep, so a tenant that floods from its first request is found at once.
//! * **Reading: on one disk the weight phase goes in turns** ([`super::quantum`],
//!   `quantum_ms`, default 100 on a device bound by seeks with one head, 0 elsewhere;
//!   `quantum_idle_ms`, default 4). The tenant picked by `P` keeps the disk for a
//!   quantum of real time (shorter with more tenants active, none when under 20 ms),
//!   its requests fill the disk's queue so the disk orders them, and its `P` advances
//!   by the time it held the disk instead of its requests' prices: the cost model does
//!   not know where a request lies, and a writer in a small region did 825 writes a
//!   second alone where the model prices 240. Reservations go out as before; while a
//!   request of a timed tenant is in the device, the turn sends nothing more, so it
//!   waits behind what the turn had sent; a timed tenant's request its reservation
//!   does not let out yet goes outside the turn once it has waited half its `rt` (four
//!   SLO readers in on/off bursts beside violators and flooders waited for the others'
//!   turns: 98.2 % within `rt` at seed 4, 100 % with it). In the SLO conformance
//!   matrix an SLO reader beside a sequential and a random best-effort tenant on the
//!   `hdd` model met its `rt` for 100 % of requests and the best-effort tenants kept
//!   0.80–0.97 of their slices alone, where request by request they got 0.46 or
//!   less. With turns the
//!   depth stays the engine's (`depth = 0`) unless configured: the adaptive depth
//!   shortened the queue the turn fills. An array's members serve at once and one
//!   tenant's turn left most of them idle (0.14× `none` beside an SLO reader on the
//!   RAID 0 model): no turns there by default, until they are cut per member.
//! * The tenants' heads are kept in heaps by `R`, by `L` (those held by their limit) and
//!   by `P` (those that may go by weight, and all of them for a newcomer's start), with
//!   stale entries dropped as they surface: O(log n) per request at any tenant count.
use super::depth::DispatchDepth;
use super::floor::Floor;
use super::frame::{Frame, Kind, Service};
use super::phase::{self, DEFAULT_PHASE_HOLD_MS, Phases, Pick};
use super::quantum::{Charge, DEFAULT_QUANTUM_IDLE_MS, DEFAULT_QUANTUM_MS, Quanta, Turn};
use super::token_bucket::RateTest;
use super::{Admission, Detail, Dispatch, Gauge, Observation, Policy, PolicyError, PolicyParams};
use crate::device::cost::Currency;
use crate::types::{Completion, NANOS_PER_SEC, Nanos, Request, TenantId, TenantSpec};
use rustc_hash::FxHashSet;
use serde_json::json;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The three tags of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tags {
    /// Reservation tag `R`, ns of virtual time.
    pub reservation: Nanos,
    /// Limit tag `L`, ns of virtual time.
    pub limit: Nanos,
    /// Proportional-share (weight) tag `P`, ns of virtual time.
    pub proportion: Nanos,
}

#[derive(Debug, Clone)]
struct Tenant {
    /// 1/r and 1/l in nanoseconds (`None`: no reservation / no limit).
    r_inc: Option<Nanos>,
    l_inc: Option<Nanos>,
    /// Weight of reference ÷ weight: `P` advances by cost × this (module doc).
    p_ratio: f64,
    /// Where the head's `P` started (`max(P', v)`): the virtual time its dispatch by
    /// weight reaches, and what a floor dispatch leaves `P` at.
    head_start: Nanos,
    /// When its queue last emptied (`None` while it has requests queued, or before
    /// its first): within `anticipation` of it the tenant keeps its `P'`.
    idle_since: Option<Nanos>,
    /// Tags of the previous request (`None` before the first).
    last: Option<Tags>,
    /// Tags of the head of the queue.
    head: Option<Tags>,
    /// Bumped whenever the head changes: older heap entries are stale.
    generation: u64,
    by_reservation: u64,
    by_weight: u64,
    by_floor: u64,
    /// The SLO's response time (`None` without an SLO).
    rt: Option<Nanos>,
    /// 1/(r × (1 + `reservation_slack`)): `R`'s step while the tenant keeps to `r`.
    r_inc_slack: Option<Nanos>,
    /// Whether the tenant's arrivals keep to its reservation (`None`: no reservation).
    rate: Option<RateTest>,
    /// Whether its latest arrival found it within its reservation.
    within: bool,
    /// How much of its reservation, in time, it may bank when its SLO states a burst
    /// (`None`: `reservation_burst_ms`).
    r_burst: Option<Nanos>,
}

impl Tenant {
    /// Whether its completions are judged against its SLO's `rt`: it has an SLO and
    /// keeps to its reservation (a violator's requests past it are owed no `rt`).
    fn timed(&self) -> bool {
        self.rt.is_some() && self.within
    }
}

/// A heap entry: (tag, tenant, generation), smallest tag first (ties: lower tenant).
type Entry = Reverse<(Nanos, TenantId, u64)>;

/// The mClock scheduler.
#[derive(Debug, Clone)]
pub struct MClock {
    /// Queues, depth and floor ([`super::frame`]; requests out by a reservation go
    /// outside the depth and the floor).
    frame: Frame,
    tenants: Vec<Tenant>,
    /// Heads of tenants with a reservation, by `R`.
    by_r: BinaryHeap<Entry>,
    /// Heads held by their limit (`L` in the future when tagged), by `L`.
    by_l: BinaryHeap<Entry>,
    /// With turns on: heads of tenants with an SLO, by when half their `rt` has passed
    /// since arrival (module doc).
    by_deadline: BinaryHeap<Entry>,
    /// Heads that may go by weight (no limit, or `L` come due), by `P`, per kind of
    /// their request ([`phase::kind`]: reads, writes).
    by_p: [BinaryHeap<Entry>; 2],
    /// Virtual time: the largest start of a `P` dispatched in the weight phase
    /// (module doc).
    virtual_time: Nanos,
    /// The weight `P`'s steps are measured against: the sum and count of the weights
    /// the policy was built with (`None` before the first tenant).
    weight_ref: Option<(f64, f64)>,
    /// `anticipation_ms`, ns.
    anticipation: Nanos,
    /// A completion of a timed tenant later than `late` × its `rt` is late.
    late: f64,
    /// `reservation_slack` (module doc).
    slack: f64,
    /// `reservation_burst_ms`: how much of its reservation, in time, a tenant within it
    /// may have unused recently and still use at once (ns).
    burst: Nanos,
    /// Turns on a seek-bound device (`quantum_ms`; module doc).
    quanta: Option<Quanta>,
    /// Read and write phases on flash (`phase_window_ms`; [`super::phase`]).
    phases: Option<Phases>,
    /// `P` where the current turn started.
    turn_start: Nanos,
    /// Requests in the device that went out by the reservation of a timed tenant: a
    /// turn sends nothing more while one is there (module doc).
    timed_out: FxHashSet<u64>,
}

/// `reservation_slack` by default (module doc).
const DEFAULT_RESERVATION_SLACK: f64 = 0.25;

/// `reservation_burst_ms` by default (module doc).
const DEFAULT_RESERVATION_BURST_MS: f64 = 16.0;

/// The reservation test's tolerance, burst (requests) and ticks a second: TA3's rate
/// test (`rate_slack`, `rate_window_requests`, `refill_hz`).
const RATE_TOLERANCE: f64 = 0.05;
const RATE_TEST_REQUESTS: f64 = 100.0;
const RATE_TEST_HZ: f64 = 1000.0;

/// A round of turns without a service floor (`max_wait_ms = 0`), ns.
const ROUND_WITHOUT_FLOOR: Nanos = 500_000_000;

/// `late` by default (module doc).
const DEFAULT_LATE: f64 = 0.6;

fn inverse(rate: f64) -> Nanos {
    (NANOS_PER_SEC as f64 / rate).round().max(1.0) as Nanos
}

impl MClock {
    /// Builds mClock from its dispatch depth, `late`, `reservation_slack` and
    /// `reservation_burst` (reservations, limits and weights come from the tenants).
    pub fn build(
        params: &mut PolicyParams,
        tenants: &[TenantSpec],
    ) -> Result<Box<dyn Policy>, PolicyError> {
        // Turns by default on one disk (an array's members serve at once: a turn of
        // one tenant leaves most of them idle).
        let one_disk = params.device().is_some_and(|d| d.seeks()) && params.actuators() == Some(1);
        let quantum_ms = params.f64_or(
            "quantum_ms",
            if one_disk { DEFAULT_QUANTUM_MS } else { 0.0 },
        )?;
        if !(0.0..=10_000.0).contains(&quantum_ms) {
            return Err(params.invalid(
                "quantum_ms",
                format!("must be in [0, 10000] ms, got {quantum_ms}"),
            ));
        }
        // The depth adapts unless told otherwise, or unless turns keep it (module doc).
        let depth = DispatchDepth::from_params(params, tenants.len(), quantum_ms == 0.0)?;
        let late = params.f64_or("late", DEFAULT_LATE)?;
        if !(late > 0.0 && late <= 10.0) {
            return Err(params.invalid("late", format!("must be in (0, 10], got {late}")));
        }
        let slack = params.f64_or("reservation_slack", DEFAULT_RESERVATION_SLACK)?;
        if !(0.0..=1.0).contains(&slack) {
            return Err(params.invalid(
                "reservation_slack",
                format!("must be in [0, 1], got {slack}"),
            ));
        }
        let burst_ms = params.f64_or("reservation_burst_ms", DEFAULT_RESERVATION_BURST_MS)?;
        if !(0.0..=10_000.0).contains(&burst_ms) {
            return Err(params.invalid(
                "reservation_burst_ms",
                format!("must be in [0, 10000] ms, got {burst_ms}"),
            ));
        }
        let anticipation_ms = params.f64_or("anticipation_ms", 0.0)?;
        if !(0.0..=10_000.0).contains(&anticipation_ms) {
            return Err(params.invalid(
                "anticipation_ms",
                format!("must be in [0, 10000] ms, got {anticipation_ms}"),
            ));
        }
        let floor = Floor::from_params(params, tenants.len())?;
        let quantum_idle_ms = params.f64_or("quantum_idle_ms", DEFAULT_QUANTUM_IDLE_MS)?;
        if !(0.0..=1_000.0).contains(&quantum_idle_ms) {
            return Err(params.invalid(
                "quantum_idle_ms",
                format!("must be in [0, 1000] ms, got {quantum_idle_ms}"),
            ));
        }
        // Read and write phases only when asked for ([`super::phase`]: measured, they
        // do not pay as a default).
        let window_ms = params.f64_or("phase_window_ms", 0.0)?;
        let hold_ms = params.f64_or("phase_hold_ms", DEFAULT_PHASE_HOLD_MS)?;
        for (name, v) in [("phase_window_ms", window_ms), ("phase_hold_ms", hold_ms)] {
            if !(0.0..=10_000.0).contains(&v) {
                return Err(params.invalid(name, format!("must be in [0, 10000] ms, got {v}")));
            }
        }
        let mut m = MClock::with(tenants, depth, late, slack);
        m.frame = m.frame.with_floor(floor);
        if window_ms > 0.0 {
            m.phases = Some(Phases::new(
                (window_ms * 1e6) as Nanos,
                (hold_ms * 1e6) as Nanos,
            ));
        }
        if quantum_ms > 0.0 {
            m.quanta = Some(Quanta::new(
                (quantum_ms * 1e6) as Nanos,
                (quantum_idle_ms * 1e6) as Nanos,
                m.frame.floor_max_wait().unwrap_or(ROUND_WITHOUT_FLOOR),
            ));
        }
        m.burst = (burst_ms * 1e6) as Nanos;
        m.anticipation = (anticipation_ms * 1e6) as Nanos;
        Ok(Box::new(m))
    }

    /// mClock over `tenants`, with each one's reservation, limit (IOPS) and weight, and
    /// no dispatch depth of its own (the paper's scheduler alone, without slack, burst,
    /// anticipation or service floor).
    pub fn new(tenants: &[TenantSpec]) -> Self {
        Self::with(
            tenants,
            DispatchDepth::fixed(tenants.len(), 0),
            DEFAULT_LATE,
            0.0,
        )
    }

    fn with(tenants: &[TenantSpec], depth: DispatchDepth, late: f64, slack: f64) -> Self {
        let mut m = MClock {
            frame: Frame::new(tenants, depth, Floor::new(tenants.len(), None)),
            tenants: Vec::new(),
            by_r: BinaryHeap::new(),
            by_l: BinaryHeap::new(),
            by_deadline: BinaryHeap::new(),
            by_p: [BinaryHeap::new(), BinaryHeap::new()],
            virtual_time: 0,
            weight_ref: None,
            anticipation: 0,
            late,
            slack,
            burst: 0,
            quanta: None,
            phases: None,
            turn_start: 0,
            timed_out: FxHashSet::default(),
        };
        if !tenants.is_empty() {
            let sum: f64 = tenants.iter().map(|t| t.weight).sum();
            m.weight_ref = Some((sum, tenants.len() as f64));
        }
        m.tenants = tenants.iter().map(|t| m.tenant(t, 0)).collect();
        for (i, x) in m.tenants.iter().enumerate() {
            m.frame.set_timed(i as TenantId, x.timed());
        }
        m
    }

    fn tenant(&self, spec: &TenantSpec, now: Nanos) -> Tenant {
        let reservation = reservation(spec);
        Tenant {
            rt: spec.slo.map(|slo| slo.rt_nanos()),
            r_inc: reservation.map(inverse),
            r_inc_slack: reservation.map(|r| inverse(r * (1.0 + self.slack))),
            // Within its SLO's burst a tenant keeps to its rate.
            rate: reservation.map(|r| {
                let depth = spec.slo.map_or(RATE_TEST_REQUESTS, |s| {
                    s.burst_requests().max(RATE_TEST_REQUESTS)
                });
                // The burst beyond the test's own depth is earned by sending under
                // the rate.
                RateTest::new(r, RATE_TOLERANCE, depth, RATE_TEST_HZ, now)
                    .starting_with(RATE_TEST_REQUESTS)
            }),
            // A tenant with an SLO banks its burst of reservation.
            r_burst: spec
                .slo
                .zip(reservation)
                .map(|(s, r)| crate::types::secs_to_nanos(s.burst_requests() / r)),
            within: true,
            l_inc: spec.limit_iops.map(inverse),
            p_ratio: self.ratio(spec.weight),
            head_start: 0,
            idle_since: None,
            last: None,
            head: None,
            generation: 0,
            by_reservation: 0,
            by_weight: 0,
            by_floor: 0,
        }
    }

    /// Tags of tenant `t`'s head request, if it has one.
    pub fn head_tags(&self, t: TenantId) -> Option<Tags> {
        self.tenants[t as usize].head
    }

    /// Whether an entry is its tenant's current head's.
    fn live(&self, e: &Entry) -> bool {
        let Reverse((_, t, g)) = *e;
        let x = &self.tenants[t as usize];
        x.head.is_some() && x.generation == g
    }

    /// The first live entry of `heap`, dropping stale ones.
    fn peek(
        &mut self,
        which: fn(&mut MClock) -> &mut BinaryHeap<Entry>,
    ) -> Option<(Nanos, TenantId)> {
        loop {
            let top = *which(self).peek()?;
            if self.live(&top) {
                let Reverse((tag, t, _)) = top;
                return Some((tag, t));
            }
            which(self).pop();
        }
    }

    /// Weight of reference ÷ `weight` (module doc).
    fn ratio(&self, weight: f64) -> f64 {
        self.weight_ref.map_or(1.0, |(sum, n)| sum / (n * weight))
    }

    /// What a request costing `cost` adds to its tenant's `P`.
    fn step(x: &Tenant, cost: u64) -> Nanos {
        // A float cast saturates: a tiny weight gives a huge step, never a wrap.
        ((cost.max(1) as f64 * x.p_ratio).round() as Nanos).max(1)
    }

    /// Tags the head of tenant `t` from the previous tags and its arrival, and lists
    /// it; a tenant that just became backlogged starts no lower than virtual time
    /// unless it was idle for less than the anticipation window.
    fn tag_head(&mut self, t: usize, newly_backlogged: bool, now: Nanos) {
        let Some(r) = self.frame.front(t as TenantId).copied() else {
            self.tenants[t].head = None;
            return;
        };
        let (v, anticipation) = (self.virtual_time, self.anticipation);
        let x = &mut self.tenants[t];
        let burst = x.r_burst.unwrap_or(self.burst);
        let at = r.arrival;
        let next = |prev: Option<Nanos>, inc: Nanos| prev.map_or(at, |p| (p + inc).max(at));
        let anticipated = x
            .idle_since
            .is_some_and(|idle| now.saturating_sub(idle) < anticipation);
        let previous = x.last.map_or(0, |l| l.proportion);
        let start = if newly_backlogged && !anticipated {
            previous.max(v)
        } else {
            previous
        };
        x.idle_since = None;
        x.head_start = start;
        let proportion = start.saturating_add(Self::step(x, r.cost));
        let r_inc = if x.within { x.r_inc_slack } else { x.r_inc }.unwrap_or(0);
        let reservation = match (x.last, x.within) {
            // Within its reservation, what of it went unused in the last `burst` lets
            // a burst go at once (module doc).
            (Some(l), true) if burst > 0 => (l.reservation + r_inc).max(at.saturating_sub(burst)),
            (last, _) => next(last.map(|l| l.reservation), r_inc),
        };

        let tags = Tags {
            reservation,
            limit: next(x.last.map(|l| l.limit), x.l_inc.unwrap_or(0)),
            proportion,
        };
        x.head = Some(tags);
        x.generation += 1;
        let g = x.generation;
        let tid = t as TenantId;
        if x.r_inc.is_some() {
            self.by_r.push(Reverse((tags.reservation, tid, g)));
        }
        if let (Some(rt), true, true) = (x.rt, x.within, self.quanta.is_some()) {
            self.by_deadline
                .push(Reverse((at.saturating_add(rt / 2), tid, g)));
        }
        if x.l_inc.is_some() && tags.limit > now {
            self.by_l.push(Reverse((tags.limit, tid, g)));
        } else {
            self.by_p[phase::kind(r.op)].push(Reverse((tags.proportion, tid, g)));
        }
    }

    /// Moves the heads whose limit came due by `now` to the weight phase's heap.
    fn promote(&mut self, now: Nanos) {
        while let Some((l, t)) = self.peek(|m| &mut m.by_l) {
            if l > now {
                break;
            }
            self.by_l.pop();
            let x = &self.tenants[t as usize];
            let head = x.head.expect("a live entry has a head");
            let kind = phase::kind(self.frame.front(t).expect("a head is queued").op);
            self.by_p[kind].push(Reverse((head.proportion, t, x.generation)));
        }
    }

    /// Takes tenant `t`'s head for the device, by its reservation, by weight, or by
    /// the service floor (which charges its `P` nothing and hands `R` back).
    fn take(&mut self, t: usize, by: Phase, now: Nanos) -> Request {
        let cost = self
            .frame
            .front(t as TenantId)
            .expect("a tenant taken has a head")
            .cost
            .max(1) as f64;
        let service = match by {
            Phase::Reservation => Service::Outside,
            Phase::Weight | Phase::Turn | Phase::Deadline => Service::Share(cost),
            Phase::Floor => Service::Floor(cost),
        };
        let (request, more) = self.frame.take(t as TenantId, now, service);
        let x = &mut self.tenants[t];
        let mut tags = x.head.take().expect("head is tagged");
        x.generation += 1;
        match by {
            Phase::Reservation => {
                x.by_reservation += 1;
                if x.timed() && self.quanta.is_some() {
                    self.timed_out.insert(request.id);
                }
            }
            Phase::Weight => {
                x.by_weight += 1;
                self.virtual_time = self.virtual_time.max(x.head_start);
            }
            Phase::Turn | Phase::Deadline => {
                // In a turn: the turn's start set virtual time and its time is charged
                // at its end. Outside it: charged its price, and the turn waits for it.
                x.by_weight += 1;
                if by == Phase::Deadline {
                    self.timed_out.insert(request.id);
                }
            }
            Phase::Floor => {
                x.by_floor += 1;
                tags.proportion = x.head_start;
            }
        }
        // Service outside the reservation does not count against it.
        if let (Some(inc), false) = (x.r_inc, by == Phase::Reservation) {
            tags.reservation = tags.reservation.saturating_sub(inc);
        }
        x.last = Some(tags);
        if !more {
            x.idle_since = Some(now);
        }
        self.tag_head(t, false, now);
        request
    }

    /// The turns' part of the weight phase ([`super::quantum`]): a timed tenant's head
    /// that waited half its `rt`, then the turn's decision; `None` when no turn is on
    /// (pick by weight, which starts one).
    fn by_turn(&mut self, now: Nanos, reservation_due: Option<Nanos>) -> Option<Dispatch> {
        // With turns, a tenant with an SLO whose head has waited half its `rt` goes
        // now, outside the turn (module doc).
        while self.quanta.is_some()
            && let Some((due, t)) = self.peek(|m| &mut m.by_deadline)
            && due <= now
        {
            self.by_deadline.pop();
            let x = &self.tenants[t as usize];
            let head = x.head.expect("a live entry has a head");
            if x.l_inc.is_none() || head.limit <= now {
                return Some(Dispatch::Request(self.take(
                    t as usize,
                    Phase::Deadline,
                    now,
                )));
            }
        }
        let mut turn = Turn::Free;
        if let Some(q) = self.quanta.as_mut() {
            let frame = &self.frame;
            let (now_turn, charge) = q.poll(now, |t| frame.is_backlogged(t));
            if let Some(c) = charge {
                self.charge(c, now);
            }
            turn = now_turn;
        }
        // A floor dispatch due now but over the floor's budget waits for dispatches by
        // weight: not a time to be woken at.
        let floor_ahead = self.frame.floor_next_due().filter(|&at| at > now);
        match turn {
            // A timed tenant's request is in the device: the turn waits until it is
            // served, so it waits behind at most what the turn had sent.
            Turn::Open(_) if !self.timed_out.is_empty() => {
                Some(wait_or_idle([reservation_due, floor_ahead], now))
            }
            Turn::Open(t) => {
                let x = &self.tenants[t as usize];
                let head = x.head.expect("an open turn's tenant has a request queued");
                if x.l_inc.is_none() || head.limit <= now {
                    let request = self.take(t as usize, Phase::Turn, now);
                    self.quanta
                        .as_mut()
                        .expect("turns come from quanta")
                        .dispatched(
                            request.tenant,
                            request.id,
                            now,
                            self.frame.queues().active(),
                        );
                    return Some(Dispatch::Request(request));
                }
                // Held by its limit: its turn waits for it.
                Some(wait_or_idle(
                    [Some(head.limit), reservation_due, floor_ahead],
                    now,
                ))
            }
            Turn::Hold(until) => Some(wait_or_idle([until, reservation_due, floor_ahead], now)),
            Turn::Free => None,
        }
    }

    /// Charges a turn that ended: its tenant's `P` is where the turn started plus the
    /// time it held the device (module doc of [`super::quantum`]).
    fn charge(&mut self, c: Charge, now: Nanos) {
        let t = c.tenant as usize;
        let x = &mut self.tenants[t];
        let step = ((c.device_ns as f64 * x.p_ratio).round() as Nanos).max(1);
        let last = x.last.as_mut().expect("a turn dispatched");
        last.proportion = self.turn_start.saturating_add(step);
        if x.head.is_some() {
            x.head = None;
            x.generation += 1;
            self.tag_head(t, false, now);
        }
    }
}

impl MClock {
    /// The tenant whose head goes by weight now: the smallest `P` among the heads that
    /// may go (with phases: of the phase's kind, unless the first by weight has nothing
    /// in the device); `Err(t)` while a phase waits until `t` for its kind's next
    /// request, `None` without a head.
    fn weight_head(&mut self, now: Nanos) -> Option<Result<TenantId, Nanos>> {
        let smallest = [self.peek(|m| &mut m.by_p[0]), self.peek(|m| &mut m.by_p[1])];
        // One order over both kinds: tags, then tenants, as one heap.
        let first = match smallest {
            [Some(r), Some(w)] => Some(r.min(w)),
            [a, b] => a.or(b),
        };
        let Some(phases) = self.phases.as_mut() else {
            return first.map(|(_, t)| Ok(t));
        };
        // The first by weight with nothing in the device goes whatever the phase: a
        // light tenant does not wait out the other kind's phase.
        if let Some((_, t)) = first
            && self.frame.queues().in_flight_of(t) == 0
        {
            return Some(Ok(t));
        }
        let writes = self.frame.in_device_of_kind(Kind::Write);
        let in_device = [self.frame.queues().in_flight() - writes, writes];
        match phases.pick(now, smallest.map(|s| s.map(|(tag, _)| tag)), in_device)? {
            Pick::Kind(k) => {
                let (_, t) = smallest[k].expect("the kind picked has a head");
                Some(Ok(t))
            }
            Pick::Wait(until) => Some(Err(until)),
        }
    }
}

/// The IOPS `spec` reserves: its `reservation_iops`, or without one its SLO's `iops`
/// (module doc).
fn reservation(spec: &TenantSpec) -> Option<f64> {
    spec.reservation_iops.or(spec.slo.map(|s| s.iops))
}

/// Waits for the earliest of `times`, or idles without one.
fn wait_or_idle<const N: usize>(times: [Option<Nanos>; N], now: Nanos) -> Dispatch {
    match times.into_iter().flatten().min() {
        Some(at) => Dispatch::Wait(at.max(now + 1)),
        None => Dispatch::Idle,
    }
}

/// How a request left the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Its reservation tag came due.
    Reservation,
    /// By weight (smallest `P` among heads under their limit).
    Weight,
    /// By weight in the turn of a tenant picked by weight ([`super::quantum`]).
    Turn,
    /// By weight, outside the turn: a tenant with an SLO whose head waited half its
    /// `rt`.
    Deadline,
    /// By the service floor.
    Floor,
}

impl Policy for MClock {
    fn name(&self) -> &'static str {
        "mclock"
    }

    fn enqueue(&mut self, request: Request, now: Nanos) -> Admission {
        let t = request.tenant as usize;
        let x = &self.tenants[t];
        // Behind: others were dispatched by weight past this tenant's last `P`.
        let behind = x.last.is_some_and(|l| l.proportion < self.virtual_time);
        debug_assert_eq!(x.head.is_some(), self.frame.is_backlogged(request.tenant));
        let x = &mut self.tenants[t];
        if let Some(rate) = x.rate.as_mut() {
            rate.arrive(now);
            x.within = !rate.over(now);
        }
        let timed = x.timed();
        let tenant = request.tenant;
        let head = self.frame.arrive(request, now, behind);
        self.frame.set_timed(tenant, timed);
        if head {
            // With phases a tenant's requests wait out the other kind's phase in the
            // device and in the host: one with requests in the device is not back from
            // idle, and keeps its `P` (virtual time ran ahead with the other phase).
            let idle = self.phases.is_none() || self.frame.queues().in_flight_of(tenant) == 0;
            self.tag_head(t, idle, now);
        }
        Admission::Queued
    }

    fn dispatch(&mut self, now: Nanos) -> Dispatch {
        // Constraint phase: reservations that are due.
        if let Some((r, t)) = self.peek(|m| &mut m.by_r)
            && r <= now
        {
            return Dispatch::Request(self.take(t as usize, Phase::Reservation, now));
        }
        let reservation_due = self.peek(|m| &mut m.by_r).map(|(r, _)| r);
        // Weight phase among tenants under their limit, within the dispatch depth.
        if !self.frame.may_dispatch(now) {
            return reservation_due.map_or(Dispatch::Idle, |at| Dispatch::Wait(at.max(now + 1)));
        }
        self.promote(now);
        while let Some(t) = self.frame.floor_due(now) {
            let head = self.tenants[t as usize]
                .head
                .expect("the floor names backlogged tenants");
            if self.tenants[t as usize].l_inc.is_some() && head.limit > now {
                // Held by its limit: not owed the floor until the limit lets it go.
                self.frame.floor_postpone(t, head.limit);
                continue;
            }
            return Dispatch::Request(self.take(t as usize, Phase::Floor, now));
        }
        if let Some(d) = self.by_turn(now, reservation_due) {
            return d;
        }
        let head = self.weight_head(now);
        if let Some(Err(until)) = head {
            // A phase waits for its kind's next request. A floor dispatch due now but
            // over the floor's budget waits for dispatches by weight, as in a turn.
            let limit_due = self.peek(|m| &mut m.by_l).map(|(l, _)| l);
            let floor_ahead = self.frame.floor_next_due().filter(|&at| at > now);
            return wait_or_idle([Some(until), reservation_due, limit_due, floor_ahead], now);
        }
        if let Some(Ok(t)) = head {
            let start = self.tenants[t as usize].head_start;
            let request = self.take(t as usize, Phase::Weight, now);
            if let Some(q) = self.quanta.as_mut() {
                self.turn_start = start;
                q.dispatched(
                    request.tenant,
                    request.id,
                    now,
                    self.frame.queues().active(),
                );
            }
            return Dispatch::Request(request);
        }
        let limit_due = self.peek(|m| &mut m.by_l).map(|(l, _)| l);
        let floor_due = self.frame.floor_next_due();
        match [reservation_due, limit_due, floor_due]
            .into_iter()
            .flatten()
            .min()
        {
            Some(at) => Dispatch::Wait(at.max(now + 1)),
            None => Dispatch::Idle,
        }
    }

    fn complete(&mut self, completion: &Completion, now: Nanos) {
        let t = completion.request.tenant;
        let _ = self.frame.complete(completion, now);
        let x = &self.tenants[t as usize];
        // Late in the device: a request that waited here for its tag was held by the
        // reservation or the weights, which a shorter device queue does not cure.
        let took = completion.finish.saturating_sub(completion.start);
        let judged =
            x.rt.filter(|_| x.timed())
                .map(|rt| took > (rt as f64 * self.late) as Nanos);
        self.timed_out.remove(&completion.request.id);
        if let Some(late) = judged {
            self.frame.timed(t, now, late);
        }
        if let Some(c) = self
            .quanta
            .as_mut()
            .and_then(|q| q.completed(completion.request.id, completion.request.cost, now))
        {
            self.charge(c, now);
        }
    }

    fn add_tenant(&mut self, spec: &TenantSpec, now: Nanos) -> TenantId {
        if self.weight_ref.is_none() {
            self.weight_ref = Some((spec.weight, 1.0));
        }
        let x = self.tenant(spec, now);
        let timed = x.timed();
        self.tenants.push(x);
        let id = self.frame.add(spec, now);
        self.frame.set_timed(id, timed);
        id
    }

    fn update_tenant(&mut self, tenant: TenantId, spec: &TenantSpec, now: Nanos) {
        let fresh = self.tenant(spec, now);
        let x = &mut self.tenants[tenant as usize];
        if x.r_inc != fresh.r_inc {
            x.rate = fresh.rate;
            x.within = true;
        }
        x.r_inc = fresh.r_inc;
        x.r_inc_slack = fresh.r_inc_slack;
        x.r_burst = fresh.r_burst;
        x.l_inc = fresh.l_inc;
        x.p_ratio = fresh.p_ratio;
        x.rt = fresh.rt;
        let timed = x.timed();
        self.frame.set_timed(tenant, timed);
        self.frame.set_weight(tenant, spec.weight);
    }

    fn queued(&self) -> usize {
        self.frame.queues().queued()
    }

    fn withdraw_all(&mut self) -> Vec<Request> {
        for x in &mut self.tenants {
            x.head = None;
            x.generation += 1;
        }
        self.by_r.clear();
        self.by_l.clear();
        self.by_deadline.clear();
        self.by_p.iter_mut().for_each(BinaryHeap::clear);
        if let Some(q) = self.quanta.as_mut() {
            q.clear();
        }
        self.frame.withdraw_all()
    }

    fn observe(&self, detail: Detail) -> Observation {
        Observation::of(detail, self.gauges(), || self.report())
    }

    fn currency(&self) -> Currency {
        Currency::DeviceTime
    }

    fn check(&self) -> Result<(), String> {
        self.frame.check()?;
        if let Some(q) = &self.quanta {
            q.check(self.frame.queues().in_flight())?;
        }
        let mut in_p = vec![0u8; self.tenants.len()];
        let mut in_r = vec![0u8; self.tenants.len()];
        for e in self.by_p.iter().flatten().chain(&self.by_l) {
            if self.live(e) {
                in_p[e.0.1 as usize] += 1;
            }
        }
        for e in &self.by_r {
            if self.live(e) {
                in_r[e.0.1 as usize] += 1;
            }
        }
        for (i, x) in self.tenants.iter().enumerate() {
            let t = i as TenantId;
            if x.head.is_some() != self.frame.is_backlogged(t) {
                return Err(format!("tenant {t}: head tagged = {}", x.head.is_some()));
            }
            let Some(h) = x.head else { continue };
            // A head's tags never go back behind the previous request's.
            if let Some(l) = x.last
                && (h.proportion <= l.proportion || h.limit < l.limit)
            {
                return Err(format!("tenant {t}: tags went back: {l:?} then {h:?}"));
            }
            if h.proportion <= x.head_start {
                return Err(format!(
                    "tenant {t}: P {} not after its start",
                    h.proportion
                ));
            }
            if in_p[i] == 0 || (x.r_inc.is_some() && in_r[i] == 0) {
                return Err(format!("tenant {t}: its head is in no heap"));
            }
        }
        Ok(())
    }
}

impl MClock {
    /// The gauges of [`Policy::observe`].
    fn gauges(&self) -> Vec<Gauge> {
        let mut g = Vec::from(self.frame.gauges());
        for (i, t) in self.tenants.iter().enumerate() {
            g.push(Gauge::tenant(
                "by_reservation_total",
                "Requests dispatched in the reservation phase",
                i,
                t.by_reservation as f64,
            ));
            g.push(Gauge::tenant(
                "by_weight_total",
                "Requests dispatched in the weight phase",
                i,
                t.by_weight as f64,
            ));
            g.push(Gauge::tenant(
                "by_floor_total",
                "Requests dispatched by the service floor",
                i,
                t.by_floor as f64,
            ));
        }
        g
    }

    /// The report part of [`Policy::observe`].
    fn report(&self) -> serde_json::Value {
        let tenants: Vec<_> = self
            .tenants
            .iter()
            .map(|x| {
                json!({
                    "by_reservation": x.by_reservation,
                    "by_weight": x.by_weight,
                    "by_floor": x.by_floor,
                })
            })
            .collect();
        json!({
            "tenants": tenants,
            "depth": self.frame.depth_report(),
            "floor_dispatches": self.frame.floor_dispatches(),
            "turns": self.quanta.as_ref().map(Quanta::turns),
            "phases": self.phases.as_ref().map(Phases::switches),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::TestPolicy;
    use crate::policy::test_request;

    fn spec(name: &str, weight: f64, r: Option<f64>, l: Option<f64>) -> TenantSpec {
        TenantSpec {
            reservation_iops: r,
            limit_iops: l,
            ..TenantSpec::weighted(name, weight)
        }
    }

    fn next(p: &mut dyn Policy, now: Nanos) -> Option<(TenantId, u64)> {
        match p.dispatch(now) {
            Dispatch::Request(r) => Some((r.tenant, r.id)),
            _ => None,
        }
    }

    /// Completes `r` (dispatched at 0) at `finish`, lets the window end and reads the
    /// depth gauge.
    fn depth_after(p: &mut dyn Policy, r: Request, finish: Nanos) -> Option<f64> {
        p.complete(
            &Completion {
                request: r,
                start: 0,
                finish,
            },
            finish,
        );
        // A window holds 32 completions, or ends after a hundred times its 10 ms.
        let _ = p.dispatch(1_010_000_000);
        p.observe(Detail::Gauges)
            .gauges
            .iter()
            .find(|g| g.name == "depth")
            .map(|g| g.value)
    }

    /// With `depth = "auto"`, a completion of an SLO tenant later than 0.6 × its `rt`
    /// shortens the device queue at the window's end; one in time leaves it alone.
    #[test]
    fn a_late_slo_completion_shortens_the_auto_depth() {
        let run = |finish_ms: u64| {
            let tenants = [
                crate::policy::test_slo_tenant("reader", 1000.0, 10_000),
                spec("writer", 1.0, None, None),
            ];
            let mut params = crate::policy::test_params("mclock", toml::toml! { depth = "auto" });
            let mut p = MClock::build(&mut params, &tenants).unwrap();
            for id in 0..40 {
                p.put(crate::policy::test_request(id, 1, 4096, 0), 0);
            }
            let r = crate::policy::test_request(100, 0, 4096, 0);
            p.put(r, 0);
            let mut out = 0;
            while let Dispatch::Request(_) = p.dispatch(0) {
                out += 1;
            }
            assert_eq!(out, 41, "no limit of its own yet");
            depth_after(p.as_mut(), r, finish_ms * 1_000_000)
        };
        // The writer's 40 went by weight (the reader's, reserved by its SLO, past the
        // depth): the depth shrinks from 40 by an eighth.
        assert_eq!(run(7), Some(40.0 - 5.0), "7 ms is late for a 10 ms rt");
        assert_eq!(run(6), Some(0.0), "6 ms is in time");
    }

    /// A tenant sending past its reservation is not timed: its late completions are
    /// owed no `rt` and leave the depth alone, while a compliant one's shorten it.
    #[test]
    fn only_a_tenant_within_its_reservation_is_judged() {
        let run = |arrivals: u64| {
            let tenants = [
                TenantSpec {
                    reservation_iops: Some(1000.0),
                    ..crate::policy::test_slo_tenant("slo", 1000.0, 10_000)
                },
                spec("writer", 1.0, None, None),
            ];
            let mut params = crate::policy::test_params("mclock", toml::toml! { depth = "auto" });
            let mut p = MClock::build(&mut params, &tenants).unwrap();
            for id in 0..40 {
                p.put(crate::policy::test_request(id, 1, 4096, 0), 0);
            }
            // `arrivals` at once: 200 is twice the rate test's burst of 100.
            let reqs: Vec<_> = (0..arrivals)
                .map(|i| crate::policy::test_request(100 + i, 0, 4096, 0))
                .collect();
            for r in &reqs {
                p.put(*r, 0);
            }
            let mut first = None;
            while let Dispatch::Request(r) = p.dispatch(0) {
                if r.tenant == 0 && first.is_none() {
                    first = Some(r);
                }
            }
            depth_after(p.as_mut(), first.unwrap(), 9_000_000)
        };
        assert_ne!(run(1), Some(0.0), "compliant and late: the depth shrinks");
        assert_eq!(run(200), Some(0.0), "past its reservation: not judged");
    }

    #[test]
    fn a_reservation_kept_to_is_served_with_slack_and_one_exceeded_without() {
        let tenants = [spec("A", 1.0, Some(1000.0), None)];
        let mut p = MClock::with(
            &tenants,
            DispatchDepth::fixed(tenants.len(), 0),
            DEFAULT_LATE,
            0.25,
        );
        p.put(test_request(0, 0, 4096, 0), 0);
        assert_eq!(next(&mut p, 0), Some((0, 0)));
        // Within its reservation: the next R is 1 / 1,250 s on.
        p.put(test_request(1, 0, 4096, 0), 0);
        assert_eq!(p.head_tags(0).unwrap().reservation, 800_000);
        // 150 arrivals at once empty its rate test (100 requests deep): over the
        // reservation, R steps by 1 / 1,000 s.
        for id in 2..152 {
            p.put(test_request(id, 0, 4096, 0), 0);
        }
        assert!(!p.tenants[0].within);
        assert_eq!(next(&mut p, 800_000), Some((0, 1)));
        assert_eq!(p.head_tags(0).unwrap().reservation, 1_800_000);
    }

    /// Back from a pause, a tenant within its reservation may use at once what of it
    /// went unused in the last `reservation_burst_ms`: at 1,000 IOPS and 16 ms, 17
    /// requests (tags 84 … 100 ms) go out together, the 18th at its pace; with 0, the
    /// paper's tag, one.
    #[test]
    fn a_reservation_left_unused_for_the_burst_goes_out_at_once() {
        let run = |burst_ms: f64| {
            let tenants = [
                spec("A", 1.0, Some(1000.0), None),
                spec("B", 1.0, None, None),
            ];
            let mut params = crate::policy::test_params(
                "mclock",
                toml::toml! { depth = 1
                reservation_slack = 0.0
                reservation_burst_ms = burst_ms },
            );
            let mut p = MClock::build(&mut params, &tenants).unwrap();
            p.put(test_request(0, 1, 4096, 0), 0);
            assert!(matches!(p.dispatch(0), Dispatch::Request(r) if r.tenant == 1));
            p.put(test_request(1, 0, 4096, 0), 0);
            assert!(matches!(p.dispatch(0), Dispatch::Request(r) if r.id == 1));
            for id in 2..32 {
                p.put(test_request(id, 0, 4096, 100_000_000), 100_000_000);
            }
            let mut at_once = 0;
            while let Dispatch::Request(r) = p.dispatch(100_000_000) {
                assert_eq!(r.tenant, 0, "B waits for the depth");
                at_once += 1;
            }
            (at_once, p.dispatch(100_000_000))
        };
        assert_eq!(run(16.0), (17, Dispatch::Wait(101_000_000)));
        assert_eq!(run(0.0), (1, Dispatch::Wait(101_000_000)));
    }

    #[test]
    fn reservations_go_out_past_the_dispatch_depth() {
        // Depth 1: B's first request fills it; A's reservations still go out at their
        // tags (1 ms apart, no slack), and the depth counts only B's.
        let tenants = [
            spec("A", 1.0, Some(1000.0), None),
            spec("B", 1.0, None, None),
        ];
        let mut params = crate::policy::test_params(
            "mclock",
            toml::toml! { depth = 1
            reservation_slack = 0.0 },
        );
        let mut p = MClock::build(&mut params, &tenants).unwrap();
        for id in 0..3 {
            p.put(test_request(id, 0, 4096, 0), 0);
            p.put(test_request(10 + id, 1, 4096, 0), 0);
        }
        let mut got = Vec::new();
        while let Dispatch::Request(r) = p.dispatch(0) {
            got.push(r.id);
        }
        assert_eq!(
            got,
            vec![0, 10],
            "A by reservation, B by weight within the depth"
        );
        assert_eq!(p.dispatch(0), Dispatch::Wait(1_000_000), "A's next R");
        match p.dispatch(1_000_000) {
            Dispatch::Request(r) => assert_eq!(r.id, 1),
            other => panic!("A's reservation past the depth, got {other:?}"),
        }
        assert_eq!(p.dispatch(1_000_000), Dispatch::Wait(2_000_000));
        let outstanding = p
            .observe(Detail::Gauges)
            .gauges
            .iter()
            .find(|g| g.name == "outstanding")
            .map(|g| g.value);
        assert_eq!(
            outstanding,
            Some(3.0),
            "two by reservation, one within the depth"
        );
    }

    #[test]
    fn tag_arithmetic_on_a_hand_computed_case() {
        // A: reservation 1000 IOPS (1 ms), weight 1. B: weight 4, limit 500 IOPS (2 ms).
        // Mean weight 2.5: a 4 KiB request (4,096 ns of device time in these tests)
        // steps A's P by 4,096 × 2.5 = 10,240 and B's by 4,096 × 2.5 / 4 = 2,560.
        // Three requests each, all arriving at t = 0.
        let mut p = MClock::new(&[
            spec("A", 1.0, Some(1000.0), None),
            spec("B", 4.0, None, Some(500.0)),
        ]);
        for id in 0..3 {
            p.put(test_request(id, 0, 4096, 0), 0);
            p.put(test_request(10 + id, 1, 4096, 0), 0);
        }
        // First heads: R and L at the arrival, P one step past virtual time (0).
        let first = |proportion| Tags {
            reservation: 0,
            limit: 0,
            proportion,
        };
        assert_eq!(p.head_tags(0), Some(first(10_240)));
        assert_eq!(p.head_tags(1), Some(first(2_560)));
        // t = 0: A's R = 0 is due → A by reservation. A's next: R 1 ms, P 20,480.
        assert_eq!(next(&mut p, 0), Some((0, 0)));
        assert_eq!(
            p.head_tags(0),
            Some(Tags {
                reservation: 1_000_000,
                limit: 0,
                proportion: 20_480
            })
        );
        // Still t = 0: no R due; weight phase: B (P 2,560, L 0 ≤ now). B's next: P
        // 5,120, L 2 ms.
        assert_eq!(next(&mut p, 0), Some((1, 10)));
        assert_eq!(p.head_tags(1).unwrap().limit, 2_000_000);
        assert_eq!(p.head_tags(1).unwrap().proportion, 5_120);
        // B is held by its limit (L 2 ms) and A's R is 1 ms away, but A has no limit:
        // A by weight (work-conserving), which hands A's R back: the next head gets
        // R = 1 ms again, not 2 ms.
        assert_eq!(next(&mut p, 0), Some((0, 1)));
        assert_eq!(
            p.head_tags(0),
            Some(Tags {
                reservation: 1_000_000,
                limit: 0,
                proportion: 30_720
            })
        );
        assert_eq!(
            p.virtual_time, 10_240,
            "the start of A's P dispatched by weight"
        );
        assert_eq!(next(&mut p, 0), Some((0, 2)));
        // Only B is left, held by its limit until 2 ms, then every 2 ms.
        assert_eq!(p.dispatch(0), Dispatch::Wait(2_000_000));
        assert_eq!(next(&mut p, 2_000_000), Some((1, 11)));
        assert_eq!(p.dispatch(2_000_000), Dispatch::Wait(4_000_000));
        assert_eq!(next(&mut p, 4_000_000), Some((1, 12)));
        assert_eq!(p.dispatch(4_000_000), Dispatch::Idle);
        assert_eq!(p.report_json()["tenants"][0]["by_reservation"], 1);
        assert_eq!(p.report_json()["tenants"][0]["by_weight"], 2);
        assert_eq!(p.report_json()["tenants"][1]["by_weight"], 3);
        p.check().unwrap();
    }

    #[test]
    fn idle_tenants_bank_no_credit_and_newcomers_join_at_virtual_time() {
        let mut p = MClock::new(&[spec("A", 1.0, None, None), spec("B", 1.0, None, None)]);
        // A alone for a while: its P steps 4,096 a request.
        for id in 0..5 {
            p.put(test_request(id, 0, 4096, 0), 0);
        }
        for _ in 0..3 {
            assert_eq!(next(&mut p, 0).map(|x| x.0), Some(0));
        }
        // Virtual time is where A's third request started (8,192); A's head starts at
        // 12,288. B arrives at 10 ms and starts at virtual time, not at its P' (0): it
        // cannot take the service it did not ask for.
        assert_eq!(p.virtual_time, 8_192);
        p.put(test_request(100, 1, 4096, 10_000_000), 10_000_000);
        p.put(test_request(101, 1, 4096, 10_000_000), 10_000_000);
        assert_eq!(p.head_tags(1).unwrap().proportion, 12_288);
        let order: Vec<_> = (0..4).filter_map(|_| next(&mut p, 10_000_000)).collect();
        assert_eq!(order, vec![(1, 100), (0, 3), (1, 101), (0, 4)]);
        // After an idle spell, the reservation tag restarts at the arrival time.
        let mut q = MClock::new(&[spec("A", 1.0, Some(10.0), None)]);
        q.put(test_request(1, 0, 4096, 0), 0);
        assert_eq!(next(&mut q, 0), Some((0, 1)));
        q.put(test_request(2, 0, 4096, 5_000_000_000), 5_000_000_000);
        assert_eq!(q.head_tags(0).unwrap().reservation, 5_000_000_000);
    }

    /// The ids `p` dispatches, in order, for a workload of mixed sizes and weights:
    /// three tenants, requests arriving every 10 µs, completions 50 µs after dispatch,
    /// the device holding at most 8.
    fn dispatches(weights: [f64; 3]) -> Vec<u64> {
        let tenants: Vec<_> = weights
            .iter()
            .enumerate()
            .map(|(i, &w)| spec(&format!("t{i}"), w, None, None))
            .collect();
        let mut p = MClock::new(&tenants);
        let sizes = [512u32, 4096, 1 << 20];
        let mut in_flight: std::collections::VecDeque<(Nanos, Request)> = Default::default();
        let mut out = Vec::new();
        let mut id = 0;
        for step in 0..3_000u64 {
            let now = step * 10_000;
            while in_flight.front().is_some_and(|(at, _)| *at <= now) {
                let (at, r) = in_flight.pop_front().unwrap();
                p.complete(
                    &Completion {
                        request: r,
                        start: at - 50_000,
                        finish: at,
                    },
                    now,
                );
            }
            // Tenant 1 pauses now and then: it comes back from idle.
            for t in 0..3u32 {
                if t == 1 && (step / 200) % 3 == 2 {
                    continue;
                }
                id += 1;
                p.put(test_request(id, t, sizes[t as usize], now), now);
            }
            while in_flight.len() < 8 {
                let Dispatch::Request(r) = p.dispatch(now) else {
                    break;
                };
                out.push(r.id);
                in_flight.push_back((now + 50_000, r));
            }
            p.check().unwrap();
        }
        out
    }

    /// The weights' scale is not a setting: weights 1:2:3 and the same ×10⁵ give the
    /// same dispatches, request for request.
    #[test]
    fn weights_times_a_hundred_thousand_dispatch_the_same() {
        let small = dispatches([1.0, 2.0, 3.0]);
        let large = dispatches([1e5, 2e5, 3e5]);
        assert!(small.len() > 2_000, "{}", small.len());
        assert_eq!(small, large);
        assert_ne!(small, dispatches([3.0, 2.0, 1.0]), "the ratio does matter");
    }

    /// `P` steps by device time: a 1 MiB tenant and a 4 KiB one of equal weight, both
    /// backlogged, get equal device time, not equal requests.
    #[test]
    fn equal_weights_share_device_time_not_requests() {
        let mut p = MClock::new(&[spec("big", 1.0, None, None), spec("small", 1.0, None, None)]);
        for id in 0..1_000 {
            p.put(test_request(id, 0, 1 << 20, 0), 0);
            p.put(test_request(10_000 + id, 1, 4096, 0), 0);
        }
        let mut time = [0u64; 2];
        for _ in 0..600 {
            let Dispatch::Request(r) = p.dispatch(0) else {
                panic!("backlogged")
            };
            time[r.tenant as usize] += r.cost;
        }
        // 2 MiB of device time for the large one against 2.3 MiB for the small one:
        // within one large request of each other.
        let gap = time[0].abs_diff(time[1]);
        assert!(gap <= 1 << 20, "{time:?}");
    }

    /// A tenant whose requests are all in the device while another comes back from
    /// idle: the returning tenant starts at virtual time and the busy one keeps its
    /// turn (the paper's lift to the smallest *queued* tag left the returning tenant
    /// with its stale tag, winning every pick).
    #[test]
    fn a_tenant_back_from_idle_does_not_starve_one_whose_requests_are_in_the_device() {
        let mut p = MClock::new(&[
            spec("reader", 2.0, None, None),
            spec("writer", 1.0, None, None),
        ]);
        // The writer is served early, then goes idle; the reader runs alone for long.
        p.put(test_request(1, 1, 4096, 0), 0);
        assert_eq!(next(&mut p, 0), Some((1, 1)));
        let mut id = 100;
        for _ in 0..10_000 {
            id += 1;
            p.put(test_request(id, 0, 4096, 0), 0);
            assert_eq!(next(&mut p, 0).map(|x| x.0), Some(0));
        }
        // The reader's requests are all in the device (nothing queued); the writer
        // returns with a burst of 100, then the reader sends again.
        for k in 0..100 {
            p.put(test_request(50_000 + k, 1, 4096, 1), 1);
        }
        for k in 0..100 {
            p.put(test_request(60_000 + k, 0, 4096, 1), 1);
        }
        let first: Vec<_> = (0..30)
            .filter_map(|_| next(&mut p, 1))
            .map(|x| x.0)
            .collect();
        let reader = first.iter().filter(|&&t| t == 0).count();
        // Weights 2:1: the reader gets two of every three.
        assert_eq!(reader, 20, "{first:?}");
    }

    /// The floor serves a backlogged tenant of weight 1 beside one of weight 10⁶ at
    /// least every `max_wait_ms`, without charging its `P`.
    #[test]
    fn the_floor_bounds_a_light_tenants_wait() {
        let tenants = [
            spec("heavy", 1e6, None, None),
            spec("light", 1.0, None, None),
        ];
        let mut params = crate::policy::test_params("mclock", toml::toml! { max_wait_ms = 10.0 });
        let mut p = MClock::build(&mut params, &tenants).unwrap();
        for id in 0..100_000 {
            p.put(test_request(id, 0, 4096, 0), 0);
        }
        p.put(test_request(1_000_000, 1, 4096, 0), 0);
        p.put(test_request(1_000_001, 1, 4096, 0), 0);
        // By weight the light tenant would wait for about a million of the heavy
        // one's requests (mean weight 500,000.5: steps of 2,048 against 2.05 × 10⁹);
        // the floor serves it every 10 ms.
        let mut light = Vec::new();
        for k in 0..30_000u64 {
            let now = k * 1_000;
            if let Dispatch::Request(r) = p.dispatch(now) {
                if r.tenant == 1 {
                    light.push(now);
                }
                p.complete(&crate::policy::test_completion(r, now), now);
            }
            p.check().unwrap();
        }
        assert_eq!(light.len(), 2, "{light:?}");
        assert!(light[0] <= 10_001_000, "{light:?}");
        assert!(light[1] - light[0] <= 10_001_000, "{light:?}");
        let floor = p.observe(Detail::Full).report["floor_dispatches"].clone();
        assert_eq!(floor, 2);
    }

    /// With turns, one tenant at a time is dispatched by weight, for a quantum of
    /// real time, and each turn is charged the time it held the device: a tenant whose
    /// requests take twice as long gets half as many, the same time.
    /// A tenant with an SLO and no reservation is reserved its SLO's IOPS: its request
    /// goes by reservation ahead of a tenant that is first by weight.
    #[test]
    fn an_slo_without_a_reservation_reserves_its_iops() {
        let tenants = [
            spec("bulk", 1.0, None, None),
            crate::policy::test_slo_tenant("db", 100.0, 50_000),
        ];
        let mut params = crate::policy::test_params("mclock", toml::Table::new());
        let mut p = MClock::build(&mut params, &tenants).unwrap();
        for id in 0..10 {
            p.put(test_request(id, 0, 4096, 0), 0);
        }
        p.put(test_request(10, 1, 4096, 0), 0);
        match p.dispatch(0) {
            Dispatch::Request(r) => assert_eq!(r.id, 10, "the reserved request first"),
            other => panic!("expected a request, got {other:?}"),
        }
        let report = p.observe(Detail::Full).report;
        assert_eq!(report["tenants"][1]["by_reservation"], 1);
        assert_eq!(report["tenants"][0]["by_reservation"], 0);
    }

    /// With `phase_window_ms`, a reader and a writer of equal weight go in phases: each
    /// tenant's first request at once (nothing of its in the device), then the reads
    /// until their tags pass the writes' by the window, then the writes, which wait a
    /// while for their next when all are in the device; each kind's tags stay within a
    /// window of the other's.
    #[test]
    fn phases_send_one_kind_at_a_time_and_keep_the_tags_together() {
        let tenants = [
            spec("reader", 1.0, None, None),
            spec("writer", 1.0, None, None),
        ];
        // A window of 3 µs of virtual time: three 1 µs requests ahead of the other kind;
        // a phase waits 1 ms for its kind's next request.
        let mut params = crate::policy::test_params(
            "mclock",
            toml::toml! { phase_window_ms = 0.003
            phase_hold_ms = 1.0 },
        );
        let mut p = MClock::build(&mut params, &tenants).unwrap();
        for id in 0..16 {
            let mut r = test_request(id, (id % 2) as TenantId, 1000, 0);
            if r.tenant == 1 {
                r.op = crate::types::Op::Write;
            }
            p.put(r, 0);
        }
        let burst = |p: &mut Box<dyn Policy>, now: Nanos| {
            let mut tenants = Vec::new();
            let next = loop {
                match p.dispatch(now) {
                    Dispatch::Request(r) => tenants.push(r.tenant),
                    other => break other,
                }
                p.check().unwrap();
            };
            (tenants, next)
        };
        // P of the reads 1..8 µs, of the writes 1..8 µs: the first of each at once, the
        // reads to 5 µs (within 3 µs of the writer's next, 2 µs), the writes to the
        // last (all within 3 µs of the reads' next, 6 µs), then a wait of 1 ms.
        let (first, next) = burst(&mut p, 0);
        assert_eq!(first, [0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(next, Dispatch::Wait(1_000_000));
        // No write came: the reads' phase, for the other three.
        let (second, next) = burst(&mut p, 1_000_000);
        assert_eq!(second, [0, 0, 0]);
        assert_eq!(next, Dispatch::Idle);
        assert_eq!(p.observe(Detail::Full).report["phases"], 2);
    }

    #[test]
    fn turns_serve_one_tenant_at_a_time_and_charge_the_time_it_held() {
        let tenants = [spec("fast", 1.0, None, None), spec("slow", 1.0, None, None)];
        let mut params = crate::policy::test_params(
            "mclock",
            toml::toml! { quantum_ms = 10.0
            quantum_idle_ms = 1.0 },
        );
        let mut p = MClock::build(&mut params, &tenants).unwrap();
        for id in 0..200 {
            p.put(test_request(id, (id % 2) as TenantId, 4096, 0), 0);
        }
        // One request at a time on the device: 1 ms for the fast tenant's, 2 ms for
        // the slow one's.
        let mut now = 0;
        let mut order = Vec::new();
        while now < 100_000_000 {
            match p.dispatch(now) {
                Dispatch::Request(r) => {
                    let took = if r.tenant == 0 { 1_000_000 } else { 2_000_000 };
                    p.complete(
                        &Completion {
                            request: r,
                            start: now,
                            finish: now + took,
                        },
                        now + took,
                    );
                    order.push(r.tenant);
                    now += took;
                }
                Dispatch::Wait(at) => now = at,
                Dispatch::Idle => break,
            }
            p.check().unwrap();
        }
        let turn = |t: TenantId, n: usize| std::iter::repeat_n(t, n);
        let expected: Vec<TenantId> = (0..5).flat_map(|_| turn(0, 10).chain(turn(1, 5))).collect();
        assert_eq!(order, expected);
        assert_eq!(p.observe(Detail::Full).report["turns"], 10);
    }

    /// A timed tenant's request in the device stops the turn's dispatches until it
    /// completes: it waits behind what the turn had sent, not behind what it sends.
    #[test]
    fn a_timed_request_in_the_device_holds_the_turn() {
        let tenants = [
            spec("flood", 1.0, None, None),
            TenantSpec {
                reservation_iops: Some(100.0),
                ..crate::policy::test_slo_tenant("slo", 100.0, 50_000)
            },
        ];
        let mut params = crate::policy::test_params("mclock", toml::toml! { quantum_ms = 100.0 });
        let mut p = MClock::build(&mut params, &tenants).unwrap();
        for id in 0..50 {
            p.put(test_request(id, 0, 4096, 0), 0);
        }
        assert_eq!(next(p.as_mut(), 0), Some((0, 0)));
        assert_eq!(next(p.as_mut(), 0), Some((0, 1)));
        p.put(test_request(100, 1, 4096, 1_000_000), 1_000_000);
        // It goes by its reservation at once; the turn then waits for it.
        let slo = match p.dispatch(1_000_000) {
            Dispatch::Request(r) => r,
            other => panic!("the reservation is due: {other:?}"),
        };
        assert_eq!(slo.id, 100);
        assert!(!matches!(p.dispatch(1_000_000), Dispatch::Request(_)));
        p.complete(
            &Completion {
                request: slo,
                start: 1_000_000,
                finish: 3_000_000,
            },
            3_000_000,
        );
        assert_eq!(next(p.as_mut(), 3_000_000), Some((0, 2)));
        p.check().unwrap();
    }

    /// With turns, a timed tenant's request that its reservation does not let out yet
    /// goes once it has waited half its `rt`, whoever's turn it is, and holds the turn.
    #[test]
    fn a_timed_request_goes_outside_the_turn_at_half_its_rt() {
        let tenants = [
            spec("flood", 1.0, None, None),
            TenantSpec {
                reservation_iops: Some(1.0),
                ..crate::policy::test_slo_tenant("slo", 1.0, 50_000)
            },
        ];
        let mut params = crate::policy::test_params("mclock", toml::toml! { quantum_ms = 100.0 });
        let mut p = MClock::build(&mut params, &tenants).unwrap();
        for id in 0..50 {
            p.put(test_request(id, 0, 4096, 0), 0);
        }
        assert_eq!(next(p.as_mut(), 0), Some((0, 0)));
        // The first goes by its reservation and completes.
        p.put(test_request(100, 1, 4096, 1_000_000), 1_000_000);
        let first = match p.dispatch(1_000_000) {
            Dispatch::Request(r) => r,
            other => panic!("the reservation is due: {other:?}"),
        };
        assert_eq!(first.id, 100);
        p.complete(
            &Completion {
                request: first,
                start: 1_000_000,
                finish: 2_000_000,
            },
            2_000_000,
        );
        // The second is not due by reservation for 0.8 s: the turn goes on...
        p.put(test_request(101, 1, 4096, 3_000_000), 3_000_000);
        assert_eq!(next(p.as_mut(), 3_000_000), Some((0, 1)));
        assert_eq!(next(p.as_mut(), 27_999_999), Some((0, 2)));
        // ...until it has waited 25 ms; then the turn waits for it.
        assert_eq!(next(p.as_mut(), 28_000_000), Some((1, 101)));
        assert!(!matches!(p.dispatch(28_000_000), Dispatch::Request(_)));
        p.check().unwrap();
    }
}
