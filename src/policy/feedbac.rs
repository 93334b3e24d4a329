//! `feedbac`: feedback-based allocation of credits — FeedBAC (P. Kwon, S. Ahn, "Dynamic
//! Bandwidth Distribution Method for High Performance Non-volatile Memory in Cloud
//! Computing Environment").
//!
//! * **Credit allocator.** Every allocation period (`period_ms`) each *active* tenant
//!   (requests queued or in flight, or seen within the last period: see below) receives
//!   `C × w_i / Σ_active w` credits, where `C` is `headroom` × the forecast of what the
//!   device will consume in one period. Any tenant with credits left and a queued
//!   request may dispatch — no idling. The last request may overdraw; the debt is paid
//!   from the next allocation. Inactive tenants get nothing and keep nothing.
//! * **Reading: a credit is device time** (`cost = "device"`, the default): a request
//!   costs what the device spends on it by its cost model ([`crate::device::cost`], stamped by
//!   the host), and the forecast is of the device's *work rate* — device time dispatched
//!   per second — not of bytes acknowledged. The paper's credit is a byte (`cost =
//!   "bytes"`, its literal reading) or a request (`"requests"`, or `cost_per_io =
//!   true`). Bytes mislead twice: a 512 B write costs an SSD a page and a 1 MiB
//!   sequential read costs a disk a few milliseconds where a 4 KiB random one costs six,
//!   so byte-fair credits wrecked throughput beside small writers and on disks; and a
//!   write-back drive acknowledges a write before its program and garbage collection are
//!   paid, so acknowledged bytes forecast a capacity the drive does not have for long.
//!   A write is charged at dispatch what it will cost: its program and the garbage
//!   collection the drive's state implies (the model's write amplification). Dispatches
//!   still follow the device's acknowledgements (a slot frees when a request completes),
//!   so on a write-back drive the work dispatched per period swings with the buffer's
//!   drain; the predictor (below) bounds what it learns at the device's work rate and
//!   does not chase the swings (FeedBAC Fig. 5 in `docs/reproduction.md`).
//! * **Reading: credits are spent evenly through the period.** Among the tenants that
//!   may dispatch, the one with the most credits left per unit of weight goes first
//!   (ties: the oldest request). The source only says who may dispatch, not in what
//!   order. Oldest-first serves every backlogged tenant at the same rate until the light
//!   ones run dry, so the heaviest tenant gets its share only in each period's tail;
//!   when the forecast is above what the device then does, the period ends before that
//!   tail is over, the heavy tenant's unspent credits pass the carry-over bound, and the
//!   split drifts towards equal (measured: docs/readings.md, `feedbac.rs`). Spending in
//!   proportion leaves every tenant the same fraction unspent, so a high forecast costs
//!   no one more than its share. `spread = false` restores oldest-first.
//! * **Reading: hand out a little less than the forecast** (`headroom`, 0.9). The two
//!   ways to miss are not alike: a low allocation costs nothing (early refill starts the
//!   next period the moment everyone has spent), a high one ends periods by the clock
//!   with credits unspent, and whoever could not spend in time — the tenant whose share
//!   needs the most turns of its closed loop — loses them. The forecast itself still
//!   learns the full consumption. Handing out less cut the share error of the FeedBAC
//!   trace replays at little cost in throughput, and on a real disk with live fio
//!   clients the heaviest tenant stopped forfeiting credits at the bound (measured:
//!   docs/readings.md, `feedbac.rs`).
//! * **Reading: a tenant seen within the last period is still active.** A closed-loop
//!   client holds nothing on the server between a burst of replies and its next
//!   requests. A period starting in that gap took the tenant out of the split (the others
//!   got its share) and zeroed its credits, and an early refill did not wait for it. On a
//!   real disk with four fio clients that was most of what the heaviest tenant lost
//!   (measured: docs/readings.md, `feedbac.rs`). So allocation and early refill count a
//!   tenant whose last arrival or completion is less than one period old; one gone
//!   longer gets nothing and keeps nothing.
//! * **Early refill.** When the tenants that could spend have exhausted their credits,
//!   the next period starts at once, so a low forecast never leaves the device idle.
//!   **Reading: who "could spend"** — two, and a choice between them (`backlog_refill`).
//!   The source refills when every active tenant is out. Read literally
//!   (`backlog_refill = false`), a tenant that asks for less than its share — a light
//!   reader beside a backlogged writer — always has credits left, so no early refill
//!   comes; the writer waits for every period's end, the device idles, and the forecast
//!   learns the throttled rate, a small fraction of `none`'s throughput on aged SATA and
//!   NVMe drives (the conformance suite's work-conservation property). So by default
//!   (`backlog_refill = true`) a tenant's credits hold the refill back only while it is
//!   not *satisfied* — it ended the last period with half its allocation or more unspent
//!   — or has requests waiting, and a tenant gone quiet holds it back for at most
//!   `period_ms`. That conserves work (measured: docs/readings.md, `feedbac.rs`).
//! * **Reading: a satisfied tenant that never runs out of work is stuck in the device.**
//!   With `backlog_refill` alone, a closed-loop tenant whose requests all sit in a deep
//!   device queue looks satisfied too (it cannot spend while the others' requests are
//!   ahead of its own), the others refill around it, and it never gets its share, as in
//!   the FeedBAC paper's own setting (weights 100:50:25:10, iodepth 32 each, device
//!   queue 128, random 50/50). Telling it from a tenant that asks for little needs its
//!   requests to wait where the policy sees them, so FeedBAC keeps its own dispatch
//!   depth ([`super::depth::DispatchDepth`], `depth = "auto"` by default): a tenant that
//!   is satisfied and yet had requests in the device all through the depth controller's
//!   window counts as behind, and the depth shrinks until its requests wait in the host,
//!   where they hold back the early refill. That brings the paper's setting back to its
//!   weights at the literal rule's throughput (measured: docs/readings.md, `feedbac.rs`).
//!   The cost is the light tenant that always has a request in flight
//!   (docs/conformance.md, "Adaptive depth"). `backlog_refill = false, depth = 0` is the
//!   paper's literal FeedBAC.
//! * **Carry-over.** Credits left when a period ends are kept, up to `carry` × the
//!   tenant's allocation (default 1: one period's worth), so a tenant that could not
//!   spend in time keeps its share but cannot hoard a burst.
//! * **Predictor.** Every prediction period (`prediction_periods` × `period_ms` of time;
//!   early refills do not shorten it), the observation
//!   `x` = credits consumed over the prediction period / its length feeds Holt's double
//!   exponential smoothing: `S = αx + (1−α)(S + b)`, `b = β(S − S_prev) + (1−β)b`,
//!   forecast `S + b`. **Reading for α:** it is re-chosen each prediction period from
//!   the relative error e = |forecast − x| / x of the forecast just tested:
//!   `α = α_min + (α_max − α_min) × min(1, e / e_full)`, with α ∈ [0.1, 0.9] and
//!   e_full = 0.2 (a 20 % miss follows at full speed), scaled by how persistently the
//!   misses keep their side: the tracking signal |E| / M, E and M the signed and the
//!   absolute relative errors smoothed with weight 0.5 (Trigg and Leach's adaptive
//!   response rate). Misses on one side (the level moved) follow at full speed; misses
//!   that alternate (a write-back drive's drain swinging about its level) barely move
//!   the forecast, which chasing them had thrown off (measured: docs/readings.md,
//!   `feedbac.rs`). β = 0.3 by default.
//!   **Reading: a trend the observation contradicts is dropped.** When the forecast
//!   missed on the side opposite to its trend, the trend is set to zero before the
//!   update: the falling trend a start-up burst leaves would otherwise hold the forecast
//!   under the device's rate for as many periods as (1 − β) takes to wear it down.
//!   **Reading: with credits of device time, an observation is bounded by the device's
//!   work rate** (`max_work_rate`, 1.5 seconds of device time a second; 0: no bound). A
//!   device charged by its fitted cost model does about one second of work a second; a
//!   write-back drive acknowledges faster while its buffer fills (measured:
//!   docs/readings.md, `feedbac.rs`), and a forecast that learns that hands out credits
//!   the device cannot honour. A low bound costs nothing (early refill), a high one
//!   would. Credits of bytes or requests have no known capacity and are not bounded.
//!   **Reading: a forecast below zero restarts.** When a burst ends, the trend can carry
//!   `S + b` below zero; the smoother then restarts from the observation (`S = x`,
//!   `b = 0`) instead of forecasting nothing for as long as the trend takes to decay.
//!   **Reading: an early refill hands out at least enough for one tenant to go on.**
//!   When every tenant with work waiting is in debt, a refill of the forecast alone may
//!   leave them all in debt: nobody is let through, nothing is consumed, the forecast
//!   (which skips idle prediction periods) never moves, and a live server stalled for
//!   good (seen with four fio clients switching from random reads to random writes on
//!   an emulated aged NVMe drive). So such a refill's total is raised, in proportion
//!   for everyone, until the tenant closest to paying its debt (relative to its weight)
//!   has credit. An earlier reading floored every period at one request for the
//!   lightest tenant; among many tenants of widely different weights that floor was far
//!   above the forecast and the allocation stopped meaning anything (measured:
//!   docs/readings.md, `feedbac.rs`). Now a tenant whose share is a fraction of a
//!   request a period carries its credit (or its debt) exactly: it dispatches when its
//!   credit is positive and pays the overdraft over the periods after.
//!   **Reading: idle spells are not observations.** A prediction period in which nothing
//!   was consumed is skipped: it measures demand, not the device, and feeding it drove
//!   the forecast to zero on a live server left idle for a while, so the first burst
//!   after it waited for credits that accrued at one byte a second.
//!
//! * **Reading: the period follows the device.** A closed-loop tenant can only spend as
//!   fast as its requests come back. When the allocation period is not long compared with
//!   the time a request spends in the device, the heaviest tenant cannot spend its
//!   allocation before the period ends, loses what exceeds the carry-over bound, and the
//!   split drifts (measured: docs/readings.md, `feedbac.rs`). So the allocation period is
//!   `max(period_ms, latency_periods × mean device time)`, the mean taken over the last
//!   prediction period and applied from the next one.
//!
//! **Reading: a returning tenant starts a period.** A tenant that becomes active (it was
//! not present: no request queued, in flight or seen within a period) in the middle of
//! a stretched period starts a new one at once, so it is served within the shortest
//! period rather than waiting for the end of one that has stretched on a slow device
//! (measured: docs/readings.md, `feedbac.rs`). Within unstretched periods it waits for
//! the next allocation (at most `period_ms`) unless an early refill comes first.
//!
//! A backlogged tenant is served at least once every `max_wait_ms` (500) by the
//! service floor ([`super::floor`]), which takes none of its credits.
//!
//! Dispatch keeps the tenants that may spend in a heap by the dispatch order, so a
//! request costs O(log n) at any tenant count; a new period rebuilds it (O(n) per
//! period, which stretches with the device's latency).
//!
//! Parameters: `period_ms` (10, the shortest period), `latency_periods` (32; 0 keeps
//! the period fixed), `spread` (true), `headroom` (0.9, in (0, 1]), `backlog_refill`
//! (true), `depth` (`"auto"`, `min_depth`, `window_ms`: [`super::depth`]),
//! `prediction_periods` (10), `carry` (1.0), `beta` (0.3), `max_work_rate` (1.5,
//! seconds of device time a second; 0: unbounded), `initial_mb_s` (64: the
//! forecast before the first observation with `cost = "bytes"`; with device time one
//! second of device time a second; early refill covers a low guess), `cost`
//! (`"device"`, the default; `"bytes"`, `"requests"`), `max_wait_ms` (500; 0: no
//! floor). Weight changes apply from the next allocation. `stats()` records predicted
//! vs consumed credits per prediction period (the paper's Fig. 5).

