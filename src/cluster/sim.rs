//! `sim`: several fronts sharing one simulated cluster, in virtual time. Each front is
//! a host core ([`Host`]) with a policy: [`Mode::Coordinated`] — the throttle's gate
//! ([`Limited`]) with each tenant's limits the front's part of its global ones, from the
//! front's [`FrontShare`] every period; [`Mode::Local`] — the single-host `govern`
//! throttle ([`Throttle`]) on each front, deciding from what that front alone sees
//! (each front splits its tenants by weight, no exchange); [`Mode::NoQos`] — FIFO.
//! The fronts send their reports to each other with a delay, losing each with a
//! probability (seeded). Tenants' volumes are closed loops (the workload generators'
//! requests) on given fronts, each active over a time range (a phase change moves a
//! tenant's load from one front to another); a front can join or leave (crash, or
//! partition: still serving, its reports neither sent nor received) at a given time.
//!
//! Deterministic: the scenario and its seed give the same result. Checked as it runs:
//! a request is dispatched and completes once (its id), a volume's outstanding count
//! never goes below zero, every host's and gate's counts add up (each window).

use super::model::{ClusterError, ClusterModel, ClusterParams};
use crate::device::cost::CostModel;
use crate::host::{Host, Limits as HostLimits, Observer, Refuse, Status};
use crate::limits::governor::{DeviceUsage, Governor, Limits, Usage};
use crate::limits::share::{FrontShare, Report, ShareParams};
use crate::limits::throttle::{Limited, Throttle, count, count_device};
use crate::policy::Fifo;
use crate::policy::{Admission, Policy, Refusal};
use crate::types::{Completion, Nanos, Request, TenantId, TenantSpec};
use crate::workload::{Arrivals, Generator, Pattern, Phase, SizeDist};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet};

/// How the fronts share the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Each front's share of each tenant's global limits (the exchange).
    Coordinated,
    /// Each front its own governor over what it sees, no exchange.
    Local,
    /// No limits: FIFO at every front.
    NoQos,
}

/// How a front leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// It stops: no more requests, no more reports.
    Crash,
    /// It goes on serving, but its reports are neither sent nor received.
    Partition,
}

/// One tenant volume on one front: a closed loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Volume {
    /// Its tenant.
    pub tenant: TenantId,
    /// The front serving it.
    pub front: usize,
    /// Requests kept outstanding.
    pub iodepth: u32,
    /// Part of its requests that are reads.
    pub read_mix: f64,
    /// Request size, bytes.
    pub size: u32,
    /// When it starts, ns.
    pub start: Nanos,
    /// When it stops (`None`: at the end).
    pub end: Option<Nanos>,
}

/// The report exchange's network.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exchange {
    /// A report's delay, ns.
    pub delay: Nanos,
    /// The probability a report is lost.
    pub loss: f64,
}

/// A multi-front run.
#[derive(Debug, Clone)]
pub struct ClusterScenario {
    /// Seeds the workloads, the losses and the cluster's jitter.
    pub seed: u64,
    /// Length of the run, ns.
    pub duration: Nanos,
    /// The cluster.
    pub cluster: ClusterParams,
    /// Fronts.
    pub fronts: usize,
    /// The tenants (global ids).
    pub tenants: Vec<TenantSpec>,
    /// Their volumes.
    pub volumes: Vec<Volume>,
    /// The exchange's network.
    pub exchange: Exchange,
    /// How the fronts share.
    pub mode: Mode,
    /// Fronts absent until a time.
    pub joins: Vec<(usize, Nanos)>,
    /// Fronts that leave at a time.
    pub leaves: Vec<(usize, Nanos, Leave)>,
    /// Requests on the cluster at once per front.
    pub queue_depth: u32,
}

/// Results are counted in windows of this length, ns.
pub const WINDOW: Nanos = 1_000_000_000;

/// What a run gave.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterResult {
    /// Per window, per front, per tenant: requests completed.
    pub windows: Vec<Vec<Vec<u64>>>,
    /// Per window, per tenant: its global limits as the lowest-numbered front still
    /// exchanging decided them, averaged over the window's periods (`None` without
    /// one: a mode without exchange).
    pub global: Vec<Vec<Option<Limits>>>,
    /// Per front that left, per tenant: its local limits when it left.
    pub left_with: Vec<(usize, Vec<Limits>)>,
    /// Reports refused by a front (none expected).
    pub refused_reports: u64,
    /// Requests completed.
    pub completed: u64,
}

