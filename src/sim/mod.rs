//! The discrete-event simulator: tenants' workloads against a device model in virtual
//! time, under one policy, with a device queue depth. Deterministic: the only inputs
//! are the scenario and its seed.

use crate::device::{DeviceModel, Finished, Submitted};
use crate::metrics::{PolicyOutcome, Recorder, RunResult, SimStats};
use crate::policy::{self, Dispatch, Policy, PolicyError};
use crate::scenario::{PolicyChoice, Scenario};
use crate::types::{Completion, Nanos, Request};
use crate::workload::{Arrivals, Generator};
use indicatif::ProgressBar;
use serde::Serialize;
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Instant;

/// Everything a scenario produced (results.json).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScenarioResult {
    pub scenario: String,
    pub description: String,
    pub seed: u64,
    pub duration_s: f64,
    pub device: String,
    pub runs: Vec<RunResult>,
}

#[derive(Debug, Clone, Copy)]
enum EventKind {
    /// A request completes on the device.
    Complete { request: Request, start: Nanos },
    /// Open-loop arrival for a tenant; `epoch` drops arrivals of an ended phase.
    Arrival { tenant: u32, epoch: u32 },
    /// A tenant's phase `phase` begins (`phase == len` means its last phase ended).
    Phase { tenant: u32, phase: u32 },
    /// The policy asked to be asked again.
    Wake,
    /// The policy's timer.
    Timer,
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
    phase: Option<usize>,
    epoch: u32,
    /// Requests issued and not yet completed.
    outstanding: u32,
    /// Requests held by the policy (issued, not yet dispatched).
    held: u32,
}

/// One run: one scenario, one policy, one device state.
struct Run<'a> {
    scenario: &'a Scenario,
    policy: Box<dyn Policy>,
    device: Box<dyn DeviceModel>,
    recorder: Recorder,
    events: BinaryHeap<Event>,
    seq: u64,
    next_id: u64,
    in_flight: u32,
    tenants: Vec<TenantRun>,
    wake_at: Option<Nanos>,
    timer_at: Option<Nanos>,
    device_at: Option<Nanos>,
    finished: Vec<Finished>,
}

impl<'a> Run<'a> {
    fn push(&mut self, time: Nanos, kind: EventKind) {
        self.seq += 1;
        self.events.push(Event {
            time,
            seq: self.seq,
            kind,
        });
    }

    fn issue(&mut self, tenant: u32, now: Nanos) {
        let setup = &self.scenario.tenants[tenant as usize];
        let t = &mut self.tenants[tenant as usize];
        let Some(phase) = t.phase.map(|p| &setup.workload.phases[p]) else {
            return;
        };
        let (op, offset, len) = t.generator.next_io(phase);
        if self
            .scenario
            .queue_limit
            .is_some_and(|limit| t.held >= limit)
        {
            self.recorder.rejected(tenant, now);
            return;
        }
        t.held += 1;
        t.outstanding += 1;
        self.next_id += 1;
        let request = Request {
            id: self.next_id,
            tenant,
            op,
            offset,
            len,
            arrival: now,
        };
        self.recorder.arrived(tenant, now);
        self.policy.enqueue(request, now);
        while let Some(refused) = self.policy.take_refused() {
            // The client got an error; a closed loop issues its next request at its next
            // completion (issuing now would be refused again at the same instant).
            let t = &mut self.tenants[refused.tenant as usize];
            t.held -= 1;
            t.outstanding -= 1;
            self.recorder.refused(&refused, now);
        }
    }

    fn start_phase(&mut self, tenant: u32, phase: u32, now: Nanos) {
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
            Arrivals::Idle => {}
        }
    }

    /// Hands the device everything the policy releases while there is a free slot.
    fn pump(&mut self, now: Nanos) {
        while self.in_flight < self.scenario.queue_depth {
            match self.policy.dispatch(now) {
                Dispatch::Request(request) => {
                    self.in_flight += 1;
                    self.tenants[request.tenant as usize].held -= 1;
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
                Dispatch::Wait(at) => {
                    let at = at.max(now + 1);
                    if self.wake_at.is_none_or(|w| at < w || w <= now) {
                        self.wake_at = Some(at);
                        self.push(at, EventKind::Wake);
                    }
                    break;
                }
                Dispatch::Idle => break,
            }
        }
        if let Some(at) = self.policy.next_timer() {
            let at = at.max(now + 1);
            if self.timer_at.is_none_or(|t| at < t || t <= now) {
                self.timer_at = Some(at);
                self.push(at, EventKind::Timer);
            }
        }
    }

    /// Makes sure a `Device` event is due when the device model next wants one.
    fn arm_device(&mut self, now: Nanos) {
        if let Some(at) = self.device.next_event() {
            let at = at.max(now);
            if self.device_at.is_none_or(|d| at < d || d < now) {
                self.device_at = Some(at);
                self.push(at, EventKind::Device);
            }
        }
    }

    fn complete(&mut self, request: Request, start: Nanos, now: Nanos) {
        self.in_flight -= 1;
        let c = Completion {
            request,
            start,
            finish: now,
        };
        self.recorder.completed(&c);
        self.policy.complete(&c, now);
        let tenant = request.tenant;
        let t = &mut self.tenants[tenant as usize];
        t.outstanding -= 1;
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
                if self.device_at == Some(now) {
                    self.device_at = None;
                }
                let mut finished = std::mem::take(&mut self.finished);
                self.device.advance(now, &mut finished);
                for f in finished.drain(..) {
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
                if let Arrivals::Open { rate_iops, process } =
                    self.scenario.tenants[tenant as usize].workload.phases[p].arrivals
                {
                    let next = now + t.generator.interarrival(rate_iops, process);
                    self.push(next, EventKind::Arrival { tenant, epoch });
                    self.issue(tenant, now);
                }
            }
            EventKind::Phase { tenant, phase } => self.start_phase(tenant, phase, now),
            EventKind::Wake => {
                if self.wake_at == Some(now) {
                    self.wake_at = None;
                }
            }
            EventKind::Timer => {
                if self.timer_at == Some(now) {
                    self.timer_at = None;
                }
                if self.policy.next_timer().is_some_and(|t| t <= now) {
                    self.policy.on_timer(now);
                }
            }
        }
    }
}

