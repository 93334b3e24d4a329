//! End-to-end behaviour of the simulator: determinism, shipped scenarios, and the GC
//! model's interference shape (MCFQ Figs. 1-2).

use ioshare::metrics::ScenarioResult;
use ioshare::scenario::Scenario;
use ioshare::sim::{run_scenario, run_scenarios};
use std::path::Path;

const SMALL: &str = r#"
    seed = 11
    duration_s = 1.5
    warmup_s = 0.2
    interval_s = 0.25
    partition = true
    [device]
    model = "ssd"
    preset = "sata-840pro"
    precondition = "aged"
    capacity_gib = 0.25
    [[tenant]]
    name = "a"
    weight = 4
    workload = "varmail"
    [[tenant]]
    name = "b"
    weight = 1
    workload = { pattern = "randrw", read_mix = 0.3, size_mean = "16k", rate_iops = 800.0 }
"#;

/// results.json without the one field that measures the host (wall time).
fn canonical(result: &ScenarioResult) -> String {
    let mut v = serde_json::to_value(result).unwrap();
    for run in v["runs"].as_array_mut().unwrap() {
        run["sim"].as_object_mut().unwrap().remove("wall_seconds");
    }
    serde_json::to_string(&v).unwrap()
}

#[test]
fn same_seed_gives_identical_results() {
    let s = Scenario::parse(SMALL, "small.toml", "small").unwrap();
    let a = run_scenario(&s, false).unwrap();
    let b = run_scenario(&s, false).unwrap();
    assert_eq!(canonical(&a), canonical(&b));
    assert_eq!(a.runs[0].timeseries, b.runs[0].timeseries);
    assert!(a.runs[0].sim.requests > 1000, "{}", a.runs[0].sim.requests);
    // A different seed changes the run.
    let mut s2 = s.clone();
    s2.seed = 12;
    let c = run_scenario(&s2, false).unwrap();
    assert_ne!(canonical(&a), canonical(&c));
}

#[test]
fn results_follow_the_json_contract() {
    let s = Scenario::parse(SMALL, "small.toml", "small").unwrap();
    let v = serde_json::to_value(run_scenario(&s, false).unwrap()).unwrap();
    assert_eq!(v["scenario"], "small");
    assert_eq!(v["seed"], 11);
    let run = &v["runs"][0];
    for key in [
        "policy",
        "policy_name",
        "total_bandwidth_bytes_per_s",
        "share_error",
        "interval_share_error",
        "intervals_judged",
        "ratio_error",
        "jain",
        "tenants",
        "device",
        "sim",
    ] {
        assert!(run.get(key).is_some(), "run lacks {key}");
    }
    for key in ["gc_runs", "pages_moved", "write_amplification"] {
        assert!(run["device"].get(key).is_some(), "device lacks {key}");
    }
    for key in ["requests", "wall_seconds"] {
        assert!(run["sim"].get(key).is_some(), "sim lacks {key}");
    }
    let t = &run["tenants"][0];
    for key in [
        "name",
        "weight",
        "bytes",
        "ios",
        "arrived",
        "iops",
        "bandwidth_bytes_per_s",
        "share",
        "ideal_share",
        "latency_us",
    ] {
        assert!(t.get(key).is_some(), "tenant lacks {key}");
    }
    for key in ["mean", "p50", "p99", "p999", "max"] {
        assert!(t["latency_us"].get(key).is_some(), "latency lacks {key}");
    }
    // The aged device collects garbage under this mixed load.
    assert!(run["device"]["gc_runs"].as_u64().unwrap() > 0);
    assert!(run["device"]["write_amplification"].as_f64().unwrap() > 1.0);
}

