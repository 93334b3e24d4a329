//! The discrete-event simulator: tenants' workloads against a device model in virtual
//! time, under one policy, with a device queue depth. Deterministic: the only inputs
//! are the scenario and its seed.

pub mod alone;
pub(crate) mod checker;

use crate::config::PolicyChoice;
use crate::device::cost::CostModel;
use crate::device::driver::Driver;
use crate::device::{DeviceModel, Finished, Submitted};
use crate::host::{Host, Limits, Observer, Status};
use crate::metrics::{Recorder, RunResult, ScenarioResult};
use crate::policy::{self, Admission, Observation, Policy, PolicyError};
use crate::scenario::Scenario;
use crate::trace::replay::{Replay, ReplayStats};
use crate::types::Op;
use crate::types::{Completion, Nanos, Request, TenantId};
use crate::workload::{Arrivals, Generator};
use checker::Checker;
use indicatif::ProgressBar;
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Instant;

#[derive(Debug, Clone, Copy)]
enum EventKind {
    /// A request completes on the device.
    Complete { request: Request, start: Nanos },
    /// Open-loop arrival for a tenant; `epoch` drops arrivals of an ended phase.
    Arrival { tenant: TenantId, epoch: u32 },
    /// A tenant's phase `phase` begins (`phase == len` means its last phase ended).
    Phase { tenant: TenantId, phase: u32 },
    /// The host's alarm ([`Host::next_alarm`]): the policy's wait or timer.
    Alarm,
    /// A deferring device model asked to be advanced.
    Device,
}

#[derive(Debug, Clone, Copy)]
struct Event {
    time: Nanos,
    seq: u64,
    kind: EventKind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.time == other.time && self.seq == other.seq
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Reversed: the heap pops the earliest time, ties in insertion order.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

struct TenantRun {
    generator: Generator,
    /// A trace workload's replay, and with original timing the record due next.
    replay: Option<Replay>,
    due: Option<(Op, u64, u32)>,
    phase: Option<usize>,
    epoch: u32,
    /// Requests issued and not yet completed or refused (a closed loop keeps `iodepth`).
    outstanding: u32,
}

/// One run: one scenario, one policy, one device state, driving the host core.
struct Run<'a, O: Observer> {
    scenario: &'a Scenario,
    host: Host<O>,
    device: Driver,
    events: BinaryHeap<Event>,
    seq: u64,
    next_id: u64,
    tenants: Vec<TenantRun>,
    /// When the pending `Alarm` event fires.
    alarm_at: Option<Nanos>,
    finished: Vec<Finished>,
}