impl ClusterResult {
    /// Tenant `t`'s requests a second in window `w`, over all fronts.
    pub fn iops(&self, w: usize, t: usize) -> f64 {
        self.windows[w].iter().map(|f| f[t]).sum::<u64>() as f64 * 1e9 / WINDOW as f64
    }

    /// Tenant `t`'s requests a second at front `f` in window `w`.
    pub fn front_iops(&self, w: usize, f: usize, t: usize) -> f64 {
        self.windows[w][f][t] as f64 * 1e9 / WINDOW as f64
    }

    /// The cluster's requests a second in window `w`.
    pub fn total(&self, w: usize) -> f64 {
        self.windows[w].iter().flatten().sum::<u64>() as f64 * 1e9 / WINDOW as f64
    }

    /// Share error over windows `from..`: the mean over windows of the mean over
    /// `tenants` of |s − s*| / s*, s a tenant's part of their requests a second (all of
    /// one size and direction: device time), s* its weight's part.
    pub fn share_error(&self, from: usize, tenants: &[usize], weights: &[f64]) -> f64 {
        let wsum: f64 = tenants.iter().map(|&t| weights[t]).sum();
        let mut errs = Vec::new();
        for w in from..self.windows.len() {
            let total: f64 = tenants.iter().map(|&t| self.iops(w, t)).sum();
            if total <= 0.0 {
                continue;
            }
            let e: f64 = tenants
                .iter()
                .map(|&t| {
                    let want = weights[t] / wsum;
                    (self.iops(w, t) / total - want).abs() / want
                })
                .sum::<f64>()
                / tenants.len() as f64;
            errs.push(e);
        }
        errs.iter().sum::<f64>() / errs.len().max(1) as f64
    }
}

/// A front's observer: its cumulative counters, what each tenant completed this
/// window, and the requests it has on the cluster (each dispatched and completed once).
#[derive(Debug, Clone, Default)]
struct Counts {
    usage: Vec<Usage>,
    device: DeviceUsage,
    window: Vec<u64>,
    on_cluster: HashSet<u64>,
}

impl Observer for Counts {
    fn arrived(&mut self, _request: &Request) {}
    fn refused(&mut self, request: &Request, reason: Refusal, _now: Nanos) {
        panic!(
            "request {} refused ({reason:?}): no queue limit",
            request.id
        );
    }
    fn dispatched(&mut self, r: &Request, _now: Nanos) {
        assert!(
            self.on_cluster.insert(r.id),
            "request {} dispatched twice",
            r.id
        );
        count(&mut self.usage[r.tenant as usize], r);
    }
    fn completed(&mut self, c: &Completion, _status: Status) {
        assert!(
            self.on_cluster.remove(&c.request.id),
            "request {} completed twice or never dispatched",
            c.request.id
        );
        count_device(&mut self.device, c);
        self.window[c.request.tenant as usize] += 1;
    }
}

#[derive(Debug, Clone)]
enum Ev {
    Complete { front: usize, request: Request },
    Alarm { front: usize },
    Period { front: usize },
    Deliver { to: usize, report: Box<Report> },
    VolumeStart { volume: usize },
    VolumeEnd { volume: usize },
    Join { front: usize },
    Leave { front: usize, how: Leave },
    Window,
}

struct Event {
    time: Nanos,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        (self.time, self.seq) == (o.time, o.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    fn cmp(&self, o: &Self) -> Ordering {
        (o.time, o.seq).cmp(&(self.time, self.seq))
    }
}

struct Front {
    host: Host<Counts>,
    share: Option<FrontShare>,
    up: bool,
    partitioned: bool,
    alarm_at: Option<Nanos>,
    hosted: Vec<TenantId>,
}

struct VolumeRun {
    spec: Volume,
    generator: Generator,
    phase: Phase,
    active: bool,
    outstanding: u32,
}

struct Run<'a> {
    s: &'a ClusterScenario,
    cluster: ClusterModel,
    fronts: Vec<Front>,
    volumes: Vec<VolumeRun>,
    events: BinaryHeap<Event>,
    seq: u64,
    next_id: u64,
    /// Request id → its volume, while it is outstanding.
    of: HashMap<u64, usize>,
    /// Request id → when it went to the cluster, while it is there.
    dispatched_at: HashMap<u64, Nanos>,
    rng: ChaCha8Rng,
    cost: CostModel,
    params: ShareParams,
    result: ClusterResult,
    /// This window's sum of the global limits (reads, writes, bytes read, bytes
    /// written) per tenant as the lowest-numbered exchanging front decided them, and
    /// the decisions summed.
    global_sum: Vec<[f64; 4]>,
    global_n: u32,
}

