//! `ioshare engine-swarm`: the live engine's core under the fault swarm
//! (`ioshare::server::swarm`), many seeds or one.

use crate::*;
use ioshare::server::swarm;

/// Arguments of `engine-swarm`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Run this one seed (replays a failure) and print what it did.
    #[arg(long, conflicts_with_all = ["seeds", "from"])]
    seed: Option<u64>,
    /// How many seeds to run.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
}

pub(crate) fn run(a: Args) -> Result<()> {
    if let Some(seed) = a.seed {
        let r = swarm::run_seed(seed).map_err(|f| anyhow::anyhow!("{f}"))?;
        println!("seed {seed}: every property held: {r:?}");
        return Ok(());
    }
    if a.seeds == 0 {
        bail!("--seeds 0 runs nothing");
    }
    let mut total = swarm::Report::default();
    let (mut crashed, mut failed) = (0u64, Vec::new());
    for seed in a.from..a.from.saturating_add(a.seeds) {
        match swarm::run_seed(seed) {
            Ok(r) => {
                total.requests += r.requests;
                total.replies += r.replies;
                total.errors += r.errors;
                total.faults += r.faults;
                total.sectors_checked += r.sectors_checked;
                total.events += r.events;
                total.refused += r.refused;
                crashed += u64::from(r.crashed);
            }
            Err(f) => {
                eprintln!("{f}\n");
                failed.push(seed);
            }
        }
    }
    println!(
        "{} seed(s) from {}: {} failed; {} requests, {} replies ({} errors), {} disk faults, {} crashes with {} sectors checked, {} connections refused by the limits, {} events",
        a.seeds,
        a.from,
        failed.len(),
        total.requests,
        total.replies,
        total.errors,
        total.faults,
        crashed,
        total.sectors_checked,
        total.refused,
        total.events
    );
    if !failed.is_empty() {
        bail!("failing seeds: {failed:?}");
    }
    Ok(())
}
