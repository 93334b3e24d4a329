//! `ioshare conformance`: the proportional-share matrix, or with `--slo` the SLO one.

use super::*;

/// What the proportional matrix prints on standard output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// Cells passed per policy and device, the figures missed, the total.
    Summary,
    /// Every cell's figures, Markdown (`--table`: what docs/conformance.md holds).
    Table,
    /// Every cell, JSON (`--json`).
    Json,
}

impl Output {
    /// From `--table` and `--json` (clap keeps them apart).
    pub(crate) fn from_flags(table: bool, json: bool) -> Self {
        match (table, json) {
            (_, true) => Output::Json,
            (true, false) => Output::Table,
            (false, false) => Output::Summary,
        }
    }
}

/// `ioshare conformance`.
pub(crate) fn run(
    devices: Vec<String>,
    slo: bool,
    (seed, seeds): (u64, u64),
    policies: Vec<String>,
    output: Output,
) -> Result<()> {
    if slo {
        if !policies.is_empty() {
            bail!("--policy judges proportional-share policies: not with --slo");
        }
        if output == Output::Json {
            bail!("--json is for the proportional matrix: with --slo, the summary or --table");
        }
        slo_conformance(&devices, seed, seeds, output)
    } else {
        conformance(&devices, seed, seeds, &policies, output)
    }
}

/// `n of total` done after `elapsed` seconds: what is left, roughly.
fn eta(n: usize, total: usize, elapsed: f64) -> String {
    if n == 0 || n >= total {
        return String::new();
    }
    let left = elapsed / n as f64 * (total - n) as f64;
    if left >= 90.0 {
        format!(", about {:.0} min left", left / 60.0)
    } else {
        format!(", about {left:.0} s left")
    }
}

/// `--policy` entries as a scenario's `policies` list holds them: a bare name quoted,
/// an inline table as given; each checked by building a scenario with it.
fn policy_entries(given: &[String]) -> Result<Vec<String>> {
    given
        .iter()
        .map(|p| {
            let entry = if p.trim_start().starts_with('{') {
                p.clone()
            } else {
                format!("\"{p}\"")
            };
            let probe = format!(
                "name = \"p\"\nduration_s = 1\npolicies = [{entry}]\n[device]\nmodel = \"ssd\"\n[[tenant]]\nname = \"a\"\nworkload = {{ pattern = \"randread\" }}\n"
            );
            ioshare::scenario::Scenario::parse(&probe, "--policy", "conformance")
                .map_err(|e| anyhow::anyhow!("--policy {p}: {e}"))?;
            Ok(entry)
        })
        .collect()
}

/// Runs the SLO conformance matrix and prints it.
fn slo_conformance(devices: &[String], first_seed: u64, seeds: u64, output: Output) -> Result<()> {
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
        eprintln!("{passed} of {total} verdicts pass (a verdict per case and policy)");
    } else if output == Output::Summary {
        print!("{}", slo::summary(&outcomes));
        println!("Every case's figures: --table (Markdown, as docs/conformance.md holds it).");
    } else {
        let table = slo::markdown(&outcomes);
        print!("{table}");
        let counts = format!(
            "{passed} of {total} verdicts pass ({} cases, a verdict per policy in each)",
            outcomes.len()
        );
        eprintln!(
            "{}",
            against_documented(&table, first_seed, counts, "slo conformance table")
        );
    }
    Ok(())
}

/// The documented matrices (seed 1), to say whether a run is what the project expects.
const DOCUMENTED: &str = include_str!("../../docs/conformance.md");

/// How a run's table compares with the one `docs/conformance.md` documents under the
/// marker `<!-- {what}: ... -->`: every row as documented (the misses are the open work
/// the document lists), or which rows differ. Seed 1 only: the document holds seed 1.
fn against_documented(table: &str, seed: u64, counts: String, what: &str) -> String {
    if seed != 1 {
        return format!("{counts} (docs/conformance.md documents seed 1; this was seed {seed})");
    }
    let Some(documented) = DOCUMENTED
        .find(&format!("<!-- {what}:"))
        .map(|at| &DOCUMENTED[at..])
        .and_then(|rest| rest.find("<!-- end of").map(|end| &rest[..end]))
    else {
        return counts;
    };
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| ---"))
        .skip(1)
        .collect();
    let differ: Vec<&str> = rows
        .iter()
        .copied()
        .filter(|row| !documented.lines().any(|d| d == *row))
        .collect();
    if differ.is_empty() {
        format!(
            "{counts}: every one of the {} rows is as docs/conformance.md documents it (seed 1). \
             The cells that do not pass are known: the document says why under \"What is still missed\".",
            rows.len()
        )
    } else {
        format!(
            "{counts}; {} of the {} rows differ from docs/conformance.md (seed 1), the first:\n  {}\n\
             A policy or device model changed since the table was written: regenerate it \
             (bench/conformance-tables.sh) and say why in the document.",
            differ.len(),
            rows.len(),
            differ[0]
        )
    }
}

