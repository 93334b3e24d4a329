//! Schedulers as sans-I/O state machines, and the registry that finds them by name.
//!
//! A policy is handed requests, completions and the current time and answers what to
//! dispatch next. It never reads a clock, spawns a thread or does I/O, so the same object
//! runs in the simulator (virtual time) and in the live server (wall time).

use crate::device::cost;
use crate::limits::{governor, throttle};
mod bfq;
mod cfq;
pub(crate) mod depth;
mod feedbac;
pub mod floor;
pub(crate) mod frame;
mod limit;
mod mclock;
mod mots;
mod none;
mod phase;
mod quantum;
mod queues;
mod sfq;
mod ta1;
mod ta2;
mod ta3;
pub(crate) mod token_bucket;

pub use bfq::Bfq;
pub use cfq::Cfq;
pub use feedbac::FeedBac;
pub(crate) use feedbac::Holt;
pub use mclock::MClock;
pub use mots::Mots;
pub use none::Fifo;
pub use queues::TenantQueues;
pub use sfq::Sfq;

use crate::types::{Completion, Nanos, Request, TenantId, TenantSpec};
use cost::Currency;
use std::collections::BTreeSet;

/// The policy's answer to "what should the device do now?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a dispatched request must go to the device, or it is lost"]
pub enum Dispatch {
    /// Send this request to the device now.
    Request(Request),
    /// Nothing now; ask again at this time (for example when a bucket refills).
    Wait(Nanos),
    /// Nothing until a new request arrives or a request completes.
    Idle,
}

/// Why a request was refused instead of served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// The tenant already had `queue_limit` requests waiting in the host.
    QueueFull,
    /// The policy refused it: a token-bucket policy saw that it could no longer meet
    /// its response time.
    Policy,
    /// The host is stopping: the drain deadline passed while the request waited (or it
    /// arrived after that).
    Stopping,
}

/// What became of a request offered to a policy (or to the host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a refused request must be answered, or its client waits forever"]
pub enum Admission {
    /// Held; it leaves through [`Policy::dispatch`].
    Queued,
    /// Not taken: the caller answers the client with an error; the policy keeps nothing
    /// of it.
    Refused(Request, Refusal),
}

/// One value of a policy's state, exported as `ioshare_policy_<name>`.
#[derive(Debug, Clone, PartialEq)]
pub struct Gauge {
    /// Metric name without prefix; counters end in `_total`.
    pub name: &'static str,
    /// One line saying what the value is (Prometheus `# HELP`).
    pub help: &'static str,
    /// The tenant it belongs to, `None` for the whole policy.
    pub tenant: Option<TenantId>,
    /// The value now.
    pub value: f64,
}

impl Gauge {
    /// A value of the whole policy.
    pub fn policy(name: &'static str, help: &'static str, value: f64) -> Self {
        Gauge {
            name,
            help,
            tenant: None,
            value,
        }
    }

    /// A value of one tenant.
    pub fn tenant(name: &'static str, help: &'static str, tenant: usize, value: f64) -> Self {
        Gauge {
            name,
            help,
            tenant: Some(TenantId::try_from(tenant).expect("tenant index fits a TenantId")),
            value,
        }
    }

    /// A counter (only grows) rather than a value that goes up and down.
    pub fn is_counter(&self) -> bool {
        self.name.ends_with("_total")
    }
}

/// Switch states of a policy over a run (TA1/TA2/TA3), for per-phase on-time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SwitchLog {
    /// Per tenant: whether its switch was on at time 0; `None` for tenants without one.
    pub initially_on: Vec<Option<bool>>,
    /// (time, tenant, on) in time order.
    pub transitions: Vec<(Nanos, TenantId, bool)>,
    /// `Some(t)`: the log is bounded and kept no transitions after `t`.
    pub complete_until: Option<Nanos>,
}

impl SwitchLog {
    /// Fraction of `[from, to)` tenant `t`'s switch was on; `None` without a switch or
    /// past what a bounded log kept.
    pub fn on_fraction(&self, t: usize, from: Nanos, to: Nanos) -> Option<f64> {
        if self.complete_until.is_some_and(|until| to > until) {
            return None;
        }
        let mut on = (*self.initially_on.get(t)?)?;
        if to <= from {
            return Some(0.0);
        }
        let mut since = 0;
        let mut total = 0;
        let overlap = |a: Nanos, b: Nanos| b.min(to).saturating_sub(a.max(from));
        for &(time, tenant, state) in &self.transitions {
            if tenant as usize != t || state == on {
                continue;
            }
            if on {
                total += overlap(since, time);
            }
            on = state;
            since = time;
        }
        if on {
            total += overlap(since, to);
        }
        Some(total as f64 / (to - from) as f64)
    }
}

