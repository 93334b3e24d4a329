//! `share`: the exchange between the fronts of a shared cluster and each front's part of
//! every tenant's global limits. Sans-I/O: it is handed reports (its own and its
//! peers'), bytes off the wire and the time, and answers each local tenant's limits;
//! it reads no clock, starts no thread and does no I/O (the simulator,
//! [`crate::cluster::sim`], carries the reports between fronts; a live driver will carry them
//! over UDP between `ioshare serve` processes).
//!
//! The design is a periodic allocator in the style of Pisces (D. Shue, M. J. Freedman,
//! A. Shaikh, "Performance Isolation and Fairness for Multi-Tenant Cloud Storage", OSDI
//! 2012: global weights, local weights adjusted to each node's demand) and of VMware's
//! Storage Resource Pools and mClock's distributed dmClock (A. Gulati, A. Merchant, P.
//! Varman, OSDI 2010: reservation, limit and weight per tenant across servers), with
//! the [`Governor`] as the global allocator, leaderless:
//! 1. **Reports.** Every period each front publishes a [`Report`]: per tenant it
//!    serves, its *cumulative* counters as the governor's [`Usage`] (read and write
//!    requests and bytes that passed its throttle) and whether requests of it were
//!    waiting at this front's limits at the period's end (*wanting* more), and the
//!    cluster's completions and their latencies as this front saw them
//!    ([`DeviceUsage`], cumulative). **Reading:** cumulative counters make a lost or
//!    reordered report harmless: the next one carries what it said (a report older than
//!    the one kept is ignored), and a report's sequence number says how many periods
//!    its difference from the last one covers.
//! 2. **A replica of the governor on every front.** Each front keeps the latest report
//!    of every peer and, each period, runs its own [`Governor`] on the sum over fronts
//!    of each peer's rate a period (its last difference over the periods it covers)
//!    → each tenant's *global* limits. The same reports give the same decisions on
//!    every front (it is deterministic); **reading:** reports arrive at different times
//!    on different fronts (delay, loss), so replicas see slightly different sums and
//!    their limits differ by a period's noise, which the limits' headroom absorbs. No
//!    leader, no election: a front that fails takes nothing down with it. A front that
//!    joins starts its replica fresh (its forecast at the cluster's nominal capacity)
//!    and converges with the others as the forecast follows the same congestion.
//! 3. **The split by demand.** A tenant's global limits are split across the fronts
//!    that serve it: a front's part is a floor — its equal part of [`FLOOR`] (5 %) of
//!    the whole — plus the rest in proportion to what the tenant took there (smoothed,
//!    [`DEMAND_SMOOTHING`] a period), times `1 +` [`HEADROOM`] where it is wanting more:
//!    room taken from the fronts that did not use theirs (Pisces' local weight
//!    adjustment, which moves weight towards the node whose demand exceeds its share).
//!    **Readings:** the floor lets a front where the tenant just started show demand
//!    (a part of nothing shows none and never grows); 5 % rather than 10 % because an
//!    unused floor is lost to the tenant (a tenant busy at one front of two gets 97.5 %
//!    of its limit); the weight's minimal share was not chosen because it is a global
//!    quantity, unrelated to where a tenant's volumes are. A tenant wanting more at
//!    every front keeps the split it has (each front uses all of its part). The
//!    reservation is part of the limits the governor gives and is split with them.
//! 4. **Losing contact.** A peer whose last report is older than `stale_after`
//!    periods is taken to keep using its last allocation: its last rates stay in the
//!    sum (the others do not take its room) and its part of each tenant stays frozen.
//!    A front that hears no peer for `stale_after` (partitioned, or the others gone
//!    quiet) keeps its last allocation: it never raises a tenant's local limits above
//!    their last value, so no tenant exceeds its global limit by more than the silent
//!    front's last allocation. A peer silent for `gone_after` periods, or one that says
//!    it leaves, is dropped and its parts go to the others at the next decision.
//!    A front that joins gives each of its tenants an equal part of the limits its
//!    fresh replica starts with (the number of fronts it was told of) until its first
//!    decision, and keeps to it (never raises it) until it hears another front.
//!
//! Received bytes are validated ([`Report::decode`], [`FrontShare::receive`]): bad
//! bytes, another version, an unknown tenant, counters that contradict each other or a
//! report past [`MAX_REPORT_BYTES`] are a [`ShareError`], never a panic, and change
//! nothing. Everything that grows is bounded: peers by [`MAX_FRONTS`], tenants by the
//! configuration.

