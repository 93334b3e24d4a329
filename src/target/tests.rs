use super::*;
use crate::characterize::Bench;
use crate::characterize::runner::{LiveRunner, Runner};

const MIB: u64 = 1 << 20;

fn request(id: u64, op: Op, offset: u64, len: u32) -> Request {
    Request {
        id,
        tenant: 0,
        op,
        offset,
        len,
        arrival: 0,
        cost: 0,
    }
}

/// Runs a device until everything submitted has come back; the completions.
fn settle(dev: &mut RingDevice, expected: usize) -> Vec<Finished> {
    let mut done = Vec::new();
    while done.len() < expected && dev.failure().is_none() {
        dev.wait(dev.now() + 1_000_000_000);
        let now = dev.now();
        dev.advance(now, &mut done);
    }
    done
}

/// A path that does not exist is created at the size asked for, filled, and removed
/// when the target is dropped.
#[test]
fn a_new_file_is_created_filled_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.img");
    let t = Target::open(&path, Some(5 * MIB), true, false).unwrap();
    assert_eq!(t.kind, Kind::File { created: true });
    assert_eq!(t.size, 4 * MIB, "down to 2 MiB");
    t.fill(false).unwrap();
    let data = std::fs::read(&path).unwrap();
    assert!(data[..4 * MIB as usize].iter().any(|&b| b != 0), "filled");
    drop(t);
    assert!(!path.exists());
}

/// Aging writes `passes` × the size in random 4 KiB blocks (seeded), over the data
/// the fill wrote.
#[test]
fn aging_overwrites_random_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let t = Target::open(&dir.path().join("t.img"), Some(4 * MIB), true, false).unwrap();
    t.fill(false).unwrap();
    let before = std::fs::read(&t.path).unwrap();
    t.age(0.5, false).unwrap();
    let after = std::fs::read(&t.path).unwrap();
    let changed = before
        .chunks(4096)
        .zip(after.chunks(4096))
        .filter(|(a, b)| a != b)
        .count();
    // 512 writes over 1024 blocks: about 1 − e^(−0.5) ≈ 39 % of them, seeded.
    assert!((300..=500).contains(&changed), "{changed} blocks changed");
    assert!(t.age(0.0, false).is_err());
}

/// A file too small to measure is refused before it is made; a size for a path that
/// exists is a mistake, not ignored.
#[test]
fn size_mistakes_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.img");
    let e = Target::open(&path, Some(MIB), true, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("at least 2 MiB"), "{e}");
    assert!(!path.exists());
    std::fs::write(&path, vec![0u8; 4 * MIB as usize]).unwrap();
    let e = Target::open(&path, Some(8 * MIB), true, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not exist"), "{e}");
}

/// A file it did not create is written only when told to, and is left in place.
#[test]
fn an_existing_file_is_written_only_when_told_to() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keep.img");
    std::fs::write(&path, vec![7u8; 4 * MIB as usize]).unwrap();
    let e = Target::open(&path, None, true, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--destroy-data"), "{e}");
    let t = Target::open(&path, None, false, false).unwrap();
    assert_eq!(t.kind, Kind::File { created: false });
    drop(t);
    let t = Target::open(&path, None, true, true).unwrap();
    drop(t);
    assert!(path.exists(), "not created here, not removed");
    let e = Target::open(&dir.path().join("missing"), None, true, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--size"), "{e}");
}

/// Requests go to the file and come back; what a write wrote a read reads; a request
/// past the end or out of alignment fails the device with a reason.
#[test]
fn requests_complete_and_mistakes_fail_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let t = Target::open(&dir.path().join("t.img"), Some(4 * MIB), true, false).unwrap();
    let mut dev = t.device().unwrap();
    assert_eq!(
        dev.submit(&request(1, Op::Write, 0, 65536), 0),
        Submitted::Queued
    );
    let done = settle(&mut dev, 1);
    assert_eq!(done.len(), 1);
    assert_eq!(dev.failure(), None);
    let _ = dev.submit(&request(2, Op::Read, MIB, 4096), dev.now());
    let _ = dev.submit(&request(3, Op::Read, 2 * MIB, 4096), dev.now());
    let done = settle(&mut dev, 2);
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|f| f.finish >= f.submitted));
    let written = std::fs::read(&t.path).unwrap();
    // Each 4 KiB block stamped with a count, the rest pseudo-random.
    // (Stamps count over the process: consecutive from the first block's.)
    let first = u64::from_le_bytes(written[..8].try_into().unwrap());
    for (i, block) in written[..65536].chunks(4096).enumerate() {
        assert_eq!(block[..8], (first + i as u64).to_le_bytes(), "block {i}");
        assert!(block[8..].iter().any(|&b| b != 0));
    }
    // Refused requests complete at once without going to the file.
    let _ = dev.submit(&request(4, Op::Read, 4 * MIB, 4096), dev.now());
    let why = dev.failure().unwrap();
    assert!(why.contains("past the target"), "{why}");
    let mut done = Vec::new();
    let now = dev.now();
    dev.advance(now, &mut done);
    assert_eq!(done.len(), 1);
    assert_eq!(
        std::fs::metadata(&t.path).unwrap().len(),
        4 * MIB,
        "not extended"
    );
}

