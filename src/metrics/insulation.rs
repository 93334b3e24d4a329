//! Insulation: what a tenant got against what its entitled slice of the device gives
//! it alone. Wachs, Abd-El-Malek, Thereska and Ganger, "Argon: Performance Insulation
//! for Shared Storage Servers", FAST 2007, §2: each of n workloads sharing a server
//! should get at least R of the efficiency it has alone within its share (their goal
//! R = 0.9); Park and Shen's FIOS (FAST 2012) judges flash schedulers by the same
//! proportional slowdown.
//!
//! Per tenant i, with `T_i` its throughput alone on the same device, state and seed,
//! `D_i` the device time it used alone (device-seconds a second, by the cost model) and
//! `E_i` its entitled device time:
//!
//! ```text
//! R_i = got_i ÷ (T_i × E_i ÷ D_i)
//! ```
//!
//! `E` is max-min (water-filling) by weight over the device's capacity, each tenant
//! demanding `D_i`: no tenant is entitled to more than it asks alone, and what the light
//! ones leave is split by weight among the rest. Reservations and limits clamp it as
//! mClock's definition does (Gulati, Merchant and Varman, OSDI 2010, §3): `E_i =
//! clamp(w_i·x, floor_i, ceil_i)` for the one `x` at which the entitlements fill the
//! device, `floor_i = min(r_i·c_i, D_i)` and `ceil_i = min(l_i·c_i, D_i)` with `c_i` the
//! device time of one of its requests alone.
//!
//! Readings chosen:
//! * Throughput is bytes a second (requests a second for a tenant that moved no bytes
//!   alone — there is none among the workloads here).
//! * The device's capacity is one device-second a second — the cost model is fitted so
//!   that each kind of request alone at full load is exactly that
//!   ([`crate::device::spec::DeviceSpec::fitted_cost`]). A tenant that used more than
//!   that alone (short seeks in a small region of a disk, a write buffer absorbing its
//!   writes: what the model prices at its average) used the whole device: its device
//!   time is scaled by its own figure alone ([`scale`]), so it demands one
//!   device-second a second and its reservation is priced at the same scale. Taking
//!   the most any tenant used alone as the capacity instead (the reading before)
//!   entitled the others to slices the device does not have: a 4 KiB writer in a 128
//!   MiB region of the `hdd` model used 3.49 device-seconds a second alone, and a 1 MiB
//!   reader beside it was entitled to all it did alone, the writer to two thirds of
//!   it — 1.67 disks of real time, which no order of requests gives. A policy that
//!   wastes the device is still judged by what its tenants lose, not excused by a
//!   smaller capacity.
//! * Every tenant that used the device alone enters the water-filling, backlogged or
//!   not: a light tenant's demand is small, and it is entitled to all of it.
//! * Figures are whole-run means. A tenant with idle phases demands the mean of its
//!   busy and idle time; the per-interval share error
//!   ([`super::RunResult::interval_share_error`]) judges the split second by second.
//! * Reservations above what a tenant asks alone are worth what it asks; reservations
//!   that together exceed the capacity split it in proportion to the reservations (as
//!   [`super::entitled`] does), those without one then entitled to nothing.

use super::entitled::Claim;
use serde::Serialize;

/// Insulation the house holds every backlogged tenant to (Argon's R).
pub const INSULATED: f64 = 0.9;

/// What one tenant did alone on the device: under `none`, with the same device,
/// precondition, seed and region, nobody else.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Alone {
    /// Bytes completed a second.
    pub bandwidth_bytes_per_s: f64,
    /// Requests completed a second.
    pub iops: f64,
    /// Device time used a second (device-seconds by the cost model).
    pub device_time_per_s: f64,
    /// Of its requests, the fraction within its SLO's response time; absent without
    /// an SLO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slo_satisfaction: Option<f64>,
    /// Its p99 response time alone, µs.
    pub p99_us: f64,
    /// Its reservation alone: the fraction of the time it asked that it was short of
    /// it ([`super::TenantResult::reservation_missed`]); absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_missed: Option<f64>,
    /// An open-loop tenant that misses its SLO even alone: the highest arrival rate, in
    /// tenths of its own, at which it meets it alone ([`super::SLO_MET`]); absent
    /// otherwise (or when not even a tenth of it does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feasible_iops: Option<f64>,
    /// The fraction of the time the device's heads were busy with it (a disk, an
    /// array: [`crate::device::DeviceStats::busy_ns`]); absent on flash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub occupancy: Option<f64>,
}