use crate::device::cost::CostModel;
use crate::limits::governor::{DeviceUsage, Governor, Limits, Params, Usage};
use crate::types::{Nanos, TenantId, TenantSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The version of [`Report`] this code writes and reads.
pub const REPORT_VERSION: u32 = 1;

/// The most bytes a report may take on the wire.
pub const MAX_REPORT_BYTES: usize = 1 << 20;

/// The most fronts a front keeps reports of.
pub const MAX_FRONTS: usize = 4096;

/// The part of a tenant's limits split equally among the fronts that serve it, whatever
/// their demand (module docs).
pub const FLOOR: f64 = 0.05;

/// What a front where a tenant is wanting more asks beyond what it took, as a fraction.
pub const HEADROOM: f64 = 0.5;

/// What a front's smoothed demand for a tenant moves towards its newest rate a period.
pub const DEMAND_SMOOTHING: f64 = 0.5;

/// A front's identity in the cluster.
pub type FrontId = u32;

/// One tenant in a front's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantReport {
    /// The tenant, by its id in the cluster's configuration.
    pub tenant: TenantId,
    /// What passed this front's throttle for it since the front started (cumulative).
    pub usage: Usage,
    /// Whether requests of it were waiting at this front's limits at the period's end.
    pub wanting: bool,
}

/// What a front publishes every period (module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// [`REPORT_VERSION`].
    pub version: u32,
    /// The front that made it.
    pub front: FrontId,
    /// Its number: one more each period.
    pub seq: u64,
    /// Whether the front is leaving (its parts are to be given to the others now).
    pub leaving: bool,
    /// Every tenant it serves, in id order.
    pub tenants: Vec<TenantReport>,
    /// The cluster's completions and their latencies as this front saw them
    /// (cumulative).
    pub device: DeviceUsage,
}

/// A report that cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShareError {
    /// The bytes are not a report.
    #[error("not a report: {0}")]
    Malformed(String),
    /// More bytes than [`MAX_REPORT_BYTES`].
    #[error("a report of {0} bytes (at most {MAX_REPORT_BYTES})")]
    TooLarge(usize),
    /// Another version of the format.
    #[error("report version {0} (this front reads {REPORT_VERSION})")]
    Version(u32),
    /// A tenant the configuration does not have.
    #[error("front {front}: unknown tenant {tenant}")]
    UnknownTenant {
        /// The front that reported it.
        front: FrontId,
        /// The tenant.
        tenant: TenantId,
    },
    /// A tenant twice, or out of order.
    #[error("front {front}: tenant {tenant} out of order or twice")]
    TenantOrder {
        /// The front.
        front: FrontId,
        /// The tenant.
        tenant: TenantId,
    },
    /// Counters that contradict each other.
    #[error("front {front}: {what}")]
    Inconsistent {
        /// The front.
        front: FrontId,
        /// What is wrong.
        what: String,
    },
    /// A report that claims to be this front's.
    #[error("a report from this front's own id {0}")]
    Own(FrontId),
    /// More fronts than [`MAX_FRONTS`].
    #[error("more than {MAX_FRONTS} fronts")]
    TooManyFronts,
}

impl Report {
    /// The report as bytes (JSON).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a report always serializes")
    }

    /// A report from bytes, validated on its own ([`Report::validate`]).
    pub fn decode(bytes: &[u8]) -> Result<Report, ShareError> {
        if bytes.len() > MAX_REPORT_BYTES {
            return Err(ShareError::TooLarge(bytes.len()));
        }
        let report: Report =
            serde_json::from_slice(bytes).map_err(|e| ShareError::Malformed(e.to_string()))?;
        report.validate()?;
        Ok(report)
    }

    /// Its own consistency: the version, tenants in strictly increasing order, the
    /// device's write counters within its totals.
    pub fn validate(&self) -> Result<(), ShareError> {
        if self.version != REPORT_VERSION {
            return Err(ShareError::Version(self.version));
        }
        for w in self.tenants.windows(2) {
            if w[0].tenant >= w[1].tenant {
                return Err(ShareError::TenantOrder {
                    front: self.front,
                    tenant: w[1].tenant,
                });
            }
        }
        let d = &self.device;
        if d.writes > d.ios || d.write_ns > d.latency_ns {
            return Err(ShareError::Inconsistent {
                front: self.front,
                what: format!("the device's writes are more than its total: {d:?}"),
            });
        }
        Ok(())
    }
}

