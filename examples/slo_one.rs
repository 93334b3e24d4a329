//! Runs cases of the SLO conformance matrix and prints their rows, for looking closer
//! at a cell: `cargo run --release --example slo_one -- <device> [mix index ...]`
//! (device: nvme-aged, nvme-clean, hdd, raid0; TABLE=1 also prints the simulator's
//! table of each run).

use ioshare::conformance::slo::{Case, Mix, SloDevice, Spacing, check, markdown, scenario};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let device = SloDevice::ALL
        .into_iter()
        .find(|d| Some(d.name()) == args.get(1).map(String::as_str))
        .unwrap_or(SloDevice::NvmeAged);
    let mixes: Vec<usize> = if args.len() > 2 {
        args[2..]
            .iter()
            .map(|a| a.parse().expect("a mix index"))
            .collect()
    } else {
        (0..Mix::ALL.len()).collect()
    };
    for m in mixes {
        for spacing in Spacing::ALL {
            let case = Case {
                mix: Mix::ALL[m],
                device,
                spacing,
            };
            let t = std::time::Instant::now();
            let o = check(case, 1);
            print!("{}", markdown(std::slice::from_ref(&o)));
            eprintln!("({:.1} s)", t.elapsed().as_secs_f64());
            if std::env::var("TABLE").is_ok() {
                for feasibility in [true, false] {
                    let r = ioshare::sim::run_scenario(&scenario(case, 1, feasibility), false)
                        .expect("runs");
                    print!("{}", ioshare::report::table(&r));
                }
            }
        }
    }
}