/// How much of its state a policy is asked to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// The gauges only: cheap and bounded, asked for often (`/metrics`).
    Gauges,
    /// Everything, for the report at the end of a run.
    Full,
}

/// What a policy shows of itself: one view for live monitoring and reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observation {
    /// The state now (credits, switch states, slices) and counters, one value per
    /// (name, tenant).
    pub gauges: Vec<Gauge>,
    /// With [`Detail::Full`], for policies that switch throttling in and out: the
    /// switch states over the run (reports turn it into on-time per phase).
    pub switches: Option<SwitchLog>,
    /// With [`Detail::Full`]: what only a report shows (a forecast per period, the
    /// switch timeline), as results.json's `policy_stats`; `Null` when nothing.
    pub report: serde_json::Value,
    /// What the policy shares by weight ([`Policy::currency`]; the host fills it in).
    pub currency: Currency,
}

impl Observation {
    /// The gauges, and with [`Detail::Full`] the report `report` builds (only then);
    /// no switch log.
    pub fn of(
        detail: Detail,
        gauges: Vec<Gauge>,
        report: impl FnOnce() -> serde_json::Value,
    ) -> Self {
        Observation {
            gauges,
            switches: None,
            report: match detail {
                Detail::Full => report(),
                Detail::Gauges => serde_json::Value::Null,
            },
            currency: Currency::default(),
        }
    }
}

/// A scheduler. See the module docs for the contract.
pub trait Policy: Send {
    /// Registry name of the policy (`none`, `cfq`, ...).
    fn name(&self) -> &'static str;

    /// A new request from a tenant. The policy holds it ([`Admission::Queued`]) or
    /// refuses it ([`Admission::Refused`] with this very request and
    /// [`Refusal::Policy`]); it never refuses another request than the one offered.
    fn enqueue(&mut self, request: Request, now: Nanos) -> Admission;

    /// The next request to send to the device, or when to ask again. The caller asks
    /// only while the device has a free slot.
    fn dispatch(&mut self, now: Nanos) -> Dispatch;

    /// A dispatched request finished.
    fn complete(&mut self, completion: &Completion, now: Nanos);

    /// When the policy next wants [`Policy::on_timer`] called even if nothing happens
    /// (periodic ticks, refills). `None` when it has no timer.
    fn next_timer(&self) -> Option<Nanos> {
        None
    }

    /// Called at (or after) the time answered by [`Policy::next_timer`].
    fn on_timer(&mut self, _now: Nanos) {}

    /// A tenant's weight, SLO, reservation or limit changed while running. The policy
    /// applies it from its next period/slice.
    fn update_tenant(&mut self, tenant: TenantId, spec: &TenantSpec, now: Nanos);

    /// Limits decided outside the policy for `tenant` from `now` on (a cluster's fronts
    /// agreeing on each tenant's part of its global limits, `crate::cluster`). A policy
    /// that enforces such limits ([`throttle::Limited`]) takes them and answers `true`;
    /// any other ignores them and answers `false`.
    fn set_limits(&mut self, _tenant: TenantId, _limits: &governor::Limits, _now: Nanos) -> bool {
        false
    }

    /// A tenant joins while running; its id is the number of tenants before it. The
    /// policy serves it from now on as it serves a tenant that was there from the start
    /// and idle until now (built with it at time 0, a policy given the same events makes
    /// the same decisions: `tests::a_tenant_added_at_the_start_is_one_built_in`).
    fn add_tenant(&mut self, spec: &TenantSpec, now: Nanos) -> TenantId;

    /// Requests held by the policy (not yet dispatched), over all tenants.
    fn queued(&self) -> usize;

    /// Hands back every request the policy holds and forgets them (the host is
    /// stopping and answers them itself). Afterwards [`Policy::queued`] is 0.
    fn withdraw_all(&mut self) -> Vec<Request>;

    /// The policy's state (see [`Observation`]).
    fn observe(&self, _detail: Detail) -> Observation {
        Observation::default()
    }

    /// What it shares between tenants by weight ([`Currency::DeviceTime`] unless it
    /// says otherwise): what its share error is judged in.
    fn currency(&self) -> Currency {
        Currency::DeviceTime
    }