/// The exchange's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShareParams {
    /// The global governor's settings (its period is the exchange's).
    pub governor: Params,
    /// A peer silent this many periods keeps its last allocation.
    pub stale_after: u64,
    /// A peer silent this many periods is dropped.
    pub gone_after: u64,
}

impl ShareParams {
    /// The defaults for a cluster priced by `cost`: the governor's for that cost model
    /// (100 ms periods), stale after 5 periods, gone after 30.
    pub fn for_cluster(cost: &CostModel) -> ShareParams {
        ShareParams {
            governor: Params::for_device(cost),
            stale_after: 5,
            gone_after: 30,
        }
    }
}

/// What a front keeps of one peer (itself included).
#[derive(Debug, Clone)]
struct Peer {
    /// Its latest report and when it came (this front's time).
    latest: Report,
    heard_at: Nanos,
    /// The report its rates were last taken from (`None`: none yet).
    base: Option<Report>,
    /// Per tenant it serves: its rate a period (read and write requests and bytes),
    /// its smoothed demand (requests a period), whether it wants more, and its part of
    /// the tenant's limits at the last decision it was fresh for.
    tenants: BTreeMap<TenantId, PeerTenant>,
    /// The device's rate a period as it saw it.
    device: [f64; 4],
}

#[derive(Debug, Clone, Copy, Default)]
struct PeerTenant {
    rate: [f64; 4],
    demand: f64,
    wanting: bool,
    part: Option<f64>,
}

/// One front's side of the exchange (module docs).
#[derive(Debug, Clone)]
pub struct FrontShare {
    me: FrontId,
    params: ShareParams,
    governor: Governor,
    /// The tenants this front serves.
    hosted: Vec<bool>,
    peers: BTreeMap<FrontId, Peer>,
    /// This front's limits per tenant (default, none, for one it does not serve).
    local: Vec<Limits>,
    /// The global limits of the last decision.
    global: Vec<Limits>,
    /// The front's own report count.
    seq: u64,
    decisions: u64,
    /// When it last took a report of another front (`None`: never, or every front
    /// it heard has since said it left).
    heard_other: Option<Nanos>,
    /// Whether it was told of other fronts it has not heard yet (a front that joins
    /// keeps its equal parts until it hears one).
    expects_others: bool,
}

impl FrontShare {
    /// Front `me` of a cluster whose tenants are `specs` (the cluster's configuration,
    /// in id order), serving `hosted`, priced by `cost`; it was told of `fronts` fronts
    /// (itself included) and starts each of its tenants at an equal part of the limits
    /// its governor starts with.
    pub fn new(
        me: FrontId,
        specs: &[TenantSpec],
        hosted: &[TenantId],
        cost: CostModel,
        params: ShareParams,
        fronts: usize,
    ) -> FrontShare {
        let governor = Governor::new(specs, cost, params.governor);
        let global = governor.limits();
        let mut hosted_mask = vec![false; specs.len()];
        for &t in hosted {
            hosted_mask[t as usize] = true;
        }
        let part = 1.0 / fronts.max(1) as f64;
        let local = (0..specs.len())
            .map(|t| {
                if hosted_mask[t] {
                    scale(&global[t], part)
                } else {
                    Limits::default()
                }
            })
            .collect();
        FrontShare {
            me,
            params,
            governor,
            hosted: hosted_mask,
            peers: BTreeMap::new(),
            local,
            global,
            seq: 0,
            decisions: 0,
            heard_other: None,
            expects_others: fronts > 1,
        }
    }

    /// This front's id.
    pub fn id(&self) -> FrontId {
        self.me
    }

    /// The period, ns.
    pub fn period(&self) -> Nanos {
        self.params.governor.period
    }

    /// This front's limits for `tenant` (no limits for a tenant it does not serve).
    pub fn limits(&self, tenant: TenantId) -> Limits {
        self.local[tenant as usize]
    }

    /// Each tenant's global limits at the last decision.
    pub fn global_limits(&self) -> &[Limits] {
        &self.global
    }

    /// The peers it keeps reports of (itself included once it reported).
    pub fn peers(&self) -> Vec<FrontId> {
        self.peers.keys().copied().collect()
    }