use super::depth::DispatchDepth;
use super::floor::Floor;
use super::frame::{Frame, Service};
use super::{Admission, Detail, Dispatch, Gauge, Observation, Policy, PolicyError, PolicyParams};
use crate::device::cost::Currency;
use crate::types::{
    Completion, NANOS_PER_SEC, Nanos, Request, TenantId, TenantSpec, nanos_to_secs, secs_to_nanos,
};
use serde::Serialize;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

const ALPHA_MIN: f64 = 0.1;
const ALPHA_MAX: f64 = 0.9;
const ERROR_FULL: f64 = 0.2;
/// Smoothing of the signed and absolute forecast errors whose ratio says whether the
/// misses persist (see [`Holt`]).
const TRACKING: f64 = 0.5;
/// Fraction of the forecast handed out per period (see the module doc).
const DEFAULT_HEADROOM: f64 = 0.9;
/// The most device time a second the forecast learns (see the module doc).
const DEFAULT_MAX_WORK_RATE: f64 = 1.5;
/// Forecast records kept for reports (the most recent ones).
const HISTORY_LIMIT: usize = 10_000;

struct Tenant {
    credits: f64,
    allocation: f64,
    /// Credits lost at the carry-over bound (or on going idle), summed.
    forfeited: f64,
    /// Last arrival or completion.
    last_seen: Option<Nanos>,
    /// It ended the last period with half its allocation or more unspent: it asks for
    /// less than its share, and its credits do not hold back an early refill.
    satisfied: bool,
    /// Bumped whenever its place in the dispatch order changes: older heap entries are
    /// stale.
    generation: u64,
}

impl Tenant {
    /// A tenant not seen yet, without credits.
    fn new() -> Self {
        Tenant {
            credits: 0.0,
            allocation: 0.0,
            forfeited: 0.0,
            last_seen: None,
            satisfied: false,
            generation: 0,
        }
    }

    /// Active (requests queued or in flight), or seen within `grace` before `now`: an
    /// allocation counts it in.
    fn present(&self, active: bool, now: Nanos, grace: Nanos) -> bool {
        active
            || self
                .last_seen
                .is_some_and(|t| now < t.saturating_add(grace))
    }
}

/// A tenant that may spend, in dispatch order: most credits left per weight first (or
/// 0 for everyone when not spreading), then the oldest head request.
#[derive(Debug, Clone, Copy)]
struct Turn {
    left: f64,
    arrival: Nanos,
    id: u64,
    tenant: TenantId,
    generation: u64,
}

impl PartialEq for Turn {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Turn {}
impl PartialOrd for Turn {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Turn {
    /// The heap pops the greatest: most `left`, then the smallest arrival and id.
    fn cmp(&self, other: &Self) -> Ordering {
        self.left
            .total_cmp(&other.left)
            .then(other.arrival.cmp(&self.arrival))
            .then(other.id.cmp(&self.id))
    }
}

/// One prediction period: what was forecast and what was consumed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ForecastRecord {
    /// End of the prediction period, seconds.
    pub t_s: f64,
    /// Credits the forecast said the period would consume.
    pub predicted: f64,
    /// Credits consumed.
    pub consumed: f64,
    /// Smoothing factor α, chosen from this period's forecast error.
    pub alpha: f64,
}

/// Holt's double exponential smoothing with an error-driven α.
#[derive(Debug, Clone)]
pub struct Holt {
    level: f64,
    trend: f64,
    alpha: f64,
    beta: f64,
    initialized: bool,
    /// Smoothed signed relative error (forecast − observation) / observation.
    error: f64,
    /// Smoothed absolute relative error.
    abs_error: f64,
}

impl Holt {
    /// A smoother with trend factor `beta`, not yet fed.
    pub fn new(beta: f64) -> Self {
        Holt {
            level: 0.0,
            trend: 0.0,
            alpha: ALPHA_MAX,
            beta,
            initialized: false,
            error: 0.0,
            abs_error: 0.0,
        }
    }

