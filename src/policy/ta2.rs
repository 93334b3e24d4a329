//! `ta2`: TA1's buckets behind one bypass switch for all tenants — TA2 of Y. J. Nam,
//! C. Park, "Token-Bucket-based Performance Control Techniques for Large-Scale Shared
//! Storage Systems", 2005.
//!
//! The switch starts off: requests go straight to storage. When a completion's storage
//! response time exceeds its tenant's high water mark (`hwm × rt`, default 85 %) every
//! bucket is switched in; when the largest of the last `rt_window` (2048) falls below
//! the low water mark (`lwm × rt`, default 80 %) every bucket is switched out. Like
//! Facade, it throttles everyone when one tenant misbehaves. The shared machinery and
//! the readings it chose are in [`super::token_bucket`].

use super::token_bucket::SwitchedBuckets;
use super::{Policy, PolicyError, PolicyParams};
use crate::types::TenantSpec;

/// Builds TA2 (`refill_hz`, `depth_factor`, `max_wait`, `hwm`, `lwm`, `rt_window`,
/// `predict`).
pub fn build(
    params: &mut PolicyParams,
    tenants: &[TenantSpec],
) -> Result<Box<dyn Policy>, PolicyError> {
    Ok(Box::new(SwitchedBuckets::build(
        "ta2", params, tenants, true, false,
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::TestPolicy;
    use crate::policy::{Dispatch, test_request, test_slo_tenant};
    use crate::types::Completion;

    /// Dispatches request `id` of `tenant` arriving at `at` and completes it at
    /// `finish`: the storage response time is `finish - at` while the switch is off.
    fn observe(p: &mut Box<dyn Policy>, id: u64, tenant: u32, at: u64, finish: u64) {
        let r = test_request(id, tenant, 4096, at);
        p.put(r, at);
        assert_eq!(p.dispatch(at), Dispatch::Request(r));
        p.complete(
            &Completion {
                request: r,
                start: at,
                finish,
            },
            finish,
        );
    }

    /// TA2 with the paper's buckets, judging each tenant by its completions among the
    /// last `window`, without prediction.
    fn over_window(tenants: &[TenantSpec], window: i64) -> Box<dyn Policy> {
        let mut params = crate::policy::test_params(
            "ta2",
            toml::toml! { rt_window = window
            predict = 0.0
            depth_rt = 0.0
            depth_requests = 0.0
            min_breach_ms = 0.0 },
        );
        build(&mut params, tenants).unwrap()
    }

    #[test]
    fn hysteresis_between_the_water_marks_switches_everyone() {
        // rt 10 ms: on above 8.5 ms, off below 8 ms.
        let tenants = [
            test_slo_tenant("a", 1000.0, 10_000),
            test_slo_tenant("b", 1000.0, 10_000),
        ];
        let mut p = over_window(&tenants, 2);
        observe(&mut p, 1, 0, 0, 8_500_000); // at the mark: not above
        assert_eq!(p.report_json()["transitions"], 0);
        observe(&mut p, 2, 1, 10_000_000, 18_500_001); // b above its HWM
        assert_eq!(p.report_json()["tenants"][0]["on"], true);
        assert_eq!(p.report_json()["tenants"][1]["on"], true);
        // Both buckets (1 deep) now gate: the second request of `a` waits for a tick.
        for id in [3, 4] {
            p.put(test_request(id, 0, 4096, 20_000_000), 20_000_000);
        }
        let r3 = test_request(3, 0, 4096, 20_000_000);
        assert_eq!(p.dispatch(20_000_000), Dispatch::Request(r3));
        assert_eq!(p.dispatch(20_000_000), Dispatch::Wait(21_000_000));
        // 8.2 ms is between the marks: still on.
        p.complete(
            &Completion {
                request: r3,
                start: 20_000_000,
                finish: 28_200_000,
            },
            28_200_000,
        );
        assert_eq!(p.report_json()["tenants"][0]["on"], true);
        // Request 4 passes its bucket at 21 ms, finishes 7.9 ms later: below the LWM.
        let r4 = test_request(4, 0, 4096, 20_000_000);
        assert_eq!(p.dispatch(21_000_000), Dispatch::Request(r4));
        p.complete(
            &Completion {
                request: r4,
                start: 21_000_000,
                finish: 28_900_000,
            },
            28_900_000,
        );
        assert_eq!(p.report_json()["tenants"][0]["on"], false);
        assert_eq!(p.report_json()["tenants"][1]["on"], false);
        assert_eq!(p.report_json()["transitions"], 4);
        assert_eq!(
            p.report_json()["switch_timeline_ms"],
            serde_json::json!([
                [18.500001, 0, true],
                [18.500001, 1, true],
                [28.9, 0, false],
                [28.9, 1, false]
            ])
        );
    }

    /// Each completion is judged against its own tenant's marks: a writer's 30 ms (its
    /// rt is 50 ms) neither breaches nor ends the reader's breach (rt 5 ms). Judging the
    /// shared window's largest response time against whichever tenant completed turned
    /// the switch on at every reader completion and off at every writer one.
    #[test]
    fn tenants_with_different_rt_are_each_judged_by_their_own_marks() {
        let tenants = [
            test_slo_tenant("reader", 1000.0, 5_000),
            test_slo_tenant("writer", 1000.0, 50_000),
        ];
        let mut p = over_window(&tenants, 8);
        const MS: u64 = 1_000_000;
        observe(&mut p, 1, 0, 0, 4_500_000); // above the reader's 4.25 ms
        assert_eq!(p.report_json()["tenants"][1]["on"], true);
        observe(&mut p, 2, 1, 10 * MS, 40 * MS); // 30 ms: fine for the writer
        assert_eq!(
            p.report_json()["tenants"][0]["on"],
            true,
            "reader still late"
        );
        assert_eq!(p.report_json()["transitions"], 2);
        // Fast reader completions push its 4.5 ms out of the last 8.
        for i in 0..7 {
            let at = (50 + 2 * i) * MS;
            observe(&mut p, 3 + i, 0, at, at + MS);
            assert_eq!(p.report_json()["tenants"][0]["on"], i < 6, "completion {i}");
        }
        assert_eq!(p.report_json()["transitions"], 4);
    }

    #[test]
    fn after_switching_off_new_requests_bypass_the_backlog() {
        let tenants = [test_slo_tenant("a", 1000.0, 10_000)];
        // Each completion judged alone (a window of one).
        let mut p = over_window(&tenants, 1);
        observe(&mut p, 1, 0, 0, 9_000_000); // on
        for id in 2..=4 {
            p.put(test_request(id, 0, 4096, 9_000_000), 9_000_000);
        }
        let r2 = test_request(2, 0, 4096, 9_000_000);
        assert_eq!(p.dispatch(9_000_000), Dispatch::Request(r2));
        assert_eq!(p.dispatch(9_000_000), Dispatch::Wait(10_000_000));
        p.complete(
            &Completion {
                request: r2,
                start: 9_000_000,
                finish: 10_000_000,
            },
            10_000_000,
        ); // 1 ms: off
        assert_eq!(p.report_json()["tenants"][0]["on"], false);
        // A new request goes straight to storage, spending the 10 ms tick's token as
        // it passes; 3 and 4 keep draining through the bucket (3 at 11 ms, 4 at 12 ms)
        // instead of flooding storage.
        p.put(test_request(5, 0, 4096, 10_000_000), 10_000_000);
        let order: Vec<_> = std::iter::from_fn(|| match p.dispatch(10_000_000) {
            Dispatch::Request(r) => Some(r.id),
            _ => None,
        })
        .collect();
        assert_eq!(order, vec![5]);
        assert_eq!(p.dispatch(10_000_000), Dispatch::Wait(11_000_000));
        assert!(matches!(p.dispatch(11_000_000), Dispatch::Request(r) if r.id == 3));
        assert_eq!(p.dispatch(11_000_000), Dispatch::Wait(12_000_000));
        assert!(matches!(p.dispatch(12_000_000), Dispatch::Request(r) if r.id == 4));
    }

    #[test]
    fn the_window_maximum_must_fall_below_the_low_mark_and_a_breach_lasts_its_minimum() {
        // Window of 3: after a 9 ms completion (on), two fast ones keep it in the
        // window; the third pushes it out and the switch goes off. With the default
        // minimum breach of 100 ms it stays on until a completion 100 ms after the
        // breach began (at 9 ms).
        for (min_breach, want) in [
            (0.0, vec![true, true, false, false, false, false]),
            (100.0, vec![true, true, true, true, true, false]),
        ] {
            let mut params = crate::policy::test_params(
                "ta2",
                toml::toml! { rt_window = 3
                min_breach_ms = min_breach },
            );
            let mut p = build(&mut params, &[test_slo_tenant("a", 1000.0, 10_000)]).unwrap();
            observe(&mut p, 1, 0, 0, 9_000_000);
            assert_eq!(p.report_json()["tenants"][0]["on"], true);
            let mut on = Vec::new();
            for (i, id) in (2..=7).enumerate() {
                let at = 20_000_000 * (i as u64 + 1);
                let r = test_request(id, 0, 4096, at);
                p.put(r, at);
                assert_eq!(p.dispatch(at), Dispatch::Request(r));
                let c = Completion {
                    request: r,
                    start: at,
                    finish: at + 1_000_000,
                };
                p.complete(&c, c.finish);
                on.push(p.report_json()["tenants"][0]["on"].as_bool().unwrap());
            }
            assert_eq!(on, want, "min_breach_ms {min_breach}");
        }
    }

    #[test]
    fn water_marks_are_checked() {
        let mut params = crate::policy::test_params(
            "ta2",
            toml::toml! { hwm = 0.7
            lwm = 0.8 },
        );
        let err = build(&mut params, &[test_slo_tenant("a", 1.0, 1)])
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("'lwm': must be in (0, hwm = 0.7]"),
            "{err}"
        );
    }
}