    /// The global governor's forecast, device ns a period.
    pub fn forecast(&self) -> f64 {
        self.governor.capacity()
    }

    /// Decisions made.
    pub fn decisions(&self) -> u64 {
        self.decisions
    }

    /// This period's report from the front's cumulative counters (`tenants`: every
    /// tenant it serves, with its counters and whether requests of it wait at its
    /// limits; `device`: its cluster counters), kept as its own and returned to be
    /// sent. `leaving`: the front is going away.
    pub fn report(
        &mut self,
        tenants: &[(TenantId, Usage, bool)],
        device: DeviceUsage,
        leaving: bool,
        now: Nanos,
    ) -> Report {
        self.seq += 1;
        let mut list: Vec<TenantReport> = tenants
            .iter()
            .map(|&(tenant, usage, wanting)| TenantReport {
                tenant,
                usage,
                wanting,
            })
            .collect();
        list.sort_by_key(|t| t.tenant);
        list.dedup_by_key(|t| t.tenant);
        let report = Report {
            version: REPORT_VERSION,
            front: self.me,
            seq: self.seq,
            leaving,
            tenants: list,
            device,
        };
        self.take(report.clone(), now)
            .expect("a front's own report is valid");
        report
    }

    /// A peer's report as bytes off the wire: taken (`Ok(true)`), older than the one
    /// kept (`Ok(false)`), or refused with nothing changed.
    pub fn receive_bytes(&mut self, bytes: &[u8], now: Nanos) -> Result<bool, ShareError> {
        let report = Report::decode(bytes)?;
        self.receive(report, now)
    }

    /// A peer's report: taken (`Ok(true)`), older than the one kept (`Ok(false)`), or
    /// refused with nothing changed.
    pub fn receive(&mut self, report: Report, now: Nanos) -> Result<bool, ShareError> {
        if report.front == self.me {
            return Err(ShareError::Own(self.me));
        }
        self.take(report, now)
    }

    /// A peer left (told so by whoever knows): dropped now.
    pub fn forget(&mut self, front: FrontId) {
        self.peers.remove(&front);
        self.forget_silence();
    }

    /// With no other front left that has not said it leaves, silence is not a
    /// partition any more.
    fn forget_silence(&mut self) {
        let me = self.me;
        if !self
            .peers
            .iter()
            .any(|(&f, p)| f != me && !p.latest.leaving)
        {
            self.heard_other = None;
            self.expects_others = false;
        }
    }

    fn take(&mut self, report: Report, now: Nanos) -> Result<bool, ShareError> {
        report.validate()?;
        let n = self.hosted.len();
        if let Some(t) = report.tenants.iter().find(|t| t.tenant as usize >= n) {
            return Err(ShareError::UnknownTenant {
                front: report.front,
                tenant: t.tenant,
            });
        }
        if report.front != self.me {
            self.heard_other = Some(now);
        }
        match self.peers.get_mut(&report.front) {
            Some(p) => {
                if report.seq <= p.latest.seq {
                    return Ok(false);
                }
                p.latest = report;
                p.heard_at = now;
            }
            None => {
                if self.peers.len() >= MAX_FRONTS {
                    return Err(ShareError::TooManyFronts);
                }
                let tenants = report
                    .tenants
                    .iter()
                    .map(|t| {
                        (
                            t.tenant,
                            PeerTenant {
                                wanting: t.wanting,
                                ..PeerTenant::default()
                            },
                        )
                    })
                    .collect();
                self.peers.insert(
                    report.front,
                    Peer {
                        latest: report,
                        heard_at: now,
                        base: None,
                        tenants,
                        device: [0.0; 4],
                    },
                );
            }
        }
        Ok(true)
    }