/// What a scenario cannot have, named.
fn check(s: &ClusterScenario) -> Result<(), ClusterError> {
    let bad = |what: String| Err(ClusterError(what));
    if s.fronts == 0 || s.queue_depth == 0 {
        return bad("at least one front, of queue depth 1 or more".into());
    }
    if !(0.0..=1.0).contains(&s.exchange.loss) {
        return bad(format!("a loss of {} (0 to 1)", s.exchange.loss));
    }
    for (i, v) in s.volumes.iter().enumerate() {
        if v.tenant as usize >= s.tenants.len()
            || v.front >= s.fronts
            || v.iodepth == 0
            || v.size == 0
            || !(0.0..=1.0).contains(&v.read_mix)
        {
            return bad(format!("volume {i}: {v:?}"));
        }
    }
    for &(front, _) in &s.joins {
        if front >= s.fronts {
            return bad(format!("front {front} joins: no such front"));
        }
    }
    for &(front, _, _) in &s.leaves {
        if front >= s.fronts {
            return bad(format!("front {front} leaves: no such front"));
        }
    }
    Ok(())
}

/// Runs `s` to its end; a scenario it cannot run is an error naming what is wrong.
pub fn run(s: &ClusterScenario) -> Result<ClusterResult, ClusterError> {
    check(s)?;
    let cluster = ClusterModel::new(s.cluster)?;
    let cost = cluster.cost_model();
    let mut params = ShareParams::for_cluster(&cost);
    // Congested above twice the unloaded round trip.
    let unloaded = crate::device::fixed::FixedDevice::new(s.cluster.osd).service_time(4096)
        + 2 * (s.cluster.net + s.cluster.jitter / 2);
    params.governor.target = 2 * unloaded;
    let fronts = build_fronts(s, cost, &params);
    let volumes = s
        .volumes
        .iter()
        .enumerate()
        .map(|(i, v)| VolumeRun {
            spec: *v,
            generator: Generator::new(s.seed, i as u64, 0, 1 << 30),
            phase: Phase {
                start: 0,
                end: None,
                pattern: if v.read_mix >= 1.0 {
                    Pattern::RandRead
                } else {
                    Pattern::RandRw
                },
                read_mix: v.read_mix,
                size: SizeDist::Fixed(v.size),
                align: 4096,
                arrivals: Arrivals::Closed { iodepth: v.iodepth },
            },
            active: false,
            outstanding: 0,
        })
        .collect();
    let mut r = Run {
        s,
        cluster,
        fronts,
        volumes,
        events: BinaryHeap::new(),
        seq: 0,
        next_id: 0,
        of: HashMap::new(),
        dispatched_at: HashMap::new(),
        rng: ChaCha8Rng::seed_from_u64(s.seed ^ 0x5eed),
        cost,
        params,
        result: ClusterResult {
            windows: Vec::new(),
            global: Vec::new(),
            left_with: Vec::new(),
            refused_reports: 0,
            completed: 0,
        },
        global_sum: vec![[0.0; 4]; s.tenants.len()],
        global_n: 0,
    };
    for f in 0..s.fronts {
        let at = s.joins.iter().find(|j| j.0 == f).map_or(0, |j| j.1);
        r.push(at, Ev::Join { front: f });
    }
    for &(front, at, how) in &s.leaves {
        r.push(at, Ev::Leave { front, how });
    }
    for (i, v) in s.volumes.iter().enumerate() {
        r.push(v.start, Ev::VolumeStart { volume: i });
        if let Some(end) = v.end {
            r.push(end, Ev::VolumeEnd { volume: i });
        }
    }
    r.push(WINDOW, Ev::Window);
    while let Some(e) = r.events.pop() {
        if e.time > s.duration {
            break;
        }
        r.handle(e.time, e.ev);
    }
    Ok(r.result)
}