#[test]
fn open_loop_tenant_gets_its_rate_on_an_idle_device() {
    let text = r#"
        seed = 3
        duration_s = 4
        [device]
        model = "fixed"
        latency_us = 100
        parallelism = 4
        [[tenant]]
        name = "only"
        workload = { pattern = "randread", size = "4k", rate_iops = 2000.0 }
    "#;
    let s = Scenario::parse(text, "t.toml", "t").unwrap();
    let r = run_scenario(&s, false).unwrap();
    let t = &r.runs[0].tenants[0];
    // Poisson arrivals at 2000/s over 4 s: within a few percent of 8000 requests.
    assert!((t.iops - 2000.0).abs() < 100.0, "{}", t.iops);
    // Latency on an unloaded fixed device is its service time: 100 µs + 4 KiB at 500 MB/s.
    assert!(
        (t.latency_us.p50 - 108.2).abs() < 1.0,
        "{}",
        t.latency_us.p50
    );
}

#[test]
fn every_shipped_scenario_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            if path.to_string_lossy().ends_with("-trace.toml") {
                // They take their trace from IOSHARE_TRACE; tests/trace.rs runs them.
                continue;
            }
            let all = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(!all.is_empty());
            // Within the cost limits: `ioshare sim` runs it without --force.
            for s in &all {
                let why = s.too_costly(ioshare::scenario::cost::Limits::default());
                assert_eq!(why, None, "{}", path.display());
            }
            n += 1;
        }
    }
    assert!(n >= 2);
    Scenario::parse(ioshare::DEMO_SCENARIO, "demo", "demo").unwrap();
}

/// MCFQ Figs. 1-2 in small: on a clean drive the sequential writer's bandwidth does not
/// depend on the random writer's request size; on an aged drive it falls as it grows.
#[test]
fn gc_interference_shape_of_mcfq_figs_1_2() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/mcfq-fig1-2.toml");
    let text = std::fs::read_to_string(path)
        .unwrap()
        .replace("capacity_gib = 32", "capacity_gib = 2")
        .replace("duration_s = 20", "duration_s = 6")
        .replace(
            r#"["4k", "8k", "16k", "32k", "64k", "128k", "256k", "512k"]"#,
            r#"["4k", "512k"]"#,
        );
    let all = Scenario::parse_all(&text, "fig", "fig").unwrap();
    assert_eq!(all.len(), 4);
    let r = run_scenarios(&all, false).unwrap();
    let a_bw: Vec<f64> = r
        .runs
        .iter()
        .map(|run| run.tenants[0].bandwidth_bytes_per_s)
        .collect();
    let (clean_small, clean_big, aged_small, aged_big) = (a_bw[0], a_bw[1], a_bw[2], a_bw[3]);
    assert!(
        (clean_big / clean_small - 1.0).abs() < 0.02,
        "clean: {clean_small} vs {clean_big}"
    );
    assert!(
        aged_big < 0.8 * aged_small,
        "aged: {aged_small} vs {aged_big}"
    );
    assert!(r.runs[3].device.write_amplification > 2.0);
    assert_eq!(r.runs[0].device.gc_runs, 0);
}