    /// Its own invariants, after any event (the simulator's checker calls it after
    /// every one, as it calls [`crate::device::DeviceModel::check`]): counts add up,
    /// tags never go back, credits handed out are the period's. `Err` says what broke.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

impl PolicyError {
    /// `name` is no policy: the error, with the registered name it most resembles
    /// when one is within two edits (or differs only in case).
    pub fn unknown(name: &str) -> Self {
        let near = names()
            .into_iter()
            .map(|known| {
                (
                    strsim::levenshtein(&name.to_ascii_lowercase(), known),
                    known,
                )
            })
            .filter(|&(d, _)| d <= 2)
            .min()
            .map(|(_, known)| known);
        PolicyError::Unknown {
            name: name.to_string(),
            near,
            known: names().join(", "),
        }
    }
}

/// Whether a policy of this name is registered.
pub fn is_registered(name: &str) -> bool {
    registry().iter().any(|p| p.name == name)
}

/// Error building a policy from its configuration.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PolicyError {
    /// No policy has this name.
    #[error("unknown policy '{name}'{} (known: {known})", match near { Some(n) => format!(": did you mean '{n}'?"), None => String::new() })]
    Unknown {
        /// The name asked for.
        name: String,
        /// The known name closest to it, when one is close (a typing slip).
        near: Option<&'static str>,
        /// Every known policy name, comma-separated.
        known: String,
    },
    /// The configuration gives a parameter the policy does not take.
    #[error("policy '{policy}': unknown parameter '{param}'")]
    UnknownParam {
        /// The policy's name.
        policy: String,
        /// The parameter's name.
        param: String,
    },
    /// A parameter has a value of the wrong type or out of range.
    #[error("policy '{policy}': parameter '{param}': {problem}")]
    BadParam {
        /// The policy's name.
        policy: String,
        /// The parameter's name.
        param: String,
        /// What is wrong with the value.
        problem: String,
    },
}

/// A policy parameter's value, as a configuration gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    /// A whole number.
    Int(i64),
    /// A number with a fraction.
    Float(f64),
    /// `true` or `false`.
    Bool(bool),
    /// Text.
    Text(String),
}

impl std::fmt::Display for ParamValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamValue::Int(v) => write!(f, "{v}"),
            ParamValue::Float(v) => write!(f, "{v:?}"),
            ParamValue::Bool(v) => write!(f, "{v}"),
            ParamValue::Text(v) => write!(f, "{v:?}"),
        }
    }
}

/// A policy's parameters by name (what `{ name = "sfq", depth = 8 }` says besides
/// `name` and `label`).
pub type Params = std::collections::BTreeMap<String, ParamValue>;

/// Parameters given to a policy in a scenario or server config. Every key must be read
/// by the policy's constructor; [`PolicyParams::finish`] reports the ones left over, so a
/// misspelt parameter is an error instead of a silent default.
#[derive(Debug, Clone, Default)]
pub struct PolicyParams {
    policy: String,
    table: Params,
    used: BTreeSet<String>,
    /// What requests cost the device the policy will schedule, when it is known.
    device: Option<cost::CostModel>,
    /// Its heads that move independently, when known (1: a disk).
    actuators: Option<u32>,
}

impl PolicyParams {
    /// The parameters `table` given to `policy`.
    pub fn new(policy: &str, table: Params) -> Self {
        PolicyParams {
            policy: policy.to_string(),
            table,
            used: BTreeSet::new(),
            device: None,
            actuators: None,
        }
    }

    /// The device's cost model, for defaults that depend on the device.
    pub fn with_device(mut self, model: Option<cost::CostModel>) -> Self {
        self.device = model;
        self
    }

    /// The device's cost model, when known.
    pub fn device(&self) -> Option<&cost::CostModel> {
        self.device.as_ref()
    }

    /// The device's heads that move independently (1: one disk; an array's members),
    /// when known.
    pub fn with_actuators(mut self, actuators: Option<u32>) -> Self {
        self.actuators = actuators;
        self
    }

    /// The device's independent heads, when known.
    pub fn actuators(&self) -> Option<u32> {
        self.actuators
    }

    /// Text, or `default` when absent.
    pub fn str_or(&mut self, key: &str, default: &str) -> Result<String, PolicyError> {
        self.used.insert(key.to_string());
        match self.table.get(key) {
            None => Ok(default.to_string()),
            Some(ParamValue::Text(v)) => Ok(v.clone()),
            Some(other) => Err(self.invalid(key, format!("expected text, got {other}"))),
        }
    }

