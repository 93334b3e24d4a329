//! What each backlogged tenant is entitled to when some tenants hold reservations or
//! limits: the allocation mClock's definition implies (Gulati, Merchant and Varman,
//! "mClock: Handling Throughput Variability for Hypervisor IO Scheduling", OSDI 2010,
//! §3): every tenant gets at least its reservation, at most its limit, and what is left
//! is split by weight — tenant i gets `clamp(w_i · x, R_i, L_i)` with the one `x` at
//! which the allocations add up to what the device gave the backlogged tenants.
//!
//! Readings chosen:
//! * Reservations and limits are promised in requests a second; the shares are judged
//!   in the unit the figure is in (device time, bytes). A tenant's reservation is
//!   turned into that unit at its own mean request over the span (`r · secs · mean`):
//!   300 reads a second of 4 KiB are 300 of them, whatever each costs the device.
//! * The capacity shared is what the backlogged tenants moved together — the device's
//!   speed is what it was in the run, not a datasheet's.
//! * Reservations that add up to more than that capacity split it in proportion to the
//!   reservations (mClock's reservation tags then run behind together, none first); a
//!   tenant without a reservation is then entitled to nothing and leaves the figure.
//!   Limits that add up to less than it: each tenant is entitled to its limit.
//! * A tenant that completed nothing has no mean request: its reservation and limit
//!   cannot be turned into the unit, and it is judged by its weight alone.
//! * Without any reservation or limit among the backlogged tenants the weights are
//!   returned as they are, so every figure is exactly what it was by weight.

use crate::types::TenantSpec;

/// What a tenant is promised, for judging its share: its weight, and mClock's
/// reservation and limit in requests a second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Claim {
    /// Proportional-share weight, > 0.
    pub weight: f64,
    /// Minimum requests a second, when promised.
    pub reservation_iops: Option<f64>,
    /// Maximum requests a second, when promised.
    pub limit_iops: Option<f64>,
}

impl Claim {
    /// A weight and nothing else.
    pub fn weighted(weight: f64) -> Self {
        Claim {
            weight,
            reservation_iops: None,
            limit_iops: None,
        }
    }
}

impl From<&TenantSpec> for Claim {
    fn from(t: &TenantSpec) -> Self {
        Claim {
            weight: t.weight,
            reservation_iops: t.reservation_iops,
            limit_iops: t.limit_iops,
        }
    }
}

/// Bisection steps: each halves the interval, 200 reach the last bit of an f64 from
/// any starting width.
const STEPS: usize = 200;

/// Each tenant's entitlement over a span of `secs` seconds, in the unit of `moved`
/// (what each tenant moved; `mean[i]` its mean request in that unit): for the
/// `backlogged` tenants the mClock allocation of their total, 0 for the others. Used
/// as weights by [`super::share_error`] and [`super::measurable`]; without
/// reservations or limits among the backlogged tenants it is the weights themselves.
pub fn entitlements(
    moved: &[f64],
    claims: &[Claim],
    backlogged: &[bool],
    mean: &[f64],
    secs: f64,
) -> Vec<f64> {
    let idx: Vec<usize> = (0..moved.len()).filter(|&i| backlogged[i]).collect();
    let bound =
        |i: usize, rate: Option<f64>| rate.filter(|_| mean[i] > 0.0).map(|r| r * secs * mean[i]);
    let floor: Vec<f64> = (0..moved.len())
        .map(|i| bound(i, claims[i].reservation_iops).unwrap_or(0.0))
        .collect();
    let ceil: Vec<f64> = (0..moved.len())
        .map(|i| {
            bound(i, claims[i].limit_iops)
                .unwrap_or(f64::INFINITY)
                .max(floor[i])
        })
        .collect();
    if idx
        .iter()
        .all(|&i| floor[i] == 0.0 && ceil[i] == f64::INFINITY)
    {
        return claims.iter().map(|c| c.weight).collect();
    }
    let capacity: f64 = idx.iter().map(|&i| moved[i]).sum();
    fill(&idx, &|i| claims[i].weight, &floor, &ceil, capacity)
}

