//! The judge: insulation against each tenant's own slice (hand-computed on three
//! scenarios), the verdict that ranks the promises that matter first, infeasible
//! promises said as such, and reservations met exactly read as met.

use ioshare::metrics::{RunResult, ScenarioResult, TenantResult};
use ioshare::report::verdict::{self, Promise, Ranking};
use ioshare::scenario::Scenario;

fn run(text: &str) -> ScenarioResult {
    let s = Scenario::parse(text, "t.toml", "t").unwrap();
    ioshare::sim::run_scenario(&s, false).unwrap()
}

fn by_policy<'a>(r: &'a ScenarioResult, label: &str) -> &'a RunResult {
    r.runs.iter().find(|x| x.policy == label).unwrap()
}

fn close(a: f64, b: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-9 * b.abs().max(1.0),
        "{what}: {a} vs {b}"
    );
}

/// The device: one request at a time, 100 µs plus 500 MB/s (a 4 KiB read takes
/// 108.192 µs, a 64 KiB one 231.072 µs).
const FIXED: &str =
    "[device]\nmodel = 'fixed'\nparallelism = 1\nlatency_us = 100\nbandwidth_mb_s = 500\n";

/// Each tenant alone (its own run under `none`): bytes and device-seconds a second
/// per interval.
fn alone_series(text: &str) -> Vec<(Vec<f64>, Vec<f64>)> {
    let s = Scenario::parse(text, "t.toml", "t").unwrap();
    let iv = s.interval as f64 / 1e9;
    (0..s.tenants.len())
        .map(|i| {
            let only = ioshare::sim::alone::alone_scenario(&s, i);
            let r = ioshare::sim::run_scenario(&only, false).unwrap();
            let ts = &r.runs[0].timeseries;
            (
                ts.bytes[0].iter().map(|&b| b as f64).collect(),
                ts.device_ns[0]
                    .iter()
                    .map(|&d| d as f64 / 1e9 / iv)
                    .collect(),
            )
        })
        .collect()
}

/// What a tenant's device time is divided by to be a part of the device (one
/// device-second a second): its device time alone when more than that (it had the
/// whole device; the fixed model reports no heads' time), else 1.
fn scale(t: &TenantResult) -> f64 {
    t.alone.unwrap().device_time_per_s.max(1.0)
}

/// Max-min of two tenants by weight over `c`, demands `d`.
fn max_min2(d: [f64; 2], w: [f64; 2], c: f64) -> [f64; 2] {
    let fair = [c * w[0] / (w[0] + w[1]), c * w[1] / (w[0] + w[1])];
    if d[0] <= fair[0] {
        [d[0], d[1].min(c - d[0])]
    } else if d[1] <= fair[1] {
        [d[0].min(c - d[1]), d[1]]
    } else {
        fair
    }
}

/// R by hand: the bytes a tenant moved over Σ its bytes alone in each interval × its
/// entitlement there ÷ what it used alone there (over its scale `s`; at most 1); and
/// its entitled share.
fn by_hand(got: u64, alone: &(Vec<f64>, Vec<f64>), entitled: &[f64], s: f64) -> (f64, f64) {
    let (bytes, used) = alone;
    let expected: f64 = (0..bytes.len())
        .filter(|&k| used[k] > 0.0)
        .map(|k| bytes[k] * (entitled[k] / (used[k] / s)).min(1.0))
        .sum();
    let share = entitled.iter().sum::<f64>() / entitled.len() as f64;
    (got as f64 / expected, share)
}

/// Checks both tenants of a two-tenant run against the hand computation: max-min of
/// their alone demands by `weights` in each interval.
fn two_by_hand(one: &RunResult, alone: &[(Vec<f64>, Vec<f64>)], weights: [f64; 2]) {
    let s: Vec<f64> = one.tenants.iter().map(scale).collect();
    let e: Vec<[f64; 2]> = (0..alone[0].1.len())
        .map(|k| max_min2([alone[0].1[k] / s[0], alone[1].1[k] / s[1]], weights, 1.0))
        .collect();
    for (i, t) in one.tenants.iter().enumerate() {
        let mine: Vec<f64> = e.iter().map(|x| x[i]).collect();
        let (r, share) = by_hand(t.bytes, &alone[i], &mine, s[i]);
        close(t.insulation.unwrap(), r, &t.name);
        close(t.entitled_device_share.unwrap(), share, &t.name);
    }
}