impl<O: Observer> Run<'_, O> {
    fn push(&mut self, time: Nanos, kind: EventKind) {
        self.seq += 1;
        self.events.push(Event {
            time,
            seq: self.seq,
            kind,
        });
    }

    fn issue(&mut self, tenant: TenantId, now: Nanos) {
        let setup = &self.scenario.tenants[tenant as usize];
        let t = &mut self.tenants[tenant as usize];
        let Some(phase) = t.phase.map(|p| &setup.workload.phases[p]) else {
            return;
        };
        let (op, offset, len) = match &mut t.replay {
            None => t.generator.next_io(phase),
            Some(replay) => match t.due.take() {
                Some(due) => due,
                None => match replay.next_io() {
                    Some((_, op, offset, len)) => (op, offset, len),
                    None => return,
                },
            },
        };
        self.next_id += 1;
        let request = Request {
            id: self.next_id,
            tenant,
            op,
            offset,
            len,
            arrival: now,
            cost: 0,
        };
        match self.host.admit(request, now) {
            Admission::Queued => t.outstanding += 1,
            // The client got an error; a closed loop issues its next request at its
            // next completion (issuing now would be refused again at the same instant).
            Admission::Refused(..) => {}
        }
    }

    fn start_phase(&mut self, tenant: TenantId, phase: u32, now: Nanos) {
        let workload = &self.scenario.tenants[tenant as usize].workload;
        let t = &mut self.tenants[tenant as usize];
        t.epoch += 1;
        let Some(p) = workload.phases.get(phase as usize).copied() else {
            t.phase = None;
            return;
        };
        t.phase = Some(phase as usize);
        if let Some(end) = p.end {
            self.push(
                end,
                EventKind::Phase {
                    tenant,
                    phase: phase + 1,
                },
            );
        }
        match p.arrivals {
            Arrivals::Closed { iodepth } => {
                let missing = iodepth.saturating_sub(self.tenants[tenant as usize].outstanding);
                for _ in 0..missing {
                    self.issue(tenant, now);
                }
            }
            Arrivals::Open { rate_iops, process } => {
                let t = &mut self.tenants[tenant as usize];
                let at = now + t.generator.interarrival(rate_iops, process);
                let epoch = t.epoch;
                self.push(at, EventKind::Arrival { tenant, epoch });
            }
            Arrivals::Trace => self.schedule_trace(tenant),
            Arrivals::Idle => {}
        }
    }

    /// Reads a replayed trace's next record and sets an arrival at its time.
    fn schedule_trace(&mut self, tenant: TenantId) {
        let t = &mut self.tenants[tenant as usize];
        let Some((at, op, offset, len)) = t.replay.as_mut().and_then(|r| r.next_io()) else {
            return;
        };
        t.due = Some((op, offset, len));
        let epoch = t.epoch;
        self.push(at, EventKind::Arrival { tenant, epoch });
    }

    /// Hands the device everything the host releases while there is a free slot, then
    /// sets the alarms the policy asked for.
    fn pump(&mut self, now: Nanos) {
        while let Some(request) = self.host.dispatch(now) {
            match self.device.submit(&request, now) {
                Submitted::Finishes(finish) => self.push(
                    finish.max(now),
                    EventKind::Complete {
                        request,
                        start: now,
                    },
                ),
                Submitted::Queued => self.arm_device(now),
            }
        }
        self.arm_alarm(now);
    }

    /// Makes sure an `Alarm` event is due when the host next wants one (an earlier
    /// pending one stands; a later one that became stale fires and does nothing).
    fn arm_alarm(&mut self, now: Nanos) {
        if let Some(at) = self.host.next_alarm() {
            let at = at.max(now + 1);
            if self.alarm_at.is_none_or(|a| at < a || a <= now) {
                self.alarm_at = Some(at);
                self.push(at, EventKind::Alarm);
            }
        }
    }

    /// Makes sure a `Device` event is due when the device model next wants one.
    fn arm_device(&mut self, now: Nanos) {
        if let Some(at) = self.device.arm(now) {
            self.push(at, EventKind::Device);
        }
    }

    fn complete(&mut self, request: Request, start: Nanos, now: Nanos) {
        let c = Completion {
            request,
            start,
            finish: now,
        };
        self.host.complete(&c, Status::Ok, now);
        let tenant = request.tenant;
        let t = &mut self.tenants[tenant as usize];
        t.outstanding = t
            .outstanding
            .checked_sub(1)
            .expect("a completion of an issued request");
        if let Some(p) = t.phase {
            let phase = &self.scenario.tenants[tenant as usize].workload.phases[p];
            if let Arrivals::Closed { iodepth } = phase.arrivals
                && t.outstanding < iodepth
            {
                self.issue(tenant, now);
            }
        }
    }

    fn handle(&mut self, event: Event) {
        let now = event.time;
        match event.kind {
            EventKind::Complete { request, start } => self.complete(request, start, now),
            EventKind::Device => {
                let mut finished = std::mem::take(&mut self.finished);
                self.device.advance(now, &mut finished);
                for f in finished.drain(..) {
                    if let Some(busy) = f.busy {
                        self.host.observer_mut().measured(&f.request, busy);
                    }
                    self.complete(f.request, f.submitted, now);
                }
                self.finished = finished;
                self.arm_device(now);
            }
            EventKind::Arrival { tenant, epoch } => {
                let t = &mut self.tenants[tenant as usize];
                if t.epoch != epoch {
                    return;
                }
                let Some(p) = t.phase else { return };
                match self.scenario.tenants[tenant as usize].workload.phases[p].arrivals {
                    Arrivals::Open { rate_iops, process } => {
                        let next = now + t.generator.interarrival(rate_iops, process);
                        self.push(next, EventKind::Arrival { tenant, epoch });
                        self.issue(tenant, now);
                    }
                    Arrivals::Trace => {
                        self.issue(tenant, now);
                        self.schedule_trace(tenant);
                    }
                    Arrivals::Closed { .. } | Arrivals::Idle => {}
                }
            }
            EventKind::Phase { tenant, phase } => self.start_phase(tenant, phase, now),
            EventKind::Alarm => {
                if self.alarm_at == Some(now) {
                    self.alarm_at = None;
                }
                let mut refused = Vec::new();
                self.host.on_time(now, &mut refused);
                assert!(refused.is_empty(), "the simulator does not drain");
            }
        }
    }

    /// Runs the events before the scenario's end; `after_event` sees the run after
    /// every event (the checker).
    fn run(&mut self, progress: Option<&ProgressBar>, mut after_event: impl FnMut(&Self, Nanos)) {
        let mut steps: u64 = 0;
        loop {
            if let Some(wall) = self.device.model_mut().wall() {
                // A real device: wait in wall time for the next event or a completion.
                if wall.failure().is_some() {
                    break;
                }
                let next = self
                    .events
                    .peek()
                    .map_or(self.scenario.duration, |e| e.time)
                    .min(self.scenario.duration);
                wall.wait(next);
                let now = wall.now();
                if self.device.next_event().is_some() {
                    // Completions: a device event now (after everything handled so far,
                    // which was due by an earlier wall time).
                    self.arm_device(now);
                } else if self.events.peek().is_none_or(|e| e.time > now) {
                    // Woken early with nothing ready (a short transfer went again, a
                    // signal): nothing is due yet, so wait again, unless the run is over.
                    if now >= self.scenario.duration {
                        break;
                    }
                    continue;
                }
            }
            let Some(event) = self.events.pop() else {
                break;
            };
            if event.time >= self.scenario.duration {
                break;
            }
            let now = event.time;
            self.handle(event);
            // Let every event at this instant land before asking the policy.
            if self.events.peek().is_none_or(|e| e.time != now) {
                self.pump(now);
            }
            after_event(self, now);
            steps += 1;
            if steps & 0xffff == 0
                && let Some(pb) = progress
            {
                pb.set_position(now / 1_000_000);
            }
        }
    }
}