    /// Feeds an observation, given the forecast that was made for it; returns the next
    /// forecast (never below zero).
    pub fn observe(&mut self, x: f64, forecast_made: f64) -> f64 {
        if !self.initialized {
            self.level = x;
            self.trend = 0.0;
            self.initialized = true;
        } else {
            let signed = if x > 0.0 {
                ((forecast_made - x) / x).clamp(-1.0, 1.0)
            } else {
                1.0
            };
            let e = signed.abs();
            self.error = TRACKING * signed + (1.0 - TRACKING) * self.error;
            self.abs_error = TRACKING * e + (1.0 - TRACKING) * self.abs_error;
            // Misses that keep their side (a level that moved) follow at full speed;
            // misses that alternate (an observation that swings about its level) barely
            // move it.
            let persistence = if self.abs_error > 0.0 {
                (self.error.abs() / self.abs_error).min(1.0)
            } else {
                1.0
            };
            self.alpha =
                ALPHA_MIN + (ALPHA_MAX - ALPHA_MIN) * (e / ERROR_FULL).min(1.0) * persistence;
            if (x - forecast_made) * self.trend < 0.0 {
                // The trend said the other way: the forecast missed on the side opposite
                // to it. A trend learnt from a burst (a write-back buffer filling at
                // start) would otherwise drag the forecast away from the device's rate
                // for as many periods as it takes (1 − β) to wear it down.
                self.trend = 0.0;
            }
            let prev = self.level;
            self.level = self.alpha * x + (1.0 - self.alpha) * (self.level + self.trend);
            self.trend = self.beta * (self.level - prev) + (1.0 - self.beta) * self.trend;
            if self.level + self.trend <= 0.0 {
                // A falling trend (a burst that ended) carried the forecast below zero:
                // that is no forecast. Start again from what was just seen, or the
                // trend would take many periods to climb back while the device idles.
                self.level = x;
                self.trend = 0.0;
                self.error = 0.0;
                self.abs_error = 0.0;
            }
        }
        (self.level + self.trend).max(0.0)
    }

    /// The level smoothing factor α chosen at the last observation.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }
}

/// FeedBAC state.
pub struct FeedBac {
    /// Queues, depth and floor ([`super::frame`]).
    frame: Frame,
    tenants: Vec<Tenant>,
    /// Tenants that may spend (credit left, a request waiting), in dispatch order;
    /// entries whose generation is not their tenant's are stale.
    turns: BinaryHeap<Turn>,
    /// Length of the current allocation period.
    period: Nanos,
    /// `period_ms`: the shortest allocation period.
    min_period: Nanos,
    /// The period stretches to this many mean device times (0: fixed period).
    latency_periods: f64,
    /// Time requests completed in this prediction period spent in the device
    /// (dispatch to completion), summed, and their count.
    device_time_sum: f64,
    device_time_count: u64,
    /// Mean device time over the last prediction period with completions.
    device_time: f64,
    prediction_periods: u32,
    carry: f64,
    /// What credits are.
    currency: Currency,
    /// Forecast consumption rate, credits per second.
    rate: f64,
    holt: Holt,
    period_end: Nanos,
    prediction_end: Nanos,
    consumed_in_prediction: f64,
    periods: u64,
    early_refills: u64,
    /// Early refills whose total was raised so that a tenant in debt could go on.
    raised_refills: u64,
    /// Periods started early because a tenant came back.
    joins: u64,
    /// Dispatch order: most credits left per weight first (true) or oldest first.
    spread: bool,
    /// Fraction of the forecast handed out per period.
    headroom: f64,
    /// The highest observation the forecast learns, credits per second (device time
    /// only: `max_work_rate` seconds of device time a second; infinite otherwise).
    max_rate: f64,
    /// Early refill when every tenant with requests waiting is out of credits (true), or
    /// every present tenant (false).
    backlog_refill: bool,
    history: VecDeque<ForecastRecord>,
    /// How many requests may be in the device at once (`depth`).
    /// The last allocation: the total handed out, and what the tenants received of it.
    last_total: f64,
    last_allocated: f64,
    /// Where the last scan for a tenant holding back an early refill found one.
    holder: usize,
}

impl FeedBac {
    /// FeedBAC over `tenants` with allocation period `period` (ns), a prediction period
    /// of `prediction_periods` allocation periods, carry-over bound `carry` (allocations),
    /// trend factor `beta`, initial forecast `initial_rate` (credits per second) and
    /// costs per request (`cost_per_io`) or per byte.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        tenants: &[TenantSpec],
        period: Nanos,
        prediction_periods: u32,
        carry: f64,
        beta: f64,
        initial_rate: f64,
        cost_per_io: bool,
    ) -> Self {
        FeedBac {
            frame: Frame::new(
                tenants,
                DispatchDepth::fixed(tenants.len(), 0),
                Floor::new(tenants.len(), None),
            ),
            tenants: tenants.iter().map(|_| Tenant::new()).collect(),
            turns: BinaryHeap::new(),
            period: period.max(1),
            min_period: period.max(1),
            latency_periods: 0.0,
            device_time_sum: 0.0,
            device_time_count: 0,
            device_time: 0.0,
            prediction_periods: prediction_periods.max(1),
            carry,
            currency: if cost_per_io {
                Currency::Requests
            } else {
                Currency::Bytes
            },
            rate: initial_rate,
            holt: Holt::new(beta),
            period_end: 0,
            prediction_end: 0,
            consumed_in_prediction: 0.0,
            periods: 0,
            early_refills: 0,
            raised_refills: 0,
            joins: 0,
            spread: true,
            headroom: DEFAULT_HEADROOM,
            max_rate: f64::INFINITY,
            backlog_refill: false,
            history: VecDeque::new(),
            last_total: 0.0,
            last_allocated: 0.0,
            holder: 0,
        }
    }

    /// Builds FeedBAC from `period_ms`, `prediction_periods`, `carry`, `beta`, `max_work_rate`,
    /// `initial_mb_s`, `cost_per_io`, `cost`, `latency_periods`, `spread`, `headroom`,
    /// `backlog_refill`, the depth's and the floor's parameters.
    pub fn build(
        params: &mut PolicyParams,
        tenants: &[TenantSpec],
    ) -> Result<Box<dyn Policy>, PolicyError> {
        let period_ms = params.f64_or("period_ms", 10.0)?;
        let prediction = params.u64_or("prediction_periods", 10)?;
        let carry = params.f64_or("carry", 1.0)?;
        let beta = params.f64_or("beta", 0.3)?;
        let initial = params.f64_or("initial_mb_s", 64.0)?;
        let per_io = params.bool_or("cost_per_io", false)?;
        let currency = params.currency(
            "cost",
            if per_io {
                Currency::Requests
            } else {
                Currency::DeviceTime
            },
        )?;
        if per_io && currency != Currency::Requests {
            return Err(params.invalid("cost_per_io", "contradicts `cost`; give one of them"));
        }
        let latency_periods = params.f64_or("latency_periods", 32.0)?;
        let spread = params.bool_or("spread", true)?;
        let headroom = params.f64_or("headroom", DEFAULT_HEADROOM)?;
        let max_work_rate = params.f64_or("max_work_rate", DEFAULT_MAX_WORK_RATE)?;
        if max_work_rate < 0.0 {
            return Err(params.invalid("max_work_rate", "must be ≥ 0 (0: no bound)"));
        }
        let backlog_refill = params.bool_or("backlog_refill", true)?;
        let depth = DispatchDepth::from_params(params, tenants.len(), true)?;
        let floor = Floor::from_params(params, tenants.len())?;
        if !(headroom > 0.0 && headroom <= 1.0) {
            return Err(params.invalid("headroom", "must be in (0, 1]"));
        }
        if latency_periods < 0.0 {
            return Err(params.invalid("latency_periods", "must be ≥ 0"));
        }
        if period_ms <= 0.0 {
            return Err(params.invalid("period_ms", "must be > 0"));
        }
        if prediction == 0 {
            return Err(params.invalid("prediction_periods", "must be ≥ 1"));
        }
        if !(0.0..=1.0).contains(&beta) {
            return Err(params.invalid("beta", "must be between 0 and 1"));
        }
        if initial <= 0.0 {
            return Err(params.invalid("initial_mb_s", "must be > 0"));
        }
        // With per-I/O cost the initial guess is read as thousands of IOPS; with device
        // time it is one second of device time per second (a busy device).
        let initial_rate = match currency {
            Currency::Bytes => initial * 1e6,
            Currency::Requests => initial * 1e3,
            Currency::DeviceTime => NANOS_PER_SEC as f64,
        };
        Ok(Box::new(
            FeedBac::new(
                tenants,
                secs_to_nanos(period_ms / 1e3),
                prediction as u32,
                carry,
                beta,
                initial_rate,
                per_io,
            )
            .with_latency_periods(latency_periods)
            .with_spread(spread)
            .with_headroom(headroom)
            .with_max_work_rate(match currency {
                Currency::DeviceTime if max_work_rate > 0.0 => max_work_rate,
                _ => f64::INFINITY,
            })
            .with_backlog_refill(backlog_refill)
            .with_currency(currency)
            .with_depth(depth)
            .with_floor(floor),
        ))
    }