/// A target opened for reading refuses writes.
#[test]
fn a_read_only_target_fails_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.img");
    std::fs::write(&path, vec![1u8; 4 * MIB as usize]).unwrap();
    let t = Target::open(&path, None, false, false).unwrap();
    let mut dev = t.device().unwrap();
    let _ = dev.submit(&request(1, Op::Write, 0, 4096), 0);
    let _ = settle(&mut dev, 1);
    assert!(dev.failure().unwrap().contains("opened for reading"));
    assert_eq!(std::fs::read(&path).unwrap(), vec![1u8; 4 * MIB as usize]);
}

/// The simulator's driver runs a scenario on a real file in wall time: both tenants
/// move data, the measured span is the scenario's, latencies are real.
#[test]
fn a_scenario_runs_on_a_file_in_wall_time() {
    let dir = tempfile::tempdir().unwrap();
    let t = Target::open(&dir.path().join("t.img"), Some(16 * MIB), true, false).unwrap();
    t.fill(false).unwrap();
    let mut runner = LiveRunner {
        target: t,
        cost_device: None,
    };
    let device = runner.device();
    let policies = ["\"none\"".to_string(), "\"sfq\"".to_string()];
    let bench = Bench {
        device: &device,
        seed: 1,
        seconds: 0.4,
        warmup: 0.1,
        interval: 0.1,
        queue_depth: Some(8),
        policies: &policies,
    };
    let s = bench
        .scenario(&[
            (
                "r",
                "{ pattern = \"randread\", size = \"4k\", iodepth = 2 }".into(),
            ),
            (
                "w",
                "{ pattern = \"write\", size = \"64k\", iodepth = 1 }".into(),
            ),
        ])
        .unwrap();
    let started = std::time::Instant::now();
    let runs = runner.run(&[s], false).unwrap();
    let took = started.elapsed().as_secs_f64();
    assert!(took >= 0.8, "two runs of 0.4 s in wall time, took {took}");
    assert_eq!(runs.len(), 2);
    for r in &runs {
        for t in &r.tenants {
            assert!(
                t.ios > 0 && t.bandwidth_bytes_per_s > 0.0,
                "{}: {t:?}",
                r.policy
            );
            assert!(t.latency_us.p50 > 0.0);
        }
    }
}

/// A block device holding the mounted root file system is found mounted (skipped
/// where the root is not on a block device, as in some containers).
#[test]
fn the_root_file_systems_device_is_mounted() {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let Some(root) = info
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 4 && f[4] == "/")
    else {
        return;
    };
    let Some((major, minor)) = root[2].split_once(':') else {
        return;
    };
    if !Path::new(&format!("/sys/dev/block/{}", root[2])).exists() {
        eprintln!("the root is not on a block device: skipped");
        return;
    }
    let rdev = libc::makedev(major.parse().unwrap(), minor.parse().unwrap());
    assert_eq!(mounted(rdev).unwrap().as_deref(), Some("/"));
}