impl Alone {
    /// Device time of one of its requests alone, seconds; 0 when it completed nothing.
    pub fn per_request(&self) -> f64 {
        if self.iops > 0.0 {
            self.device_time_per_s / self.iops
        } else {
            0.0
        }
    }
}

/// Max-min by weight over `capacity` with each tenant demanding `demand[i]`
/// (device-seconds a second), reservations and limits turned into device time at
/// `per_request[i]` device-seconds a request.
pub fn water_fill(
    demand: &[f64],
    per_request: &[f64],
    claims: &[Claim],
    capacity: f64,
) -> Vec<f64> {
    assert_eq!(demand.len(), claims.len(), "one claim per tenant");
    let n = demand.len();
    let demand: Vec<f64> = demand.iter().map(|d| d.max(0.0)).collect();
    let bound = |i: usize, rate: Option<f64>| rate.map(|r| (r * per_request[i]).min(demand[i]));
    let floor: Vec<f64> = (0..n)
        .map(|i| bound(i, claims[i].reservation_iops).unwrap_or(0.0))
        .collect();
    let ceil: Vec<f64> = (0..n)
        .map(|i| {
            bound(i, claims[i].limit_iops)
                .unwrap_or(demand[i])
                .max(floor[i])
        })
        .collect();
    let all: Vec<usize> = (0..n).collect();
    super::entitled::fill(&all, &|i| claims[i].weight, &floor, &ceil, capacity)
}

/// What a tenant's device time is divided by to be a part of the device. On a device
/// whose heads' busy time is measured (a disk, an array), its device time alone over
/// the part of the time the heads were busy with it: its demand is then that part, the
/// device's own measure. Elsewhere its device time alone when that is more than one
/// device-second a second (it had the whole device), else 1.
pub fn scale(alone: &Alone) -> f64 {
    match alone.occupancy {
        Some(o) if o > 0.0 && alone.device_time_per_s > 0.0 => alone.device_time_per_s / o,
        _ => alone.device_time_per_s.max(1.0),
    }
}

/// Whether a slice of `entitled` device-seconds a second over `secs` seconds is enough
/// of the tenant's own requests (at `per_request` device-seconds each alone) to
/// measure: at least [`super::MEASURABLE_REQUESTS`] of them, and at least the service
/// floor's [`super::FLOOR_REQUESTS_PER_S`] a second. A weight-1000 tenant among 1,024
/// on a disk is entitled to one random read in four seconds: what it gets is the
/// floor's, or one request more or less, not its slice.
pub fn measurable(entitled: f64, per_request: f64, secs: f64) -> bool {
    let requests = super::MEASURABLE_REQUESTS.max(super::FLOOR_REQUESTS_PER_S * secs);
    per_request > 0.0 && entitled * secs / per_request >= requests
}

/// One tenant alone, interval by interval: bytes and device time (ns) it completed in
/// each interval of the measured span (the run's grid).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AloneSeries {
    /// Bytes completed per interval.
    pub bytes: Vec<u64>,
    /// Device time completed per interval, ns.
    pub device_ns: Vec<u64>,
}

/// What every run of a scenario is measured against: each tenant alone, its entitled
/// part of the device, and the bytes that part would give it over the measured span.
#[derive(Debug, Clone, PartialEq)]
pub struct Yardstick {
    /// Each tenant alone, whole-run figures.
    pub alone: Vec<Alone>,
    /// Its entitled part of the device's time over the span (0–1).
    pub entitled_share: Vec<f64>,
    /// The bytes its entitled slice gives it alone over the span; `None` where the
    /// slice is too small to measure ([`measurable`]) or it moved nothing alone.
    pub expected_bytes: Vec<Option<f64>>,
}

