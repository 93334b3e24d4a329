//! `ta3`: TA2 with a switch per tenant (spec: token-bucket.md, TA3).
//!
//! When a completion's storage response time exceeds its tenant's high water mark, the
//! buckets of only those tenants whose arrival rate over the last `rate_window_ms`
//! (default 100) is above their agreed `iops` (by more than `rate_slack`, default 5 %)
//! are switched in: compliant tenants are never held by a bucket, and a violator runs
//! free while nobody is hurt. A completion below its tenant's low water mark switches
//! every bucket out. The shared machinery and the readings it chose are in
//! [`super::token_bucket`].

use super::token_bucket::SwitchedBuckets;
use super::{Policy, PolicyError, PolicyParams};
use crate::types::TenantSpec;

/// Builds TA3 (`refill_hz`, `depth_factor`, `hwm`, `lwm`, `rate_window_ms`, `rate_slack`).
pub fn build(
    params: &mut PolicyParams,
    tenants: &[TenantSpec],
) -> Result<Box<dyn Policy>, PolicyError> {
    Ok(Box::new(SwitchedBuckets::build(
        "ta3", params, tenants, true, true,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Dispatch, test_request, test_slo_tenant};
    use crate::types::Completion;

    #[test]
    fn a_breach_switches_only_the_tenant_above_its_rate() {
        // Both agreed 100 IOPS; over the 100 ms window `a` sends 20 (200 IOPS) and `b`
        // sends 10 (100 IOPS, within 5 %).
        let tenants = [
            test_slo_tenant("a", 100.0, 10_000),
            test_slo_tenant("b", 100.0, 10_000),
        ];
        let mut p = build(&mut PolicyParams::default(), &tenants).unwrap();
        let mut id = 0;
        let mut sent = Vec::new();
        for ms in 0..100u64 {
            let now = ms * 1_000_000;
            let mut send = |t: u32| {
                id += 1;
                let r = test_request(id, t, 4096, now);
                p.enqueue(r, now);
                assert_eq!(
                    p.dispatch(now),
                    Dispatch::Request(r),
                    "switch off: straight through"
                );
                sent.push(r);
            };
            if ms % 5 == 0 {
                send(0);
            }
            if ms % 10 == 0 {
                send(1);
            }
        }
        // A request of the compliant tenant `b` finishes 9 ms after it was sent, above
        // its 8.5 ms high water mark.
        let last_b = *sent.iter().rev().find(|r| r.tenant == 1).unwrap();
        let now = last_b.arrival + 9_000_000;
        p.complete(
            &Completion {
                request: last_b,
                start: last_b.arrival,
                finish: now,
            },
            now,
        );
        let stats = p.stats();
        assert_eq!(stats["tenants"][0]["on"], true, "violator throttled");
        assert_eq!(
            stats["tenants"][1]["on"], false,
            "compliant tenant untouched"
        );
        assert_eq!(
            stats["switch_timeline_ms"],
            serde_json::json!([[99.0, 0, true]])
        );
        // `b` still goes straight through; `a` now meets its bucket (1 deep at 0.1 per
        // ms, already spent by nothing: full, so one passes, the next waits 10 ticks).
        let rb = test_request(1000, 1, 4096, now);
        p.enqueue(rb, now);
        assert_eq!(p.dispatch(now), Dispatch::Request(rb));
        let ra1 = test_request(1001, 0, 4096, now);
        let ra2 = test_request(1002, 0, 4096, now);
        p.enqueue(ra1, now);
        p.enqueue(ra2, now);
        assert_eq!(p.dispatch(now), Dispatch::Request(ra1));
        assert_eq!(p.dispatch(now), Dispatch::Wait(109_000_000));
    }

    #[test]
    fn a_violator_alone_is_not_throttled_while_response_is_good() {
        let tenants = [
            test_slo_tenant("a", 100.0, 10_000),
            test_slo_tenant("b", 100.0, 10_000),
        ];
        let mut p = build(&mut PolicyParams::default(), &tenants).unwrap();
        for id in 0..50u64 {
            let now = id * 1_000_000; // 1000 IOPS, ten times the agreed rate
            let r = test_request(id, 0, 4096, now);
            p.enqueue(r, now);
            assert_eq!(p.dispatch(now), Dispatch::Request(r));
            p.complete(
                &Completion {
                    request: r,
                    start: now,
                    finish: now + 500_000,
                },
                now + 500_000,
            );
        }
        assert_eq!(p.stats()["transitions"], 0);
    }
}
