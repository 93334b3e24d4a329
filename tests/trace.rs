//! Recorded traces end to end: replayed in the simulator (closed and original timing, a
//! capture of the server's), converted and replayed by fio against an NBD export, and
//! the `trace` subcommands' output and errors.

use ioshare::metrics::TenantResult;
use ioshare::scenario::Scenario;
use ioshare::sim::run_scenario;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

fn ioshare() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ioshare"))
}

/// An MSR trace of `n` requests 1 ms apart: reads on disk 0 at even positions, writes
/// on disk 1 at odd ones, sizes cycling 4, 8, 16 KiB.
fn msr_trace(path: &Path, n: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    let t0: u64 = 128_166_372_003_061_629;
    for i in 0..n {
        let (disk, op) = if i % 2 == 0 {
            (0, "Read")
        } else {
            (1, "Write")
        };
        let size = 4096 << (i % 3);
        writeln!(
            f,
            "{},src1,{disk},{op},{},{size},100",
            t0 + i * 10_000,
            i * 65536
        )
        .unwrap();
    }
}

fn scenario(dir: &Path, tenants: &str, duration_s: f64) -> Scenario {
    let text = format!(
        "seed = 3\nduration_s = {duration_s}\npolicies = [\"none\", \"sfq\"]\n[device]\nmodel = \"ssd\"\npreset = \"nvme-p4500\"\ncapacity_gib = 1\n{tenants}"
    );
    let path = dir.join("s.toml");
    std::fs::write(&path, text).unwrap();
    Scenario::load(&path).unwrap().remove(0)
}

fn tenant<'a>(
    r: &'a ioshare::metrics::ScenarioResult,
    policy: &str,
    name: &str,
) -> &'a TenantResult {
    r.runs
        .iter()
        .find(|run| run.policy == policy)
        .unwrap()
        .tenants
        .iter()
        .find(|t| t.name == name)
        .unwrap()
}

#[test]
fn a_trace_replays_every_record_once_and_identically() {
    let dir = tempfile::tempdir().unwrap();
    msr_trace(&dir.path().join("t.csv"), 3000);
    let s = scenario(
        dir.path(),
        "[[tenant]]\nname = \"reads\"\nworkload = { trace = \"t.csv\", select = { disk = 0 }, timing = \"closed\", iodepth = 4 }\n\
         [[tenant]]\nname = \"all\"\nworkload = { trace = \"t.csv\", timing = \"closed\", iodepth = 2 }\n",
        2.0,
    );
    let a = run_scenario(&s, false).unwrap();
    let b = run_scenario(&s, false).unwrap();
    for policy in ["none", "sfq"] {
        let reads = tenant(&a, policy, "reads");
        let all = tenant(&a, policy, "all");
        // Closed loops finish a few thousand requests in well under the run: every record
        // issued once and completed (no warm-up, so every completion is counted).
        assert_eq!(reads.ios, 1500, "{policy}");
        assert_eq!(all.ios, 3000, "{policy}");
        assert_eq!(reads.trace.as_ref().unwrap().records, 1500);
        assert_eq!(all.trace.as_ref().unwrap().passes, 1);
        // disk 0's reads: sizes 4, 16, 8 KiB cycling over every other record.
        assert_eq!(reads.bytes, 500 * (4096 + 16384 + 8192));
        assert_eq!(all.bytes, 1000 * (4096 + 8192 + 16384));
    }
    let strip = |r: &ioshare::metrics::ScenarioResult| {
        let mut v = serde_json::to_value(r).unwrap();
        for run in v["runs"].as_array_mut().unwrap() {
            run["sim"].as_object_mut().unwrap().remove("wall_seconds");
        }
        v
    };
    assert_eq!(
        strip(&a),
        strip(&b),
        "a replay is as deterministic as a drawn workload"
    );
}