    /// The period's decision at `now`: drops the peers gone, takes every peer's rates
    /// from its latest report, runs the global governor on their sum and splits each
    /// local tenant's global limits by demand. Answers this front's limits per tenant
    /// (none for a tenant it does not serve).
    pub fn decide(&mut self, now: Nanos) -> &[Limits] {
        self.decisions += 1;
        let period = self.period();
        let stale_ns = self.params.stale_after.saturating_mul(period);
        let gone_ns = self.params.gone_after.saturating_mul(period);
        let me = self.me;
        let said_bye = self.peers.values().any(|p| p.latest.leaving);
        self.peers.retain(|&f, p| {
            f == me || (!p.latest.leaving && now.saturating_sub(p.heard_at) <= gone_ns)
        });
        if said_bye {
            self.forget_silence();
        }
        for p in self.peers.values_mut() {
            p.advance();
        }
        // The sum over fronts, a period.
        let n = self.hosted.len();
        let mut sum = vec![[0.0f64; 4]; n];
        let mut device = [0.0f64; 4];
        let mut seen_held = vec![false; n];
        for p in self.peers.values() {
            for (&t, pt) in &p.tenants {
                for (s, r) in sum[t as usize].iter_mut().zip(pt.rate) {
                    *s += r;
                }
                seen_held[t as usize] |= pt.wanting;
            }
            for (d, r) in device.iter_mut().zip(p.device) {
                *d += r;
            }
        }
        let usage: Vec<Usage> = sum
            .iter()
            .map(|r| Usage {
                read_ios: r[0].round() as u64,
                write_ios: r[1].round() as u64,
                read_bytes: r[2].round() as u64,
                write_bytes: r[3].round() as u64,
            })
            .collect();
        let ios = device[0].round() as u64;
        let latency_ns = device[1].round() as u64;
        let device = DeviceUsage {
            ios,
            latency_ns,
            writes: (device[2].round() as u64).min(ios),
            write_ns: (device[3].round() as u64).min(latency_ns),
        };
        self.global = self.governor.decide_seen(&usage, device, &seen_held);
        // Who is fresh; whether this front hears anyone.
        let fresh: BTreeMap<FrontId, bool> = self
            .peers
            .iter()
            .map(|(&f, p)| (f, f == me || now.saturating_sub(p.heard_at) <= stale_ns))
            .collect();
        // Hearing nobody for `stale_after` (peers dropped as gone since included): a
        // partition as far as this front can tell.
        let isolated = match self.heard_other {
            Some(at) => now.saturating_sub(at) > stale_ns,
            None => self.expects_others,
        };
        for t in 0..n {
            self.split(t as TenantId, &fresh);
            if !self.hosted[t] {
                continue;
            }
            let part = self
                .peers
                .get(&me)
                .and_then(|p| p.tenants.get(&(t as TenantId)))
                .and_then(|pt| pt.part);
            let Some(part) = part else {
                continue;
            };
            let new = scale(&self.global[t], part);
            self.local[t] = if isolated {
                lower(&new, &self.local[t])
            } else {
                new
            };
        }
        &self.local
    }

    /// Splits tenant `t`'s limits among the fronts that serve it: the stale keep their
    /// parts, the fresh share the rest by demand above a floor (module docs).
    fn split(&mut self, t: TenantId, fresh: &BTreeMap<FrontId, bool>) {
        let hosts: Vec<FrontId> = self
            .peers
            .iter()
            .filter(|(_, p)| p.tenants.contains_key(&t))
            .map(|(&f, _)| f)
            .collect();
        if hosts.is_empty() {
            return;
        }
        let equal = 1.0 / hosts.len() as f64;
        let mut frozen = 0.0;
        let mut live = Vec::new();
        for &f in &hosts {
            let pt = &self.peers[&f].tenants[&t];
            if fresh[&f] {
                live.push(f);
            } else {
                frozen += pt.part.unwrap_or(equal);
            }
        }
        if live.is_empty() {
            return;
        }
        let left = (1.0 - frozen).max(0.0);
        let asks: Vec<f64> = live
            .iter()
            .map(|f| {
                let pt = &self.peers[f].tenants[&t];
                pt.demand * if pt.wanting { 1.0 + HEADROOM } else { 1.0 }
            })
            .collect();
        let total: f64 = asks.iter().sum();
        let floor = FLOOR / live.len() as f64;
        for (f, ask) in live.iter().zip(asks) {
            let by_demand = if total > 0.0 {
                ask / total
            } else {
                1.0 / live.len() as f64
            };
            let part = left * (floor + (1.0 - FLOOR) * by_demand);
            assert!(
                (0.0..=1.0 + 1e-9).contains(&part),
                "a part of a tenant's limits: {part}"
            );
            let peer = self.peers.get_mut(f).expect("a host");
            peer.tenants.get_mut(&t).expect("a tenant it serves").part = Some(part);
        }
    }
}