    /// Stretches the allocation period to `k` mean device times when that is longer
    /// than `period_ms` (0 keeps the period fixed).
    pub fn with_latency_periods(mut self, k: f64) -> Self {
        self.latency_periods = k;
        self
    }

    /// Bounds what the forecast learns at `seconds_per_second` of device time a second
    /// (credits of device time only; see the module doc).
    pub fn with_max_work_rate(mut self, seconds_per_second: f64) -> Self {
        self.max_rate = seconds_per_second * NANOS_PER_SEC as f64;
        self
    }

    /// Hands out `h` × the forecast each period.
    pub fn with_headroom(mut self, h: f64) -> Self {
        self.headroom = h;
        self
    }

    /// Early refill when every tenant with requests waiting is out of credits (true), or
    /// only when every present tenant is (false).
    pub fn with_backlog_refill(mut self, on: bool) -> Self {
        self.backlog_refill = on;
        self
    }

    /// The dispatch depth (`depth`: fixed, `0` = none of its own, or `"auto"`).
    pub fn with_depth(mut self, depth: DispatchDepth) -> Self {
        self.frame = self.frame.with_depth(depth);
        self
    }

    /// Serves every backlogged tenant at least as often as `floor` says.
    pub fn with_floor(mut self, floor: Floor) -> Self {
        self.frame = self.frame.with_floor(floor);
        self
    }

    /// Dispatch order: most credits left per weight first (true) or oldest first.
    pub fn with_spread(mut self, on: bool) -> Self {
        self.spread = on;
        self
    }

    /// A prediction period spans `prediction_periods` allocation periods.
    fn prediction_len(&self) -> Nanos {
        self.period * self.prediction_periods as Nanos
    }

    /// Current allocation period.
    pub fn period(&self) -> Nanos {
        self.period
    }

    /// Charges requests in `currency` (device time, bytes or requests).
    pub fn with_currency(mut self, currency: Currency) -> Self {
        self.currency = currency;
        self
    }

    /// Credits a tenant holds now.
    pub fn credits(&self, tenant: TenantId) -> f64 {
        self.tenants[tenant as usize].credits
    }

    /// Forecast consumption rate, credits per second.
    pub fn forecast_rate(&self) -> f64 {
        self.rate
    }

    /// The most recent prediction periods' forecasts, oldest first.
    pub fn forecast_history(&self) -> impl Iterator<Item = &ForecastRecord> {
        self.history.iter()
    }

    fn present(&self, t: usize, now: Nanos, grace: Nanos) -> bool {
        self.tenants[t].present(self.frame.queues().is_active(t as TenantId), now, grace)
    }

    /// Lists `tenant` in the dispatch order when it may spend (credit left, a request
    /// waiting); any older entry of its goes stale.
    fn relist(&mut self, tenant: TenantId) {
        let t = &mut self.tenants[tenant as usize];
        t.generation += 1;
        if t.credits > 0.0
            && let Some(r) = self.frame.queues().front(tenant)
        {
            let w = self.frame.weight(tenant);
            self.turns.push(Turn {
                left: if self.spread { t.credits / w } else { 0.0 },
                arrival: r.arrival,
                id: r.id,
                tenant,
                generation: t.generation,
            });
        }
    }

    /// Starts a new allocation period at `now` and hands out credits: `C × w / Σw` to
    /// every present tenant, `C` at least `min_total` (an early refill raises it so that
    /// one tenant in debt can go on).
    fn new_period(&mut self, now: Nanos, min_total: f64) {
        self.periods += 1;
        self.period_end = now + self.period;
        let grace = self.period;
        let present: Vec<bool> = (0..self.tenants.len())
            .map(|i| self.present(i, now, grace))
            .collect();
        let active_w: f64 = (0..self.tenants.len())
            .filter(|&i| present[i])
            .map(|i| self.frame.weight(i as TenantId))
            .sum();
        let forecast = self.headroom * self.rate * self.period as f64 / NANOS_PER_SEC as f64;
        let total = forecast.max(min_total);
        let mut allocated = 0.0;
        for (i, t) in self.tenants.iter_mut().enumerate() {
            t.satisfied = t.allocation > 0.0 && t.credits >= 0.5 * t.allocation;
            if present[i] && active_w > 0.0 {
                let alloc = total * self.frame.weight(i as TenantId) / active_w;
                let kept = t.credits.min(self.carry * t.allocation);
                t.forfeited += t.credits - kept;
                t.credits = kept + alloc;
                t.allocation = alloc;
                allocated += alloc;
            } else {
                t.forfeited += t.credits.max(0.0);
                t.credits = 0.0;
                t.allocation = 0.0;
            }
        }
        self.last_total = if active_w > 0.0 { total } else { 0.0 };
        self.last_allocated = allocated;
        self.turns.clear();
        for i in 0..self.tenants.len() {
            self.relist(i as TenantId);
        }
    }

    /// The smallest total an early refill must hand out for a tenant with work waiting
    /// to have credit: the least `−credits × Σw / w` over them (0 when one has credit).
    fn total_to_go_on(&self, now: Nanos) -> f64 {
        let grace = self.period;
        let active_w: f64 = (0..self.tenants.len())
            .filter(|&i| self.present(i, now, grace))
            .map(|i| self.frame.weight(i as TenantId))
            .sum();
        (0..self.tenants.len())
            .filter(|&i| self.frame.is_backlogged(i as TenantId))
            .map(|i| {
                let t = &self.tenants[i];
                let kept = t.credits.min(self.carry * t.allocation);
                // Just past zero: a whisker more than the debt.
                (-kept).max(0.0) * active_w / self.frame.weight(i as TenantId) * (1.0 + 1e-9)
                    + f64::MIN_POSITIVE
            })
            .fold(f64::INFINITY, f64::min)
    }

    /// Closes the prediction period ending at `end`: observe, forecast, record.
    fn predict(&mut self, end: Nanos) {
        if self.consumed_in_prediction == 0.0 {
            // Nobody asked for anything: an idle spell says nothing about the device, and
            // learning "0" from it would starve the first burst after it.
            return;
        }
        let secs = nanos_to_secs(self.prediction_len());
        // What the device could have done, not what it acknowledged: credits of device
        // time consumed faster than the device works went into a buffer.
        let x = (self.consumed_in_prediction / secs).min(self.max_rate);
        let forecast_made = self.rate;
        self.rate = self.holt.observe(x, forecast_made).max(1.0);
        self.history.push_back(ForecastRecord {
            t_s: nanos_to_secs(end),
            predicted: forecast_made * secs,
            consumed: self.consumed_in_prediction,
            alpha: self.holt.alpha(),
        });
        if self.history.len() > HISTORY_LIMIT {
            self.history.pop_front();
        }
        self.consumed_in_prediction = 0.0;
    }