/// The fronts of `s`, each a host core with the policy its mode says, priced by `cost`.
fn build_fronts(s: &ClusterScenario, cost: CostModel, params: &ShareParams) -> Vec<Front> {
    let n = s.tenants.len();
    (0..s.fronts)
        .map(|f| {
            let policy: Box<dyn Policy> = match s.mode {
                Mode::Coordinated => Box::new(Limited::new(n, SLICE)),
                Mode::Local => Box::new(Throttle::new(
                    &s.tenants,
                    Governor::new(&s.tenants, cost, params.governor),
                    SLICE,
                )),
                Mode::NoQos => Box::new(Fifo::new(n)),
            };
            let counts = Counts {
                usage: vec![Usage::default(); n],
                window: vec![0; n],
                ..Counts::default()
            };
            let limits = HostLimits {
                queue_depth: s.queue_depth,
                queue_limit: None,
                refuse: Refuse::Error,
                stall: None,
            };
            let mut hosted: Vec<TenantId> = s
                .volumes
                .iter()
                .filter(|v| v.front == f)
                .map(|v| v.tenant)
                .collect();
            hosted.sort_unstable();
            hosted.dedup();
            Front {
                host: Host::new(policy, counts, limits, n, cost),
                share: None,
                up: false,
                partitioned: false,
                alarm_at: None,
                hosted,
            }
        })
        .collect()
}

/// The throttle's slice (the kernel's on a non-rotational device), ns.
const SLICE: Nanos = 20_000_000;