impl Peer {
    /// Takes its rates from its latest report: the difference from the last report
    /// used, over the periods between them; no new report keeps the last rates.
    fn advance(&mut self) {
        let latest = &self.latest;
        // Tenants it no longer serves are dropped; new ones added.
        self.tenants
            .retain(|t, _| latest.tenants.binary_search_by_key(t, |r| r.tenant).is_ok());
        for r in &latest.tenants {
            let pt = self.tenants.entry(r.tenant).or_default();
            pt.wanting = r.wanting;
        }
        let Some(base) = &self.base else {
            self.base = Some(latest.clone());
            return;
        };
        if latest.seq <= base.seq {
            return;
        }
        let periods = (latest.seq - base.seq) as f64;
        for r in &latest.tenants {
            // Reports list their tenants in increasing order (validated).
            let before = base
                .tenants
                .binary_search_by_key(&r.tenant, |b| b.tenant)
                .map_or(Usage::default(), |k| base.tenants[k].usage);
            let diff = [
                r.usage.read_ios.saturating_sub(before.read_ios),
                r.usage.write_ios.saturating_sub(before.write_ios),
                r.usage.read_bytes.saturating_sub(before.read_bytes),
                r.usage.write_bytes.saturating_sub(before.write_bytes),
            ];
            let pt = self.tenants.get_mut(&r.tenant).expect("added above");
            for (rate, d) in pt.rate.iter_mut().zip(diff) {
                *rate = d as f64 / periods;
            }
            let ios = pt.rate[0] + pt.rate[1];
            pt.demand += DEMAND_SMOOTHING * (ios - pt.demand);
        }
        let d = latest.device.since(&base.device);
        self.device = [
            d.ios as f64 / periods,
            d.latency_ns as f64 / periods,
            d.writes as f64 / periods,
            d.write_ns as f64 / periods,
        ];
        self.base = Some(latest.clone());
    }
}

/// `l` times `part`, each limit that is set.
fn scale(l: &Limits, part: f64) -> Limits {
    let s = |x: Option<f64>| x.map(|v| v * part);
    Limits {
        riops: s(l.riops),
        wiops: s(l.wiops),
        rbps: s(l.rbps),
        wbps: s(l.wbps),
    }
}