#[test]
fn original_timing_issues_at_the_traces_times_scaled_by_speed() {
    let dir = tempfile::tempdir().unwrap();
    // 3000 records 1 ms apart: 3 s of trace.
    msr_trace(&dir.path().join("t.csv"), 3000);
    let s = scenario(
        dir.path(),
        "[[tenant]]\nname = \"x1\"\nworkload = { trace = \"t.csv\" }\n\
         [[tenant]]\nname = \"x2\"\nworkload = { trace = \"t.csv\", speed = 2.0 }\n\
         [[tenant]]\nname = \"looped\"\nworkload = { trace = \"t.csv\", speed = 4.0, loop = true, select = { from_s = 1.0, to_s = 1.5 } }\n",
        1.0,
    );
    let r = run_scenario(&s, false).unwrap();
    let (x1, x2, looped) = (
        tenant(&r, "none", "x1"),
        tenant(&r, "none", "x2"),
        tenant(&r, "none", "looped"),
    );
    // In 1 s: records stamped 0..1 s (1000 of them, the last completing before the end),
    // twice as many at speed 2.
    assert_eq!(
        x1.trace.as_ref().unwrap().records,
        1001,
        "the next record is read ahead"
    );
    assert_eq!(x1.ios, 1000);
    assert_eq!(x2.ios, 2000);
    // A 0.5 s slice (500 records) at speed 4 lasts 0.125 s, passes a mean gap apart:
    // eight passes in the second, the ninth opened for its first record, due at 1 s.
    let t = looped.trace.as_ref().unwrap();
    assert_eq!((t.passes, t.records), (9, 4001), "{t:?}");
    assert_eq!(looped.ios, 4000);
}

#[test]
fn a_capture_of_the_server_replays_in_the_simulator_unchanged() {
    use ioshare::iolog::{self, Action, Entry};
    let dir = tempfile::tempdir().unwrap();
    let files = vec!["vm1".to_string(), "vm2".to_string()];
    let mut text = iolog::start(&files);
    for i in 0..400u64 {
        let action = match i / 2 % 4 {
            0 => Action::Read,
            1 | 2 => Action::Write,
            _ => Action::Datasync,
        };
        let (offset, len) = if action == Action::Datasync {
            (0, 0)
        } else {
            (i * 4096, 4096)
        };
        iolog::push(
            &mut text,
            &Entry {
                time_us: i * 500,
                file: files[(i % 2) as usize].clone(),
                action,
                offset,
                len,
                fua: i % 8 == 1,
                zero: false,
            },
        );
    }
    text.push_str(&iolog::finish(&files, 200_000));
    std::fs::write(dir.path().join("cap.log"), &text).unwrap();
    let s = scenario(
        dir.path(),
        "[[tenant]]\nname = \"vm1\"\nworkload = { trace = \"cap.log\", select = { volume = 0 } }\n\
         [[tenant]]\nname = \"vm2\"\nworkload = { trace = \"cap.log\", select = { volume = 1 } }\n",
        0.5,
    );
    assert!(
        s.tenants[0].workload.label.contains("fio3"),
        "{}",
        s.tenants[0].workload.label
    );
    let r = run_scenario(&s, false).unwrap();
    for name in ["vm1", "vm2"] {
        let t = tenant(&r, "none", name);
        let replay = t.trace.as_ref().unwrap();
        assert_eq!((replay.records, replay.skipped), (200, 0), "{name}");
        // 200 requests 1 ms apart on each export, flushes among them: all done in 0.5 s.
        assert_eq!(t.ios, 200, "{name}");
        // 50 reads and 100 writes of 4 KiB, 50 flushes.
        assert_eq!(t.bytes, 150 * 4096, "{name}");
    }
}