impl Run<'_> {
    fn push(&mut self, time: Nanos, ev: Ev) {
        self.seq += 1;
        self.events.push(Event {
            time,
            seq: self.seq,
            ev,
        });
    }

    fn handle(&mut self, now: Nanos, ev: Ev) {
        match ev {
            Ev::Complete { front, request } => self.complete(front, request, now),
            Ev::Alarm { front } => {
                let f = &mut self.fronts[front];
                if f.alarm_at.is_some_and(|a| a <= now) {
                    f.alarm_at = None;
                }
                let mut refused = Vec::new();
                f.host.on_time(now, &mut refused);
                assert!(refused.is_empty(), "no drain: nothing refused");
                self.pump(front, now);
            }
            Ev::Period { front } => self.period(front, now),
            Ev::Deliver { to, report } => {
                let f = &mut self.fronts[to];
                if f.up
                    && !f.partitioned
                    && let Some(share) = &mut f.share
                    && share.receive(*report, now).is_err()
                {
                    self.result.refused_reports += 1;
                }
            }
            Ev::VolumeStart { volume } => {
                self.volumes[volume].active = true;
                self.fill(volume, now);
            }
            Ev::VolumeEnd { volume } => self.volumes[volume].active = false,
            Ev::Join { front } => self.join(front, now),
            Ev::Leave { front, how } => {
                let f = &mut self.fronts[front];
                if let Some(share) = &f.share {
                    let l: Vec<Limits> = (0..self.s.tenants.len())
                        .map(|t| share.limits(t as TenantId))
                        .collect();
                    self.result.left_with.push((front, l));
                }
                match how {
                    Leave::Crash => f.up = false,
                    Leave::Partition => f.partitioned = true,
                }
            }
            Ev::Window => self.window(now),
        }
    }

    fn join(&mut self, front: usize, now: Nanos) {
        let up = self.fronts.iter().filter(|f| f.up).count() + 1;
        let f = &mut self.fronts[front];
        f.up = true;
        if self.s.mode == Mode::Coordinated {
            let share = FrontShare::new(
                front as u32,
                &self.s.tenants,
                &f.hosted,
                self.cost,
                self.params,
                up,
            );
            for &t in &f.hosted {
                assert!(f.host.set_limits(t, &share.limits(t), now));
            }
            f.share = Some(share);
            self.push(now + self.params.governor.period, Ev::Period { front });
        }
        for v in 0..self.volumes.len() {
            if self.volumes[v].spec.front == front {
                self.fill(v, now);
            }
        }
    }

    /// Issues volume `v`'s requests up to its iodepth, if it and its front are up.
    fn fill(&mut self, v: usize, now: Nanos) {
        let front = self.volumes[v].spec.front;
        if !self.fronts[front].up {
            return;
        }
        while self.volumes[v].active && self.volumes[v].outstanding < self.volumes[v].spec.iodepth {
            let vol = &mut self.volumes[v];
            let (op, offset, len) = vol.generator.next_io(&vol.phase);
            self.next_id += 1;
            let request = Request {
                id: self.next_id,
                tenant: vol.spec.tenant,
                op,
                offset,
                len,
                arrival: now,
                cost: 0,
            };
            vol.outstanding += 1;
            self.of.insert(request.id, v);
            match self.fronts[front].host.admit(request, now) {
                Admission::Queued => {}
                Admission::Refused(..) => unreachable!("no queue limit, no refusing policy"),
            }
        }
        self.pump(front, now);
    }

    /// Sends what the front's host releases to the cluster; sets its alarm.
    fn pump(&mut self, front: usize, now: Nanos) {
        while let Some(request) = self.fronts[front].host.dispatch(now) {
            let v = self.of[&request.id];
            let back = self.cluster.submit(v as u64, &request, now);
            self.push(back, Ev::Complete { front, request });
            self.dispatched_at.insert(request.id, now);
        }
        let f = &mut self.fronts[front];
        if let Some(at) = f.host.next_alarm() {
            let at = at.max(now + 1);
            if f.alarm_at.is_none_or(|a| at < a || a <= now) {
                f.alarm_at = Some(at);
                self.push(at, Ev::Alarm { front });
            }
        }
    }

    fn complete(&mut self, front: usize, request: Request, now: Nanos) {
        let start = self
            .dispatched_at
            .remove(&request.id)
            .expect("a completion of a dispatched request");
        let c = Completion {
            request,
            start,
            finish: now,
        };
        self.fronts[front].host.complete(&c, Status::Ok, now);
        self.result.completed += 1;
        let v = self.of.remove(&request.id).expect("an outstanding request");
        let vol = &mut self.volumes[v];
        vol.outstanding = vol
            .outstanding
            .checked_sub(1)
            .expect("a completion of an issued request");
        self.fill(v, now);
    }

    fn period(&mut self, front: usize, now: Nanos) {
        let f = &mut self.fronts[front];
        if !f.up {
            return;
        }
        let Some(share) = &mut f.share else {
            return;
        };
        let counts = f.host.observer();
        let tenants: Vec<(TenantId, Usage, bool)> = f
            .hosted
            .iter()
            .map(|&t| (t, counts.usage[t as usize], f.host.held(t) > 0))
            .collect();
        let report = share.report(&tenants, counts.device, false, now);
        let limits = share.decide(now).to_vec();
        for &t in &f.hosted {
            assert!(f.host.set_limits(t, &limits[t as usize], now));
        }
        let partitioned = f.partitioned;
        let seer = self
            .fronts
            .iter()
            .position(|f| f.up && !f.partitioned && f.share.is_some());
        if seer == Some(front) {
            let global = self.fronts[front]
                .share
                .as_ref()
                .expect("an exchanging front")
                .global_limits();
            for (sum, l) in self.global_sum.iter_mut().zip(global) {
                for (k, v) in [l.riops, l.wiops, l.rbps, l.wbps].into_iter().enumerate() {
                    sum[k] += v.unwrap_or(f64::INFINITY);
                }
            }
            self.global_n += 1;
        }
        self.push(now + self.params.governor.period, Ev::Period { front });
        if !partitioned {
            for to in 0..self.fronts.len() {
                if to == front || !self.fronts[to].up {
                    continue;
                }
                if self.rng.random::<f64>() < self.s.exchange.loss {
                    continue;
                }
                self.push(
                    now + self.s.exchange.delay,
                    Ev::Deliver {
                        to,
                        report: Box::new(report.clone()),
                    },
                );
            }
        }
        self.pump(front, now);
    }

    fn window(&mut self, now: Nanos) {
        let n = self.s.tenants.len();
        let mut counts = Vec::new();
        for f in &mut self.fronts {
            f.host.check().unwrap_or_else(|e| panic!("host: {e}"));
            counts.push(std::mem::replace(
                &mut f.host.observer_mut().window,
                vec![0; n],
            ));
        }
        self.result.windows.push(counts);
        let decisions = f64::from(self.global_n);
        let global = self
            .global_sum
            .iter()
            .map(|sum| {
                let mean = |k: usize| Some(sum[k] / decisions).filter(|v| v.is_finite());
                (decisions > 0.0).then(|| Limits {
                    riops: mean(0),
                    wiops: mean(1),
                    rbps: mean(2),
                    wbps: mean(3),
                })
            })
            .collect();
        self.result.global.push(global);
        self.global_sum = vec![[0.0; 4]; n];
        self.global_n = 0;
        self.push(now + WINDOW, Ev::Window);
    }
}