    /// What the policy shares (`key`, default `default`): `"device"` (device time,
    /// each request's cost in the device's model, which the host stamps on it),
    /// `"bytes"` or `"requests"`.
    pub fn currency(&mut self, key: &str, default: Currency) -> Result<Currency, PolicyError> {
        let text = self.str_or(key, default.name())?;
        Currency::parse(&text).ok_or_else(|| {
            self.invalid(
                key,
                format!("'{text}' is not one of device, bytes, requests"),
            )
        })
    }

    /// An error about one parameter of this policy.
    pub fn invalid(&self, param: &str, problem: impl Into<String>) -> PolicyError {
        PolicyError::BadParam {
            policy: self.policy.clone(),
            param: param.to_string(),
            problem: problem.into(),
        }
    }

    /// A non-negative number, or `default` when absent.
    pub fn f64_or(&mut self, key: &str, default: f64) -> Result<f64, PolicyError> {
        self.used.insert(key.to_string());
        match self.table.get(key) {
            None => Ok(default),
            Some(ParamValue::Float(v)) if v.is_finite() && *v >= 0.0 => Ok(*v),
            Some(ParamValue::Int(v)) if *v >= 0 => Ok(*v as f64),
            Some(other) => {
                Err(self.invalid(key, format!("expected a non-negative number, got {other}")))
            }
        }
    }

    /// A number in `range`, or `default` when absent; outside it, refused with `why`.
    pub fn f64_in(
        &mut self,
        key: &str,
        default: f64,
        range: std::ops::RangeInclusive<f64>,
        why: &str,
    ) -> Result<f64, PolicyError> {
        let v = self.f64_or(key, default)?;
        if !range.contains(&v) {
            return Err(self.invalid(key, why));
        }
        Ok(v)
    }

    /// A non-negative integer, or `default` when absent.
    pub fn u64_or(&mut self, key: &str, default: u64) -> Result<u64, PolicyError> {
        self.used.insert(key.to_string());
        match self.table.get(key) {
            None => Ok(default),
            Some(ParamValue::Int(v)) if *v >= 0 => Ok(*v as u64),
            Some(other) => {
                Err(self.invalid(key, format!("expected a non-negative integer, got {other}")))
            }
        }
    }

    /// A depth: a non-negative integer, or `"auto"` (`None`); when absent, `"auto"` if
    /// `auto_by_default`, else `0`.
    pub fn depth_or_auto(
        &mut self,
        key: &str,
        auto_by_default: bool,
    ) -> Result<Option<u32>, PolicyError> {
        self.used.insert(key.to_string());
        match self.table.get(key) {
            None => Ok((!auto_by_default).then_some(0)),
            Some(ParamValue::Text(v)) if v == "auto" => Ok(None),
            Some(ParamValue::Int(v)) if (0..=i64::from(u32::MAX)).contains(v) => {
                Ok(Some(*v as u32))
            }
            Some(other) => Err(self.invalid(
                key,
                format!("expected \"auto\" or a non-negative integer, got {other}"),
            )),
        }
    }

    /// Whether `key` was given (it is not marked as read).
    pub fn is_set(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    /// A boolean, or `default` when absent.
    pub fn bool_or(&mut self, key: &str, default: bool) -> Result<bool, PolicyError> {
        self.used.insert(key.to_string());
        match self.table.get(key) {
            None => Ok(default),
            Some(ParamValue::Bool(v)) => Ok(*v),
            Some(other) => Err(self.invalid(key, format!("expected true or false, got {other}"))),
        }
    }

    /// Fails on any key the constructor did not read.
    pub fn finish(self) -> Result<(), PolicyError> {
        match self.table.keys().find(|k| !self.used.contains(*k)) {
            Some(k) => Err(PolicyError::UnknownParam {
                policy: self.policy,
                param: k.clone(),
            }),
            None => Ok(()),
        }
    }
}

/// Builds a policy for the given tenants from its parameters.
pub type PolicyBuilder =
    fn(&mut PolicyParams, &[TenantSpec]) -> Result<Box<dyn Policy>, PolicyError>;

/// The promises a policy makes, which it is judged on: a token bucket does not aim at
/// weights, a proportional-share scheduler not at response times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Aims {
    /// It splits the device by the tenants' weights.
    pub weights: bool,
    /// It holds each tenant's reservation (minimum IOPS).
    pub reservations: bool,
    /// It caps each tenant at its limit (maximum IOPS).
    pub limits: bool,
    /// It keeps each SLO tenant's response time.
    pub slo: bool,
}