/// Runs one policy on a copy of `device` (already preconditioned).
pub fn run_policy(
    scenario: &Scenario,
    choice: &PolicyChoice,
    device: Box<dyn DeviceModel>,
    progress: Option<&ProgressBar>,
) -> Result<RunResult, PolicyError> {
    let specs = scenario.specs();
    let policy = policy::build(&choice.name, choice.params.clone(), &specs)?;
    let wall = Instant::now();
    let mut run = Run {
        scenario,
        policy,
        device,
        recorder: Recorder::new(
            &specs,
            scenario.warmup,
            scenario.duration,
            scenario.interval,
        )
        .with_phases(&scenario.phase_starts()),
        events: BinaryHeap::with_capacity(1024),
        seq: 0,
        next_id: 0,
        in_flight: 0,
        tenants: scenario
            .tenants
            .iter()
            .enumerate()
            .map(|(i, t)| TenantRun {
                generator: Generator::new(scenario.seed, i as u64 + 1, t.offset, t.size),
                phase: None,
                epoch: 0,
                outstanding: 0,
                held: 0,
            })
            .collect(),
        wake_at: None,
        timer_at: None,
        device_at: None,
        finished: Vec::new(),
    };
    run.device.reset_stats();
    for tenant in 0..scenario.tenants.len() as u32 {
        run.push(0, EventKind::Phase { tenant, phase: 0 });
    }
    let mut steps: u64 = 0;
    while let Some(event) = run.events.pop() {
        if event.time >= scenario.duration {
            break;
        }
        let now = event.time;
        run.handle(event);
        // Let every event at this instant land before asking the policy.
        if run.events.peek().is_none_or(|e| e.time != now) {
            run.pump(now);
        }
        steps += 1;
        if steps & 0xffff == 0
            && let Some(pb) = progress
        {
            pb.set_position(now / 1_000_000);
        }
    }
    let wall_seconds = wall.elapsed().as_secs_f64();
    let workloads: Vec<String> = scenario
        .tenants
        .iter()
        .map(|t| t.workload.label.clone())
        .collect();
    let device_stats = run.device.stats();
    let outcome = PolicyOutcome {
        stats: run.policy.stats(),
        switches: run.policy.switch_log(),
    };
    Ok(run.recorder.finish(
        &choice.label,
        &specs,
        &workloads,
        device_stats,
        SimStats {
            requests: 0,
            wall_seconds,
        },
        outcome,
    ))
}

/// Runs every policy of every scenario (the points of a sweep), each run on a fresh
/// copy of its preconditioned device. Devices with the same spec and seed are built
/// (and aged) once.
pub fn run_scenarios(
    scenarios: &[Scenario],
    show_progress: bool,
) -> Result<ScenarioResult, PolicyError> {
    let first = scenarios.first().expect("at least one scenario");
    let mut devices: Vec<(&crate::scenario::DeviceSpec, u64, Box<dyn DeviceModel>)> = Vec::new();
    let mut runs = Vec::new();
    for scenario in scenarios {
        let idx = match devices
            .iter()
            .position(|(d, s, _)| **d == scenario.device && *s == scenario.seed)
        {
            Some(i) => i,
            None => {
                devices.push((
                    &scenario.device,
                    scenario.seed,
                    scenario.device.build(scenario.seed),
                ));
                devices.len() - 1
            }
        };
        for choice in &scenario.policies {
            let label = if scenario.variant.is_empty() {
                choice.label.clone()
            } else {
                format!("{} [{}]", choice.label, scenario.variant)
            };
            let bar = show_progress.then(|| progress_bar(scenario, &label));
            let mut result =
                run_policy(scenario, choice, devices[idx].2.clone_box(), bar.as_ref())?;
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            result.variant = scenario.variant.clone();
            runs.push(result);
        }
    }
    Ok(ScenarioResult {
        scenario: first.name.clone(),
        description: first.description.clone(),
        seed: first.seed,
        duration_s: crate::types::nanos_to_secs(first.duration),
        device: first.device.describe(),
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