fn two(weights: (f64, f64), a: &str, b: &str, policies: &str) -> String {
    format!(
        "duration_s = 4\nwarmup_s = 0.5\ninterval_s = 0.5\ninsulation = true\npolicies = {policies}\n{FIXED}\
         [[tenant]]\nname = 'a'\nweight = {}\nworkload = {a}\n\
         [[tenant]]\nname = 'b'\nweight = {}\nworkload = {b}\n",
        weights.0, weights.1
    )
}

#[test]
fn two_backlogged_tenants_are_entitled_by_weight() {
    // a (weight 1, 4 KiB) and b (weight 3, 64 KiB), both deep: each alone keeps the
    // device busy, so each demands all of it; max-min gives 1/4 and 3/4.
    let text = two(
        (1.0, 3.0),
        "{ pattern = 'randread', size = '4k', iodepth = 4 }",
        "{ pattern = 'randread', size = '64k', iodepth = 4 }",
        "['none', 'feedbac']",
    );
    let r = run(&text);
    let alone = alone_series(&text);
    for run in &r.runs {
        // Alone, each is the device's: 1 / 108.192 µs and 1 / 231.072 µs.
        let a = run.tenants[0].alone.unwrap();
        assert!((a.iops - 1e6 / 108.192).abs() / a.iops < 0.01, "{a:?}");
        assert!(a.device_time_per_s > 0.99, "{a:?}");
        two_by_hand(run, &alone, [1.0, 3.0]);
        // Every interval both ask for the whole device: 1/4 and 3/4.
        for (t, want) in run.tenants.iter().zip([0.25, 0.75]) {
            let share = t.entitled_device_share.unwrap();
            assert!((share - want).abs() < 1e-9, "{share}");
        }
        let lowest = run.tenants[0]
            .insulation
            .unwrap()
            .min(run.tenants[1].insulation.unwrap());
        assert_eq!(run.min_insulation, Some(lowest));
    }
    // feedbac shares device time 1:3 (holding requests in the host with a depth of its
    // own): both at their slice. none shares by queue depth, one request each in
    // turn: a takes more than its slice, b less.
    let feedbac = by_policy(&r, "feedbac");
    assert!(
        feedbac.min_insulation.unwrap() > 0.98,
        "{:?}",
        feedbac.min_insulation
    );
    let none = by_policy(&r, "none");
    assert!(
        none.tenants[0].insulation.unwrap() > 1.2,
        "{:?}",
        none.tenants[0]
    );
    assert!(
        none.tenants[1].insulation.unwrap() < 0.95,
        "{:?}",
        none.tenants[1]
    );
    assert_eq!(none.min_insulation_tenant.as_deref(), Some("b"));
}