impl Aims {
    const NOTHING: Aims = Aims {
        weights: false,
        reservations: false,
        limits: false,
        slo: false,
    };
    const WEIGHTS_AND_LIMITS: Aims = Aims {
        weights: true,
        limits: true,
        ..Aims::NOTHING
    };
    const WEIGHTS: Aims = Aims {
        weights: true,
        ..Aims::NOTHING
    };
    const SLO: Aims = Aims {
        slo: true,
        ..Aims::NOTHING
    };
}

/// One registered policy.
pub struct PolicyInfo {
    /// Name a configuration selects it by.
    pub name: &'static str,
    /// What it does, in one line.
    pub summary: &'static str,
    /// The promises it makes.
    pub aims: Aims,
    /// Whether the tenants' limits are kept by the limit gate in front of it
    /// (`limit.rs`) rather than by the policy itself.
    pub gated: bool,
    /// Builds it from its parameters.
    pub build: PolicyBuilder,
}

/// The policy a server or scenario gets when it names none: of the registered policies
/// the one that keeps every kind of promise a configuration writes — weights (shares of
/// device time), reservations and limits (mClock's tags), response times (a tenant's
/// SLO, which reserves its IOPS: the adaptive dispatch depth) — with the shaping its
/// device needs (turns on one disk). Measured against the others in
/// docs/conformance.md; `none` (no control) only when named.
pub const DEFAULT_POLICY: &str = "mclock";

/// Every policy ioshare knows, in the order reports list them.
pub fn registry() -> &'static [PolicyInfo] {
    &[
        PolicyInfo {
            name: "none",
            summary: "FIFO across tenants, no control (the baseline)",
            aims: Aims::NOTHING,
            gated: false,
            build: |_, tenants| Ok(Box::new(Fifo::new(tenants.len()))),
        },
        PolicyInfo {
            name: "cfq",
            summary: "time slices proportional to weight, round-robin, optional idling (Linux CFQ style)",
            aims: Aims::WEIGHTS_AND_LIMITS,
            gated: true,
            build: Cfq::build,
        },
        PolicyInfo {
            name: "mots",
            summary: "the MoTS feedback controller correcting a base scheduler's weights every second (SFQ by default; CFQ slices by bytes: the paper's MCFQ)",
            aims: Aims::WEIGHTS_AND_LIMITS,
            gated: true,
            build: Mots::build,
        },
        PolicyInfo {
            name: "bfq",
            summary: "budget fair queueing: one tenant at a time, budgets of device time by weight, no idling by default (Linux BFQ style)",
            aims: Aims::WEIGHTS_AND_LIMITS,
            gated: true,
            build: Bfq::build,
        },
        PolicyInfo {
            name: "feedbac",
            summary: "credits by weight each period, total forecast by Holt smoothing, early refill, bounded carry-over",
            aims: Aims::WEIGHTS_AND_LIMITS,
            gated: true,
            build: FeedBac::build,
        },
        PolicyInfo {
            name: "sfq",
            summary: "start-time fair queueing with dispatch depth D, SFQ(D): work-conserving, by device time",
            aims: Aims::WEIGHTS_AND_LIMITS,
            gated: true,
            build: Sfq::build,
        },
        PolicyInfo {
            name: "ta1",
            summary: "a token bucket per SLO tenant (iops / τ per tick, as deep as the SLO's burst), always on",
            aims: Aims::SLO,
            gated: false,
            build: ta1::build,
        },
        PolicyInfo {
            name: "ta2",
            summary: "TA1's buckets behind one switch, on above the high water mark of rt, off below the low",
            aims: Aims::SLO,
            gated: false,
            build: ta2::build,
        },
        PolicyInfo {
            name: "ta3",
            summary: "TA2 with a switch per tenant: only tenants above their agreed rate are throttled",
            aims: Aims::SLO,
            gated: false,
            build: ta3::build,
        },
        PolicyInfo {
            name: "govern",
            summary: "the kernel's cgroup throttle (io.max) with limits set every period by the governor: device time by weight among those who want it, total found from the device's latency",
            aims: Aims::WEIGHTS,
            gated: false,
            build: throttle::Throttle::build,
        },
        PolicyInfo {
            name: "mclock",
            summary: "mClock: reservation, weight and limit tags; reservations first, weights share the rest (in turns of the disk's time on one disk)",
            // An SLO reserves its IOPS (and times the adaptive depth): kept as a
            // reservation is.
            aims: Aims {
                weights: true,
                reservations: true,
                limits: true,
                slo: true,
            },
            gated: false,
            build: mclock::MClock::build,
        },
    ]
}

