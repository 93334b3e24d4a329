//! `ioshare conformance`: the proportional-share matrix, or with `--slo` the SLO one.

use super::*;

/// `ioshare conformance`.
pub(crate) fn run(devices: Vec<String>, slo: bool, seed: u64, seeds: u64) -> Result<()> {
    if slo {
        slo_conformance(&devices, seed, seeds)
    } else {
        conformance(&devices, seed, seeds)
    }
}

/// Runs the SLO conformance matrix and prints it.
fn slo_conformance(devices: &[String], first_seed: u64, seeds: u64) -> Result<()> {
    use ioshare::conformance::slo::{self, Case, SloDevice};
    let known: Vec<&str> = SloDevice::ALL.iter().map(|d| d.name()).collect();
    let devices: Vec<SloDevice> = if devices.is_empty() {
        SloDevice::ALL.to_vec()
    } else {
        devices
            .iter()
            .map(|d| {
                SloDevice::ALL
                    .into_iter()
                    .find(|k| k.name() == d)
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "--device: unknown device '{d}' for --slo (known: {})",
                            known.join(", ")
                        )
                    })
            })
            .collect::<Result<_>>()?
    };
    if seeds == 0 {
        bail!("--seeds must be ≥ 1");
    }
    let mut outcomes = Vec::new();
    let (mut passed, mut total) = (0, 0);
    for seed in first_seed..first_seed.saturating_add(seeds) {
        for case in Case::all()
            .into_iter()
            .filter(|c| devices.contains(&c.device))
        {
            let t = Instant::now();
            let o = slo::check(case, seed);
            let pass = o.verdicts.iter().filter(|v| v.pass()).count();
            passed += pass;
            total += o.verdicts.len();
            eprintln!(
                "seed {seed}, {} on {} ({}): {pass} of {} policies pass ({:.1} s)",
                case.mix.name(),
                case.device.name(),
                case.spacing.name(),
                o.verdicts.len(),
                t.elapsed().as_secs_f64()
            );
            outcomes.push(o);
        }
    }
    if seeds > 1 {
        print!("{}", slo::sweep_markdown(&outcomes));
    } else {
        print!("{}", slo::markdown(&outcomes));
    }
    eprintln!("{passed} of {total} pass");
    Ok(())
}

/// Runs the conformance matrix and prints it.
fn conformance(devices: &[String], first_seed: u64, seeds: u64) -> Result<()> {
    use ioshare::conformance::{self, Device, Property};
    let devices: Vec<Device> = if devices.is_empty() {
        Device::ALL.to_vec()
    } else {
        devices
            .iter()
            .map(|d| {
                Device::ALL
                    .into_iter()
                    .find(|x| x.key() == d.as_str())
                    .ok_or_else(|| {
                        let known: Vec<&str> = Device::ALL.iter().map(|x| x.key()).collect();
                        anyhow::anyhow!(
                            "--device: unknown device '{d}' (known: {})",
                            known.join(", ")
                        )
                    })
            })
            .collect::<Result<_>>()?
    };
    if seeds == 0 {
        bail!("--seeds must be ≥ 1");
    }
    let mut rows = Vec::new();
    let (mut passed, mut total) = (0, 0);
    for seed in first_seed..first_seed.saturating_add(seeds) {
        for &device in &devices {
            for property in Property::ALL {
                let t = Instant::now();
                let (_, verdicts) = conformance::check(property, device, seed);
                passed += verdicts.iter().filter(|v| v.pass()).count();
                total += verdicts.len();
                eprintln!(
                    "seed {seed}, {} on {}: {} of {} policies pass ({:.1} s)",
                    property.name(),
                    device.name(),
                    verdicts.iter().filter(|v| v.pass()).count(),
                    verdicts.len(),
                    t.elapsed().as_secs_f64()
                );
                rows.push((property, device, verdicts));
            }
        }
    }
    if seeds > 1 {
        print!("{}", conformance::sweep_markdown(&rows));
    } else {
        print!("{}", conformance::markdown(&rows));
    }
    eprintln!("{passed} of {total} pass");
    Ok(())
}