    /// Rolls prediction and allocation periods forward to `now`; the first call starts
    /// the clock.
    fn advance(&mut self, now: Nanos) {
        if self.periods == 0 {
            self.prediction_end = now + self.prediction_len();
            self.new_period(now, 0.0);
        }

        while now >= self.prediction_end {
            let end = self.prediction_end;
            self.predict(end);
            // The allocation period follows the device time measured over the prediction
            // period just closed; the next prediction period spans as many of them.
            if self.device_time_count > 0 {
                self.device_time = self.device_time_sum / self.device_time_count as f64;
                self.device_time_sum = 0.0;
                self.device_time_count = 0;
            }
            let stretched = (self.latency_periods * self.device_time) as Nanos;
            self.period = self.min_period.max(stretched);
            self.prediction_end += self.prediction_len();
        }
        while now >= self.period_end {
            let next = self.period_end;
            self.new_period(next, 0.0);
        }
    }

    /// Whether every tenant that could spend is out of credits (two readings, see the
    /// module doc). Scans from the last tenant found holding the refill back, so a
    /// holder that stays one costs O(1) a call.
    fn exhausted(&mut self, now: Nanos) -> bool {
        let n = self.tenants.len();
        let (grace, backlog) = if self.backlog_refill {
            // A tenant gone quiet holds it back no longer than the shortest period,
            // however long the period has stretched.
            (self.min_period, true)
        } else {
            (self.period, false)
        };
        for k in 0..n {
            let i = (self.holder + k) % n;
            let t = &self.tenants[i];
            let holds = t.credits > 0.0
                && if backlog {
                    self.frame.is_backlogged(i as TenantId)
                        || self.present(i, now, grace) && !t.satisfied
                } else {
                    self.present(i, now, grace)
                };
            if holds {
                self.holder = i;
                return false;
            }
        }
        true
    }

    /// Takes `tenant`'s head for the device; `charged`: from its credits (the floor's
    /// dispatches are not).
    fn take(&mut self, tenant: TenantId, now: Nanos, charged: bool) -> Request {
        let head = self
            .frame
            .front(tenant)
            .expect("a listed tenant has a head");
        let cost = self.currency.price(head) as f64;
        let service = if charged {
            self.tenants[tenant as usize].credits -= cost;
            Service::Share(cost)
        } else {
            Service::Floor(cost)
        };
        self.consumed_in_prediction += cost;
        let (r, _) = self.frame.take(tenant, now, service);
        self.relist(tenant);
        r
    }

    /// The tenant first in the dispatch order, dropping stale entries.
    fn first_turn(&mut self) -> Option<TenantId> {
        while let Some(turn) = self.turns.peek() {
            if self.tenants[turn.tenant as usize].generation == turn.generation {
                return Some(turn.tenant);
            }
            self.turns.pop();
        }
        None
    }
}

impl Policy for FeedBac {
    fn name(&self) -> &'static str {
        "feedbac"
    }

    fn enqueue(&mut self, request: Request, now: Nanos) -> Admission {
        // The first allocation waits for the first dispatch, so tenants arriving at the
        // same instant share it.
        if self.periods > 0 {
            self.advance(now);
        }
        let grace = self.period;
        let tenant = request.tenant;
        let i = tenant as usize;
        // Behind: it left half its allocation or more unspent last period (it looks
        // satisfied) while it never ran out of work (the depth controller checks that).
        let behind = self.tenants[i].satisfied;
        let newcomer = !self.present(i, now, grace);
        self.tenants[i].last_seen = Some(now);
        if self.frame.arrive(request, now, behind) {
            self.relist(tenant);
        }
        // A tenant that was away gets its credits now, not at the end of a period that
        // may have stretched to most of a second (see the module doc).
        if newcomer && self.periods > 0 && self.period > self.min_period {
            self.joins += 1;
            self.new_period(now, 0.0);
        }
        Admission::Queued
    }

    fn dispatch(&mut self, now: Nanos) -> Dispatch {
        self.advance(now);
        if !self.frame.may_dispatch(now) {
            return Dispatch::Idle;
        }
        if let Some(t) = self.frame.floor_due(now) {
            return Dispatch::Request(self.take(t, now, false));
        }
        for attempt in 0..2 {
            if let Some(t) = self.first_turn() {
                self.turns.pop();
                return Dispatch::Request(self.take(t, now, true));
            }
            if self.frame.queued() == 0 {
                return Dispatch::Idle;
            }
            // Requests wait for credits; early refill when the tenants that could spend
            // are out.
            if attempt == 0 && self.exhausted(now) {
                self.early_refills += 1;
                let need = self.total_to_go_on(now);
                let forecast =
                    self.headroom * self.rate * self.period as f64 / NANOS_PER_SEC as f64;
                if need > forecast {
                    self.raised_refills += 1;
                }
                self.new_period(now, need);
                continue;
            }
            break;
        }
        Dispatch::Wait(self.period_end)
    }

    fn complete(&mut self, completion: &Completion, now: Nanos) {
        if self.periods > 0 {
            self.advance(now);
        }
        let tenant = completion.request.tenant;
        let _ = self.frame.complete(completion, now);
        self.tenants[tenant as usize].last_seen = Some(now);
        self.device_time_sum += completion.finish.saturating_sub(completion.start) as f64;
        self.device_time_count += 1;
    }

    fn next_timer(&self) -> Option<Nanos> {
        (self.periods > 0).then_some(self.period_end.min(self.prediction_end))
    }

    fn on_timer(&mut self, now: Nanos) {
        self.advance(now);
    }

    fn update_tenant(&mut self, tenant: TenantId, spec: &TenantSpec, _now: Nanos) {
        self.frame.set_weight(tenant, spec.weight);
    }

    fn add_tenant(&mut self, spec: &TenantSpec, now: Nanos) -> TenantId {
        // No credits until the next period hands them out (a tenant that arrives with
        // work starts one early, as a tenant coming back does).
        self.tenants.push(Tenant::new());
        self.frame.add(spec, now)
    }

    fn queued(&self) -> usize {
        self.frame.queued()
    }

    fn withdraw_all(&mut self) -> Vec<Request> {
        self.turns.clear();
        for t in &mut self.tenants {
            t.generation += 1;
        }
        self.frame.withdraw_all()
    }

    fn observe(&self, detail: Detail) -> Observation {
        Observation::of(detail, self.gauges(), || self.report())
    }

    fn currency(&self) -> Currency {
        self.currency
    }

    fn check(&self) -> Result<(), String> {
        self.frame.check()?;
        // A period hands out exactly its total (in floating point, to a part in 10^9).
        if (self.last_allocated - self.last_total).abs() > 1e-9 * self.last_total.max(1.0) {
            return Err(format!(
                "the period's total was {} but the tenants received {}",
                self.last_total, self.last_allocated
            ));
        }
        if !(self.rate.is_finite() && self.rate >= 1.0) {
            return Err(format!("forecast rate {}", self.rate));
        }
        if self.consumed_in_prediction < 0.0 {
            return Err(format!("consumed {}", self.consumed_in_prediction));
        }
        let mut listed = vec![false; self.tenants.len()];
        for turn in &self.turns {
            if self.tenants[turn.tenant as usize].generation == turn.generation {
                if listed[turn.tenant as usize] {
                    return Err(format!("tenant {} listed twice", turn.tenant));
                }
                listed[turn.tenant as usize] = true;
            }
        }
        for (i, t) in self.tenants.iter().enumerate() {
            if !t.credits.is_finite() {
                return Err(format!("tenant {i}: credits {}", t.credits));
            }
            let may = t.credits > 0.0 && self.frame.is_backlogged(i as TenantId);
            if may != listed[i] {
                return Err(format!(
                    "tenant {i}: may spend = {may}, listed = {}",
                    listed[i]
                ));
            }
        }
        Ok(())
    }
}