#[test]
fn fio_replays_a_converted_trace_against_an_nbd_export() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    msr_trace(&trace, 400);
    let iolog = dir.path().join("t.iolog");
    let out = ioshare()
        .args([
            "trace",
            "convert",
            trace.to_str().unwrap(),
            iolog.to_str().unwrap(),
            "--to",
            "fio3",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("400 records written"));
    let socket = dir.path().join("nbd.sock");
    let mut nbdkit = Command::new("nbdkit")
        .args(["-f", "-U", socket.to_str().unwrap(), "memory", "64M"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nbdkit (./test.sh installs it)");
    for _ in 0..200 {
        if socket.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    let out = Command::new("fio")
        .args([
            "--name=replay",
            "--ioengine=nbd",
            &format!("--uri=nbd+unix:///?socket={}", socket.display()),
            &format!("--read_iolog={}", iolog.display()),
            "--replay_no_stall=1",
            "--output-format=json",
        ])
        .output()
        .expect("fio (./test.sh installs it)");
    let _ = nbdkit.kill();
    let _ = nbdkit.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // fio's nbd engine says "fio: connected to NBD server" before the JSON.
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0);
    // 200 reads and 200 writes, sizes cycling 4, 8, 16 KiB.
    assert_eq!(job["read"]["total_ios"], 200);
    assert_eq!(job["write"]["total_ios"], 200);
    let bytes =
        job["read"]["io_bytes"].as_u64().unwrap() + job["write"]["io_bytes"].as_u64().unwrap();
    assert_eq!(bytes, 133 * (4096 + 8192 + 16384) + 4096);
}

#[test]
fn trace_stats_prints_exact_figures_and_names_bad_lines() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    msr_trace(&trace, 300);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&trace)
        .unwrap();
    writeln!(f, "1,src1,0,Erase,0,4096,1").unwrap();
    let page = dir.path().join("stats.html");
    let out = ioshare()
        .args([
            "trace",
            "stats",
            "--json",
            trace.to_str().unwrap(),
            "--html",
            page.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(html.matches("<svg").count(), 3, "IOPS, sizes and gaps");
    assert!(html.contains("<td>requests</td><td>300</td>"), "{html}");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &v[0];
    assert_eq!(s["format"], "msr");
    assert_eq!(
        (
            s["requests"].as_u64(),
            s["skipped"].as_u64(),
            s["lines"].as_u64()
        ),
        (Some(300), Some(1), Some(301))
    );
    assert_eq!(s["reads"]["requests"], 150);
    assert_eq!(s["volumes"], 2);
    assert_eq!(s["span_s"], 0.299);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("t.csv:301: type 'Erase': expected Read or Write"),
        "{err}"
    );
    let out = ioshare()
        .args(["trace", "stats", "--strict", trace.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(":301: type 'Erase'"));
    let out = ioshare()
        .args(["trace", "stats", "--format", "csv", trace.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("unknown trace format 'csv' (known: auto, msr,")
    );
}

#[test]
fn trace_workloads_refuse_what_does_not_apply() {
    let dir = tempfile::tempdir().unwrap();
    msr_trace(&dir.path().join("t.csv"), 10);
    for (workload, problem) in [
        (
            "{ trace = \"t.csv\", pattern = \"randread\" }",
            "workload.pattern: does not apply to a trace workload",
        ),
        (
            "{ trace = \"t.csv\", iodepth = 4 }",
            "workload.iodepth: applies to timing = \"closed\"",
        ),
        (
            "{ trace = \"t.csv\", timing = \"fast\" }",
            "expected \"original\" or \"closed\"",
        ),
        (
            "{ trace = \"t.csv\", speed = 0.0 }",
            "workload.speed: must be in (0",
        ),
        (
            "{ trace = \"t.csv\", select = { disk = 0, volume = 0 } }",
            "select.disk",
        ),
        (
            "{ trace = \"t.csv\", select = { from_s = 2.0, to_s = 1.0 } }",
            "select.to_s: must be after from_s",
        ),
        ("{ trace = \"t.csv\", format = \"umass\" }", ""),
        ("{ trace = \"missing.csv\" }", "missing.csv: cannot open it"),
        (
            "{ pattern = \"randread\", remap = \"wrap\" }",
            "workload.remap: applies to a trace workload",
        ),
    ] {
        let text = format!(
            "duration_s = 1\npolicies = [\"none\"]\n[device]\nmodel = \"ssd\"\npreset = \"nvme-p4500\"\ncapacity_gib = 1\n[[tenant]]\nname = \"a\"\nworkload = {workload}\n"
        );
        let path = dir.path().join("s.toml");
        std::fs::write(&path, text).unwrap();
        match Scenario::load(&path) {
            Ok(_) => assert!(problem.is_empty(), "{workload}: accepted"),
            Err(e) => assert!(
                !problem.is_empty() && e.to_string().contains(problem),
                "{workload}: {e}"
            ),
        }
    }
}

/// The shipped `*-trace.toml` scenarios say which variable to set when it is not, and run
/// on a trace when it is.
#[test]
fn the_trace_scenarios_take_their_trace_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    msr_trace(&trace, 2000);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for name in ["mcfq-trace", "feedbac-trace"] {
        let scenario = root.join(format!("scenarios/{name}.toml"));
        let out = ioshare()
            .args([
                "sim",
                scenario.to_str().unwrap(),
                "-q",
                "--duration",
                "0.3",
                "--policy",
                "sfq",
            ])
            .env_remove("IOSHARE_TRACE")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("the environment variable IOSHARE_TRACE is not set"),
            "{name}: {err}"
        );
        let out = ioshare()
            .args([
                "sim",
                scenario.to_str().unwrap(),
                "-q",
                "--duration",
                "5.2",
                "--policy",
                "sfq",
            ])
            .env("IOSHARE_TRACE", &trace)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("trace t.csv (msr, closed qd"),
            "{name}: {text}"
        );
    }
}