/// FeedBAC Fig. 3 in small (4 GiB aged NVMe drive, 3 s): `none` ignores the weights,
/// FeedBAC follows them at `none`'s throughput on random writes, the paper's BFQ (by
/// bytes, idling) pays for idling on random reads.
#[test]
fn feedbac_fig3_shape_in_small() {
    let text = r#"
        seed = 5
        duration_s = 3
        warmup_s = 0.5
        queue_depth = 128
        partition = true
        policies = ["none", "feedbac", { name = "bfq", label = "bfq-paper", cost = "bytes", slice_idle_ms = 8, depth = 0, max_wait_ms = 0 }]
        [device]
        model = "ssd"
        preset = "nvme-p4500"
        precondition = "aged"
        capacity_gib = 4
        [[tenant]]
        name = "c1"
        weight = 100
        workload = { pattern = "randwrite", size = "4k", iodepth = 32 }
        [[tenant]]
        name = "c2"
        weight = 50
        workload = { pattern = "randwrite", size = "4k", iodepth = 32 }
        [[tenant]]
        name = "c3"
        weight = 25
        workload = { pattern = "randwrite", size = "4k", iodepth = 32 }
        [[tenant]]
        name = "c4"
        weight = 10
        workload = { pattern = "randwrite", size = "4k", iodepth = 32 }
        [sweep]
        "tenant.*.workload.pattern" = ["randwrite", "randread"]
    "#;
    let all = Scenario::parse_all(text, "fig3.toml", "fig3").unwrap();
    let r = run_scenarios(&all, false).unwrap();
    let run = |variant: &str, policy: &str| {
        r.runs
            .iter()
            .find(|x| x.policy == policy && x.variant.ends_with(variant))
            .unwrap_or_else(|| panic!("no {policy} run for {variant}"))
    };
    let none = run("randwrite", "none");
    let fb = run("randwrite", "feedbac");
    assert!(none.share_error > 1.0, "none {}", none.share_error);
    assert!(fb.share_error < 0.03, "feedbac {}", fb.share_error);
    let ratio = fb.total_bandwidth_bytes_per_s / none.total_bandwidth_bytes_per_s;
    assert!(ratio > 0.95, "feedbac at {ratio} x none on writes");
    let none = run("randread", "none");
    let paper = run("randread", "bfq-paper");
    assert!(
        paper.byte_share_error < 0.03,
        "bfq-paper {}",
        paper.byte_share_error
    );
    let ratio = paper.total_bandwidth_bytes_per_s / none.total_bandwidth_bytes_per_s;
    assert!(ratio < 0.85, "bfq-paper at {ratio} x none on reads");
}

/// The token-bucket paper's WS_A in small (2 s phases): TA0 lets a violator break the
/// compliant user's response time, TA1 keeps compliant users within it, TA3 throttles
/// only the violator and completes more than TA1 where one user leaves capacity idle.
#[test]
fn token_bucket_shape_of_ws_a() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/ta-ws-a.toml");
    let text = std::fs::read_to_string(path)
        .unwrap()
        .replace("duration_s = 90", "duration_s = 18")
        .replace("duration_s = 10", "duration_s = 2");
    let mut s = Scenario::parse(&text, "ws-a", "ws-a").unwrap();
    s.policies
        .retain(|p| ["none", "ta1", "ta3-85/80"].contains(&p.label.as_str()));
    let r = run_scenario(&s, false).unwrap();
    let run = |label: &str| r.runs.iter().find(|x| x.policy == label).unwrap();
    let sat = |label: &str, phase: usize, tenant: usize| {
        run(label).phases[phase - 1].tenants[tenant]
            .slo_satisfaction
            .unwrap()
    };
    for label in ["none", "ta1", "ta3-85/80"] {
        assert_eq!(run(label).phases.len(), 9, "{label}");
    }
    // TA0: the compliant user misses where the other exceeds its rate.
    assert!(sat("none", 6, 0) < 0.5, "W1 phase 6 {}", sat("none", 6, 0));
    assert!(sat("none", 8, 1) < 0.5, "W2 phase 8 {}", sat("none", 8, 1));
    // TA1 and TA3: compliant users keep their response time, also right after their own
    // violation (the bucket refuses what could no longer meet rt instead of queueing
    // it). Where the array carries the full agreed 5,000 IOPS (phase 5, and 6, 8, 9
    // under TA1) it is at its calibration point, so a few requests in a thousand may
    // pass 41 ms in a run this short. In phase 7 W1 starts to violate: TA3's rate test
    // (a conformance bucket 100 requests deep, so that Poisson bunching is not taken
    // for violation) needs about 30 ms of W1 at twice its rate to flag it, and in a 2 s
    // phase those 30 ms cost W2 about one request in a thousand (10 s phases: 99.91 %).
    let bar = |p: usize| {
        if [5, 6, 8, 9].contains(&p) {
            0.995
        } else if p == 7 {
            0.998
        } else {
            0.999
        }
    };
    for label in ["ta1", "ta3-85/80"] {
        for p in 1..=6 {
            let s = sat(label, p, 0);
            assert!(s >= bar(p), "{label} W1 phase {p}: {s}");
        }
        for p in [1, 2, 4, 5, 7, 8] {
            let s = sat(label, p, 1);
            assert!(s >= bar(p), "{label} W2 phase {p}: {s}");
        }
    }
    // The violator's excess is refused and counted, not queued without end.
    assert!(run("ta1").phases[2].tenants[1].refused > 0);
    // TA3 uses what the compliant user leaves: more IOPS than TA1 in phases 3 and 7,
    // with the bucket switched in for the violator only.
    for p in [3, 7] {
        let (ta3, ta1) = (
            run("ta3-85/80").phases[p - 1].iops,
            run("ta1").phases[p - 1].iops,
        );
        assert!(ta3 > 1.02 * ta1, "phase {p}: TA3 {ta3} TA1 {ta1}");
    }
    let on = |phase: usize, tenant: usize| {
        run("ta3-85/80").phases[phase - 1].tenants[tenant]
            .switch_on
            .unwrap()
    };
    assert!(
        on(3, 1) > 0.5 && on(3, 0) == 0.0,
        "{} {}",
        on(3, 1),
        on(3, 0)
    );
    // W2 violated in phase 6; its switch stays in until the array's response times
    // have been below the low mark for a whole window, well into phase 7 of 2 s.
    assert!(
        on(7, 0) > 0.5 && on(7, 1) < 0.5,
        "{} {}",
        on(7, 0),
        on(7, 1)
    );
    assert!(on(1, 0) == 0.0 && on(1, 1) == 0.0);
}