impl FeedBac {
    /// The gauges of [`Policy::observe`].
    fn gauges(&self) -> Vec<Gauge> {
        let mut g = Vec::from(self.frame.gauges());
        g.extend([
            Gauge::policy(
                "forecast_rate",
                "Forecast device capacity, credits per second",
                self.rate,
            ),
            Gauge::policy(
                "period_seconds",
                "Length of the current allocation period",
                self.period as f64 / NANOS_PER_SEC as f64,
            ),
            Gauge::policy(
                "device_time_seconds",
                "Mean device time of a request in the last prediction period",
                self.device_time / NANOS_PER_SEC as f64,
            ),
            Gauge::policy("periods_total", "Allocation periods", self.periods as f64),
            Gauge::policy(
                "joins_total",
                "Periods started early because a tenant came back",
                self.joins as f64,
            ),
            Gauge::policy(
                "early_refills_total",
                "Periods ended early because every active tenant ran out of credits",
                self.early_refills as f64,
            ),
        ]);
        for (i, t) in self.tenants.iter().enumerate() {
            g.push(Gauge::tenant(
                "credits",
                "Credits left this period",
                i,
                t.credits,
            ));
            g.push(Gauge::tenant(
                "allocation",
                "Credits given this period",
                i,
                t.allocation,
            ));
            g.push(Gauge::tenant(
                "forfeited",
                "Credits lost at the carry-over bound or on going idle, summed",
                i,
                t.forfeited,
            ));
        }
        g
    }