/// How a run is watched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Check the host's, the policy's and the device model's invariants after every
    /// event (see `sim::checker`); always on in debug builds.
    pub check: bool,
}

/// Runs one policy on a copy of `device` (already preconditioned).
pub fn run_policy(
    scenario: &Scenario,
    choice: &PolicyChoice,
    device: Box<dyn DeviceModel>,
    progress: Option<&ProgressBar>,
) -> Result<RunResult, PolicyError> {
    run_policy_with(scenario, choice, device, progress, RunOptions::default())
}

/// [`run_policy`] with options. Requests are priced by the cost model fitted to
/// `device` ([`crate::device::spec::DeviceSpec::fitted_cost`]); on a real device (in wall
/// time) by the scenario device's own model.
pub fn run_policy_with(
    scenario: &Scenario,
    choice: &PolicyChoice,
    device: Box<dyn DeviceModel>,
    progress: Option<&ProgressBar>,
    options: RunOptions,
) -> Result<RunResult, PolicyError> {
    let mut device = device;
    // A real device (characterize, calibrate) is charged by its spec's model: probing it
    // would write to it.
    let cost = if device.wall().is_some() {
        scenario.device.cost_model()
    } else {
        scenario.device.fitted_cost(device.as_ref())
    };
    run_policy_priced(scenario, choice, device, cost, progress, options)
}