impl Yardstick {
    /// Entitlements interval by interval: in each interval of `interval_s` seconds,
    /// max-min by weight over one device-second a second with each tenant demanding
    /// the device time it used alone in that interval (over its [`scale`]); the bytes it would move with
    /// it are its bytes alone in the interval scaled by entitled ÷ used (never above
    /// 1). Summed over the span of `secs` seconds: a tenant that idles for a phase is
    /// entitled to nothing while it idles (alone it idled too), and the others to its
    /// part.
    pub fn new(
        alone: Vec<Alone>,
        series: &[AloneSeries],
        claims: &[Claim],
        interval_s: f64,
        secs: f64,
    ) -> Yardstick {
        assert_eq!(alone.len(), series.len(), "one series per tenant");
        let n = alone.len();
        let scales: Vec<f64> = alone.iter().map(scale).collect();
        let per_request: Vec<f64> = alone
            .iter()
            .zip(&scales)
            .map(|(a, s)| a.per_request() / s)
            .collect();
        let bins = series.iter().map(|s| s.device_ns.len()).max().unwrap_or(0);
        let mut entitled = vec![0.0; n];
        let mut expected = vec![0.0; n];
        let mut demand = vec![0.0; n];
        for k in 0..bins {
            // The last interval may be cut short by the end of the span.
            let len = interval_s.min(secs - k as f64 * interval_s);
            if len <= 0.0 {
                break;
            }
            for ((d, s), scale) in demand.iter_mut().zip(series).zip(&scales) {
                *d = s.device_ns.get(k).copied().unwrap_or(0) as f64 / 1e9 / len / scale;
            }
            let e = water_fill(&demand, &per_request, claims, 1.0);
            for i in 0..n {
                entitled[i] += e[i] * len;
                let bytes = series[i].bytes.get(k).copied().unwrap_or(0) as f64;
                if demand[i] > 0.0 {
                    expected[i] += bytes * (e[i] / demand[i]).min(1.0);
                }
            }
        }
        Yardstick {
            entitled_share: entitled
                .iter()
                .map(|e| e / secs.max(f64::MIN_POSITIVE))
                .collect(),
            expected_bytes: (0..n)
                .map(|i| {
                    (expected[i] > 0.0 && measurable(entitled[i] / secs, per_request[i], secs))
                        .then_some(expected[i])
                })
                .collect(),
            alone,
        }
    }
}