    /// The report part of [`Policy::observe`].
    fn report(&self) -> serde_json::Value {
        let errors: Vec<f64> = self
            .history
            .iter()
            .skip(1)
            .filter(|r| r.consumed > 0.0)
            .map(|r| (r.predicted - r.consumed).abs() / r.consumed)
            .collect();
        let mean_error = if errors.is_empty() {
            0.0
        } else {
            errors.iter().sum::<f64>() / errors.len() as f64
        };
        serde_json::json!({
            "currency": self.currency.name(),
            "periods": self.periods,
            "period_ms": self.period as f64 / 1e6,
            "device_time_us": self.device_time / 1e3,
            "early_refills": self.early_refills,
            "raised_refills": self.raised_refills,
            "floor_dispatches": self.frame.floor_dispatches(),
            "forfeited": self.tenants.iter().map(|t| t.forfeited).collect::<Vec<_>>(),
            "forecast_mean_abs_error": mean_error,
            "forecast": self.history,
            "depth": self.frame.depth_report(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::TestPolicy;

    const MS: Nanos = 1_000_000;

    fn req(id: u64, tenant: TenantId, arrival: Nanos) -> Request {
        crate::policy::test_request(id, tenant, 4096, arrival)
    }

    /// Weights 3:1, 10 ms periods, forecast 1.6384 MB/s handed out whole → 16 384
    /// credits a period: 12 288 (3 requests) for a, 4 096 (1 request) for b.
    fn fb() -> FeedBac {
        let t = [
            TenantSpec::weighted("a", 3.0),
            TenantSpec::weighted("b", 1.0),
        ];
        FeedBac::new(&t, 10 * MS, 10, 1.0, 0.3, 1_638_400.0, false).with_headroom(1.0)
    }

    fn take(p: &mut FeedBac, now: Nanos) -> Option<u64> {
        match p.dispatch(now) {
            Dispatch::Request(r) => Some(r.id),
            _ => None,
        }
    }

    #[test]
    fn allocates_in_proportion_to_active_weights() {
        let mut p = fb();
        for i in 0..8 {
            p.put(req(i, 0, 0), 0);
            p.put(req(100 + i, 1, 0), 0);
        }
        p.on_timer(0); // the first allocation
        assert_eq!(p.credits(0), 12_288.0);
        assert_eq!(p.credits(1), 4_096.0);
        // Most credits left per weight first: 4 096 each at the start (a tie, so the
        // oldest: ids tie on arrival, so by id), then b's 4 096 beats a's 8 192 / 3.
        let got: Vec<u64> = (0..4).filter_map(|_| take(&mut p, MS)).collect();
        assert_eq!(got, vec![0, 100, 1, 2]);
    }

    #[test]
    fn without_spread_the_oldest_request_goes_first() {
        let mut p = fb().with_spread(false);
        for i in 0..8 {
            p.put(req(i, 0, 0), 0);
            p.put(req(100 + i, 1, 0), 0);
        }
        p.on_timer(0);
        let got: Vec<u64> = (0..4).filter_map(|_| take(&mut p, MS)).collect();
        assert_eq!(got, vec![0, 1, 2, 100]);
    }

    /// Closed loop, weights 3:1, 4 requests outstanding each, a device that serves
    /// 2 at a time in 1 ms, and a forecast twice what it can do: every period ends with
    /// credits unspent. Spending evenly, both tenants lose the same fraction at the
    /// carry-over bound and the split stays 3:1; oldest first, the heavy tenant is served
    /// at the light one's rate until the light one runs dry, is cut off at each
    /// period's end, and loses everything it could not spend.
    #[test]
    fn a_high_forecast_keeps_the_split_when_credits_are_spent_evenly() {
        fn run(spread: bool) -> ([u64; 2], [f64; 2]) {
            let t = [
                TenantSpec::weighted("a", 3.0),
                TenantSpec::weighted("b", 1.0),
            ];
            // 2 requests per ms is 8 192 000 B/s; forecast 16 384 000 B/s, fixed period.
            let mut p = FeedBac::new(&t, 10 * MS, 1_000, 1.0, 0.3, 16_384_000.0, false)
                .with_headroom(1.0)
                .with_spread(spread);
            let mut id = 0;
            for tenant in 0..2 {
                for _ in 0..4 {
                    id += 1;
                    p.put(req(id, tenant, 0), 0);
                }
            }
            let mut served = [0u64; 2];
            let mut in_device: Vec<Request> = Vec::new();
            for ms in 0..1_000u64 {
                let now = ms * MS;
                // Last millisecond's requests complete; their tenants send the next.
                for r in in_device.drain(..) {
                    let tenant = r.tenant;
                    p.complete(
                        &Completion {
                            request: r,
                            start: now - MS,
                            finish: now,
                        },
                        now,
                    );
                    id += 1;
                    p.put(req(id, tenant, now), now);
                }
                p.on_timer(now);
                while in_device.len() < 2
                    && let Dispatch::Request(r) = p.dispatch(now)
                {
                    served[r.tenant as usize] += 1;
                    in_device.push(r);
                }
            }
            (served, [p.tenants[0].forfeited, p.tenants[1].forfeited])
        }
        // The device is always full (2 000 requests in 1 s) either way.
        let (even, lost) = run(true);
        assert_eq!(even, [1_500, 500]);
        assert!(lost[1] > 0.0);
        assert_eq!(lost[0], 3.0 * lost[1]);
        let (oldest, lost) = run(false);
        assert_eq!(oldest, [1_000, 1_000]);
        assert!(lost[0] > 0.0);
        assert_eq!(lost[1], 0.0);
    }

    #[test]
    fn early_refill_fires_exactly_when_the_last_active_tenant_runs_out() {
        let mut p = fb();
        for i in 0..8 {
            p.put(req(i, 0, 0), 0);
        }
        p.put(req(100, 1, 0), 0);
        p.put(req(101, 1, 0), 0);
        p.on_timer(0);
        for _ in 0..4 {
            take(&mut p, MS).unwrap();
        }
        assert_eq!(p.early_refills, 0);
        assert_eq!(p.credits(0), 0.0);
        assert_eq!(p.credits(1), 0.0);
        // Both active tenants are at zero: the next dispatch refills at once (at 1 ms,
        // not at the 10 ms period end) and the new period ends at 11 ms.
        assert_eq!(take(&mut p, MS), Some(3));
        assert_eq!(p.early_refills, 1);
        assert_eq!(p.period_end, 11 * MS);
    }

    #[test]
    fn no_early_refill_while_an_active_tenant_still_has_credits() {
        let mut p = fb();
        p.put(req(0, 0, 0), 0); // a: one request, 12 288 credits
        for i in 0..3 {
            p.put(req(100 + i, 1, 0), 0);
        }
        p.on_timer(0);
        assert_eq!(take(&mut p, 0), Some(0));
        assert_eq!(take(&mut p, 0), Some(100));
        // b is out of credits; a still has 8 192 and its request is in flight.
        assert_eq!(p.dispatch(MS), Dispatch::Wait(10 * MS));
        assert_eq!(p.early_refills, 0);
        // At the period end b gets its next allocation.
        assert_eq!(take(&mut p, 10 * MS), Some(101));
    }

    #[test]
    fn a_period_hands_out_the_headroom_fraction_of_the_forecast() {
        let t = [
            TenantSpec::weighted("a", 3.0),
            TenantSpec::weighted("b", 1.0),
        ];
        // 100 MB/s × 10 ms = 1 MB forecast for the period; 0.9 of it handed out.
        let mut p = FeedBac::new(&t, 10 * MS, 10, 1.0, 0.3, 1e8, false);
        p.put(req(0, 0, 0), 0);
        p.put(req(100, 1, 0), 0);
        p.on_timer(0);
        assert_eq!(p.credits(0) + p.credits(1), 900_000.0);
        assert_eq!(p.credits(0), 675_000.0);
    }

    /// A closed-loop client between a reply and its next request holds nothing on the
    /// server for a moment; a period that starts then still counts it in. Gone for
    /// longer than a period, it gets nothing and keeps nothing.
    #[test]
    fn a_tenant_seen_within_a_period_keeps_its_share_and_holds_back_early_refill() {
        let mut p = fb();
        p.put(req(0, 0, 0), 0);
        for i in 0..8 {
            p.put(req(100 + i, 1, 0), 0);
        }
        p.on_timer(0);
        assert_eq!(take(&mut p, 0), Some(0)); // a: 8 192 left
        assert_eq!(take(&mut p, 0), Some(100)); // b: 0 left
        let c = Completion {
            request: req(0, 0, 0),
            start: 0,
            finish: 5 * MS,
        };
        p.complete(&c, 5 * MS);
        // a holds nothing but was seen 1 ms ago: no early refill for b.
        assert_eq!(p.dispatch(6 * MS), Dispatch::Wait(10 * MS));
        assert_eq!(p.early_refills, 0);
        // At 10 ms a (seen at 5 ms) still counts: its carry and its 3/4 of the period.
        p.on_timer(10 * MS);
        assert_eq!(p.credits(0), 8_192.0 + 12_288.0);
        assert_eq!(p.credits(1), 4_096.0);
        assert_eq!(take(&mut p, 10 * MS), Some(101));
        // At 20 ms a has been gone 15 ms: b gets the whole period, a nothing.
        p.on_timer(20 * MS);
        assert_eq!(p.credits(0), 0.0);
        assert_eq!(p.tenants[0].forfeited, 8_192.0 + 12_288.0);
        assert_eq!(p.credits(1), 16_384.0);
        // And b, alone and out of credits, refills early.
        for id in 102..106 {
            assert_eq!(take(&mut p, 21 * MS), Some(id));
        }
        assert_eq!(take(&mut p, 22 * MS), Some(106));
        assert_eq!(p.early_refills, 1);
    }

    /// Tenant a's first request stays in the device past the first period; b is
    /// backlogged. a ends the first period satisfied (two thirds of its allocation
    /// unspent), sends a second request, and a third as the first completes: with the
    /// early refill by backlog that is a closed loop stuck in the device, and the
    /// adaptive depth shortens the queue. If both had come back (a ran out of work),
    /// nothing moves.
    #[test]
    fn a_satisfied_tenant_stuck_in_the_device_shortens_the_depth() {
        fn run(a_runs_dry: bool) -> (u32, u64) {
            let mut p = fb()
                .with_backlog_refill(true)
                .with_depth(DispatchDepth::auto(2, 1, 10 * MS));
            p.put(req(0, 0, 0), 0);
            for i in 0..8 {
                p.put(req(100 + i, 1, 0), 0);
            }
            p.on_timer(0);
            assert_eq!(take(&mut p, 0), Some(0));
            assert_eq!(take(&mut p, 0), Some(100));
            p.on_timer(10 * MS);
            assert!(p.tenants[0].satisfied);
            // a sends a second request while its first is still out.
            p.put(req(1, 0, 10 * MS + 500_000), 10 * MS + 500_000);
            while take(&mut p, 10 * MS + 500_000).is_some() {}
            let done = |p: &mut FeedBac, id: u64, at: Nanos| {
                let c = Completion {
                    request: req(id, 0, 0),
                    start: 0,
                    finish: at,
                };
                p.complete(&c, at);
            };
            done(&mut p, 0, 11 * MS);
            if a_runs_dry {
                done(&mut p, 1, 11 * MS);
            }
            // A closed loop: a sends its next as its request completes.
            p.put(req(2, 0, 11 * MS), 11 * MS);
            while take(&mut p, 11 * MS).is_some() {}
            // The window that opened at 10.5 ms ends at 20.5 ms.
            let _ = p.dispatch(22 * MS);
            (
                p.frame.depth().limit(),
                p.report()["depth"]["shrinks"].as_u64().unwrap(),
            )
        }
        let (limit, shrinks) = run(false);
        assert_eq!(shrinks, 1);
        // Ten at most in the device in that window (a's two, b's eight): an eighth off.
        assert_eq!(limit, 9);
        assert_eq!(
            run(true),
            (0, 0),
            "a tenant that ran out of work is not stuck"
        );
    }

    #[test]
    fn defaults_are_the_work_conserving_reading_and_the_paper_is_one_setting_away() {
        let tenants = [TenantSpec::weighted("a", 1.0)];
        let build = |t: toml::Table| {
            let mut params = crate::policy::test_params("feedbac", t);
            let p = FeedBac::build(&mut params, &tenants);
            p.and_then(|p| params.finish().map(|()| p))
        };
        let stats = |p: &dyn Policy| p.observe(Detail::Full).report;
        let default = build(toml::Table::new()).expect("defaults");
        assert_eq!(stats(default.as_ref())["depth"]["mode"], "auto");
        let paper = build(toml::toml! { backlog_refill = false depth = 0 }).expect("literal");
        assert_eq!(stats(paper.as_ref())["depth"]["mode"], "fixed");
        assert!(build(toml::toml! { depth = 0 window_ms = 5.0 }).is_err());
    }

    #[test]
    fn carry_over_is_bounded_by_one_allocation() {
        let mut p = fb();
        p.put(req(0, 0, 0), 0);
        p.put(req(100, 1, 0), 0);
        p.on_timer(0);
        assert_eq!(take(&mut p, 0), Some(0)); // a spends 4 096 of 12 288
        // Period ends with a's requests in flight: a carries min(8 192, 12 288).
        p.on_timer(10 * MS);
        assert_eq!(p.credits(0), 8_192.0 + 12_288.0);
        // Another unused period: carry capped at one allocation.
        p.on_timer(20 * MS);
        assert_eq!(p.credits(0), 12_288.0 + 12_288.0);
    }

    #[test]
    fn weight_change_takes_effect_at_the_next_period() {
        let mut p = fb();
        p.put(req(0, 0, 0), 0);
        p.put(req(100, 1, 0), 0);
        p.on_timer(0);
        p.update_tenant(1, &TenantSpec::weighted("b", 3.0), MS);
        assert_eq!(p.credits(1), 4_096.0);
        p.on_timer(10 * MS);
        // 16 384 split 3:3 → 8 192 each (+ b's carry of its unspent 4 096).
        assert_eq!(p.credits(1), 4_096.0 + 8_192.0);
    }

    #[test]
    fn period_stretches_to_the_measured_device_time_from_the_next_prediction_period() {
        // 10 ms minimum, 2 allocation periods per prediction period, 4 device times.
        let t = [TenantSpec::weighted("a", 1.0)];
        let mut p =
            FeedBac::new(&t, 10 * MS, 2, 1.0, 0.3, 1_638_400.0, false).with_latency_periods(4.0);
        for i in 0..3 {
            p.put(req(i, 0, 0), 0);
        }
        p.on_timer(0);
        // Two requests spend 5 ms and 7 ms in the device: mean 6 ms.
        for (id, finish) in [(0, 5 * MS), (1, 7 * MS)] {
            assert_eq!(take(&mut p, 0), Some(id));
            let c = Completion {
                request: req(id, 0, 0),
                start: 0,
                finish,
            };
            p.complete(&c, finish);
        }
        // Until the prediction period closes at 20 ms the period stays at 10 ms.
        p.on_timer(10 * MS);
        assert_eq!(p.period(), 10 * MS);
        assert_eq!(p.period_end, 20 * MS);
        // From 20 ms: 4 × 6 ms = 24 ms periods, and the next prediction period spans two.
        p.on_timer(20 * MS);
        assert_eq!(p.period(), 24 * MS);
        assert_eq!(p.period_end, 44 * MS);
        assert_eq!(p.prediction_end, 68 * MS);
        // A prediction period without completions keeps the last measurement.
        p.on_timer(68 * MS);
        assert_eq!(p.period(), 24 * MS);
    }

    #[test]
    fn holt_follows_a_level_and_a_trend() {
        let mut h = Holt::new(0.3);
        assert_eq!(h.observe(100.0, 0.0), 100.0);
        let mut f = 100.0;
        for _ in 0..50 {
            f = h.observe(100.0, f);
        }
        assert!((f - 100.0).abs() < 1e-6);
        // A big miss raises α to its maximum.
        h.observe(200.0, f);
        assert!((h.alpha() - ALPHA_MAX).abs() < 1e-12);
        // A linear ramp is tracked with a shrinking error.
        let mut h = Holt::new(0.3);
        let mut f = h.observe(0.0, 0.0);
        let mut err = 0.0;
        for i in 1..200 {
            let x = 10.0 * i as f64;
            err = (f - x).abs() / x;
            f = h.observe(x, f);
        }
        assert!(err < 0.01, "{err}");
    }

    #[test]
    fn forecast_converges_to_consumption() {
        // A device that consumes exactly 4 requests (16 384 credits) per 10 ms period.
        let t = [TenantSpec::weighted("a", 1.0)];
        let mut p = FeedBac::new(&t, 10 * MS, 2, 1.0, 0.3, 100.0, false);
        // A first period in which nothing is consumed must not break the forecast.
        p.put(req(0, 0, 0), 0);
        take(&mut p, 0);
        let mut id = 0;
        for period in 0..200u64 {
            let now = period * 10 * MS;
            for _ in 0..4 {
                p.put(req(id, 0, now), now);
                id += 1;
                if let Some(i) = take(&mut p, now) {
                    let r = req(i, 0, now);
                    p.complete(&crate::policy::test_completion(r, now), now);
                }
            }
            // Whatever the forecast, at most 4 requests per period reach the device.
            while take(&mut p, now).is_some() {}
        }
        let rate = p.forecast_rate();
        assert!((rate - 1_638_400.0).abs() / 1_638_400.0 < 0.05, "{rate}");
    }

    /// From a forecast at its floor with both tenants in debt, service resumes in
    /// proportion and the forecast climbs back.
    #[test]
    fn a_collapsed_forecast_recovers() {
        let t = [
            TenantSpec::weighted("a", 2.0),
            TenantSpec::weighted("b", 1.0),
        ];
        let mut p = FeedBac::new(&t, 10 * MS, 2, 1.0, 0.3, 1_638_400.0, false);
        let mut id = 0;
        let mut served = [0u32; 2];
        // The state a burst's end left on a live server: forecast at its floor of one
        // credit a second, both tenants owing most of a request.
        for (tenant, debt) in [(0, -4000.0), (1, -4090.0)] {
            id += 1;
            p.put(req(id, tenant, 0), 0);
            let _ = p.dispatch(0);
            p.tenants[tenant as usize].credits = debt;
        }
        p.rate = 1.0;
        p.consumed_in_prediction = 0.0;
        for step in 1..400u64 {
            let now = step * MS;
            // Closed loop: each tenant keeps 4 requests queued.
            for tenant in 0..2 {
                while p.frame.queues().queued_of(tenant as TenantId) < 4 {
                    id += 1;
                    p.put(req(id, tenant as TenantId, now), now);
                }
            }
            while let Dispatch::Request(r) = p.dispatch(now) {
                served[r.tenant as usize] += 1;
                let c = Completion {
                    request: r,
                    start: now,
                    finish: now + MS / 2,
                };
                p.complete(&c, now + MS / 2);
            }
        }
        assert!(served[0] > 200 && served[1] > 100, "{served:?}");
        assert!(p.forecast_rate() > 1e6, "{}", p.forecast_rate());
    }

    /// A burst's end drives level + trend below zero: the forecast restarts from the
    /// observation instead of sitting at zero while the trend decays.
    #[test]
    fn holt_restarts_from_the_observation_below_zero() {
        let mut h = Holt::new(0.3);
        h.observe(1000.0, 0.0);
        assert_eq!(h.observe(1000.0, 1000.0), 1000.0);
        // α = 0.9 (a 99.9 % miss): level 100.9, trend −269.7 → below zero → restart.
        assert_eq!(h.observe(1.0, 1000.0), 1.0);
        assert!(h.observe(1000.0, 1.0) > 500.0);
    }

    /// A write-back buffer filling: three seconds of device time acknowledged in one.
    /// With credits of device time the forecast learns at most `max_work_rate`.
    #[test]
    fn a_buffer_filling_is_not_learnt_as_capacity() {
        let t = [TenantSpec::weighted("a", 1.0)];
        let mut p = FeedBac::new(&t, 10 * MS, 1, 1.0, 0.3, 1e9, false)
            .with_currency(Currency::DeviceTime)
            .with_max_work_rate(1.5);
        p.advance(0);
        p.consumed_in_prediction = 3.0 * 1e9 * 0.01;
        p.advance(10 * MS);
        assert!(
            (p.forecast_rate() - 1.5e9).abs() < 1.0,
            "{}",
            p.forecast_rate()
        );
        // The record keeps what was consumed.
        let last = p.forecast_history().last().copied().unwrap();
        assert!((last.consumed - 3e7).abs() < 1.0, "{last:?}");
        // Without a bound (credits of bytes) the burst is learnt as it came.
        let mut q = FeedBac::new(&t, 10 * MS, 1, 1.0, 0.3, 1e9, false);
        q.advance(0);
        q.consumed_in_prediction = 3.0 * 1e9 * 0.01;
        q.advance(10 * MS);
        assert!(
            (q.forecast_rate() - 3e9).abs() < 1.0,
            "{}",
            q.forecast_rate()
        );
    }

    /// An observation swinging ±20 % about its level: misses alternate, α stays low and
    /// the forecast stays near the level instead of chasing each swing.
    #[test]
    fn alternating_misses_barely_move_the_forecast() {
        let mut h = Holt::new(0.3);
        let mut f = h.observe(1000.0, 0.0);
        let mut worst: f64 = 0.0;
        for i in 0..200 {
            let x = if i % 2 == 0 { 1200.0 } else { 800.0 };
            f = h.observe(x, f);
            if i > 20 {
                worst = worst.max((f - 1000.0).abs());
            }
        }
        // α from the miss alone (0.9 for a 20 % miss) strays 215 from the level, past
        // the swing itself.
        assert!(worst < 110.0, "forecast strayed {worst} from the level");
        // A level that moves and stays is followed at full speed.
        for _ in 0..3 {
            f = h.observe(2000.0, f);
        }
        assert!((f - 2000.0).abs() / 2000.0 < 0.1, "{f}");
    }

    /// A burst's falling trend is dropped when the next observation says the other way.
    #[test]
    fn a_trend_the_observation_contradicts_is_dropped() {
        let mut h = Holt::new(0.3);
        h.observe(3000.0, 0.0);
        // The burst ends: a falling trend is learnt.
        let f = h.observe(1000.0, 3000.0);
        // Forecast too low while the trend falls: the trend goes, the forecast lands
        // near what was seen instead of below it.
        let f = h.observe(1000.0, f);
        assert!(f >= 900.0, "{f}");
        let f = h.observe(1000.0, f);
        assert!((f - 1000.0).abs() < 100.0, "{f}");
    }
}
