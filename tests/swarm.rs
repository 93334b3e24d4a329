//! Swarm testing: random scenarios (devices, 1 to 64 tenants, weights, SLOs,
//! reservations and limits, request sizes, open and closed loops, phases with idle
//! spells, device queues from 1 to 128, queue limits) run under every policy with the
//! simulator's checker on (every invariant after every event). A failure prints the
//! seed and the scenario; `IOSHARE_SWARM_SEED=<seed> cargo test --release --test swarm`
//! runs that one again, `IOSHARE_SWARM_CASES=<n>` runs more.

use ioshare::config::PolicyChoice;
use ioshare::policy;
use ioshare::scenario::Scenario;
use ioshare::sim::{RunOptions, run_policy_with};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt::Write;

/// Cases in `./test.sh` (each runs all ten policies): bounded at a few seconds.
const DEFAULT_CASES: u64 = 24;

fn pick<'a, T>(rng: &mut ChaCha8Rng, from: &'a [T]) -> &'a T {
    &from[rng.random_range(0..from.len())]
}

/// A scenario drawn from `seed`, as a scenario file would say it.
fn scenario(seed: u64) -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut s = String::new();
    let duration = rng.random_range(0.2..1.0);
    let tenants = *pick(&mut rng, &[1usize, 2, 2, 3, 4, 4, 8, 16, 64]);
    let queue_limit = rng.random_bool(0.4).then(|| rng.random_range(1..=48u32));
    writeln!(s, "seed = {}", rng.random_range(1..1000u64)).unwrap();
    writeln!(s, "duration_s = {duration:.3}").unwrap();
    writeln!(s, "warmup_s = {:.3}", duration * rng.random_range(0.0..0.3)).unwrap();
    writeln!(s, "interval_s = 0.05").unwrap();
    writeln!(
        s,
        "queue_depth = {}",
        pick(&mut rng, &[1u32, 2, 4, 8, 32, 64, 128])
    )
    .unwrap();
    if let Some(l) = queue_limit {
        writeln!(s, "queue_limit = {l}").unwrap();
    }
    writeln!(s, "partition = true\n[device]").unwrap();
    match rng.random_range(0..5) {
        0 => writeln!(
            s,
            "model = \"fixed\"\nlatency_us = {}\nbandwidth_mb_s = {}\nparallelism = {}\ncapacity_gib = 1",
            rng.random_range(10..3000),
            rng.random_range(50..4000),
            rng.random_range(1..=16)
        ),
        1 | 2 => writeln!(
            s,
            "model = \"ssd\"\npreset = \"{}\"\nprecondition = \"{}\"\ncapacity_gib = {}",
            pick(&mut rng, &["sata-840pro", "nvme-p4500"]),
            pick(&mut rng, &["clean", "aged"]),
            pick(&mut rng, &[0.125, 0.25])
        ),
        3 => writeln!(s, "model = \"hdd\""),
        _ => writeln!(s, "model = \"raid0\""),
    }
    .unwrap();
    for i in 0..tenants {
        writeln!(s, "[[tenant]]\nname = \"t{i}\"").unwrap();
        writeln!(s, "weight = {:.2}", rng.random_range(0.25..16.0)).unwrap();
        if rng.random_bool(0.3) {
            writeln!(
                s,
                "slo = {{ iops = {:.1}, size = 4096, rt_us = {} }}",
                rng.random_range(20.0..5000.0),
                rng.random_range(500..50_000)
            )
            .unwrap();
        }
        let reservation = rng.random_bool(0.2).then(|| rng.random_range(10.0..2000.0));
        if let Some(r) = reservation {
            writeln!(s, "reservation_iops = {r:.1}").unwrap();
        }
        if rng.random_bool(0.2) {
            let floor = reservation.unwrap_or(1.0);
            writeln!(
                s,
                "limit_iops = {:.1}",
                floor + rng.random_range(0.0..3000.0)
            )
            .unwrap();
        }
        workload(&mut rng, &mut s, queue_limit, duration);
    }
    s
}