#[test]
fn a_light_tenant_is_entitled_to_all_it_asks_and_a_returning_one_only_while_there() {
    // a sends 1,000 reads of 4 KiB a second (0.108 device-seconds a second alone); b
    // is backlogged. a is entitled to its demand, b to the rest, interval by interval.
    let text = two(
        (1.0, 1.0),
        "{ pattern = 'randread', size = '4k', rate_iops = 1000.0 }",
        "{ pattern = 'randread', size = '64k', iodepth = 8 }",
        "['sfq']",
    );
    let r = run(&text);
    let alone = alone_series(&text);
    let one = &r.runs[0];
    let demand = one.tenants[0].alone.unwrap().device_time_per_s;
    assert!((demand - 0.108192).abs() < 0.005, "{demand}");
    two_by_hand(one, &alone, [1.0, 1.0]);
    // Entitled to all it asks: R is what it got over what it got alone.
    let a = &one.tenants[0];
    let alone_bytes: f64 = alone[0].0.iter().sum();
    close(a.insulation.unwrap(), a.bytes as f64 / alone_bytes, "a");
    assert!(!a.backlogged && one.tenants[1].backlogged);
    // The run's lowest is of the backlogged tenants.
    assert_eq!(one.min_insulation, one.tenants[1].insulation);
    assert_eq!(one.min_insulation_tenant.as_deref(), Some("b"));

    // Weight 3 for a tenant idle for the first 2 s: entitled to nothing while idle
    // (b to the whole device), to 3/4 once back.
    let text = two(
        (3.0, 1.0),
        "{ pattern = 'randread', size = '4k', iodepth = 8, phases = [{ duration_s = 2, idle = true }, { duration_s = 10 }] }",
        "{ pattern = 'randread', size = '64k', iodepth = 8 }",
        "['feedbac']",
    );
    let r = run(&text);
    let alone = alone_series(&text);
    let one = &r.runs[0];
    two_by_hand(one, &alone, [3.0, 1.0]);
    // Back for 2 of the 3.5 s measured, at 3/4: 3/4 × 2/3.5 of the device; whole-run
    // means would have entitled it to 3/4 of the whole span.
    let share = one.tenants[0].entitled_device_share.unwrap();
    assert!((share - 0.75 * 2.0 / 3.5).abs() < 0.02, "{share}");
}

#[test]
fn reservations_and_limits_clamp_the_entitlements() {
    // a reserves 5,000 IOPS of 4 KiB (5,000 × its device time a request alone), b is
    // limited to 500 IOPS of 64 KiB, c has only its weight (all weight 1). With x the
    // weight-1 part: a at its floor and b at its ceiling, c gets what is left.
    let text = format!(
        "duration_s = 4\nwarmup_s = 0.5\ninterval_s = 0.5\ninsulation = true\npolicies = ['mclock']\n{FIXED}\
         [[tenant]]\nname = 'a'\nreservation_iops = 5000.0\nworkload = {{ pattern = 'randread', size = '4k', iodepth = 8 }}\n\
         [[tenant]]\nname = 'b'\nlimit_iops = 500.0\nworkload = {{ pattern = 'randread', size = '64k', iodepth = 8 }}\n\
         [[tenant]]\nname = 'c'\nworkload = {{ pattern = 'randread', size = '4k', iodepth = 8 }}\n"
    );
    let r = run(&text);
    let alone = alone_series(&text);
    let one = &r.runs[0];
    let s: Vec<f64> = one.tenants.iter().map(scale).collect();
    let per = |i: usize| {
        let a = one.tenants[i].alone.unwrap();
        a.device_time_per_s / a.iops / s[i]
    };
    let floor = 5000.0 * per(0);
    let ceil = 500.0 * per(1);
    let rest = 1.0 - floor - ceil;
    // In every interval each asks for more than that (the device is all theirs alone).
    for k in 0..alone[0].1.len() {
        assert!(
            alone[0].1[k] / s[0] > floor
                && alone[1].1[k] / s[1] > ceil
                && alone[2].1[k] / s[2] > rest
        );
    }
    assert!(rest < floor && rest > ceil, "{floor} {ceil} {rest}");
    for (i, want) in [floor, ceil, rest].into_iter().enumerate() {
        let t = &one.tenants[i];
        let mine = vec![want; alone[i].1.len()];
        let (r, share) = by_hand(t.bytes, &alone[i], &mine, s[i]);
        close(t.insulation.unwrap(), r, &t.name);
        close(t.entitled_device_share.unwrap(), share, &t.name);
        close(share, want, &t.name);
    }
}

/// Three VMs on one disk (scenarios/three-vms-disk.toml), the database's SLO as given.
fn three_vms(slo: &str, policies: &str) -> ScenarioResult {
    let text = std::fs::read_to_string("scenarios/three-vms-disk.toml").unwrap();
    let text = text
        .replace(
            "slo = { iops = 40.0, size = 4096, rt_us = 100000 }",
            &format!("slo = {slo}"),
        )
        .replace(
            r#"policies = ["none", "sfq", "feedbac", "mclock", "ta1"]"#,
            &format!("policies = {policies}"),
        );
    run(&text)
}