/// The promises the registered policy `name` makes; nothing for an unknown name.
pub fn aims(name: &str) -> Aims {
    registry()
        .iter()
        .find(|p| p.name == name)
        .map_or(Aims::NOTHING, |p| p.aims)
}

/// What `tenants` ask for that the registered policy `name` does not keep, one line
/// each (empty when it keeps it all): weights that differ, SLOs, reservations, limits
/// — for a server to say at start what a named policy such as `none` leaves unenforced.
pub fn unkept(name: &str, tenants: &[TenantSpec]) -> Vec<String> {
    let Some(info) = registry().iter().find(|p| p.name == name) else {
        return Vec::new();
    };
    let aims = info.aims;
    let mut out = Vec::new();
    let weighted = tenants.windows(2).any(|w| w[0].weight != w[1].weight);
    if weighted && !aims.weights {
        out.push(format!(
            "policy {name} does not share by weight: the tenants' weights are not enforced"
        ));
    }
    type Asks = fn(&TenantSpec) -> bool;
    let kinds: [(&str, bool, Asks); 3] = [
        ("SLO", aims.slo, |t| t.slo.is_some()),
        ("reservation", aims.reservations, |t| {
            t.reservation_iops.is_some()
        }),
        ("limit", aims.limits, |t| t.limit_iops.is_some()),
    ];
    for (what, kept, has) in kinds {
        let names: Vec<&str> = tenants
            .iter()
            .filter(|t| has(t))
            .map(|t| t.name.as_str())
            .collect();
        if !kept && !names.is_empty() {
            out.push(format!(
                "policy {name} does not keep a tenant's {what}: not enforced for {}",
                names.join(", ")
            ));
        }
    }
    out
}

/// Names of all registered policies.
pub fn names() -> Vec<&'static str> {
    registry().iter().map(|p| p.name).collect()
}

/// What policy unit tests ask of any policy.
#[cfg(test)]
pub(crate) trait TestPolicy {
    /// Enqueues a request that must be held.
    fn put(&mut self, request: Request, now: Nanos);
    /// The report part of the full observation (results.json's `policy_stats`).
    fn report_json(&self) -> serde_json::Value;
}

#[cfg(test)]
impl<P: Policy + ?Sized> TestPolicy for P {
    fn put(&mut self, request: Request, now: Nanos) {
        let id = request.id;
        assert_eq!(
            self.enqueue(request, now),
            Admission::Queued,
            "request {id} was refused"
        );
    }

    fn report_json(&self) -> serde_json::Value {
        self.observe(Detail::Full).report
    }
}

/// Parameters from a TOML table, for policy unit tests.
#[cfg(test)]
pub(crate) fn test_params(policy: &str, table: toml::Table) -> PolicyParams {
    PolicyParams::new(
        policy,
        crate::config::params(table).expect("scalar parameters"),
    )
}

/// A read request for policy unit tests.
#[cfg(test)]
pub(crate) fn test_request(id: u64, tenant: TenantId, len: u32, arrival: Nanos) -> Request {
    Request {
        id,
        tenant,
        op: crate::types::Op::Read,
        offset: 0,
        len,
        arrival,
        // Device time in these tests is the length in ns: charging it orders requests
        // as charging bytes does.
        cost: u64::from(len.max(1)),
    }
}

/// `request` sent and finished at `at`, for policy unit tests.
#[cfg(test)]
pub(crate) fn test_completion(request: Request, at: Nanos) -> Completion {
    Completion {
        request,
        start: at,
        finish: at,
    }
}

/// A tenant with an SLO of `iops` 4 KiB requests within `rt_us`, for policy unit tests.
#[cfg(test)]
pub(crate) fn test_slo_tenant(name: &str, iops: f64, rt_us: u64) -> TenantSpec {
    TenantSpec {
        // A burst of one request: the buckets' other depths decide, as before SLOs
        // had bursts (tests of the default burst say so).
        slo: Some(crate::types::Slo {
            burst: Some(1.0),
            ..crate::types::Slo::new(iops, 4096, rt_us)
        }),
        ..TenantSpec::weighted(name, 1.0)
    }
}

/// Finds a policy by name and builds it; unknown names and parameters are errors.
pub fn build(
    name: &str,
    params: Params,
    tenants: &[TenantSpec],
) -> Result<Box<dyn Policy>, PolicyError> {
    build_on(name, params, tenants, None, None)
}

