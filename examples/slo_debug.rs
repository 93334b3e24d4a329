//! Prints the simulator's table, the token buckets' breaches and switch transitions and
//! mClock's depth report for one SLO conformance case: `cargo run --release --example
//! slo_debug -- <device> <mix index> <e|p>` (device: nvme-aged, nvme-clean, hdd, raid0;
//! e: evenly spaced arrivals, p: Poisson).
use ioshare::conformance::slo::{Case, Mix, SloDevice, Spacing, scenario};
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let usage = "usage: slo_debug <nvme-aged|nvme-clean|hdd|raid0> <mix index 0-7> <e|p>";
    if a.len() != 4 {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let device = SloDevice::ALL
        .into_iter()
        .find(|d| d.name() == a[1])
        .unwrap_or_else(|| panic!("unknown device '{}'; {usage}", a[1]));
    let mix = a[2]
        .parse::<usize>()
        .ok()
        .and_then(|i| Mix::ALL.get(i).copied())
        .unwrap_or_else(|| panic!("no mix '{}'; {usage}", a[2]));
    let spacing = match a[3].as_str() {
        "p" => Spacing::Poisson,
        "e" => Spacing::Even,
        other => panic!("arrivals '{other}': e or p; {usage}"),
    };
    let r = ioshare::sim::run_scenario(
        &scenario(
            Case {
                mix,
                device,
                spacing,
            },
            1,
            false,
        ),
        false,
    )
    .unwrap();
    print!("{}", ioshare::report::table(&r));
    for run in &r.runs {
        if run.policy.starts_with("ta") {
            let s = &run.policy_stats;
            println!(
                "{} breaches {} transitions {}",
                run.policy, s["breaches"], s["transitions"]
            );
        }
        if run.policy.starts_with("mclock") {
            let d = &run.policy_stats["depth"];
            println!(
                "{} depth {} lowest {} highest {} shrinks {} grows {}",
                run.policy, d["limit"], d["lowest"], d["highest"], d["shrinks"], d["grows"]
            );
        }
    }
}
