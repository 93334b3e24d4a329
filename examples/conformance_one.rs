//! Runs one conformance property on one device and prints the simulator's table, for
//! looking closer at a failing cell: `cargo run --release --example conformance_one --
//! <property index> <device index> [policy ...]` (with `OUT=dir`, the run's results.json,
//! timeseries.csv and report.html go there instead).

use ioshare::config::PolicyChoice;
use ioshare::conformance::{Device, Property, scenario};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let p: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(0);
    let d: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(0);
    let mut s = scenario(Property::ALL[p], Device::ALL[d], 1);
    if args.len() > 3 {
        // `name` or `name:key=value,key=value` (label: the whole argument).
        s.policies = args[3..]
            .iter()
            .map(|a| match a.split_once(':') {
                None => PolicyChoice::named(a),
                Some((name, params)) => {
                    let table: toml::Table =
                        toml::from_str(&params.replace(',', "\n")).expect("key=value pairs");
                    PolicyChoice {
                        label: a.clone(),
                        name: name.to_string(),
                        params: ioshare::config::params(table).expect("scalar parameters"),
                    }
                }
            })
            .collect();
    }
    let r = ioshare::sim::run_scenario(&s, false).expect("runs");
    if let Ok(dir) = std::env::var("OUT") {
        // results.json, timeseries.csv and report.html, to look at every tenant.
        ioshare::report::write_all(&r, std::path::Path::new(&dir)).expect("writes");
        return;
    }
    print!("{}", ioshare::report::table(&r));
    if std::env::var("SERIES").is_ok() {
        // Total MB/s per 0.1 s interval, per policy.
        for run in &r.runs {
            let bins = run.timeseries.bytes[0].len();
            let totals: Vec<String> = (0..bins)
                .map(|b| {
                    let sum: u64 = run.timeseries.bytes.iter().map(|s| s[b]).sum();
                    format!("{:.0}", sum as f64 / 0.1 / 1e6)
                })
                .collect();
            println!("{:<10} {}", run.policy, totals.join(" "));
            let first: Vec<String> = (0..bins)
                .map(|b| {
                    let sum: u64 = run.timeseries.bytes.iter().map(|s| s[b]).sum();
                    let share = run.timeseries.bytes[0][b] as f64 / sum.max(1) as f64;
                    format!("{:.0}", share * 100.0)
                })
                .collect();
            println!("{:<10} first tenant's share, %: {}", "", first.join(" "));
        }
    }
}