/// mClock on the shipped scenario: the reservation is met, the limit holds, and the
/// weights split the rest 2:1.
#[test]
fn mclock_reservation_limit_and_weights() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/mclock-reservations.toml");
    let s = Scenario::load(&path).unwrap().remove(0);
    let r = run_scenario(&s, false).unwrap();
    let m = r.runs.iter().find(|x| x.policy == "mclock").unwrap();
    let iops = |name: &str| m.tenants.iter().find(|t| t.name == name).unwrap().iops;
    assert!(iops("gold") >= 3000.0 * 0.98, "{}", iops("gold"));
    // Backlogged, gold is over its reservation by the rate test: no slack, only the
    // test's 5 % tolerance (src/policy/mclock.rs).
    assert!(iops("gold") <= 3000.0 * 1.06, "{}", iops("gold"));
    assert!(iops("silver") >= 500.0 * 0.98);
    assert!(iops("capped") <= 800.0 * 1.02, "{}", iops("capped"));
    let ratio = iops("silver") / iops("bronze");
    assert!((ratio - 2.0).abs() < 0.1, "{ratio}");
    // The FIFO baseline does not hold the reservation.
    let none = r.runs.iter().find(|x| x.policy == "none").unwrap();
    assert!(none.tenants[0].iops < 2500.0);
}

/// A tenant's queue bound: beyond it, requests are refused and counted, per phase and
/// over the run; the other tenant is untouched.
#[test]
fn full_queues_reject_and_count() {
    let text = r#"
        duration_s = 2
        queue_depth = 1
        queue_limit = 4
        [device]
        model = "fixed"
        latency_us = 1000.0
        parallelism = 1
        [[tenant]]
        name = "flood"
        workload = { pattern = "randread", size = "4k", rate_iops = 5000.0, rate_process = "linear" }
        [[tenant]]
        name = "calm"
        workload = { pattern = "randread", size = "4k", rate_iops = 100.0, rate_process = "linear" }
    "#;
    let s = Scenario::parse(text, "q", "q").unwrap();
    let r = run_scenario(&s, false).unwrap();
    let t = &r.runs[0].tenants;
    // The device does ~990 IOPS; 10,000 flood requests arrive in 2 s.
    assert!(t[0].refused > 7000, "{}", t[0].refused);
    assert_eq!(t[0].refused, r.runs[0].phases[0].tenants[0].refused);
    assert_eq!(t[1].refused, 0);
    assert!(t[0].ios + t[0].refused <= 10_000 && t[0].ios + t[0].refused >= 9_990);
    // A closed loop deeper than the bound would lose requests: refused at load time.
    let err = Scenario::parse(
        &text.replace(
            "rate_iops = 100.0, rate_process = \"linear\"",
            "iodepth = 8",
        ),
        "q",
        "q",
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("workload.iodepth: 8 is above queue_limit 4"),
        "{err}"
    );
}

