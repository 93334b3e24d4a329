//! Each tenant alone: what it does on the device with nobody beside it, the yardstick
//! of insulation ([`crate::metrics::insulation`], after Argon, Wachs et al., FAST 2007,
//! §2: a workload's standalone efficiency).
//!
//! A tenant runs alone under `none` on a copy of the same preconditioned device, with
//! the same seed, its own region and its own random stream ([`TenantSetup::stream`]):
//! the very requests it sends beside others, with nobody else's in the way.
//!
//! Readings chosen:
//! * Tenants with the same workload, region size, SLO and reservation share one run (the first of
//!   them runs, in its region): 1,024 tenants of a handful of kinds cost a handful of
//!   runs. On a disk the region's place changes seek times a little; the figure is the
//!   first such tenant's.
//! * An open-loop tenant runs alone as it is: its demand is its arrivals, and its
//!   efficiency (bytes a device-second) is its requests' price in the cost model,
//!   which does not depend on how many are in flight. A closed-loop copy would give
//!   the same efficiency and a demand it never makes.
//! * The alone run keeps the scenario's device queue depth, queue limit and warm-up:
//!   the same host, without the neighbours.

use super::{RunOptions, run_policy_priced};
use crate::config::PolicyChoice;
use crate::device::DeviceModel;
use crate::device::cost::CostModel;
use crate::metrics::SLO_MET;
use crate::metrics::entitled::Claim;
use crate::metrics::insulation::{Alone, AloneSeries, Yardstick};
use crate::policy::PolicyError;
use crate::scenario::{Scenario, TenantSetup};
use crate::types::nanos_to_secs;
use crate::workload::Arrivals;

/// Whether two tenants are the same load alone: same workload, region size, SLO and
/// reservation.
fn same_load(a: &TenantSetup, b: &TenantSetup) -> bool {
    a.workload == b.workload
        && a.size == b.size
        && a.spec.slo == b.spec.slo
        && a.spec.reservation_iops == b.spec.reservation_iops
}

/// The scenario with only tenant `i`, under `none`.
pub fn alone_scenario(scenario: &Scenario, i: usize) -> Scenario {
    let mut s = scenario.clone();
    s.tenants = vec![scenario.tenants[i].clone()];
    s.policies = vec![PolicyChoice::named("none")];
    s.insulation = false;
    s
}

/// What every run of `scenario` is measured against: each tenant alone on a copy of
/// `device` (preconditioned, priced by `cost`), and its entitled slice interval by
/// interval ([`Yardstick::new`]).
pub fn yardstick(
    scenario: &Scenario,
    device: &dyn DeviceModel,
    cost: CostModel,
    options: RunOptions,
) -> Result<Yardstick, PolicyError> {
    let (figures, series) = alone_series(scenario, device, cost, options)?;
    let claims: Vec<Claim> = scenario
        .tenants
        .iter()
        .map(|t| Claim::from(&t.spec))
        .collect();
    let secs = nanos_to_secs(scenario.duration.saturating_sub(scenario.warmup));
    Ok(Yardstick::new(
        figures,
        &series,
        &claims,
        nanos_to_secs(scenario.interval),
        secs,
    ))
}

/// What each tenant of `scenario` does alone on copies of `device` (preconditioned,
/// priced by `cost`), in tenant order, with its bytes and device time per interval.
fn alone_series(
    scenario: &Scenario,
    device: &dyn DeviceModel,
    cost: CostModel,
    options: RunOptions,
) -> Result<(Vec<Alone>, Vec<AloneSeries>), PolicyError> {
    let mut runs: Vec<(usize, Alone, AloneSeries)> = Vec::new();
    let mut out = Vec::with_capacity(scenario.tenants.len());
    let mut series = Vec::with_capacity(scenario.tenants.len());
    let secs =
        nanos_to_secs(scenario.duration.saturating_sub(scenario.warmup)).max(f64::MIN_POSITIVE);
    for (i, t) in scenario.tenants.iter().enumerate() {
        if let Some((_, a, s)) = runs
            .iter()
            .find(|(j, _, _)| same_load(&scenario.tenants[*j], t))
        {
            out.push(*a);
            series.push(s.clone());
            continue;
        }
        let s = alone_scenario(scenario, i);
        let run = run_policy_priced(&s, &s.policies[0], device.clone_box(), cost, None, options)?;
        let r = &run.tenants[0];
        let mut a = Alone {
            bandwidth_bytes_per_s: r.bandwidth_bytes_per_s,
            iops: r.iops,
            device_time_per_s: r.device_time_s / secs,
            slo_satisfaction: r.slo_satisfaction,
            p99_us: r.latency_us.p99,
            reservation_missed: r.reservation_missed,
            feasible_iops: None,
            occupancy: run
                .device
                .busy_ns
                .map(|b| (nanos_to_secs(b) / secs).min(1.0)),
        };
        if a.slo_satisfaction.is_some_and(|m| m < SLO_MET) {
            a.feasible_iops = feasible_rate(&s, device, cost, options)?;
        }
        let s = AloneSeries {
            bytes: run.timeseries.bytes[0].clone(),
            device_ns: run.timeseries.device_ns[0].clone(),
        };
        runs.push((i, a, s.clone()));
        out.push(a);
        series.push(s);
    }
    Ok((out, series))
}