#[test]
fn the_verdict_heads_with_a_policy_that_keeps_the_slo_when_any_does() {
    let r = three_vms(
        "{ iops = 40.0, size = 4096, rt_us = 100000 }",
        r#"["none", "sfq", "feedbac", "mclock", "ta1"]"#,
    );
    let v = &verdict::verdicts(&r)[0];
    let keeps_slo =
        |j: &verdict::Judged| j.checks.iter().any(|c| c.promise == Promise::Slo && c.kept);
    assert!(v.ranked.iter().any(keeps_slo), "{}", verdict::text(&r));
    assert!(keeps_slo(&v.ranked[0]), "{}", verdict::text(&r));
    // none misses the SLO: it never heads the list, throughput or not.
    assert_ne!(v.ranked[0].label, "none");
    // The database is never backlogged: its weight does not bind, and the paragraph
    // says to read its latency.
    assert!(v.unbound.iter().any(|(n, _)| n == "db"), "{:?}", v.unbound);
    assert!(
        v.paragraph().contains("The weight of db (p99 "),
        "{}",
        v.paragraph()
    );
    // Ranked by weights first, a policy that keeps the SLO and misses the weights
    // falls behind one that misses the SLO by less.
    let weights_first = Ranking::parse("weights").unwrap();
    let w = &verdict::verdicts_ranked(&r, &weights_first)[0];
    assert_eq!(w.ranking.describe(), "weights > slo > reservation > limit");
    let first_weights_missed = |j: &verdict::Judged| {
        j.checks
            .iter()
            .any(|c| c.promise == Promise::Weights && c.missed())
    };
    // On the disk, with the shares in the heads' time, no policy keeps the weights
    // (sfq's split is 6.6 % off per interval, mClock's 6.2 %): ranked by weights
    // first, the next kind decides, and a policy that keeps the SLO heads the list.
    assert!(
        w.ranked.iter().all(first_weights_missed),
        "{}",
        verdict::text(&r)
    );
    assert!(keeps_slo(&w.ranked[0]), "{}", verdict::text(&r));
}

#[test]
fn an_slo_missed_even_alone_is_infeasible_and_counts_against_nobody() {
    // 80 IOPS within 20 ms on a 10k RPM disk: alone, a 4 KiB random read takes 6–8 ms
    // and Poisson arrivals queue behind each other.
    let r = three_vms(
        "{ iops = 80.0, size = 4096, rt_us = 20000 }",
        r#"["none", "sfq", "ta1"]"#,
    );
    let alone = r.runs[0].tenants[0].alone.unwrap();
    let met = alone.slo_satisfaction.unwrap();
    assert!(met < verdict::SLO_MET, "{alone:?}");
    // Alone, a lower rate meets it: the highest tenth of 80 that does.
    let n = alone.feasible_iops.unwrap();
    assert!(
        n < 80.0 && (n / 8.0 - (n / 8.0).round()).abs() < 1e-9,
        "{n}"
    );
    let v = &verdict::verdicts(&r)[0];
    assert_eq!(v.infeasible.len(), 1, "{:?}", v.infeasible);
    let why = &v.infeasible[0];
    assert!(why.ends_with(&format!(" or at ≤ {n:.0} IOPS")), "{why}");
    assert!(
        why.starts_with("db's SLO (80 IOPS within 20.00 ms) is met for ")
            && why.contains(" of requests even alone (p99 ")
            && why.contains("no policy can keep it; alone it meets 99.0 % at rt ≥ ")
            && why.contains(" or at ≤ "),
        "{why}"
    );
    assert!(v.paragraph().contains(&format!("Infeasible: {why}.")));
    for j in &v.ranked {
        let slo = j.checks.iter().find(|c| c.promise == Promise::Slo).unwrap();
        assert!(!slo.missed(), "{}: {slo:?}", j.label);
        assert_eq!(j.feasible(), j.checks.len() - 1);
    }
}