/// Fills in a run's insulation figures from `yardstick` (its scenario's tenants alone):
/// each tenant's `alone`, `entitled_device_share` and `insulation` — the bytes it moved
/// over those its slice gives it alone, absent where the slice cannot be measured
/// ([`measurable`]: such a tenant is judged by how long it waits) — and the run's
/// lowest.
pub fn judge(run: &mut super::RunResult, yardstick: &Yardstick) {
    assert_eq!(
        yardstick.alone.len(),
        run.tenants.len(),
        "one alone figure per tenant"
    );
    for (i, t) in run.tenants.iter_mut().enumerate() {
        t.alone = Some(yardstick.alone[i]);
        t.entitled_device_share = Some(yardstick.entitled_share[i]);
        t.insulation = yardstick.expected_bytes[i].map(|e| t.bytes as f64 / e);
    }
    let any_backlogged = run
        .tenants
        .iter()
        .any(|t| t.backlogged && t.insulation.is_some());
    let lowest = run
        .tenants
        .iter()
        .filter(|t| t.backlogged || !any_backlogged)
        .filter_map(|t| t.insulation.map(|r| (r, t.name.clone())))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    (run.min_insulation, run.min_insulation_tenant) = match lowest {
        Some((r, name)) => (Some(r), Some(name)),
        None => (None, None),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alone(bw: f64, iops: f64, dev: f64) -> Alone {
        Alone {
            bandwidth_bytes_per_s: bw,
            iops,
            device_time_per_s: dev,
            slo_satisfaction: None,
            p99_us: 0.0,
            reservation_missed: None,
            feasible_iops: None,
            occupancy: None,
        }
    }

    fn claim(weight: f64, r: Option<f64>, l: Option<f64>) -> Claim {
        Claim {
            weight,
            reservation_iops: r,
            limit_iops: l,
        }
    }

    /// Whole-run entitlements of tenants as they were alone (one steady interval).
    fn entitled_device_time(a: &[Alone], c: &[Claim], capacity: f64) -> Vec<f64> {
        let demand: Vec<f64> = a.iter().map(|a| a.device_time_per_s).collect();
        let per_request: Vec<f64> = a.iter().map(Alone::per_request).collect();
        water_fill(&demand, &per_request, c, capacity)
    }

    /// The yardstick of tenants steady for one second at their alone figures.
    fn one_second(a: &[Alone], c: &[Claim]) -> Yardstick {
        let series: Vec<AloneSeries> = a
            .iter()
            .map(|a| AloneSeries {
                bytes: vec![a.bandwidth_bytes_per_s as u64],
                device_ns: vec![(a.device_time_per_s * 1e9) as u64],
            })
            .collect();
        Yardstick::new(a.to_vec(), &series, c, 1.0, 1.0)
    }

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-9, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn water_filling_gives_light_tenants_all_they_ask_and_splits_the_rest_by_weight() {
        // Demands 0.1, 1.0, 1.0 device-s/s; weights 1, 1, 2. Even split by weight would
        // be 0.25/0.25/0.5; the light one takes 0.1, the 0.9 left goes 1:2 → 0.3, 0.6.
        let a = [
            alone(1e6, 100.0, 0.1),
            alone(1e8, 1e3, 1.0),
            alone(4e6, 1e3, 1.0),
        ];
        let c = [
            claim(1.0, None, None),
            claim(1.0, None, None),
            claim(2.0, None, None),
        ];
        let e = entitled_device_time(&a, &c, 1.0);
        close(&e, &[0.1, 0.3, 0.6]);
        // R: the light one got 0.9 MB/s of its 1 → 0.9; the second 33 of 100 × 0.3 =
        // 30 → 1.1; the third 2.4 of 4 × 0.6 = 2.4 → 1.
        let y = one_second(&a, &c);
        close(&y.entitled_share, &[0.1, 0.3, 0.6]);
        let r: Vec<f64> = [0.9e6, 33e6, 2.4e6]
            .iter()
            .zip(&y.expected_bytes)
            .map(|(got, e)| got / e.unwrap())
            .collect();
        close(&r, &[0.9, 1.1, 1.0]);
    }

    #[test]
    fn demands_under_the_capacity_are_each_entitled_in_full() {
        let a = [alone(1.0, 1.0, 0.3), alone(1.0, 1.0, 0.5)];
        let c = [claim(1.0, None, None), claim(5.0, None, None)];
        close(&entitled_device_time(&a, &c, 1.0), &[0.3, 0.5]);
    }

    #[test]
    fn reservations_and_limits_clamp_the_split_in_device_time() {
        // Three backlogged tenants (1 device-s/s each alone). gold reserves 400 IOPS of
        // 1 ms each alone (0.4 s/s), capped is limited to 100 IOPS of 0.5 ms (0.05 s/s),
        // bronze has weight 1 like gold: x with max(x, 0.4) + 0.05 + x = 1 → x = 0.475,
        // over gold's floor.
        let a = [
            alone(1.0, 1000.0, 1.0),
            alone(1.0, 2000.0, 1.0),
            alone(1.0, 1.0, 1.0),
        ];
        let c = [
            claim(1.0, Some(400.0), None),
            claim(1.0, None, Some(100.0)),
            claim(1.0, None, None),
        ];
        close(&entitled_device_time(&a, &c, 1.0), &[0.475, 0.05, 0.475]);
        // gold reserves 700 IOPS: its floor 0.7 binds, bronze gets what is left.
        let c = [
            claim(1.0, Some(700.0), None),
            claim(1.0, None, Some(100.0)),
            claim(1.0, None, None),
        ];
        close(&entitled_device_time(&a, &c, 1.0), &[0.7, 0.05, 0.25]);
        // Reservations over the capacity split it by reservation, in device time: 900
        // of 1 ms (0.9) and 600 of 0.5 ms (0.3) → 0.9/1.2 and 0.3/1.2.
        let c = [
            claim(1.0, Some(900.0), None),
            claim(1.0, Some(600.0), None),
            claim(1.0, None, None),
        ];
        close(&entitled_device_time(&a, &c, 1.0), &[0.75, 0.25, 0.0]);
    }

    #[test]
    fn a_tenant_alone_above_one_device_second_had_the_whole_device() {
        assert_eq!(scale(&alone(1.0, 1.0, 3.5)), 3.5);
        assert_eq!(scale(&alone(1.0, 1.0, 0.2)), 1.0);
        // The disk's case: a writer in a small region (3.49 device-s/s alone, 825
        // IOPS), a 1 MiB reader (0.91, 57 MB/s), a 60 IOPS reader with a reservation
        // of its rate (0.25). The writer demands the whole device, the reservation
        // takes its 0.25, the two backlogged tenants split the rest: 0.375 each, the
        // writer 37.5 % of what it did alone, the reader 41 %. (With the writer's
        // figure as the capacity the reader was entitled to all of its 57 MB/s and the
        // writer to two thirds of its 825 IOPS, more than one disk.)
        let a = [
            alone(245_760.0, 60.0, 0.25),
            alone(3_379_200.0, 825.0, 3.49),
            alone(57e6, 54.4, 0.91),
        ];
        let c = [
            claim(1.0, Some(60.0), None),
            claim(1.0, None, None),
            claim(1.0, None, None),
        ];
        let y = one_second(&a, &c);
        close(&y.entitled_share, &[0.25, 0.375, 0.375]);
        let want = [245_760.0, 3_379_200.0 * 0.375, 57e6 * 0.375 / 0.91];
        let ratio: Vec<f64> = y
            .expected_bytes
            .iter()
            .zip(want)
            .map(|(e, w)| e.unwrap() / w)
            .collect();
        close(&ratio, &[1.0, 1.0, 1.0]);
    }

    #[test]
    fn on_a_disk_a_tenant_demands_the_part_of_the_heads_time_it_used_alone() {
        // The same three on the disk, with the heads' busy time alone: the writer and
        // the stream kept them busy all the time, the reader at 60 IOPS 21.6 % of it
        // (3.6 ms a read, where the model prices 4.2). The reservation takes 0.216 of
        // the disk, the two backlogged tenants 0.392 each of what they did alone.
        let mut a = [
            alone(245_760.0, 60.0, 0.254),
            alone(3_379_200.0, 825.0, 3.49),
            alone(57e6, 54.4, 0.91),
        ];
        for (x, o) in a.iter_mut().zip([0.216, 1.0, 1.0]) {
            x.occupancy = Some(o);
        }
        assert_eq!(scale(&a[2]), 0.91);
        let c = [
            claim(1.0, Some(60.0), None),
            claim(1.0, None, None),
            claim(1.0, None, None),
        ];
        let y = one_second(&a, &c);
        close(&y.entitled_share, &[0.216, 0.392, 0.392]);
        let ratio: Vec<f64> = y
            .expected_bytes
            .iter()
            .zip(&a)
            .map(|(e, x)| e.unwrap() / x.bandwidth_bytes_per_s)
            .collect();
        close(&ratio, &[1.0, 0.392, 0.392]);
    }

    #[test]
    fn a_slice_of_fewer_than_four_requests_or_two_a_second_is_not_measured() {
        // 8 ms requests over 4 s: 4 requests need 0.008 device-s/s, and the floor's two
        // a second 0.016.
        assert!(!measurable(0.015, 0.008, 4.0));
        assert!(measurable(0.016, 0.008, 4.0));
        // Over half a second, four requests are the bound (two a second are one).
        assert!(!measurable(0.063, 0.008, 0.5));
        assert!(measurable(0.064, 0.008, 0.5));
        assert!(!measurable(1.0, 0.0, 4.0));
    }

    #[test]
    fn nothing_alone_or_nothing_entitled_has_no_figure() {
        // An idle tenant moved nothing alone; beside reservations that take the whole
        // device, a tenant without one is entitled to nothing.
        let a = [
            alone(0.0, 0.0, 0.0),
            alone(4e6, 1e3, 1.0),
            alone(4e6, 1e3, 1.0),
        ];
        let c = [
            claim(1.0, None, None),
            claim(1.0, Some(1000.0), None),
            claim(1.0, None, None),
        ];
        let y = one_second(&a, &c);
        assert_eq!(y.expected_bytes[0], None);
        assert_eq!(y.expected_bytes[2], None);
        assert!(y.expected_bytes[1].is_some());
    }
}
