//! `ta1`: a token bucket per tenant, always in the path — TA1 of Y. J. Nam, C. Park, "Token-Bucket-based Performance Control Techniques for Large-Scale Shared Storage Systems", 2005.
//!
//! Each tenant with an SLO `{iops, size, rt}` has a bucket refilled `refill_hz` (τ,
//! default 1000) times a second with `ρ = iops / τ` requests' worth and `depth_factor × ρ`
//! deep (σ = 1.5 ρ); a request passes when the bucket holds one request's worth, else it
//! waits in its tenant's queue; one that would wait longer than `max_wait × rt` (half)
//! is refused. Not work-conserving: capacity one tenant leaves idle is
//! not given to another. The shared machinery and the readings it chose are in
//! [`super::token_bucket`].

use super::token_bucket::SwitchedBuckets;
use super::{Policy, PolicyError, PolicyParams};
use crate::types::TenantSpec;

/// Builds TA1 (`refill_hz`, `depth_factor`, `max_wait`).
pub fn build(
    params: &mut PolicyParams,
    tenants: &[TenantSpec],
) -> Result<Box<dyn Policy>, PolicyError> {
    Ok(Box::new(SwitchedBuckets::build(
        "ta1", params, tenants, false, false,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::TestPolicy;
    use crate::policy::{Admission, Dispatch, Refusal, test_request, test_slo_tenant};

    /// The paper's bucket: `depth_factor` (1.5) × ρ deep, refilled at exactly the rate.
    fn paper() -> PolicyParams {
        crate::policy::test_params(
            "ta1",
            toml::toml! { depth_rt = 0.0
            depth_requests = 0.0
            refill_slack = 0.0 },
        )
    }

    fn ids(p: &mut Box<dyn Policy>, now: u64) -> (Vec<u64>, Dispatch) {
        let mut got = Vec::new();
        loop {
            match p.dispatch(now) {
                Dispatch::Request(r) => got.push(r.id),
                other => return (got, other),
            }
        }
    }

    #[test]
    fn bucket_gates_a_burst_at_exact_ticks() {
        // 2,000 IOPS at τ = 1000: 2 per ms, 3 deep. A burst of 6 at t = 0: 3 pass now,
        // 2 at the 1 ms tick, the last at 2 ms. The tenant without an SLO passes its one
        // request (best effort, `best_effort_depth` 1).
        let tenants = [
            test_slo_tenant("a", 2000.0, 10_000),
            TenantSpec::weighted("b", 1.0),
        ];
        let mut p = build(&mut paper(), &tenants).unwrap();
        for id in 1..=6 {
            p.put(test_request(id, 0, 4096, 0), 0);
        }
        p.put(test_request(7, 1, 4096, 0), 0);
        let (got, next) = ids(&mut p, 0);
        assert_eq!(got, vec![1, 2, 3, 7]);
        assert_eq!(next, Dispatch::Wait(1_000_000));
        assert_eq!(ids(&mut p, 999_999).0, Vec::<u64>::new());
        let (got, next) = ids(&mut p, 1_000_000);
        assert_eq!(got, vec![4, 5]);
        assert_eq!(next, Dispatch::Wait(2_000_000));
        assert_eq!(ids(&mut p, 2_000_000), (vec![6], Dispatch::Idle));
        assert_eq!(p.queued(), 0);
        assert_eq!(p.report_json()["tenants"][0]["throttled"], 3);
    }

    #[test]
    fn idle_time_refills_only_to_the_depth() {
        let tenants = [test_slo_tenant("a", 2000.0, 10_000)];
        let mut p = build(&mut paper(), &tenants).unwrap();
        // After a long idle spell the bucket holds 3, not 2 × the idle milliseconds.
        for id in 1..=5 {
            p.put(test_request(id, 0, 4096, 50_000_000), 50_000_000);
        }
        let (got, next) = ids(&mut p, 50_000_000);
        assert_eq!(got, vec![1, 2, 3]);
        assert_eq!(next, Dispatch::Wait(51_000_000));
    }

    #[test]
    fn a_request_that_would_wait_past_half_its_rt_is_refused() {
        // 1,000 IOPS, rt 10 ms, max_wait 0.5: the queue holds what passes within 5 ms,
        // 5 requests. A burst of 8 at t = 0: 1 passes (the bucket holds 1.5), 5 wait,
        // the last 2 are refused and handed back in arrival order.
        let tenants = [test_slo_tenant("a", 1000.0, 10_000)];
        let mut p = build(&mut paper(), &tenants).unwrap();
        let refused: Vec<_> = (1..=8)
            .filter_map(|id| match p.enqueue(test_request(id, 0, 4096, 0), 0) {
                Admission::Queued => None,
                Admission::Refused(r, Refusal::Policy) => Some(r.id),
                Admission::Refused(r, other) => panic!("{} refused as {other:?}", r.id),
            })
            .collect();
        assert_eq!(refused, vec![7, 8]);
        assert_eq!(ids(&mut p, 0), (vec![1], Dispatch::Wait(1_000_000)));
        assert_eq!(p.queued(), 5);
        assert_eq!(p.report_json()["tenants"][0]["refused"], 2);
        assert_eq!(p.report_json()["tenants"][0]["queue_limit"], 5);
        // `max_wait = 0` turns the bound off.
        let mut params = crate::policy::test_params(
            "ta1",
            toml::toml! { max_wait = 0.0
            depth_rt = 0.0
            depth_requests = 0.0 },
        );
        let mut p = build(&mut params, &tenants).unwrap();
        for id in 1..=8 {
            p.put(test_request(id, 0, 4096, 0), 0);
        }
        assert_eq!(p.queued(), 8);
    }

    #[test]
    fn by_default_a_bucket_holds_one_response_time_of_the_agreed_rate_or_32_requests() {
        // 2,000 IOPS, rt 10 ms: 32 requests deep (one rt is 20; the paper's would be 3),
        // refilled at the agreed rate. A burst of 42 at t = 0: 32 pass now, 2 a
        // millisecond after, 8 wait (10 fit within half the rt: nothing is refused).
        let tenants = [test_slo_tenant("a", 2000.0, 10_000)];
        let mut p = build(&mut PolicyParams::default(), &tenants).unwrap();
        for id in 1..=42 {
            assert_eq!(
                p.enqueue(test_request(id, 0, 4096, 0), 0),
                Admission::Queued
            );
        }
        let (got, next) = ids(&mut p, 0);
        assert_eq!(got, (1..=32).collect::<Vec<_>>());
        assert_eq!(next, Dispatch::Wait(1_000_000));
        assert_eq!(ids(&mut p, 1_000_000).0, vec![33, 34]);
        assert_eq!(p.queued(), 8);
        // Within its rate, the bucket refills 25 % faster (`refill_slack`): 2.5 a tick.
        assert_eq!(ids(&mut p, 5_000_000).0.len(), 8);
        // 8,000 IOPS, rt 10 ms: one rt of the rate (80) is deeper than 32.
        let tenants = [test_slo_tenant("a", 8000.0, 10_000)];
        let mut p = build(&mut PolicyParams::default(), &tenants).unwrap();
        for id in 1..=100 {
            p.put(test_request(id, 0, 4096, 0), 0);
        }
        assert_eq!(ids(&mut p, 0).0.len(), 80);
    }
}