/// Each of `new`'s limits no higher than `last`'s (a limit `last` does not set stays
/// `new`'s).
fn lower(new: &Limits, last: &Limits) -> Limits {
    let m = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    };
    Limits {
        riops: m(new.riops, last.riops),
        wiops: m(new.wiops, last.wiops),
        rbps: m(new.rbps, last.rbps),
        wbps: m(new.wbps, last.wbps),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;
    const PERIOD: Nanos = 100 * MS;

    fn specs(n: usize) -> Vec<TenantSpec> {
        (0..n)
            .map(|i| TenantSpec::weighted(format!("t{i}"), 1.0))
            .collect()
    }

    fn params() -> ShareParams {
        ShareParams::for_cluster(&CostModel::generic_ssd())
    }

    fn reads(ios: u64) -> Usage {
        Usage {
            read_ios: ios,
            read_bytes: ios * 4096,
            ..Usage::default()
        }
    }

    fn device(ios: u64) -> DeviceUsage {
        DeviceUsage {
            ios,
            latency_ns: ios * 200_000,
            ..DeviceUsage::default()
        }
    }

    /// Two fronts serving tenant 0; their cumulative counters after `period` periods at
    /// `a` and `b` reads a period, and whether each is wanting.
    fn pair_reports(
        fronts: &mut [FrontShare; 2],
        period: u64,
        rates: [u64; 2],
        wanting: [bool; 2],
    ) -> [Report; 2] {
        let now = period * PERIOD;
        let r: Vec<Report> = (0..2)
            .map(|f| {
                let ios = rates[f] * period;
                fronts[f].report(&[(0, reads(ios), wanting[f])], device(ios), false, now)
            })
            .collect();
        [r[0].clone(), r[1].clone()]
    }

    fn pair() -> [FrontShare; 2] {
        let cost = CostModel::generic_ssd();
        [0, 1].map(|f| FrontShare::new(f, &specs(1), &[0], cost, params(), 2))
    }

    #[test]
    fn a_report_round_trips_and_bad_bytes_are_errors() {
        let mut f = pair();
        let [a, _] = pair_reports(&mut f, 1, [10, 0], [true, false]);
        assert_eq!(Report::decode(&a.encode()), Ok(a.clone()));
        assert!(matches!(
            Report::decode(b"{\"version\":"),
            Err(ShareError::Malformed(_))
        ));
        assert!(matches!(
            Report::decode(&[0xff; 64]),
            Err(ShareError::Malformed(_))
        ));
        assert_eq!(
            Report::decode(&vec![b' '; MAX_REPORT_BYTES + 1]),
            Err(ShareError::TooLarge(MAX_REPORT_BYTES + 1))
        );
        let mut v = a.clone();
        v.version = 2;
        assert_eq!(Report::decode(&v.encode()), Err(ShareError::Version(2)));
        let mut twice = a.clone();
        twice.tenants.push(twice.tenants[0]);
        assert!(matches!(
            Report::decode(&twice.encode()),
            Err(ShareError::TenantOrder { .. })
        ));
        let mut odd = a.clone();
        odd.device.writes = odd.device.ios + 1;
        assert!(matches!(
            Report::decode(&odd.encode()),
            Err(ShareError::Inconsistent { .. })
        ));
        let mut unknown = a.clone();
        unknown.tenants[0].tenant = 7;
        assert!(matches!(
            f[1].receive(unknown, 0),
            Err(ShareError::UnknownTenant { tenant: 7, .. })
        ));
        assert_eq!(f[0].receive(a.clone(), 0), Err(ShareError::Own(0)));
        // Unknown fields are refused too.
        let text = String::from_utf8(a.encode())
            .unwrap()
            .replacen('{', "{\"x\":1,", 1);
        assert!(matches!(
            f[1].receive_bytes(text.as_bytes(), 0),
            Err(ShareError::Malformed(_))
        ));
        assert_eq!(f[1].receive_bytes(&a.encode(), 0), Ok(true));
        assert_eq!(f[1].receive_bytes(&a.encode(), 0), Ok(false), "not newer");
    }

    /// Bytes off the wire never panic: random bytes, and a valid report cut short or
    /// with one byte changed anywhere, are taken or refused with a typed error.
    #[test]
    fn damaged_bytes_are_errors_not_panics() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let mut f = pair();
        let [a, _] = pair_reports(&mut f, 3, [10, 5], [true, false]);
        let good = a.encode();
        let (mut taken, mut refused) = (0, 0);
        for i in 0..4000 {
            let bytes: Vec<u8> = match i % 3 {
                0 => (0..rng.random_range(0..200))
                    .map(|_| rng.random())
                    .collect(),
                1 => good[..rng.random_range(0..good.len())].to_vec(),
                _ => {
                    let mut b = good.clone();
                    let k = rng.random_range(0..b.len());
                    b[k] = rng.random();
                    b
                }
            };
            match f[1].receive_bytes(&bytes, 0) {
                Ok(_) => taken += 1,
                Err(_) => refused += 1,
            }
        }
        assert!(refused > 3000, "{taken} taken, {refused} refused");
        let _ = f[1].decide(PERIOD);
    }

    /// The same reports on two fronts give the same global limits; a tenant busy at
    /// one front and idle at the other has its limits moved to the busy one, the other
    /// keeping its floor.
    #[test]
    fn replicas_agree_and_the_split_follows_demand() {
        let mut f = pair();
        for p in 1..=30 {
            let [a, b] = pair_reports(&mut f, p, [200, 0], [true, false]);
            assert_eq!(f[0].receive(b, p * PERIOD), Ok(true));
            assert_eq!(f[1].receive(a, p * PERIOD), Ok(true));
            let _ = f[0].decide(p * PERIOD);
            let _ = f[1].decide(p * PERIOD);
            assert_eq!(f[0].global_limits(), f[1].global_limits(), "period {p}");
        }
        let global = f[0].global_limits()[0].riops.unwrap();
        let busy = f[0].limits(0).riops.unwrap();
        let idle = f[1].limits(0).riops.unwrap();
        assert!(busy >= 0.97 * global, "{busy} of {global}");
        assert!(
            (idle / global - FLOOR / 2.0).abs() < 0.01,
            "{idle} of {global}"
        );
        assert!((busy + idle - global).abs() < 1e-6 * global);
        assert_eq!(
            f[1].limits(0).riops.unwrap(),
            idle,
            "both fronts compute the same parts"
        );
    }

    /// A lost report costs nothing: the next one's difference covers both periods.
    #[test]
    fn a_lost_report_is_carried_by_the_next() {
        let mut f = pair();
        let mut g = pair();
        for p in 1..=10 {
            let [a, _] = pair_reports(&mut f, p, [100, 100], [true, true]);
            let [_, _] = pair_reports(&mut g, p, [100, 100], [true, true]);
            if p != 5 {
                f[1].receive(a, p * PERIOD).unwrap();
            }
            let _ = f[1].decide(p * PERIOD);
        }
        let rate = f[1].peers[&0].tenants[&0].rate[0];
        assert_eq!(rate, 100.0);
    }

    /// A peer silent past `stale_after` keeps its part (frozen) and its rates; a
    /// front that hears nobody never raises its limits, even once the silent peer is
    /// dropped past `gone_after`, until it is told the peer left; one that says it
    /// leaves is dropped at once.
    #[test]
    fn stale_and_gone_peers() {
        let mut f = pair();
        let mut now = 0;
        for p in 1..=10 {
            now = p * PERIOD;
            let [a, b] = pair_reports(&mut f, p, [100, 100], [true, true]);
            f[0].receive(b, now).unwrap();
            f[1].receive(a, now).unwrap();
            let _ = f[0].decide(now);
            let _ = f[1].decide(now);
        }
        let mut part_b = None;
        // Front 1 goes silent; front 0 goes on alone, still busy.
        let mut last = f[0].limits(0);
        for p in 11..=45 {
            now = p * PERIOD;
            let _ = f[0].report(&[(0, reads(100 * p), true)], device(100 * p), false, now);
            let _ = f[0].decide(now);
            let silent = p - 10;
            let l = f[0].limits(0);
            if silent == params().stale_after {
                part_b = f[0].peers[&1].tenants[&0].part;
            }
            if silent > params().stale_after && silent <= params().gone_after {
                assert_eq!(f[0].peers[&1].tenants[&0].part, part_b, "frozen");
                assert!(l.riops.unwrap() <= last.riops.unwrap() + 1e-9, "p {p}");
            }
            if silent > params().gone_after {
                assert_eq!(f[0].peers(), vec![0], "dropped after gone_after");
                // Still hearing nobody: a partition as far as it can tell.
                assert!(l.riops.unwrap() <= last.riops.unwrap() + 1e-9, "p {p}");
            }
            last = l;
        }
        // Told that front 1 left: its part is this front's.
        f[0].forget(1);
        let _ = f[0].decide(now + PERIOD);
        let l = f[0].limits(0).riops.unwrap();
        assert!(
            (l - f[0].global_limits()[0].riops.unwrap()).abs() < 1e-6,
            "the whole limit"
        );
        // Leaving: dropped at the next decision.
        let mut f = pair();
        let [a, b] = pair_reports(&mut f, 1, [1, 1], [false, false]);
        f[0].receive(b, PERIOD).unwrap();
        f[1].receive(a, PERIOD).unwrap();
        let _ = f[0].decide(PERIOD);
        assert_eq!(f[0].peers(), vec![0, 1]);
        let bye = f[1].report(&[(0, reads(2), false)], device(2), true, 2 * PERIOD);
        f[0].receive(bye, 2 * PERIOD).unwrap();
        let _ = f[0].decide(2 * PERIOD);
        assert_eq!(f[0].peers(), vec![0]);
        let _ = now;
    }

    /// A front that joins gives each of its tenants an equal part of its replica's
    /// first limits until it decides.
    #[test]
    fn a_joining_front_starts_with_an_equal_part() {
        let cost = CostModel::generic_ssd();
        let g = Governor::new(&specs(2), cost, params().governor);
        let f = FrontShare::new(3, &specs(2), &[1], cost, params(), 4);
        assert_eq!(f.limits(0), Limits::default(), "not served here");
        let want = g.limits()[1].riops.unwrap() / 4.0;
        assert!((f.limits(1).riops.unwrap() - want).abs() < 1e-9);
        // Hearing nobody yet, it never raises its part.
        let mut f = f;
        for p in 1..=10 {
            let _ = f.report(
                &[(1, reads(100 * p), true)],
                device(100 * p),
                false,
                p * PERIOD,
            );
            let _ = f.decide(p * PERIOD);
            assert!(f.limits(1).riops.unwrap() <= want + 1e-9, "period {p}");
        }
    }
}