/// Water-filling: for the tenants in `idx`, `clamp(weight(i) · x, floor[i], ceil[i])`
/// with the one `x` at which they add up to `capacity` — or every ceiling when the
/// ceilings add up to no more, or the capacity split in proportion to the floors when
/// the floors add up to as much or more; 0 for the tenants not in `idx`. One
/// computation for every entitlement here ([`entitlements`], [`max_min`],
/// [`super::insulation::water_fill`]).
pub(crate) fn fill(
    idx: &[usize],
    weight: &dyn Fn(usize) -> f64,
    floor: &[f64],
    ceil: &[f64],
    capacity: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; floor.len()];
    let floors: f64 = idx.iter().map(|&i| floor[i]).sum();
    let ceils: f64 = idx.iter().map(|&i| ceil[i]).sum();
    if floors >= capacity {
        if floors > 0.0 {
            idx.iter()
                .for_each(|&i| out[i] = capacity * floor[i] / floors);
        }
        return out;
    }
    if ceils <= capacity {
        idx.iter().for_each(|&i| out[i] = ceil[i]);
        return out;
    }
    let at = |x: f64, i: usize| (weight(i) * x).clamp(floor[i], ceil[i]);
    let total = |x: f64| idx.iter().map(|&i| at(x, i)).sum::<f64>();
    let min_w = idx.iter().map(|&i| weight(i)).fold(f64::INFINITY, f64::min);
    // At capacity / min_w every tenant is at its ceiling or past the whole capacity,
    // and the ceilings together exceed the capacity: the total is at least the
    // capacity.
    let (mut lo, mut hi) = (0.0, capacity / min_w);
    for _ in 0..STEPS {
        let mid = 0.5 * (lo + hi);
        if total(mid) < capacity {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    idx.iter().for_each(|&i| out[i] = at(hi, i));
    out
}

/// Each tenant's entitlement in one interval by max-min (water-filling): a tenant none
/// of whose requests waited in the host (`waited[i]` false) had all it asked for at
/// the latency it saw, so it demands what it `moved`; one whose requests waited
/// demands without bound. What they moved together is split by weight up to each
/// demand, clamped by reservations and limits (turned into the unit at `mean[i]` over
/// `secs`, as [`entitlements`] does). Tenants that neither moved nor waited are
/// entitled to 0.
pub fn max_min(
    moved: &[f64],
    claims: &[Claim],
    waited: &[bool],
    mean: &[f64],
    secs: f64,
) -> Vec<f64> {
    let n = moved.len();
    let idx: Vec<usize> = (0..n).filter(|&i| waited[i] || moved[i] > 0.0).collect();
    let demand = |i: usize| if waited[i] { f64::INFINITY } else { moved[i] };
    let bound =
        |i: usize, rate: Option<f64>| rate.filter(|_| mean[i] > 0.0).map(|r| r * secs * mean[i]);
    let floor: Vec<f64> = (0..n)
        .map(|i| {
            bound(i, claims[i].reservation_iops)
                .unwrap_or(0.0)
                .min(demand(i))
        })
        .collect();
    let ceil: Vec<f64> = (0..n)
        .map(|i| {
            bound(i, claims[i].limit_iops)
                .unwrap_or(f64::INFINITY)
                .min(demand(i))
                .max(floor[i])
        })
        .collect();
    let capacity: f64 = idx.iter().map(|&i| moved[i]).sum();
    fill(&idx, &|i| claims[i].weight, &floor, &ceil, capacity)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(weight: f64, r: Option<f64>, l: Option<f64>) -> Claim {
        Claim {
            weight,
            reservation_iops: r,
            limit_iops: l,
        }
    }

    #[test]
    fn without_reservations_or_limits_the_weights_come_back_unchanged() {
        let claims = [claim(1.0, None, None), claim(3.0, None, Some(5.0))];
        // The limited tenant is not backlogged: only the weights matter.
        let got = entitlements(&[10.0, 0.0], &claims, &[true, false], &[1.0, 1.0], 1.0);
        assert_eq!(got, vec![1.0, 3.0]);
    }

    #[test]
    fn the_mclock_scenario_is_split_as_its_definition_says() {
        // scenarios/mclock-reservations.toml: 7,935 requests a second of one cost;
        // gold r 3,000 w 1, silver r 500 w 2, capped l 800 w 1, bronze w 1. With x the
        // weight-1 rate: 3,000 + 2x + 800 + x = 7,935 → x = 1,378.33.
        let claims = [
            claim(1.0, Some(3000.0), None),
            claim(2.0, Some(500.0), None),
            claim(1.0, None, Some(800.0)),
            claim(1.0, None, None),
        ];
        let moved = [3150.0, 2657.0, 800.0, 1328.0];
        let got = entitlements(&moved, &claims, &[true; 4], &[1.0; 4], 1.0);
        let x = (7935.0 - 3800.0) / 3.0;
        let want = [3000.0, 2.0 * x, 800.0, x];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
        let sum: f64 = got.iter().sum();
        assert!((sum - 7935.0).abs() < 1e-6);
    }

    #[test]
    fn reservations_are_turned_into_the_unit_at_each_tenants_mean_request() {
        // Two tenants moving 100 units over 2 s; the first reserved 10 requests a second
        // of 4 units each: 80 of the 100 are its floor; weights 1:1 would give 50.
        let claims = [claim(1.0, Some(10.0), None), claim(1.0, None, None)];
        let got = entitlements(&[60.0, 40.0], &claims, &[true, true], &[4.0, 1.0], 2.0);
        assert!(
            (got[0] - 80.0).abs() < 1e-9 && (got[1] - 20.0).abs() < 1e-9,
            "{got:?}"
        );
    }

    #[test]
    fn oversubscribed_reservations_split_by_reservation_and_short_limits_are_each_kept() {
        let claims = [
            claim(1.0, Some(300.0), None),
            claim(1.0, Some(100.0), None),
            claim(5.0, None, None),
        ];
        // 300 moved, floors of 300 and 100: the 300 split 3:1.
        let got = entitlements(&[100.0, 100.0, 100.0], &claims, &[true; 3], &[1.0; 3], 1.0);
        assert_eq!(got, vec![225.0, 75.0, 0.0]);
        let claims = [claim(1.0, None, Some(50.0)), claim(2.0, None, Some(70.0))];
        let got = entitlements(&[100.0, 100.0], &claims, &[true; 2], &[1.0; 2], 1.0);
        assert_eq!(got, vec![50.0, 70.0]);
    }

    #[test]
    fn max_min_gives_a_tenant_that_never_waited_what_it_moved() {
        // One interval: a never waited and moved 10; b and c waited, moved 60 and 30,
        // weights 1 and 2. Capacity 100: a keeps its 10, b and c split 90 as 1:2.
        let claims = [
            claim(1.0, None, None),
            claim(1.0, None, None),
            claim(2.0, None, None),
        ];
        let got = max_min(
            &[10.0, 60.0, 30.0],
            &claims,
            &[false, true, true],
            &[1.0; 3],
            1.0,
        );
        assert!(
            (got[0] - 10.0).abs() < 1e-9
                && (got[1] - 30.0).abs() < 1e-9
                && (got[2] - 60.0).abs() < 1e-9,
            "{got:?}"
        );
        // a moved more than an even split without waiting (50 of 100 beside one that
        // waited): it is entitled to its weight's half only.
        let got = max_min(&[50.0, 50.0], &claims[..2], &[false, true], &[1.0; 2], 1.0);
        assert!((got[0] - 50.0).abs() < 1e-9, "{got:?}");
        let got = max_min(&[70.0, 30.0], &claims[..2], &[false, true], &[1.0; 2], 1.0);
        assert!(
            (got[0] - 50.0).abs() < 1e-9 && (got[1] - 50.0).abs() < 1e-9,
            "{got:?}"
        );
        // A starved tenant (waited, moved nothing) is entitled all the same; an idle one
        // (neither) to nothing.
        let got = max_min(
            &[40.0, 0.0, 0.0],
            &claims,
            &[true, true, false],
            &[1.0; 3],
            1.0,
        );
        assert_eq!(got, vec![20.0, 20.0, 0.0]);
    }

    #[test]
    fn a_tenant_that_completed_nothing_is_judged_by_its_weight() {
        let claims = [claim(1.0, Some(1000.0), None), claim(1.0, None, None)];
        let got = entitlements(&[0.0, 100.0], &claims, &[true, true], &[0.0, 1.0], 1.0);
        assert_eq!(got, vec![1.0, 1.0]);
    }
}