/// The highest arrival rate, in tenths of the tenant's own (0.9, 0.8, ... 0.1), at
/// which the only tenant of `alone` meets its SLO alone; `None` for a tenant whose
/// arrivals are not a rate in every phase it is active, or when none of them does.
fn feasible_rate(
    alone: &Scenario,
    device: &dyn DeviceModel,
    cost: CostModel,
    options: RunOptions,
) -> Result<Option<f64>, PolicyError> {
    if !alone.open_loop()[0] {
        return Ok(None);
    }
    let rate = |s: &Scenario| -> f64 {
        // The busiest phase's rate: what the tenant asks at its peak.
        s.tenants[0]
            .workload
            .phases
            .iter()
            .filter_map(|p| match p.arrivals {
                Arrivals::Open { rate_iops, .. } => Some(rate_iops),
                _ => None,
            })
            .fold(0.0, f64::max)
    };
    for tenths in (1..10).rev() {
        let f = f64::from(tenths) / 10.0;
        let mut s = alone.clone();
        for p in &mut s.tenants[0].workload.phases {
            if let Arrivals::Open { rate_iops, .. } = &mut p.arrivals {
                *rate_iops *= f;
            }
        }
        let run = run_policy_priced(&s, &s.policies[0], device.clone_box(), cost, None, options)?;
        if run.tenants[0]
            .slo_satisfaction
            .is_some_and(|m| m >= SLO_MET)
        {
            return Ok(Some(rate(&s)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(text: &str) -> Scenario {
        Scenario::parse(text, "t.toml", "t").unwrap()
    }

    #[test]
    fn tenants_of_one_kind_share_a_run_and_each_alone_is_its_own_run() {
        let s = scenario(
            "duration_s = 2\nwarmup_s = 0.5\npolicies = ['none']\n[device]\nmodel = 'fixed'\nparallelism = 4\n\
             [[tenant]]\nname = 'a'\nworkload = { pattern = 'randread', size = '4k', iodepth = 4 }\n\
             [[tenant]]\nname = 'b'\nworkload = { pattern = 'randread', size = '4k', iodepth = 4 }\n\
             [[tenant]]\nname = 'c'\nworkload = { pattern = 'randread', size = '64k', iodepth = 1 }\n",
        );
        let device = s.device.build(s.seed);
        let cost = s.device.fitted_cost(device.as_ref());
        let a = alone_series(&s, device.as_ref(), cost, RunOptions::default())
            .unwrap()
            .0;
        assert_eq!(a.len(), 3);
        assert_eq!(a[0], a[1]);
        assert_ne!(a[0], a[2]);
        // The alone figure is the tenant's own run under none.
        let only = alone_scenario(&s, 2);
        assert_eq!(only.tenants.len(), 1);
        assert_eq!(only.tenants[0].stream, 3);
        let run = crate::sim::run_scenario(&only, false).unwrap();
        assert_eq!(
            run.runs[0].tenants[0].bandwidth_bytes_per_s,
            a[2].bandwidth_bytes_per_s
        );
        assert_eq!(run.runs[0].tenants[0].iops, a[2].iops);
        // A deep reader alone keeps the device busy: about one device-second a second.
        assert!(a[0].device_time_per_s > 0.9, "{:?}", a[0]);
    }
}