/// The devices `--device` names (all without one): by key or by name as the tables
/// print it.
fn chosen_devices(devices: &[String]) -> Result<Vec<ioshare::conformance::Device>> {
    use ioshare::conformance::Device;
    Ok(if devices.is_empty() {
        Device::ALL.to_vec()
    } else {
        devices
            .iter()
            .map(|d| {
                // Its key, or its name as the tables print it ("sata-840pro aged", also
                // written "sata-840pro-aged").
                let plain = |s: &str| s.to_ascii_lowercase().replace(", ", "-").replace(' ', "-");
                Device::ALL
                    .into_iter()
                    .find(|x| x.key() == d.as_str() || plain(x.name()) == plain(d))
                    .ok_or_else(|| {
                        let known: Vec<String> = Device::ALL
                            .iter()
                            .map(|x| format!("{} ({})", x.key(), x.name()))
                            .collect();
                        anyhow::anyhow!(
                            "--device: unknown device '{d}' (known: {})",
                            known.join(", ")
                        )
                    })
            })
            .collect::<Result<_>>()?
    })
}

/// Runs the conformance matrix and prints it.
fn conformance(
    devices: &[String],
    first_seed: u64,
    seeds: u64,
    given: &[String],
    output: Output,
) -> Result<()> {
    use ioshare::conformance::{self, Property};
    let entries = policy_entries(given)?;
    let chosen: Option<Vec<&str>> =
        (!entries.is_empty()).then(|| entries.iter().map(String::as_str).collect());
    let devices = chosen_devices(devices)?;
    if seeds == 0 {
        bail!("--seeds must be ≥ 1");
    }
    let mut rows = Vec::new();
    let (mut passed, mut total) = (0, 0);
    let cells = seeds as usize * devices.len() * Property::ALL.len();
    let began = Instant::now();
    for seed in first_seed..first_seed.saturating_add(seeds) {
        for &device in &devices {
            for property in Property::ALL {
                let t = Instant::now();
                let (_, verdicts) = match &chosen {
                    Some(p) => conformance::check_with(property, device, seed, p),
                    None => conformance::check(property, device, seed),
                };
                let held: Vec<_> = verdicts
                    .iter()
                    .filter(|v| v.figures.iter().any(|f| f.target.is_some()))
                    .collect();
                passed += held.iter().filter(|v| v.pass()).count();
                total += held.len();
                eprintln!(
                    "[{} of {cells}] seed {seed}, {} on {}: {} of {} held policies pass ({:.1} s{})",
                    rows.len() + 1,
                    property.name(),
                    device.name(),
                    held.iter().filter(|v| v.pass()).count(),
                    held.len(),
                    t.elapsed().as_secs_f64(),
                    eta(rows.len() + 1, cells, began.elapsed().as_secs_f64())
                );
                rows.push((property, device, verdicts));
            }
        }
    }
    if output == Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&conformance::json(&rows))?
        );
        return Ok(());
    }
    if seeds > 1 {
        print!("{}", conformance::sweep_markdown(&rows));
        eprintln!(
            "{passed} of {total} held cells pass (a cell per property, device and policy; baselines not counted)"
        );
    } else if output == Output::Summary {
        print!("{}", conformance::summary(&rows));
        println!(
            "Every cell's figures: --table (Markdown, as docs/conformance.md holds it) or --json."
        );
    } else {
        let table = conformance::markdown(&rows);
        print!("{table}");
        let counts = format!(
            "{passed} of {total} held cells pass ({} properties × {} devices, a cell per policy in each; baselines not counted)",
            Property::ALL.len(),
            devices.len()
        );
        if chosen.is_some() {
            eprintln!(
                "{counts} (the policies given, not the suite's: not compared with docs/conformance.md)"
            );
        } else {
            eprintln!(
                "{}",
                against_documented(&table, first_seed, counts, "conformance table")
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table whose rows are the document's says so; a changed row is named.
    #[test]
    fn a_run_is_compared_with_the_documented_table() {
        let start = DOCUMENTED.find("<!-- conformance table:").unwrap();
        let rows: Vec<&str> = DOCUMENTED[start..].lines().skip(1).take(5).collect();
        let table = rows.join("\n");
        let said = against_documented(&table, 1, "2 of 3 cells pass".into(), "conformance table");
        assert!(
            said.starts_with(
                "2 of 3 cells pass: every one of the 3 rows is as docs/conformance.md documents it"
            ),
            "{said}"
        );
        let changed = table.replacen("| yes |", "| no |", 1);
        let said = against_documented(&changed, 1, "1 of 3 cells pass".into(), "conformance table");
        assert!(
            said.contains("1 of the 3 rows differ from docs/conformance.md"),
            "{said}"
        );
        assert!(said.contains("| no |"), "{said}");
        let said = against_documented(&table, 2, "2 of 3 cells pass".into(), "conformance table");
        assert_eq!(
            said,
            "2 of 3 cells pass (docs/conformance.md documents seed 1; this was seed 2)"
        );
    }
}