/// [`run_policy_with`] with the cost model given: fitted once per device
/// ([`crate::device::spec::DeviceSpec::fitted_cost`]) and used for every policy run on
/// copies of it, as a sweep does.
pub fn run_policy_priced(
    scenario: &Scenario,
    choice: &PolicyChoice,
    device: Box<dyn DeviceModel>,
    cost: CostModel,
    progress: Option<&ProgressBar>,
    options: RunOptions,
) -> Result<RunResult, PolicyError> {
    let specs = scenario.specs();
    let policy = policy::build_on(
        &choice.name,
        choice.params.clone(),
        &specs,
        Some(&cost),
        scenario.device.actuators(),
    )?;
    let recorder = Recorder::new(
        &specs,
        scenario.warmup,
        scenario.duration,
        scenario.interval,
    )
    .with_phases(&scenario.phase_starts())
    .with_open_loop(&scenario.open_loop());
    let wall = Instant::now();
    let (recorder, observation, device, replays) = if options.check || cfg!(debug_assertions) {
        let (checker, observation, device, replays) = drive(
            scenario,
            policy,
            Checker::new(recorder),
            device,
            cost,
            progress,
            Some(checker::check_run),
        );
        (checker.finish(), observation, device, replays)
    } else {
        drive(scenario, policy, recorder, device, cost, progress, None)
    };
    let wall_seconds = wall.elapsed().as_secs_f64();
    let workloads: Vec<String> = scenario
        .tenants
        .iter()
        .map(|t| t.workload.label.clone())
        .collect();
    let mut result = recorder.finish(
        &choice.label,
        &specs,
        &workloads,
        device.stats(),
        wall_seconds,
        observation,
    );
    result.policy_name = choice.name.clone();
    for ((t, replay), setup) in result
        .tenants
        .iter_mut()
        .zip(replays)
        .zip(&scenario.tenants)
    {
        t.trace = replay;
        t.priority = setup.priority;
    }
    Ok(result)
}

/// Runs one policy of `scenario` on a freshly built (and preconditioned) device with
/// `observer` seeing every event of the host (a trace, a measurement of one's own);
/// returns it. Checked as [`run_policy_with`] is.
pub fn run_observed<O: Observer>(
    scenario: &Scenario,
    choice: &PolicyChoice,
    observer: O,
    options: RunOptions,
) -> Result<O, PolicyError> {
    let device = scenario.device.build(scenario.seed);
    let cost = scenario.device.fitted_cost(device.as_ref());
    let policy = policy::build_on(
        &choice.name,
        choice.params.clone(),
        &scenario.specs(),
        Some(&cost),
        scenario.device.actuators(),
    )?;
    Ok(if options.check || cfg!(debug_assertions) {
        let checker = Checker::new(observer);
        let check = Some(checker::check_run as CheckFn<Checker<O>>);
        drive(scenario, policy, checker, device, cost, None, check)
            .0
            .finish()
    } else {
        drive(scenario, policy, observer, device, cost, None, None).0
    })
}

/// What the checker looks at after each event.
type CheckFn<O> = fn(&Host<O>, &dyn DeviceModel, Nanos);

/// Runs the scenario's events with one host and device; returns the observer, the
/// policy's full observation, the device and what each tenant's trace replay did.
fn drive<O: Observer>(
    scenario: &Scenario,
    policy: Box<dyn Policy>,
    observer: O,
    device: Box<dyn DeviceModel>,
    cost: CostModel,
    progress: Option<&ProgressBar>,
    check: Option<CheckFn<O>>,
) -> (
    O,
    Observation,
    Box<dyn DeviceModel>,
    Vec<Option<ReplayStats>>,
) {
    let limits = Limits {
        queue_depth: scenario.queue_depth,
        queue_limit: scenario.queue_limit,
        refuse: scenario.refuse,
        stall: None,
    };
    let mut run = Run {
        scenario,
        host: Host::new(policy, observer, limits, scenario.tenants.len(), cost),
        device: Driver::new(device),
        events: BinaryHeap::with_capacity(1024),
        seq: 0,
        next_id: 0,
        tenants: scenario
            .tenants
            .iter()
            .map(|t| TenantRun {
                generator: Generator::new(scenario.seed, t.stream, t.offset, t.size),
                replay: t
                    .workload
                    .trace
                    .as_ref()
                    .map(|spec| Replay::open(spec, t.offset, t.size)),
                due: None,
                phase: None,
                epoch: 0,
                outstanding: 0,
            })
            .collect(),
        alarm_at: None,
        finished: Vec::new(),
    };
    run.device.model_mut().reset_stats();
    run.device.model_mut().measure_from(scenario.warmup);
    for tenant in 0..scenario.tenants.len() as TenantId {
        run.push(0, EventKind::Phase { tenant, phase: 0 });
    }
    run.run(progress, |run, now| {
        if let Some(check) = check {
            check(&run.host, run.device.model(), now);
        }
    });
    let replays = run
        .tenants
        .iter()
        .map(|t| t.replay.as_ref().map(Replay::stats))
        .collect();
    let (observer, observation) = run.host.finish();
    (observer, observation, run.device.into_model(), replays)
}