/// Every event the host sees, for tests that check the order of things.
#[derive(Debug, Default)]
struct Trace {
    arrived: Vec<(u64, u32, u64)>,
    refused: Vec<(u64, ioshare::policy::Refusal)>,
    dispatched: Vec<(u64, u32, u64)>,
    completed: usize,
}

impl ioshare::host::Observer for Trace {
    fn arrived(&mut self, r: &ioshare::types::Request) {
        self.arrived.push((r.id, r.tenant, r.arrival));
    }
    fn refused(
        &mut self,
        r: &ioshare::types::Request,
        reason: ioshare::policy::Refusal,
        _now: u64,
    ) {
        self.refused.push((r.id, reason));
    }
    fn dispatched(&mut self, r: &ioshare::types::Request, now: u64) {
        self.dispatched.push((r.id, r.tenant, now));
    }
    fn completed(&mut self, _c: &ioshare::types::Completion, _s: ioshare::host::Status) {
        self.completed += 1;
    }
}

fn trace(text: &str, policy: &str) -> Trace {
    let s = Scenario::parse(text, "trace.toml", "trace").unwrap();
    let choice = s
        .policies
        .iter()
        .find(|p| p.label == policy)
        .unwrap_or_else(|| panic!("{policy} is not in the scenario"))
        .clone();
    let options = ioshare::sim::RunOptions { check: true };
    ioshare::sim::run_observed(&s, &choice, Trace::default(), options).unwrap()
}

/// The policy is asked once every event of an instant has landed: two tenants start at
/// t = 0 on a device that takes one request at a time, and mClock serves the one with a
/// reservation first although the other's request arrived first at that instant.
#[test]
fn the_policy_sees_every_arrival_of_an_instant_before_it_chooses() {
    let text = r#"
        duration_s = 0.01
        queue_depth = 1
        policies = ["mclock"]
        [device]
        model = "fixed"
        latency_us = 1000.0
        parallelism = 1
        [[tenant]]
        name = "first"
        workload = { pattern = "randread", size = "4k", iodepth = 1 }
        [[tenant]]
        name = "reserved"
        reservation_iops = 100.0
        workload = { pattern = "randread", size = "4k", iodepth = 1 }
    "#;
    let t = trace(text, "mclock");
    assert_eq!(t.arrived[0].1, 0, "tenant 0 starts first");
    assert_eq!(t.arrived[1].1, 1);
    assert_eq!((t.arrived[0].2, t.arrived[1].2), (0, 0));
    let (_, tenant, at) = t.dispatched[0];
    assert_eq!((tenant, at), (1, 0), "the reservation goes first at t = 0");
}

/// `queue_limit` in the simulator: with one request on a device that never finishes
/// within the run, a tenant has exactly the limit waiting and every other arrival is
/// refused as queue-full.
#[test]
fn the_queue_limit_holds_exactly_its_bound() {
    let text = r#"
        duration_s = 0.05
        queue_depth = 1
        queue_limit = 10
        policies = ["none"]
        [device]
        model = "fixed"
        latency_us = 100000.0
        parallelism = 1
        [[tenant]]
        name = "flood"
        workload = { pattern = "randread", size = "4k", rate_iops = 1000.0, rate_process = "linear" }
    "#;
    let t = trace(text, "none");
    // Arrivals every 1 ms from 1 ms to 49 ms.
    assert_eq!(t.arrived.len(), 49);
    assert_eq!(t.dispatched.len(), 1);
    assert_eq!(t.completed, 0);
    assert_eq!(t.refused.len(), 49 - 1 - 10);
    assert!(
        t.refused
            .iter()
            .all(|(_, why)| *why == ioshare::policy::Refusal::QueueFull)
    );
    // The first ten after the dispatched one waited; the refused are the later ones.
    assert_eq!(t.refused[0].0, t.arrived[11].0);
    // The results say which refusals were the full queue (here all of them), apart from
    // a policy's.
    let s = Scenario::parse(text, "q", "q").unwrap();
    let r = run_scenario(&s, false).unwrap();
    let flood = &r.runs[0].tenants[0];
    assert_eq!((flood.refused, flood.queue_full), (38, 38));
    let table = ioshare::report::table(&r);
    assert!(
        table.contains("38 refused (38 with its queue full)"),
        "{table}"
    );
}