/// A tenant's workload table: a pattern and sizes, then one to three phases (or one
/// arrival process for the whole run).
fn workload(rng: &mut ChaCha8Rng, s: &mut String, queue_limit: Option<u32>, duration: f64) {
    let max_depth = queue_limit.unwrap_or(32).min(32);
    writeln!(s, "[tenant.workload]").unwrap();
    let pattern = *pick(
        rng,
        &["read", "write", "rw", "randread", "randwrite", "randrw"],
    );
    writeln!(s, "pattern = \"{pattern}\"").unwrap();
    if pattern.ends_with("rw") {
        writeln!(s, "read_mix = {:.2}", rng.random_range(0.0..=1.0)).unwrap();
    }
    if rng.random_bool(0.5) {
        let size = pick(rng, &["4k", "8k", "16k", "64k", "128k", "1m"]);
        writeln!(s, "size = \"{size}\"").unwrap();
    } else {
        let size = pick(rng, &["8k", "24k", "64k"]);
        writeln!(s, "size_mean = \"{size}\"").unwrap();
    }
    let arrivals = |rng: &mut ChaCha8Rng| -> String {
        if rng.random_bool(0.5) {
            format!("iodepth = {}", rng.random_range(1..=max_depth))
        } else {
            format!(
                "rate_iops = {:.1}\nrate_process = \"{}\"",
                rng.random_range(10.0..20_000.0),
                pick(rng, &["poisson", "linear"])
            )
        }
    };
    let phases = rng.random_range(0..=3);
    if phases == 0 {
        writeln!(s, "{}", arrivals(rng)).unwrap();
        return;
    }
    for p in 0..phases {
        writeln!(s, "[[tenant.workload.phases]]").unwrap();
        if p + 1 < phases || rng.random_bool(0.5) {
            writeln!(
                s,
                "duration_s = {:.3}",
                duration * rng.random_range(0.05..0.5)
            )
            .unwrap();
        }
        if rng.random_bool(0.25) {
            writeln!(s, "idle = true").unwrap();
        } else {
            writeln!(s, "{}", arrivals(rng)).unwrap();
        }
    }
}

/// Runs every policy on the scenario of `seed` under the checker, and checks what the
/// results promise: finite figures, shares that add up, no tenant served more than it
/// asked for in bytes per second the device cannot exceed.
fn run_seed(seed: u64) {
    let text = scenario(seed);
    let s = Scenario::parse(&text, &format!("swarm seed {seed}"), "swarm").unwrap_or_else(|e| {
        panic!("swarm seed {seed}: the generator made a bad scenario: {e}\n{text}")
    });
    let device = s.device.build(s.seed);
    for name in policy::names() {
        let choice = PolicyChoice::named(name);
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_policy_with(
                &s,
                &choice,
                device.clone_box(),
                None,
                RunOptions { check: true },
            )
            .expect("every policy builds with defaults")
        }));
        let r = match run {
            Ok(r) => r,
            Err(e) => {
                let what = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "swarm seed {seed}, policy {name}: {what}\nreproduce: IOSHARE_SWARM_SEED={seed} cargo test --release --test swarm\n{text}"
                );
            }
        };
        let fail = |what: String| panic!("swarm seed {seed}, policy {name}: {what}\n{text}");
        for x in [
            r.total_bandwidth_bytes_per_s,
            r.share_error,
            r.interval_share_error,
            r.jain,
        ] {
            if !x.is_finite() || x < 0.0 {
                fail(format!("a figure is {x}"));
            }
        }
        let shares: f64 = r.tenants.iter().map(|t| t.share).sum();
        if r.total_bandwidth_bytes_per_s > 0.0 && (shares - 1.0).abs() > 1e-9 {
            fail(format!("shares add up to {shares}"));
        }
        let ios: u64 = r.tenants.iter().map(|t| t.ios).sum();
        if ios > r.sim.requests {
            fail(format!(
                "{ios} measured, {} completed in all",
                r.sim.requests
            ));
        }
    }
}

#[test]
fn random_scenarios_keep_every_invariant_under_every_policy() {
    if let Ok(seed) = std::env::var("IOSHARE_SWARM_SEED") {
        run_seed(seed.parse().expect("IOSHARE_SWARM_SEED is a number"));
        return;
    }
    let cases = std::env::var("IOSHARE_SWARM_CASES")
        .ok()
        .map(|n| n.parse().expect("IOSHARE_SWARM_CASES is a number"))
        .unwrap_or(DEFAULT_CASES);
    // Seeds differ per case but not per run: a failure in CI is a failure here.
    for case in 0..cases {
        run_seed(0x5eed_0000 + case);
    }
}

/// The generator covers what it claims: over the default cases, every device model,
/// tenant counts up to 64, queue limits, SLOs, idle phases and open and closed loops.
#[test]
fn the_swarm_covers_devices_tenant_counts_and_workloads() {
    let texts: Vec<String> = (0..DEFAULT_CASES)
        .map(|c| scenario(0x5eed_0000 + c))
        .collect();
    let all = texts.join("\n");
    for needle in [
        "model = \"fixed\"",
        "model = \"ssd\"",
        "model = \"hdd\"",
        "model = \"raid0\"",
        "queue_limit",
        "slo = ",
        "reservation_iops",
        "limit_iops",
        "idle = true",
        "iodepth",
        "rate_iops",
        "precondition = \"aged\"",
    ] {
        assert!(all.contains(needle), "no swarm case has {needle}");
    }
    assert!(
        texts.iter().any(|t| t.matches("[[tenant]]").count() >= 16),
        "no case with many tenants"
    );
}