/// Devices kept built (and aged) between the points of a sweep: points with the same
/// device and seed share one; past this many distinct ones the least recently used is
/// dropped (an aged SSD model is gigabytes). Each run works on a copy of its device, so
/// a sweep holds up to one more than this.
pub const KEPT_DEVICES: usize = 2;

/// Runs every policy of every scenario (the points of a sweep), each run on a fresh
/// copy of its preconditioned device. Devices with the same spec and seed are built
/// (and aged) once while they are among the last [`KEPT_DEVICES`] used.
pub fn run_scenarios(
    scenarios: &[Scenario],
    show_progress: bool,
) -> Result<ScenarioResult, PolicyError> {
    run_scenarios_with(scenarios, show_progress, RunOptions::default())
}

/// [`run_scenarios`] with options for every run.
pub fn run_scenarios_with(
    scenarios: &[Scenario],
    show_progress: bool,
    options: RunOptions,
) -> Result<ScenarioResult, PolicyError> {
    run_each(scenarios, show_progress, options)
}

/// [`run_scenarios_with`] over scenarios built one at a time (a sweep's points): only
/// the one running is held, besides the results.
///
/// # Panics
/// With no scenario at all.
pub fn run_each<S: std::borrow::Borrow<Scenario>>(
    scenarios: impl IntoIterator<Item = S>,
    show_progress: bool,
    options: RunOptions,
) -> Result<ScenarioResult, PolicyError> {
    let mut devices: std::collections::VecDeque<(
        crate::device::spec::DeviceSpec,
        u64,
        Box<dyn DeviceModel>,
        CostModel,
    )> = std::collections::VecDeque::new();
    let mut runs = Vec::new();
    let mut header = None;
    for scenario in scenarios {
        let scenario = scenario.borrow();
        header.get_or_insert_with(|| {
            (
                scenario.name.clone(),
                scenario.description.clone(),
                scenario.seed,
                crate::types::nanos_to_secs(scenario.duration),
                scenario.device.describe(),
            )
        });
        let idx = match devices
            .iter()
            .position(|(d, s, _, _)| *d == scenario.device && *s == scenario.seed)
        {
            // Used again: it becomes the most recently used.
            Some(i) => {
                let hit = devices.remove(i).expect("a found entry");
                devices.push_back(hit);
                devices.len() - 1
            }
            None => {
                if devices.len() == KEPT_DEVICES {
                    devices.pop_front();
                }
                let device = scenario.device.build(scenario.seed);
                let cost = scenario.device.fitted_cost(device.as_ref());
                devices.push_back((scenario.device.clone(), scenario.seed, device, cost));
                devices.len() - 1
            }
        };
        let alone = if scenario.insulation {
            Some(alone::yardstick(
                scenario,
                devices[idx].2.as_ref(),
                devices[idx].3,
                options,
            )?)
        } else {
            None
        };
        for choice in &scenario.policies {
            let label = if scenario.variant.is_empty() {
                choice.label.clone()
            } else {
                format!("{} [{}]", choice.label, scenario.variant)
            };
            let bar = show_progress.then(|| progress_bar(scenario, &label));
            let device = devices[idx].2.clone_box();
            let cost = devices[idx].3;
            let mut result =
                run_policy_priced(scenario, choice, device, cost, bar.as_ref(), options)?;
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            result.variant = scenario.variant.clone();
            if let Some(alone) = &alone {
                crate::metrics::insulation::judge(&mut result, alone);
            }
            runs.push(result);
        }
    }
    let (scenario, description, seed, duration_s, device) = header.expect("at least one scenario");
    Ok(ScenarioResult {
        scenario,
        description,
        seed,
        duration_s,
        device,
        runs,
    })
}

/// Runs every policy of one scenario.
pub fn run_scenario(
    scenario: &Scenario,
    show_progress: bool,
) -> Result<ScenarioResult, PolicyError> {
    run_scenarios(std::slice::from_ref(scenario), show_progress)
}

fn progress_bar(scenario: &Scenario, label: &str) -> ProgressBar {
    let bar = ProgressBar::new(scenario.duration / 1_000_000);
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix:>10} [{bar:30}] {pos}/{len} ms simulated ({elapsed})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(label.to_string());
    bar.set_position(0);
    bar
}