#[test]
fn a_missed_figure_never_rounds_onto_its_target() {
    let r = three_vms(
        "{ iops = 80.0, size = 4096, rt_us = 20000 }",
        r#"["none", "ta1"]"#,
    );
    for j in &verdict::verdicts(&r)[0].ranked {
        for c in j
            .checks
            .iter()
            .filter(|c| c.promise == Promise::Slo && !c.kept)
        {
            assert!(!c.text.contains("99.0 %"), "{}", c.text);
        }
    }
}

/// A tenant sending `rate` reads a second (Poisson), reserving as many, beside a
/// backlogged one, on `device`, under `policies`.
fn reserved(rate: f64, device: &str, policies: &str) -> ScenarioResult {
    run(&format!(
        "duration_s = 12\nwarmup_s = 1\npolicies = {policies}\n{device}\
         [[tenant]]\nname = 'r'\nreservation_iops = {rate}\n\
         workload = {{ pattern = 'randread', size = '4k', rate_iops = {rate}, rate_process = 'poisson' }}\n\
         [[tenant]]\nname = 'bulk'\nworkload = {{ pattern = 'randread', size = '4k', iodepth = 16 }}\n"
    ))
}

#[test]
fn a_reservation_met_exactly_is_met_at_40_80_and_1000_iops() {
    let ssd = "[device]\nmodel = 'ssd'\npreset = 'nvme-p4500'\ncapacity_gib = 4\n";
    for rate in [40.0, 80.0, 1000.0] {
        let r = reserved(rate, ssd, "['none', 'mclock']");
        for run in &r.runs {
            let t = &run.tenants[0];
            // Served as it asked: every request it sent completed.
            assert!(t.ios as f64 >= 0.97 * rate * 11.0, "{rate}: {t:?}");
            assert_eq!(t.reservation_missed, Some(0.0), "{rate} {}", run.policy);
            let v = &verdict::verdicts(&r)[0];
            let j = v.ranked.iter().find(|j| j.label == run.policy).unwrap();
            let c = j
                .checks
                .iter()
                .find(|c| c.promise == Promise::Reservation)
                .unwrap();
            assert!(c.kept, "{}", c.text);
            assert_eq!(c.text, format!("r's reservation ({rate:.0} IOPS) held"));
        }
    }
}

#[test]
fn a_reservation_short_of_its_rate_is_missed() {
    // On the disk, 1,000 IOPS of random reads cannot be had at all: missed under every
    // policy, and alone too (infeasible).
    let disk = "[device]\nmodel = 'hdd'\npreset = 'scsi-10k-73g'\n";
    let text = format!(
        "duration_s = 6\nwarmup_s = 1\ninsulation = true\npolicies = ['none', 'mclock']\n{disk}\
         [[tenant]]\nname = 'r'\nreservation_iops = 1000.0\nworkload = {{ pattern = 'randread', size = '4k', iodepth = 8 }}\n\
         [[tenant]]\nname = 'bulk'\nworkload = {{ pattern = 'randread', size = '4k', iodepth = 16 }}\n"
    );
    let r = run(&text);
    for run in &r.runs {
        let missed = run.tenants[0].reservation_missed.unwrap();
        assert!(missed > 0.5, "{}: {missed}", run.policy);
    }
    let v = &verdict::verdicts(&r)[0];
    assert!(
        v.infeasible
            .iter()
            .any(|w| w.starts_with("r's reservation (1000 IOPS) is short for ")),
        "{:?}",
        v.infeasible
    );
}

#[test]
fn a_rank_names_kinds_of_promise_only() {
    assert_eq!(
        Ranking::parse("limit, slo").unwrap().describe(),
        "limit > slo > reservation > weights"
    );
    assert!(Ranking::parse("slo,fast").unwrap_err().contains("`fast`"));
    assert!(Ranking::parse("slo,slo").unwrap_err().contains("twice"));
    assert!(Ranking::parse("").is_err());
}