/// The SLO scenarios of docs/conformance.md ("SLO policies"), shortened to 6 s: a reader
/// with SLO {2,000 IOPS, 4 KiB, 5 ms} arriving Poisson, or evenly spaced, at exactly its
/// rate keeps what the policies promise it today — TA3 at least 99 % within `rt` alone,
/// beside a flooder, beside writers with a looser `rt` and beside a violator on the RAID 0
/// array (mClock too, its depth adaptive beside SLOs by default; 98.5 % with mixed `rt`);
/// TA2 and TA3 never below no control; TA1 at least 95 %; every switch turns at most ten
/// times a second.
#[test]
fn a_compliant_poisson_reader_keeps_its_slo() {
    let cases = [
        "slo-poisson-alone",
        "slo-poisson-flooder",
        "slo-mixed-rt",
        "slo-raid-poisson",
    ]
    .into_iter()
    .flat_map(|name| ["poisson", "linear"].map(move |arrivals| (name, arrivals)));
    for (scenario, arrivals) in cases {
        let name = format!("{scenario} ({arrivals})");
        let name = name.as_str();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("scenarios/{scenario}.toml"));
        let text: String = std::fs::read_to_string(path)
            .unwrap()
            .replace("duration_s = 20", "duration_s = 6")
            .replace(
                r#"rate_process = "poisson""#,
                &format!(r#"rate_process = "{arrivals}""#),
            )
            .lines()
            .map(|l| {
                if l.starts_with("policies =") {
                    r#"policies = ["none", "ta1", "ta2", "ta3", "mclock"]"#
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let s = Scenario::parse(&text, name, name).unwrap();
        assert_eq!(s.policies.len(), 5, "{name}: the policy list was rewritten");
        let r = run_scenario(&s, false).unwrap();
        let run = |label: &str| r.runs.iter().find(|x| x.policy == label).unwrap();
        let sat = |label: &str| run(label).tenants[0].slo_satisfaction.unwrap();
        assert!(sat("ta3") >= 0.99, "{name}: ta3 {}", sat("ta3"));
        assert!(sat("ta1") >= 0.95, "{name}: ta1 {}", sat("ta1"));
        // Never below `none`, capped at 99 % as the SLO matrix reads it: 99.97 % beside
        // a `none` at 99.98 % has lost nothing the tenant was promised.
        for label in ["ta2", "ta3"] {
            assert!(
                sat(label) >= sat("none").min(0.99),
                "{name}: {label} {} none {}",
                sat(label),
                sat("none")
            );
        }
        // mClock's depth adapts beside SLO tenants by default; beside two flooding
        // writers with reservations of their own it is at the edge (98.99 % Poisson).
        let floor = if scenario == "slo-mixed-rt" {
            0.985
        } else {
            0.99
        };
        assert!(sat("mclock") >= floor, "{name}: mclock {}", sat("mclock"));
        for label in ["ta2", "ta3"] {
            let transitions = run(label).policy_stats["transitions"].as_u64().unwrap();
            let switches = s.tenants.len() as u64;
            assert!(
                transitions <= 10 * 6 * switches,
                "{name}: {label} switched {transitions} times in 6 s"
            );
        }
    }
}

/// The demo shows each kind of policy at work: without scheduling the database tenant
/// (vm4, SLO of 300 reads a second within 20 ms) misses its SLO a tenth of the time
/// (on the write-through drive, most of the time; the 840 Pro's buffer now lets its
/// reads go ahead of the fileservers' programs) and its 99th percentile is past its
/// `rt`; the token buckets keep it within; vm3 goes idle in the middle phase and comes
/// back.
#[test]
fn the_demo_shows_slo_policies_acting_and_a_tenant_returning_from_idle() {
    let mut s = Scenario::parse(ioshare::DEMO_SCENARIO, "demo", "demo").unwrap();
    s.policies = ["none", "ta1"]
        .into_iter()
        .map(ioshare::config::PolicyChoice::named)
        .collect();
    let r = run_scenario(&s, false).unwrap();
    let run = |label: &str| r.runs.iter().find(|x| x.policy == label).unwrap();
    let vm4 = |label: &str| run(label).tenants[3].slo_satisfaction.unwrap();
    assert!(vm4("none") < 0.95, "none: {}", vm4("none"));
    assert!(vm4("ta1") >= 0.99, "ta1: {}", vm4("ta1"));
    let p99 = |label: &str| run(label).tenants[3].latency_us.p99;
    assert!(
        p99("none") > 20_000.0 && p99("ta1") <= 20_000.0,
        "{} vs {}",
        p99("none"),
        p99("ta1")
    );
    let phases = &run("none").phases;
    assert_eq!(phases.len(), 3);
    let vm3 = |p: usize| phases[p].tenants[2].iops;
    assert!(vm3(1) < 0.02 * vm3(0), "idle in the middle: {}", vm3(1));
    assert!(
        vm3(2) > 0.5 * vm3(0),
        "back after: {} vs {}",
        vm3(2),
        vm3(0)
    );
}

/// A sweep's table does not pass the first point's seed and duration off as everyone's.
#[test]
fn a_sweep_table_says_it_is_a_sweep() {
    let text = "name = 's'\nduration_s = 0.2\npolicies = ['none']\n[sweep]\nseed = [1, 2]\n\
                [device]\nmodel = 'fixed'\n[[tenant]]\nname = 'a'\n\
                workload = { pattern = 'randread', size = '4k', iodepth = 2 }\n";
    let all = Scenario::parse_all(text, "s.toml", "s").unwrap();
    let r = run_scenarios(&all, false).unwrap();
    let table = ioshare::report::table(&r);
    assert!(
        table.starts_with("scenario s, a sweep of 2 points (each point's values after --)"),
        "{table}"
    );
    assert!(
        table.contains("-- seed=1") && table.contains("-- seed=2"),
        "{table}"
    );
}

/// Reads beside writes on the aged SSDs (scenarios/read-write-mix.toml): with the device
/// queue of 32 the mix keeps the device busy only about 0.8 s/s of its fitted cost model
/// (each type alone: 1 s/s by the fit), because reads waiting for a die's program hold
/// queue places; with 64 places, room for every request, the loss is gone. The
/// conformance suite's "device work ≥ 0.95× `none`" reads against this
/// (docs/conformance.md, "What is still missed").
#[test]
fn a_read_write_mix_costs_the_aged_drives_queue_places() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/read-write-mix.toml");
    let text = std::fs::read_to_string(path).unwrap();
    for (depth, low, high) in [(32, 0.75, 0.85), (64, 0.95, 1.05)] {
        let text = text.replace(
            "warmup_s = 1",
            &format!("warmup_s = 1\nqueue_depth = {depth}"),
        );
        let all = Scenario::parse_all(&text, "mix", "mix").unwrap();
        let r = run_scenarios(&all, false).unwrap();
        assert_eq!(r.runs.len(), 2);
        for run in &r.runs {
            let rate = run.device_work_rate;
            assert!(
                (low..high).contains(&rate),
                "queue {depth}: {rate:.3} s/s, expected {low}..{high}"
            );
        }
    }
}
