//! Simulator speed: simulated requests per wall second on the SSD model (and the fixed
//! model as a floor for the engine alone). The device is built and aged once, and its
//! cost model fitted once, outside the measurement; each iteration runs the scenario on a
//! fresh copy, as `ioshare sim` does for each policy. The fit itself (probing a copy of
//! the device with each request type alone) is timed as a case of its own: `ioshare sim`
//! pays it once per device and seed.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ioshare::scenario::Scenario;
use ioshare::sim::{RunOptions, run_policy_priced};

fn scenario(device: &str, workload: &str) -> Scenario {
    let text = format!(
        r#"
        seed = 1
        duration_s = 2
        partition = true
        queue_depth = 32
        [device]
        {device}
        [[tenant]]
        name = "t1"
        weight = 10
        workload = {workload}
        [[tenant]]
        name = "t2"
        weight = 7
        workload = {workload}
        [[tenant]]
        name = "t3"
        weight = 4
        workload = {workload}
        [[tenant]]
        name = "t4"
        weight = 1
        workload = {workload}
        "#
    );
    Scenario::parse(&text, "bench", "bench").expect("bench scenario is valid")
}

fn bench(c: &mut Criterion) {
    let cases = [
        (
            "ssd-sata-840pro-clean/randread-4k",
            r#"model = "ssd"
            preset = "sata-840pro"
            capacity_gib = 4"#,
            r#"{ pattern = "randread", size = "4k", iodepth = 16 }"#,
        ),
        (
            "ssd-nvme-p4500-clean/randread-4k",
            r#"model = "ssd"
            preset = "nvme-p4500"
            capacity_gib = 4"#,
            r#"{ pattern = "randread", size = "4k", iodepth = 16 }"#,
        ),
        (
            "ssd-nvme-p4500-aged/randrw-4k",
            r#"model = "ssd"
            preset = "nvme-p4500"
            precondition = "aged"
            capacity_gib = 4"#,
            r#"{ pattern = "randrw", size = "4k", iodepth = 16 }"#,
        ),
        (
            "fixed/randread-4k",
            r#"model = "fixed"
            latency_us = 20
            parallelism = 64"#,
            r#"{ pattern = "randread", size = "4k", iodepth = 16 }"#,
        ),
    ];
    let mut group = c.benchmark_group("simulator");
    group.sample_size(20);
    for (name, device, workload) in cases {
        let s = scenario(device, workload);
        let base = s.device.build(s.seed);
        let choice = &s.policies[0];
        let cost = s.device.fitted_cost(base.as_ref());
        let run = || {
            run_policy_priced(
                &s,
                choice,
                base.clone_box(),
                cost,
                None,
                RunOptions::default(),
            )
        };
        let requests = run().unwrap().sim.requests;
        group.throughput(Throughput::Elements(requests));
        group.bench_function(name, |b| b.iter(|| run().unwrap().sim.requests));
        // One fit a run: its time is what `ioshare sim` adds once per device.
        group.throughput(Throughput::Elements(1));
        group.bench_function(format!("{name}/fit-cost-model"), |b| {
            b.iter(|| s.device.fitted_cost(base.as_ref()))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
