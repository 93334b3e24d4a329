//! Global QoS across several fronts sharing one simulated cluster (`ioshare::cluster`):
//! weights, reservations and limits per tenant across all fronts together, judged on
//! the multi-front simulator. Exact: every run is seeded; the numbers in the comments
//! are what these seeds measure (docs/benchmarks.md, "More than one host (simulator)").

use ioshare::cluster::model::ClusterParams;
use ioshare::cluster::sim::{ClusterResult, ClusterScenario, Exchange, Leave, Mode, Volume, run};
use ioshare::device::fixed::FixedParams;
use ioshare::types::{Nanos, TenantSpec};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SEC: Nanos = 1_000_000_000;
const MS: Nanos = 1_000_000;

/// 8 OSDs of 4 slots at 500 µs a 4 KiB read, replication 3, 50 µs hops with up to
/// 20 µs of jitter: about 63,500 reads a second.
fn cluster() -> ClusterParams {
    ClusterParams {
        osds: 8,
        replication: 3,
        osd: FixedParams {
            capacity_gib: 64.0,
            latency_us: 500.0,
            bandwidth_mb_s: 1000.0,
            parallelism: 4,
        },
        net: 50_000,
        jitter: 20_000,
        seed: 11,
    }
}

fn reader(tenant: u32, front: usize, iodepth: u32) -> Volume {
    Volume {
        tenant,
        front,
        iodepth,
        read_mix: 1.0,
        size: 4096,
        start: 0,
        end: None,
    }
}

fn scenario(fronts: usize, tenants: Vec<TenantSpec>, volumes: Vec<Volume>, mode: Mode) -> ClusterScenario {
    ClusterScenario {
        seed: 7,
        duration: 8 * SEC,
        cluster: cluster(),
        fronts,
        tenants,
        volumes,
        exchange: Exchange {
            delay: 5 * MS,
            loss: 0.01,
        },
        mode,
        joins: Vec::new(),
        leaves: Vec::new(),
        queue_depth: 4096,
    }
}

const WEIGHTS: [f64; 6] = [1.0, 2.0, 4.0, 1.0, 2.0, 4.0];

/// Six tenants 1:2:4:1:2:4, every one backlogged: each has `max(4, 2 × fronts)`
/// volumes of iodepth 8, volume k on front `(t + ⌊F·u²⌋) mod F` (u uniform, seeded):
/// most on its home front, a few spread over others.
fn weighted(fronts: usize, mode: Mode) -> ClusterScenario {
    let tenants = WEIGHTS
        .iter()
        .enumerate()
        .map(|(i, &w)| TenantSpec::weighted(format!("t{i}"), w))
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut volumes = Vec::new();
    for t in 0..6u32 {
        for _ in 0..(2 * fronts).max(4) {
            let u: f64 = rng.random();
            let f = (t as usize + (fronts as f64 * u * u) as usize) % fronts;
            volumes.push(reader(t, f, 8));
        }
    }
    scenario(fronts, tenants, volumes, mode)
}

fn share_error(r: &ClusterResult) -> f64 {
    r.share_error(3, &[0, 1, 2, 3, 4, 5], &WEIGHTS)
}

fn mean_total(r: &ClusterResult, from: usize) -> f64 {
    let n = r.windows.len() - from;
    (from..r.windows.len()).map(|w| r.total(w)).sum::<f64>() / n as f64
}

#[test]
fn explore() {
    for fronts in [3, 8, 32] {
        for mode in [Mode::Coordinated, Mode::Local, Mode::NoQos] {
            let t = std::time::Instant::now();
            let r = run(&weighted(fronts, mode)).unwrap();
            let per: Vec<String> = (0..r.windows.len())
                .map(|w| format!("{:.0}", r.total(w)))
                .collect();
            println!(
                "{fronts} {mode:?}: share error {:.4} total {:.0} [{}] in {:?}; last window {:?}",
                share_error(&r),
                mean_total(&r, 3),
                per.join(" "),
                t.elapsed(),
                (0..6).map(|t| r.iops(7, t).round()).collect::<Vec<_>>()
            );
        }
    }
}