/// The stand-ins are what they say: `trace stats` on a stand-in's own requests gives
/// its table's read fraction and mean size.
#[test]
fn the_stand_ins_match_their_tables_by_trace_stats() {
    use ioshare::trace::{Record, stats::Collector};
    use ioshare::workload::{Generator, WorkloadConfig, standins};
    for name in standins::names() {
        let s = standins::standin(name).unwrap();
        let w = WorkloadConfig::Named(name.to_string()).resolve().unwrap();
        let mut g = Generator::new(1, 1, 0, 1 << 34);
        let mut c = Collector::new();
        let n = 200_000u64;
        for i in 0..n {
            let (op, offset, len) = g.next_io(&w.phases[0]);
            c.add(&Record {
                time: i * 1000,
                op,
                offset,
                len,
                volume: 0,
            });
        }
        let st = c.finish();
        assert_eq!(st.requests, n);
        // Sampling error of 200,000 draws: well under a point of read fraction, and the
        // mean size within 1 % of the table's.
        assert!(
            (st.read_fraction - s.read_mix).abs() < 0.005,
            "{name}: {} vs {}",
            st.read_fraction,
            s.read_mix
        );
        let mean = s.mean_size as f64;
        assert!(
            (st.mean_size - mean).abs() / mean < 0.01,
            "{name}: {} vs {mean}",
            st.mean_size
        );
    }
}

/// A bad line: skipped and said (results.json keeps it), or, with `on_error = "stop"`,
/// the end of that tenant's replay and a failing exit after the report is written.
#[test]
fn a_bad_line_is_skipped_and_said_or_stops_the_run_with_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    msr_trace(&trace, 100);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&trace)
        .unwrap();
    writeln!(f, "1,src1,0,Read,0,4096").unwrap();
    msr_trace(&dir.path().join("tail.csv"), 10);
    let tail = std::fs::read_to_string(dir.path().join("tail.csv")).unwrap();
    write!(f, "{tail}").unwrap();
    drop(f);
    for (on_error, ok) in [("skip", true), ("stop", false)] {
        let text = format!(
            "duration_s = 1\npolicies = [\"none\"]\n[device]\nmodel = \"ssd\"\npreset = \"nvme-p4500\"\ncapacity_gib = 1\n[[tenant]]\nname = \"a\"\nworkload = {{ trace = \"t.csv\", timing = \"closed\", on_error = \"{on_error}\" }}\n"
        );
        std::fs::write(dir.path().join("s.toml"), text).unwrap();
        let out_dir = dir.path().join(format!("out-{on_error}"));
        let out = ioshare()
            .args([
                "sim",
                dir.path().join("s.toml").to_str().unwrap(),
                "-q",
                "--out",
                out_dir.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.success(), ok, "{on_error}: {err}");
        assert!(
            err.contains("t.csv:101: only 6 of the 7 fields"),
            "{on_error}: {err}"
        );
        let results: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out_dir.join("results.json")).unwrap())
                .unwrap();
        let replay = &results["runs"][0]["tenants"][0]["trace"];
        if ok {
            assert_eq!(
                (replay["records"].as_u64(), replay["skipped"].as_u64()),
                (Some(110), Some(1))
            );
            assert!(replay["stopped"].is_null());
        } else {
            assert_eq!(replay["records"], 100);
            assert!(
                replay["stopped"]
                    .as_str()
                    .unwrap()
                    .ends_with("t.csv:101: only 6 of the 7 fields")
            );
        }
    }
}