/// [`build`] for a device whose cost model (and, for disks, number of independent
/// heads) is known: defaults that depend on the device (the adaptive depth's floor on a
/// disk, turns on one disk) follow it.
pub fn build_on(
    name: &str,
    params: Params,
    tenants: &[TenantSpec],
    device: Option<&cost::CostModel>,
    actuators: Option<u32>,
) -> Result<Box<dyn Policy>, PolicyError> {
    let info = registry()
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| PolicyError::unknown(name))?;
    let mut params = PolicyParams::new(name, params)
        .with_device(device.copied())
        .with_actuators(actuators);
    let policy = (info.build)(&mut params, tenants)?;
    params.finish()?;
    Ok(if info.gated {
        Box::new(limit::LimitGate::new(policy, tenants))
    } else {
        policy
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_policy_is_told_the_name_it_resembles_if_any() {
        let near = |name: &str| match PolicyError::unknown(name) {
            PolicyError::Unknown { near, .. } => near,
            other => panic!("{other:?}"),
        };
        assert_eq!(near("sfqq"), Some("sfq"));
        assert_eq!(near("mClock"), Some("mclock"));
        assert_eq!(near("fedbac"), Some("feedbac"));
        assert_eq!(near("fifo"), None);
        let text = PolicyError::unknown("fifo").to_string();
        assert!(
            text.starts_with("unknown policy 'fifo' (known: none, "),
            "{text}"
        );
        assert!(is_registered("sfq") && !is_registered("sfqq"));
    }

    /// Runs `p` through a seeded stream of arrivals over `tenants` tenants (a
    /// completion 50–400 µs after each dispatch, at most 8 in the device) and answers
    /// the order it dispatched in.
    fn dispatch_order(p: &mut dyn Policy, tenants: u32, seed: u64) -> Vec<u64> {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut device: Vec<(Nanos, Request, Nanos)> = Vec::new();
        let mut order = Vec::new();
        let mut now = 0;
        for id in 1..=600u64 {
            now += rng.random_range(0..60_000);
            device.sort_by_key(|d| d.0);
            while device.first().is_some_and(|d| d.0 <= now) {
                let (finish, request, start) = device.remove(0);
                p.complete(
                    &Completion {
                        request,
                        start,
                        finish,
                    },
                    finish,
                );
            }
            while p.next_timer().is_some_and(|t| t <= now) {
                p.on_timer(now);
            }
            let tenant = rng.random_range(0..tenants);
            let len = [4096, 16384, 131072][rng.random_range(0..3usize)];
            let _ = p.enqueue(test_request(id, tenant, len, now), now);
            while device.len() < 8 {
                match p.dispatch(now) {
                    Dispatch::Request(r) => {
                        order.push(r.id);
                        device.push((now + rng.random_range(50_000..400_000), r, now));
                    }
                    _ => break,
                }
            }
            assert_eq!(p.check(), Ok(()), "{}", p.name());
        }
        order
    }

    /// What a named policy leaves unenforced is said; the default keeps it all.
    #[test]
    fn unkept_promises_are_named() {
        let tenants = [
            TenantSpec {
                limit_iops: Some(100.0),
                ..TenantSpec::weighted("a", 4.0)
            },
            TenantSpec {
                reservation_iops: Some(50.0),
                ..TenantSpec::weighted("b", 1.0)
            },
        ];
        let none = unkept("none", &tenants);
        assert_eq!(none.len(), 3, "{none:?}");
        assert!(none[0].contains("weights are not enforced"));
        assert!(
            none[1].ends_with("reservation: not enforced for b"),
            "{none:?}"
        );
        assert!(none[2].ends_with("limit: not enforced for a"), "{none:?}");
        // sfq shares by weight and keeps limits through the gate: the reservation only.
        assert_eq!(unkept("sfq", &tenants).len(), 1);
        assert!(unkept(DEFAULT_POLICY, &tenants).is_empty());
        // Equal weights and nothing else: nothing to say, whatever the policy.
        let plain = [
            TenantSpec::weighted("a", 1.0),
            TenantSpec::weighted("b", 1.0),
        ];
        assert!(unkept("none", &plain).is_empty());
    }

    /// A tenant added at time 0 is served as one the policy was built with: the same
    /// events give the same dispatches, for every policy, tenants with weights, SLOs,
    /// reservations and limits alike.
    #[test]
    fn a_tenant_added_at_the_start_is_one_built_in() {
        let tenants = [
            TenantSpec::weighted("a", 1.0),
            TenantSpec {
                weight: 4.0,
                ..test_slo_tenant("b", 800.0, 2_000)
            },
            TenantSpec {
                reservation_iops: Some(300.0),
                limit_iops: Some(2_000.0),
                ..TenantSpec::weighted("c", 2.0)
            },
            TenantSpec::weighted("d", 8.0),
        ];
        for name in names() {
            for seed in 1..4 {
                let mut built = build(name, Params::new(), &tenants).expect("defaults build");
                let mut grown = build(name, Params::new(), &tenants[..1]).expect("builds");
                for (i, spec) in tenants.iter().enumerate().skip(1) {
                    assert_eq!(grown.add_tenant(spec, 0), i as TenantId, "{name}");
                }
                let want = dispatch_order(built.as_mut(), tenants.len() as u32, seed);
                // A throttle passes few in 20 ms, and CFQ keeps its slice for tenant c
                // while c's limit lets its requests through at 2,000 a second; the same
                // order is what is checked.
                let least = match name {
                    "govern" => 5,
                    "cfq" => 20,
                    _ => 100,
                };
                assert!(want.len() > least, "{name}: {} dispatched", want.len());
                let got = dispatch_order(grown.as_mut(), tenants.len() as u32, seed);
                assert_eq!(got, want, "{name}, seed {seed}");
            }
        }
    }

    /// A tenant added while others are backlogged is served (by weight among them)
    /// and the policy's invariants hold throughout.
    #[test]
    fn a_tenant_added_while_running_is_served() {
        for name in names() {
            let specs = [
                TenantSpec::weighted("a", 1.0),
                TenantSpec::weighted("b", 1.0),
            ];
            let mut p = build(name, Params::new(), &specs).expect("defaults build");
            let mut served = [0u32; 3];
            let mut id = 0;
            let mut in_device: Vec<Request> = Vec::new();
            for step in 0..4_000u64 {
                let now = step * 200_000;
                if step == 2_000 {
                    assert_eq!(p.add_tenant(&TenantSpec::weighted("c", 1.0), now), 2);
                }
                let tenants = if step >= 2_000 { 3 } else { 2 };
                for t in 0..tenants {
                    id += 1;
                    let _ = p.enqueue(test_request(id, t, 4096, now), now);
                }
                while p.next_timer().is_some_and(|t| t <= now) {
                    p.on_timer(now);
                }
                for request in in_device.drain(..) {
                    let c = Completion {
                        request,
                        start: now,
                        finish: now,
                    };
                    p.complete(&c, now);
                }
                while let Dispatch::Request(r) = p.dispatch(now) {
                    if step >= 2_000 {
                        served[r.tenant as usize] += 1;
                    }
                    in_device.push(r);
                    if in_device.len() == 4 {
                        break;
                    }
                }
                assert_eq!(p.check(), Ok(()), "{name}");
            }
            assert!(
                served[2] > 0,
                "{name}: the new tenant was never served: {served:?}"
            );
        }
    }

    /// Every policy shows its state as finite values with names fit for Prometheus,
    /// one value per (name, tenant), tenants in range.
    #[test]
    fn gauges_are_well_formed_for_every_policy() {
        let tenants = [
            test_slo_tenant("a", 500.0, 10_000),
            TenantSpec {
                weight: 2.0,
                ..test_slo_tenant("b", 500.0, 10_000)
            },
        ];
        for name in names() {
            let mut p = build(name, Params::new(), &tenants).expect("defaults build");
            let mut now = 0;
            for i in 0..64u64 {
                now = i * 100_000;
                let _ = p.enqueue(test_request(i + 1, (i % 2) as TenantId, 4096, now), now);
                if let Dispatch::Request(r) = p.dispatch(now) {
                    let c = Completion {
                        request: r,
                        start: now,
                        finish: now + 50_000,
                    };
                    p.complete(&c, now + 50_000);
                }
                if p.next_timer().is_some_and(|t| t <= now) {
                    p.on_timer(now);
                }
            }
            let _ = p.dispatch(now);
            let gauges = p.observe(Detail::Gauges).gauges;
            if name != "none" {
                assert!(!gauges.is_empty(), "{name} shows no state");
            }
            let mut seen = BTreeSet::new();
            for g in &gauges {
                assert!(
                    !g.name.is_empty()
                        && g.name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                    "{name}: bad metric name {:?}",
                    g.name
                );
                assert!(g.value.is_finite(), "{name}: {} = {}", g.name, g.value);
                assert!(g.tenant.is_none_or(|t| t < 2), "{name}: {g:?}");
                assert!(seen.insert((g.name, g.tenant)), "{name}: {g:?} twice");
            }
        }
    }
}
