//! The live server with real NBD clients: nbdinfo, qemu-img, qemu-io, fio's nbd engine,
//! nbdcopy (./test.sh installs them), and raw protocol bytes for the error paths.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `server.threads` for every server these tests start: `IOSHARE_TEST_THREADS`, 2 when
/// unset (so that the engine's shards are exercised on any machine); `./test.sh` runs
/// these tests again with 1.
fn threads_line() -> String {
    let n = std::env::var("IOSHARE_TEST_THREADS").unwrap_or_else(|_| "2".into());
    format!("threads = {n}\n")
}

/// A running `ioshare serve` in its own folder.
struct Server {
    child: Child,
    socket: PathBuf,
}

impl Server {
    fn start(dir: &Path, config: &str) -> Server {
        Server::start_with(dir, config, &[])
    }

    /// With more arguments after `serve CONFIG`.
    fn start_with(dir: &Path, config: &str, args: &[&str]) -> Server {
        Server::start_limited(dir, config, args, None)
    }

    /// With at most `nofile` descriptors (`ulimit -n`), when given.
    fn start_limited(dir: &Path, config: &str, args: &[&str], nofile: Option<u64>) -> Server {
        Server::start_env(dir, config, args, nofile, &[])
    }

    /// With environment variables set for the server.
    fn start_env(
        dir: &Path,
        config: &str,
        args: &[&str],
        nofile: Option<u64>,
        env: &[(&str, &str)],
    ) -> Server {
        let cfg = dir.join("serve.toml");
        std::fs::write(
            &cfg,
            format!(
                "[server]\nunix = \"s.sock\"\ninterval_s = 0\n{}{config}",
                // A test that sets its own keeps it.
                if config.contains("threads =") {
                    String::new()
                } else {
                    threads_line()
                }
            ),
        )
        .unwrap();
        let socket = dir.join("s.sock");
        let mut command = Command::new(env!("CARGO_BIN_EXE_ioshare"));
        command
            .arg("serve")
            .arg(&cfg)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
            unsafe {
                command.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command.spawn().unwrap();
        let t = Instant::now();
        while UnixStream::connect(&socket).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                panic!("server exited at start ({status}): {err}");
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The control socket is bound after the exports' listeners: ready once it is
        // there too.
        if let Some(name) = config
            .lines()
            .find_map(|l| l.trim().strip_prefix("control = \""))
            .and_then(|r| r.split('"').next())
        {
            let control = dir.join(name);
            while !control.exists() {
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "the control socket did not appear"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Server { child, socket }
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    /// SIGTERM; the server must exit 0. Returns what it wrote to stderr.
    fn stopped(self) -> String {
        let (status, err) = self.stop();
        assert!(status.success(), "{err}");
        err
    }

    /// SIGTERM; returns the exit status and what the server wrote to stderr.
    fn stop(self) -> (std::process::ExitStatus, String) {
        let (status, _, err) = self.stop_with_stdout();
        (status, err)
    }

    /// SIGTERM; the exit status, stdout and stderr. A server still running a minute
    /// later is killed (a failed status, and stderr says so): a drain that hangs fails
    /// the test instead of hanging it.
    fn stop_with_stdout(mut self) -> (std::process::ExitStatus, String, String) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let give_up = Instant::now() + Duration::from_secs(60);
        let mut hung = false;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > give_up {
                hung = true;
                let _ = self.child.kill();
                break self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        if hung {
            err.push_str("the server did not stop within 60 s of SIGTERM; killed\n");
        }
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        (status, out, err)
    }
}

impl Server {
    /// SIGKILL (no drain, no sync); what the server wrote to stderr until then.
    fn killed(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        err
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tempdir() -> tempfile::TempDir {
    // Under target/: a real file system (O_DIRECT works there, unlike on tmpfs).
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("{cmd:?}: {e} (./test.sh installs fio, qemu-utils, libnbd-bin, nbdkit)")
    });
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const TWO_TENANTS: &str = r#"
[[tenant]]
name = "vm1"
file = "vm1.img"
create = true
size = "64m"
weight = 2
slo = { iops = 200000.0, size = 4096, rt_us = 1000000 }
reservation_iops = 100.0
[[tenant]]
name = "vm2"
file = "vm2.img"
create = true
size = "32m"
slo = { iops = 200000.0, size = 4096, rt_us = 1000000 }
reservation_iops = 100.0
"#;

#[test]
fn nbdinfo_lists_and_qemu_img_opens_every_export() {
    let dir = tempdir();
    let s = Server::start(dir.path(), TWO_TENANTS);
    let list = stdout(&run(Command::new("nbdinfo").arg("--list").arg(s.uri(""))));
    assert!(
        list.contains("export=\"vm1\"") && list.contains("export-size: 67108864"),
        "{list}"
    );
    assert!(
        list.contains("export=\"vm2\"") && list.contains("export-size: 33554432"),
        "{list}"
    );
    let info = stdout(&run(Command::new("qemu-img").arg("info").arg(s.uri("vm2"))));
    assert!(
        info.contains("virtual size: 32 MiB (33554432 bytes)"),
        "{info}"
    );
    s.stopped();
}

fn fio_verify(uri: &str, bs: &str, size: &str) -> Command {
    let mut c = Command::new("fio");
    c.args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        &format!("--bs={bs}"),
        "--iodepth=16",
        &format!("--size={size}"),
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        // No verify-state file in the working directory.
        "--verify_state_save=0",
    ]);
    c
}

#[test]
fn fio_verifies_under_every_policy() {
    for policy in ioshare::policy::names() {
        let dir = tempdir();
        let s = Server::start(dir.path(), &format!("policy = \"{policy}\"\n{TWO_TENANTS}"));
        let a = fio_verify(&s.uri("vm1"), "4k", "8m").output().unwrap();
        let b = run(&mut fio_verify(&s.uri("vm2"), "16k", "8m"));
        assert!(
            a.status.success(),
            "{policy}: {}",
            String::from_utf8_lossy(&a.stderr)
        );
        for out in [&a, &b] {
            assert!(stdout(out).contains("err= 0"), "{policy}: {}", stdout(out));
        }
        let (status, err) = s.stop();
        assert!(status.success(), "{policy}: {err}");
        assert!(err.contains("0 errors, 0 refused"), "{policy}: {err}");
    }
}

/// CPU time each engine thread of process `pid` has run, nanoseconds, by thread name.
fn engine_cpu(pid: u32) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let path = task.unwrap().path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let name = name.trim().to_string();
        if name != "engine" && !name.starts_with("engine-") {
            continue;
        }
        let stat = std::fs::read_to_string(path.join("schedstat")).unwrap_or_default();
        let ns = stat
            .split(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        out.push((name, ns));
    }
    out.sort();
    out
}

/// `server.threads = 3`: three engine threads, each with its own ring. Three
/// connections open at once go one to each thread, and each thread does work for its
/// own; then four fio verify jobs of two tenants under a policy that queues (SFQ at
/// depth 4, so a completion on one thread dispatches a request of another's
/// connection) are served between them, every byte checked.
#[test]
fn engine_threads_share_the_connections_and_keep_every_byte() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        &format!("threads = 3\npolicy = {{ name = \"sfq\", depth = 4 }}\n{TWO_TENANTS}"),
    );
    let pid = s.child.id();
    let before = engine_cpu(pid);
    let names: Vec<&str> = before.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["engine", "engine-1", "engine-2"], "{before:?}");
    let mut conns: Vec<Raw> = ["vm1", "vm2", "vm1"]
        .iter()
        .map(|export| {
            let mut c = Raw::connect(&s);
            assert_eq!(c.go(export).last(), Some(&1), "{export}");
            c
        })
        .collect();
    for round in 0..300u64 {
        for (i, c) in conns.iter_mut().enumerate() {
            // Each its own 4 KiB blocks (vm1's two connections too).
            let at = (i as u64 * 1024 + round % 1024) * 4096;
            let data = vec![(round + i as u64) as u8; 4096];
            c.request(1, round, at, 4096, &data);
            assert_eq!(c.reply(0), (round, 0));
            c.request(0, round, at, 4096, &[]);
            assert_eq!(c.reply_bytes(4096), (round, 0, data));
        }
    }
    let served = engine_cpu(pid);
    for ((name, a), (_, b)) in before.iter().zip(&served) {
        assert!(
            b - a > 100_000,
            "{name} did no work: {before:?} -> {served:?}"
        );
    }
    drop(conns);
    // Two jobs an export, each in its own 8 MiB of it.
    let jobs = [
        ("vm1", "4k", "0"),
        ("vm1", "16k", "8m"),
        ("vm2", "4k", "0"),
        ("vm2", "64k", "8m"),
    ];
    let mut jobs: Vec<_> = jobs
        .iter()
        .map(|(export, bs, offset)| {
            let mut c = fio_verify(&s.uri(export), bs, "8m");
            c.arg(format!("--offset={offset}"));
            c.stdout(Stdio::piped()).stderr(Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    for job in jobs.drain(..) {
        let out = job.wait_with_output().unwrap();
        assert!(stdout(&out).contains("err= 0"), "{}", stdout(&out));
    }
    let (status, err) = s.stop();
    assert!(status.success(), "{err}");
    assert!(err.contains("0 errors, 0 refused"), "{err}");
}

#[test]
fn cache_none_serves_unaligned_requests() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        &format!("[backend]\ncache = \"none\"\n{TWO_TENANTS}"),
    );
    for bs in ["1000", "4k", "3584"] {
        let out = run(&mut fio_verify(&s.uri("vm1"), bs, "2m"));
        assert!(stdout(&out).contains("err= 0"), "{bs}: {}", stdout(&out));
    }
    assert!(s.stop().0.success());
}

/// Long reads are sent from their own buffers and long write payloads are received
/// into theirs: both cache modes, aligned and unaligned, pooled sizes and larger.
#[test]
fn large_requests_round_trip_in_both_cache_modes() {
    for cache in ["none", "writeback"] {
        let dir = tempdir();
        let s = Server::start(
            dir.path(),
            &format!("[backend]\ncache = \"{cache}\"\n{TWO_TENANTS}"),
        );
        for bs in ["17000", "128k", "2m"] {
            let out = run(&mut fio_verify(&s.uri("vm1"), bs, "16m"));
            assert!(
                stdout(&out).contains("err= 0"),
                "{cache} {bs}: {}",
                stdout(&out)
            );
        }
        let (status, err) = s.stop();
        assert!(status.success(), "{cache}: {err}");
        assert!(err.contains("0 errors, 0 refused"), "{cache}: {err}");
    }
}

/// `cache = "pdc"`: a region written sequentially three times over is a circular log;
/// once it is found its writes go O_DIRECT and their range is dropped from the page
/// cache, while everything else stays cached. fio verifies every byte through both
/// paths: the log's passes (the last ones direct, read back through the cache), then
/// random aligned and unaligned writes over the whole export, the log's extent
/// included.
#[test]
fn pdc_keeps_every_byte_across_the_direct_and_cached_paths() {
    let dir = tempdir();
    let capture = dir.path().join("cap.log");
    let report = dir.path().join("out");
    // vm1 takes the server's pdc, vm2 (the last table) says none.
    let s = Server::start_with(
        dir.path(),
        &format!(
            "[backend]\ncache = \"pdc\"\n[backend.pdc]\ngroup = \"16m\"\n{TWO_TENANTS}cache = \"none\"\n"
        ),
        &[
            "--capture",
            capture.to_str().unwrap(),
            "--out",
            report.to_str().unwrap(),
        ],
    );
    let mut log = fio_verify(&s.uri("vm1"), "64k", "8m");
    log.args(["--rw=write", "--loops=3"]);
    let out = run(&mut log);
    assert!(stdout(&out).contains("err= 0"), "{}", stdout(&out));
    for bs in ["4k", "1000", "128k"] {
        let mut f = fio_verify(&s.uri("vm1"), bs, "64m");
        f.arg("--number_ios=2000");
        let out = run(&mut f);
        assert!(stdout(&out).contains("err= 0"), "{bs}: {}", stdout(&out));
    }
    let out = run(&mut fio_verify(&s.uri("vm2"), "4k", "8m"));
    assert!(stdout(&out).contains("err= 0"), "{}", stdout(&out));
    let err = s.stopped();
    assert!(
        err.contains(
            "vm1: group 0 holds a circular log (the guest's journal) at bytes 0–8388608 (8 MiB)"
        ),
        "{err}"
    );
    assert_eq!(err.matches("holds a circular log").count(), 1, "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("ioshare: vm1:") && l.contains("pdc:"))
        .unwrap();
    assert!(
        line.contains("0 errors") && line.contains("1 journal group(s)"),
        "{line}"
    );
    assert!(!line.contains(", 0 B bypassed"), "{line}");
    // The capture holds each request once, in fio's format.
    let text = std::fs::read_to_string(&capture).unwrap();
    let entries = ioshare::iolog::parse(&text).unwrap();
    let requests: usize = line
        .trim_start_matches("ioshare: vm1: ")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(entries.iter().filter(|e| e.file == "vm1").count(), requests);
    // The log's three passes, in order.
    let passes: Vec<u64> = entries
        .iter()
        .filter(|e| e.file == "vm1" && e.action == ioshare::iolog::Action::Write)
        .take(3 * 128)
        .map(|e| e.offset)
        .collect();
    let pass: Vec<u64> = (0..128).map(|i| i * 65536).collect();
    assert_eq!(passes, [pass.clone(), pass.clone(), pass].concat());
    assert!(err.contains("--capture:"), "{err}");
    // results.json says the same per tenant.
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.join("results.json")).unwrap())
            .unwrap();
    let cache = &results["runs"][0]["host_cache"];
    assert_eq!(cache[0]["tenant"], "vm1");
    assert_eq!(cache[0]["cache"], "pdc");
    assert_eq!(cache[0]["journal_groups"], serde_json::json!([0]));
    assert_eq!(cache[0]["journal_group_bytes"], 16 << 20);
    let bypassed = cache[0]["journal_bypassed_bytes"].as_u64().unwrap();
    let writes = cache[0]["journal_writes"].as_u64().unwrap();
    assert!(
        bypassed > 0 && writes > 0 && bypassed >= writes * 4096,
        "{cache}"
    );
    assert_eq!(
        cache[1],
        serde_json::json!({ "tenant": "vm2", "cache": "none" })
    );
}

#[test]
fn nbdcopy_round_trip_and_regions_stay_isolated() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        r#"
[backend]
path = "shared.img"
[[tenant]]
name = "a"
offset = 0
size = "8m"
[[tenant]]
name = "b"
offset = "8m"
size = "8m"
"#,
    );
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let src = dir.path().join("src.img");
    std::fs::write(&src, &data).unwrap();
    run(Command::new("nbdcopy").arg(&src).arg(s.uri("b")));
    let back = dir.path().join("back.img");
    run(Command::new("nbdcopy").arg(s.uri("b")).arg(&back));
    assert!(std::fs::read(&back).unwrap() == data, "b read back differs");
    let a = dir.path().join("a.img");
    run(Command::new("nbdcopy").arg(s.uri("a")).arg(&a));
    assert!(
        std::fs::read(&a).unwrap().iter().all(|&x| x == 0),
        "b's bytes leaked into a"
    );
    assert!(s.stop().0.success());
    let shared = std::fs::read(dir.path().join("shared.img")).unwrap();
    assert!(
        shared[8 << 20..] == data[..],
        "b is bytes 8..16 MiB of the shared file"
    );
}

#[test]
fn flushed_data_survives_sigkill() {
    let dir = tempdir();
    let s = Server::start(dir.path(), TWO_TENANTS);
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0xab 4096 65536", "-c", "flush"])
        .arg(s.uri("vm1")));
    drop(s); // SIGKILL
    let s = Server::start(dir.path(), TWO_TENANTS);
    let out = run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0xab 4096 65536"])
        .arg(s.uri("vm1")));
    assert!(
        !stdout(&out).contains("Pattern verification failed"),
        "{}",
        stdout(&out)
    );
    assert!(s.stop().0.success());
}

/// A server started again at once after a SIGKILL takes the images' locks: the killed
/// one's rings may hold the files for a moment, and the lock is waited for, not
/// refused.
#[test]
fn a_restart_right_after_a_kill_takes_the_images_lock() {
    let dir = tempdir();
    let mut s = Server::start(dir.path(), TWO_TENANTS);
    for round in 0..5 {
        run(Command::new("qemu-io")
            .args(["-f", "raw", "-c", "write -P 0xcd 0 1m"])
            .arg(s.uri("vm1")));
        // Killed with writes in flight (the rings busy), as a crash finds it.
        let mut load = Command::new("fio")
            .args([
                "--name=load",
                "--ioengine=nbd",
                "--rw=randwrite",
                "--bs=64k",
                "--iodepth=32",
                "--offset=8m",
                "--size=48m",
                "--time_based",
                "--runtime=20",
            ])
            .arg(format!("--uri={}", s.uri("vm2")))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let err = s.killed();
        let _ = load.kill();
        let _ = load.wait();
        assert!(!err.contains("panicked"), "round {round}: {err}");
        s = Server::start(dir.path(), TWO_TENANTS);
    }
    let out = run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0xcd 0 1m"])
        .arg(s.uri("vm1")));
    assert!(!stdout(&out).contains("Pattern verification failed"));
    s.stopped();
}

/// A raw protocol client: fixed newstyle handshake by `NBD_OPT_GO`.
struct Raw(UnixStream);

impl Raw {
    fn connect(s: &Server) -> Raw {
        let mut c = UnixStream::connect(&s.socket).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut greeting = [0u8; 18];
        c.read_exact(&mut greeting).unwrap();
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        c.write_all(&3u32.to_be_bytes()).unwrap(); // fixed newstyle, no zeroes
        Raw(c)
    }

    fn option(&mut self, option: u32, data: &[u8]) {
        let mut b = b"IHAVEOPT".to_vec();
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.0.write_all(&b).unwrap();
    }

    /// Sends GO for `name`; returns the reply types up to the final one.
    fn go(&mut self, name: &str) -> Vec<u32> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        self.option(7, &d);
        let mut kinds = Vec::new();
        loop {
            let mut h = [0u8; 20];
            self.0.read_exact(&mut h).unwrap();
            let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
            let mut body = vec![0; len];
            self.0.read_exact(&mut body).unwrap();
            kinds.push(kind);
            if kind != 3 {
                return kinds; // ACK or an error ends the reply
            }
        }
    }

    /// The option replies up to the final one: their types.
    fn option_replies(&mut self) -> Vec<u32> {
        let mut kinds = Vec::new();
        loop {
            let mut h = [0u8; 20];
            self.0.read_exact(&mut h).unwrap();
            let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
            let mut body = vec![0; len];
            self.0.read_exact(&mut body).unwrap();
            kinds.push(kind);
            if kind != 3 && kind != 4 {
                return kinds;
            }
        }
    }

    /// Structured replies and `base:allocation` for `name`, then GO: the connection
    /// may ask for block status.
    fn go_for_status(&mut self, name: &str) {
        self.option(8, &[]);
        assert_eq!(self.option_replies(), vec![1]);
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&15u32.to_be_bytes());
        d.extend_from_slice(b"base:allocation");
        self.option(10, &d);
        assert_eq!(self.option_replies(), vec![4, 1]);
        assert_eq!(self.go(name), vec![3, 3, 1]);
    }

    /// The chunks of one structured reply: (handle, error: the first error chunk's
    /// code or 0, extents seen).
    fn status_reply(&mut self) -> (u64, u32, usize) {
        let (mut error, mut extents) = (0, 0);
        loop {
            let mut h = [0u8; 20];
            self.0.read_exact(&mut h).unwrap();
            assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), 0x668e_33ef);
            let flags = u16::from_be_bytes(h[4..6].try_into().unwrap());
            let kind = u16::from_be_bytes(h[6..8].try_into().unwrap());
            let handle = u64::from_be_bytes(h[8..16].try_into().unwrap());
            let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
            let mut body = vec![0; len];
            self.0.read_exact(&mut body).unwrap();
            match kind {
                5 => extents += (len - 4) / 8,
                k if k & 0x8000 != 0 && error == 0 => {
                    error = u32::from_be_bytes(body[..4].try_into().unwrap());
                }
                _ => {}
            }
            if flags & 1 != 0 {
                return (handle, error, extents);
            }
        }
    }

    fn request(&mut self, kind: u16, handle: u64, offset: u64, len: u32, payload: &[u8]) {
        let mut b = 0x2560_9513u32.to_be_bytes().to_vec();
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&handle.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        self.0.write_all(&b).unwrap();
        self.0.write_all(payload).unwrap();
    }

    /// (handle, error) of the next simple reply, reading `data` bytes after a success.
    /// Sends `n` 32 MiB READ headers at once and reads no reply; the server may stop
    /// reading them (that is the point): a write that times out has met its
    /// back-pressure.
    fn pipeline_big_reads(&mut self, n: u64) {
        let mut headers = Vec::new();
        for h in 0..n {
            headers.extend_from_slice(&0x2560_9513u32.to_be_bytes());
            headers.extend_from_slice(&[0, 0, 0, 0]); // flags, READ
            headers.extend_from_slice(&h.to_be_bytes());
            headers.extend_from_slice(&((h % 2) * (32 << 20)).to_be_bytes());
            headers.extend_from_slice(&(32u32 << 20).to_be_bytes());
        }
        self.0
            .set_write_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let _ = self.0.write_all(&headers);
    }

    fn reply(&mut self, data: usize) -> (u64, u32) {
        let (handle, error, _) = self.reply_bytes(data);
        (handle, error)
    }

    /// [`Raw::reply`] with the data read after a success.
    fn reply_bytes(&mut self, data: usize) -> (u64, u32, Vec<u8>) {
        let mut h = [0u8; 16];
        self.0.read_exact(&mut h).unwrap();
        assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), 0x6744_6698);
        let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let mut d = Vec::new();
        if error == 0 {
            d = vec![0; data];
            self.0.read_exact(&mut d).unwrap();
        }
        (u64::from_be_bytes(h[8..16].try_into().unwrap()), error, d)
    }
}

#[test]
fn bad_requests_get_errors_and_connections_stay_usable() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        &format!(
            "{TWO_TENANTS}\n[[tenant]]\nname = \"ro\"\nfile = \"ro.img\"\ncreate = true\nsize = \"1m\"\nread_only = true\n"
        ),
    );
    let mut c = Raw::connect(&s);
    assert_eq!(
        c.go("../vm1.img"),
        vec![(1 << 31) + 6],
        "unknown export: ERR_UNKNOWN"
    );
    assert_eq!(c.go("vm2"), vec![3, 3, 1]);
    c.request(0, 1, (32 << 20) - 512, 4096, &[]); // read past the end
    assert_eq!(c.reply(0), (1, 22));
    c.request(1, 2, 0, (32 << 20) + 1, &vec![7; (32 << 20) + 1]); // write over 32 MiB
    assert_eq!(c.reply(0), (2, 22));
    c.request(1, 3, (32 << 20) - 2, 4, b"abcd"); // write past the end
    assert_eq!(c.reply(0), (3, 28));
    c.request(1, 4, 0, 4, b"abcd");
    assert_eq!(c.reply(0), (4, 0));
    c.request(0, 5, 0, 4, &[]);
    assert_eq!(c.reply(4), (5, 0), "still usable");
    let mut ro = Raw::connect(&s);
    assert_eq!(ro.go("ro"), vec![3, 3, 1]);
    ro.request(1, 9, 0, 2, b"no");
    assert_eq!(ro.reply(0), (9, 1), "EPERM on a read-only export");
    // Garbage instead of a handshake: that client is dropped, the others go on.
    let mut bad = UnixStream::connect(&s.socket).unwrap();
    let mut greeting = [0u8; 18];
    bad.read_exact(&mut greeting).unwrap();
    bad.write_all(&[0xff; 64]).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    let _ = bad.read_to_end(&mut rest);
    c.request(0, 6, 0, 4, &[]);
    assert_eq!(c.reply(4), (6, 0));
    // The protocol's corners: a trim past the end is EINVAL (as nbdkit and qemu-nbd
    // answer it), a cache hint is taken, a fast zero is done in place or refused at once.
    c.request(4, 7, (32 << 20) - 512, 4096, &[]);
    assert_eq!(c.reply(0), (7, 22));
    c.request(5, 8, 0, 65536, &[]);
    assert_eq!(c.reply(0), (8, 0));
    c.0.write_all(&[0x25, 0x60, 0x95, 0x13, 0, 0x10, 0, 6])
        .unwrap(); // FAST_ZERO, WRITE_ZEROES
    c.0.write_all(&10u64.to_be_bytes()).unwrap();
    c.0.write_all(&0u64.to_be_bytes()).unwrap();
    c.0.write_all(&65536u32.to_be_bytes()).unwrap();
    let (handle, error) = c.reply(0);
    assert!(
        handle == 10 && (error == 0 || error == 95),
        "{handle} {error}"
    );
    // Every error answered is counted, per tenant and reason.
    let err = s.stopped();
    let line = |name: &str| {
        err.lines()
            .find(|l| l.starts_with(&format!("ioshare: {name}: ")))
            .unwrap_or_else(|| panic!("no summary of {name}: {err}"))
            .to_string()
    };
    let vm2 = line("vm2");
    let fast_zero = usize::from(error == 95);
    let want = if fast_zero == 1 {
        "5 errors (EINVAL 3, ENOSPC 1, ENOTSUP 1)"
    } else {
        "4 errors (EINVAL 3, ENOSPC 1)"
    };
    assert!(vm2.contains(want), "{vm2}");
    assert!(line("ro").contains("1 error (EPERM 1)"), "{err}");
    assert!(line("vm1").contains("0 errors,"), "{err}");
}

/// What `nbdinfo` shows of an export: the empty name selects the default export, and
/// its name and description come back when asked; a cache hint is advertised.
#[test]
fn nbdinfo_shows_the_default_export_by_name_with_its_description() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        &format!(
            "default_export = \"vm2\"\n{}",
            TWO_TENANTS.replacen(
                "name = \"vm2\"",
                "name = \"vm2\"\ndescription = \"the second disk\"",
                1
            )
        ),
    );
    let out = run(Command::new("nbdinfo")
        .arg("--json")
        .arg(format!("nbd+unix:///?socket={}", s.socket.display())));
    let text = stdout(&out);
    assert!(
        text.contains("\"export-name\": \"vm2\"") || text.contains("\"export-name\":\"vm2\""),
        "{text}"
    );
    assert!(text.contains("the second disk"), "{text}");
    assert!(
        text.contains("can_cache") && text.contains("can_fast_zero"),
        "{text}"
    );
    s.stopped();
}

/// `n` headers of 4 KiB reads, handles 0.., each at `offset(handle)`.
fn read_headers(n: u64, offset: impl Fn(u64) -> u64) -> Vec<u8> {
    let mut burst = Vec::new();
    for h in 0..n {
        burst.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        burst.extend_from_slice(&[0, 0, 0, 0]); // flags, READ
        burst.extend_from_slice(&h.to_be_bytes());
        burst.extend_from_slice(&offset(h).to_be_bytes());
        burst.extend_from_slice(&4096u32.to_be_bytes());
    }
    burst
}

/// Resident memory of a process, from /proc (bytes).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kib << 10
}

/// The most a process grew past `before` (bytes resident) over `samples` looks 100 ms
/// apart.
fn peak_growth(pid: u32, before: u64, samples: u32) -> u64 {
    (0..samples)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            rss(pid).saturating_sub(before)
        })
        .max()
        .unwrap_or(0)
}

/// A client that pipelines 32 MiB reads and never reads the replies makes the server
/// hold at most its per-connection bound of unsent reply data (64 MiB) and one request
/// more, not a reply per request: the server stops reading that connection. Another
/// tenant is served meanwhile, and the server stops cleanly.
#[test]
fn a_client_that_never_reads_its_replies_holds_bounded_memory() {
    let dir = tempdir();
    let s = Server::start(dir.path(), TWO_TENANTS);
    let pid = s.child.id();
    let mut warm = Raw::connect(&s);
    warm.go("vm2");
    warm.request(0, 1, 0, 4096, &[]);
    assert_eq!(warm.reply(4096), (1, 0));
    let before = rss(pid);
    let mut greedy = Raw::connect(&s);
    greedy.go("vm1");
    greedy.pipeline_big_reads(400);
    // Let the server take what it will of them.
    let grown = peak_growth(pid, before, 20);
    assert!(
        grown <= 160 << 20,
        "the server grew by {} MiB for a client that reads nothing",
        grown >> 20
    );
    warm.request(0, 2, 4096, 4096, &[]);
    assert_eq!(warm.reply(4096), (2, 0), "another tenant is still served");
    drop(greedy);
    s.stopped();
}

/// 16 clients pipelining 4 KiB reads and reading no reply hold the server at the memory
/// budget (64 MiB here), not twice it: small buffers are carved from slabs, with none of
/// the aligned allocator's overhead (it had held 2.1× the budget). Once every client has
/// gone, the memory goes back to the system.
#[test]
fn small_replies_nobody_reads_hold_the_budget_and_are_given_back() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        &format!("max_inflight_bytes = \"64m\"\n{TWO_TENANTS}"),
    );
    let pid = s.child.id();
    let mut reader = served_reader(&s);
    let before = rss(pid);
    let burst = std::sync::Arc::new(read_headers(4096, |h| (h * 4096) % (60 << 20)));
    let flooders: Vec<_> = (0..16)
        .map(|_| {
            let mut c = Raw::connect(&s);
            c.go("vm1");
            let burst = burst.clone();
            std::thread::spawn(move || {
                c.0.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
                for _ in 0..16 {
                    if c.0.write_all(&burst).is_err() {
                        break;
                    }
                }
                c
            })
        })
        .collect();
    let grown = peak_growth(pid, before, 20);
    assert!(
        grown <= 80 << 20,
        "the server grew by {} MiB for 16 clients reading no reply (budget 64 MiB)",
        grown >> 20
    );
    reader.request(0, 2, 4096, 4096, &[]);
    assert_eq!(reader.reply(4096), (2, 0), "small reads are still served");
    let clients: Vec<Raw> = flooders.into_iter().map(|f| f.join().unwrap()).collect();
    drop(clients);
    drop(reader);
    let t = Instant::now();
    while rss(pid) > before + (8 << 20) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{} MiB held after every client left ({} MiB before)",
            rss(pid) >> 20,
            before >> 20
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    s.stopped();
}

/// Clients that send a 32 MiB write header and then nothing hold no more than the
/// memory budget between them: a write's payload buffer is counted when its header is
/// parsed, and headers past the budget wait unparsed. Small reads of another tenant are
/// served meanwhile.
#[test]
fn stalled_write_headers_stay_within_the_memory_budget() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        &format!("max_inflight_bytes = \"128m\"\n{TWO_TENANTS}"),
    );
    let pid = s.child.id();
    let mut reader = served_reader(&s);
    let before = rss(pid);
    let stalled = stalled_writers(&s, 24);
    let grown = peak_growth(pid, before, 10);
    // 24 × 32 MiB unbounded; the budget (128 MiB) plus slack for the allocator.
    assert!(
        grown <= 192 << 20,
        "the server grew by {} MiB for 24 stalled write headers",
        grown >> 20
    );
    reader.request(0, 2, 4096, 4096, &[]);
    assert_eq!(reader.reply(4096), (2, 0), "small reads are still served");
    drop(stalled);
    s.stopped();
}

/// Clients that send requests the server answers with an error (reads past the end)
/// and never read the replies hold no more than the memory budget between them: every
/// reply holds its 16 bytes from its request's arrival until it is sent, and a
/// connection past its share is not read. (Before replies counted, 4 such clients grew
/// the server by gigabytes.) Another tenant is served meanwhile.
#[test]
fn error_replies_nobody_reads_stay_within_the_memory_budget() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        &format!("max_inflight_bytes = \"64m\"\n{TWO_TENANTS}"),
    );
    let pid = s.child.id();
    let mut reader = served_reader(&s);
    let before = rss(pid);
    // 65,536 reads past vm1's end (64 MiB), sent 128 times per client: 8 M requests,
    // 128 MiB of error replies per client if the server read them all.
    let burst = std::sync::Arc::new(read_headers(65_536, |_| 64 << 20));
    let flooders: Vec<_> = (0..4)
        .map(|_| {
            let mut c = Raw::connect(&s);
            c.go("vm1");
            let burst = burst.clone();
            std::thread::spawn(move || {
                c.0.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
                for _ in 0..128 {
                    // A write that times out has met the back-pressure.
                    if c.0.write_all(&burst).is_err() {
                        break;
                    }
                }
                c
            })
        })
        .collect();
    let grown = peak_growth(pid, before, 40);
    // 4 × 128 MiB unbounded; the budget (64 MiB, as a vector that doubles: 128) and
    // slack for the allocator.
    assert!(
        grown <= 192 << 20,
        "the server grew by {} MiB for error replies nobody reads",
        grown >> 20
    );
    reader.request(0, 2, 4096, 4096, &[]);
    assert_eq!(reader.reply(4096), (2, 0), "another tenant is still served");
    let clients: Vec<Raw> = flooders.into_iter().map(|t| t.join().unwrap()).collect();
    drop(clients);
    s.stopped();
}

/// When the engine dies (an injected panic stands for a bug), the server does not go on
/// handshaking clients it will never serve: it says what happened and exits non-zero,
/// for a supervisor to restart it.
#[test]
fn a_dead_engine_stops_the_server_with_an_error() {
    let dir = tempdir();
    let mut s = Server::start_env(
        dir.path(),
        TWO_TENANTS,
        &[],
        None,
        &[("IOSHARE_TEST_ENGINE_PANIC_AFTER", "3")],
    );
    let mut c = Raw::connect(&s);
    c.go("vm2");
    for h in 1..=2 {
        c.request(0, h, 0, 4096, &[]);
        assert_eq!(c.reply(4096), (h, 0));
    }
    // The third request kills the engine: no reply, the connection closes.
    c.request(0, 3, 0, 4096, &[]);
    let mut rest = Vec::new();
    let _ = c.0.read_to_end(&mut rest);
    assert!(rest.is_empty(), "a reply from a dead engine");
    let give_up = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < give_up, "the server outlived its engine");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    s.child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "exit status {status}: {err}");
    assert!(
        err.contains("the engine stopped while serving")
            && err.contains("the engine panicked: injected"),
        "{err}"
    );
}

/// One tenant's connections cannot take another's place: with `max_connections` 16 and
/// two exports, each may have 8 served connections (the default share); vm1's ninth is
/// refused with `NBD_REP_ERR_POLICY` and may select again once one of its own closed,
/// and vm2's client is served beside vm1's eight.
#[test]
fn one_tenants_connections_never_lock_out_another() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        &format!("max_connections = 16\nmax_connections_per_peer = 16\n{TWO_TENANTS}"),
    );
    let mut held: Vec<Raw> = (0..8)
        .map(|_| {
            let mut c = Raw::connect(&s);
            assert_eq!(c.go("vm1"), vec![3, 3, 1]);
            c
        })
        .collect();
    let mut ninth = Raw::connect(&s);
    assert_eq!(
        ninth.go("vm1"),
        vec![(1 << 31) + 2],
        "ERR_POLICY at the limit"
    );
    let mut other = Raw::connect(&s);
    assert_eq!(other.go("vm2"), vec![3, 3, 1]);
    other.request(0, 1, 0, 4096, &[]);
    assert_eq!(other.reply(4096), (1, 0));
    // One of vm1's own goes: the refused client selects again and is served.
    drop(held.pop());
    let t = Instant::now();
    let served = loop {
        let kinds = ninth.go("vm1");
        if kinds == vec![3, 3, 1] {
            break true;
        }
        assert_eq!(kinds, vec![(1 << 31) + 2]);
        if t.elapsed() > Duration::from_secs(10) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        served,
        "the limit was not given back when a connection closed"
    );
    ninth.request(0, 2, 0, 4096, &[]);
    assert_eq!(ninth.reply(4096), (2, 0));
    drop(held);
    let err = s.stopped();
    assert!(err.contains("max_connections_per_tenant"), "{err}");
}

/// `max_connections_per_peer`: past it a peer's new connections are closed at accept
/// (the Unix socket is one peer), and its open ones are served.
#[test]
fn a_peer_past_its_limit_is_closed_at_accept() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        &format!("max_connections_per_peer = 3\n{TWO_TENANTS}"),
    );
    // The start-up probe's connection may still be closing: wait for room.
    std::thread::sleep(Duration::from_millis(300));
    let mut open: Vec<Raw> = (0..3).map(|_| Raw::connect(&s)).collect();
    let mut fourth = UnixStream::connect(&s.socket).unwrap();
    fourth
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    let _ = fourth.read_to_end(&mut got);
    assert!(
        got.is_empty(),
        "a connection past the peer's limit was greeted"
    );
    assert_eq!(open[0].go("vm2"), vec![3, 3, 1]);
    open[0].request(0, 1, 0, 4096, &[]);
    assert_eq!(open[0].reply(4096), (1, 0));
    drop(open);
    let err = s.stopped();
    assert!(
        err.contains("max_connections_per_peer (3) reached by local"),
        "{err}"
    );
}

/// A vm2 client whose first 4 KiB read (request 1) has been answered.
fn served_reader(s: &Server) -> Raw {
    let mut reader = Raw::connect(s);
    reader.go("vm2");
    reader.request(0, 1, 0, 4096, &[]);
    assert_eq!(reader.reply(4096), (1, 0));
    reader
}

/// `n` vm1 clients, each having sent the header of a 32 MiB write and 512 bytes of it.
fn stalled_writers(s: &Server, n: u64) -> Vec<Raw> {
    (0..n)
        .map(|i| {
            let mut c = Raw::connect(s);
            c.go("vm1");
            c.request(1, i, 0, 32 << 20, &[7; 512]);
            c
        })
        .collect()
}

/// A client that connects and says nothing is dropped after the handshake timeout;
/// others are served meanwhile, and the server logs nothing for it.
#[test]
fn a_silent_client_is_dropped_after_the_handshake_timeout() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        &format!("handshake_timeout_s = 0.3\n{TWO_TENANTS}"),
    );
    let mut silent = UnixStream::connect(&s.socket).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut greeting = [0u8; 18];
    silent.read_exact(&mut greeting).unwrap();
    let t = Instant::now();
    let mut rest = Vec::new();
    let n = silent.read_to_end(&mut rest).unwrap_or(0);
    assert_eq!(n, 0, "nothing more is sent to a silent client");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
        "dropped after {waited:?}"
    );
    let mut c = Raw::connect(&s);
    assert_eq!(c.go("vm2"), vec![3, 3, 1]);
    c.request(0, 1, 0, 4096, &[]);
    assert_eq!(c.reply(4096), (1, 0));
    let err = s.stopped();
    assert!(!err.contains("connection 1:"), "{err}");
}

/// Sends `bytes` (then zeroes) a byte every 0.3 s (no read ever waits the timeout)
/// until the server closes the connection; how long that took, or `None` after
/// `give_up`.
fn dribble<S: Read + Write>(
    c: &mut S,
    bytes: &[u8],
    set_timeout: impl Fn(&S),
    give_up: Duration,
) -> Option<Duration> {
    set_timeout(c);
    let t = Instant::now();
    let mut byte = [0u8; 64];
    let mut sent = 0;
    while t.elapsed() < give_up {
        let next = bytes.get(sent).copied().unwrap_or(0);
        sent += 1;
        if c.write_all(&[next]).is_err() {
            return Some(t.elapsed());
        }
        match c.read(&mut byte) {
            Ok(0) => return Some(t.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(t.elapsed()),
        }
    }
    None
}

/// The handshake timeout bounds the whole handshake, not each read: a client that
/// sends a byte every 0.3 s — in the NBD options, or in its TLS ClientHello after
/// STARTTLS — is closed once its handshake has taken the timeout (each byte renewed the
/// read timeout: such a client stayed forever).
#[test]
fn a_handshake_sent_a_byte_at_a_time_is_closed_at_its_deadline() {
    let dir = tempdir();
    let key = "9e0fa2c63f1b4d5e8a7c6b5a49382716f0e1d2c3b4a59687a1b2c3d4e5f60718";
    std::fs::write(dir.path().join("keys.psk"), format!("alice:{key}\n")).unwrap();
    let port = free_port();
    let s = Server::start(
        dir.path(),
        &format!(
            "handshake_timeout_s = 1\ntcp = \"127.0.0.1:{port}\"\ntls = \"require\"\ntls_psk = \"keys.psk\"\n{TWO_TENANTS}"
        ),
    );
    let pace = |c: &UnixStream| {
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
    };
    let mut plain = Raw::connect(&s);
    // An NBD_OPT_GO whose 4 KiB of data come a byte at a time.
    let mut go = b"IHAVEOPT".to_vec();
    go.extend_from_slice(&7u32.to_be_bytes());
    go.extend_from_slice(&4096u32.to_be_bytes());
    let closed = dribble(&mut plain.0, &go, pace, Duration::from_secs(8));
    let closed = closed.expect("a dribbling client is closed");
    assert!(closed < Duration::from_secs(4), "closed after {closed:?}");

    let mut tls = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    tls.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greeting = [0u8; 18];
    tls.read_exact(&mut greeting).unwrap();
    tls.write_all(&3u32.to_be_bytes()).unwrap();
    let mut starttls = b"IHAVEOPT".to_vec();
    starttls.extend_from_slice(&5u32.to_be_bytes());
    starttls.extend_from_slice(&0u32.to_be_bytes());
    tls.write_all(&starttls).unwrap();
    let mut reply = [0u8; 20];
    tls.read_exact(&mut reply).unwrap();
    assert_eq!(
        u32::from_be_bytes(reply[12..16].try_into().unwrap()),
        1,
        "ACK"
    );
    let pace = |c: &std::net::TcpStream| {
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
    };
    // A TLS handshake record of 512 bytes.
    let hello = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc];
    let closed = dribble(&mut tls, &hello, pace, Duration::from_secs(8));
    let closed = closed.expect("a ClientHello at a byte a time is closed");
    assert!(closed < Duration::from_secs(4), "closed after {closed:?}");
    let err = s.stopped();
    assert!(
        !err.contains("TLS handshake"),
        "closed here, not the client's failure: {err}"
    );
}

/// `max_connections` counts connections handshaking and served; more are closed at
/// once, and a slot comes back when a connection closes.
#[test]
fn connections_beyond_the_limit_evict_idle_handshakes_and_slots_come_back() {
    let dir = tempdir();
    let s = Server::start(dir.path(), &format!("max_connections = 3\n{TWO_TENANTS}"));
    let greets = |c: &mut UnixStream| {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut greeting = [0u8; 18];
        c.read_exact(&mut greeting).is_ok()
    };
    // Two served, one handshaking: the limit.
    let mut served: Vec<Raw> = (0..2)
        .map(|_| {
            let mut c = Raw::connect(&s);
            assert_eq!(c.go("vm1"), vec![3, 3, 1]);
            c
        })
        .collect();
    let mut idle = UnixStream::connect(&s.socket).unwrap();
    assert!(greets(&mut idle));
    // A fourth takes the place of the one idle in its handshake, which is closed.
    let mut fourth = UnixStream::connect(&s.socket).unwrap();
    assert!(greets(&mut fourth), "the fourth is greeted");
    let mut rest = Vec::new();
    assert_eq!(
        idle.read_to_end(&mut rest).unwrap(),
        0,
        "the idle one is closed"
    );
    fourth.write_all(&3u32.to_be_bytes()).unwrap();
    let mut fourth = Raw(fourth);
    assert_eq!(fourth.go("vm2"), vec![3, 3, 1]);
    // Now all three are served: a fifth is closed without a greeting.
    let mut over = UnixStream::connect(&s.socket).unwrap();
    assert!(!greets(&mut over), "nothing to evict: the fifth is closed");
    // A served connection leaves: its slot comes back.
    drop(served.pop());
    let t = Instant::now();
    let mut back = loop {
        let mut c = UnixStream::connect(&s.socket).unwrap();
        if greets(&mut c) {
            break c;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the slot never came back"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    back.write_all(&3u32.to_be_bytes()).unwrap();
    let mut c = Raw(back);
    assert_eq!(c.go("vm2"), vec![3, 3, 1]);
    c.request(0, 1, 0, 4096, &[]);
    assert_eq!(c.reply(4096), (1, 0));
    drop((served, fourth, c));
    let err = s.stopped();
    assert!(err.contains("server.max_connections (3) reached"), "{err}");
}

/// A missing image is an error naming it and the setting, not a blank disk.
#[test]
fn a_missing_image_is_an_error_unless_created() {
    let dir = tempdir();
    let cfg = dir.path().join("serve.toml");
    std::fs::write(
        &cfg,
        "[server]\nunix = \"s.sock\"\n[[tenant]]\nname = \"x\"\nfile = \"gone.img\"\nsize = \"1m\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ioshare"))
        .arg("serve")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tenant 'x': ") && err.contains("gone.img: no such image; set create = true"),
        "{err}"
    );
    assert!(!dir.path().join("gone.img").exists(), "nothing created");
}

/// A second server on an image another one serves refuses to start, naming the image;
/// images the server creates are readable by their owner only.
#[test]
fn a_second_server_on_the_same_image_refuses_to_start() {
    use std::os::unix::fs::PermissionsExt;
    let first_dir = tempdir();
    let s = Server::start(first_dir.path(), TWO_TENANTS);
    let mode = std::fs::metadata(first_dir.path().join("vm1.img"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "a new image is private to its owner");
    let image = first_dir.path().join("vm1.img");
    let second = tempdir();
    let cfg = second.path().join("serve.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nunix = \"s.sock\"\n[[tenant]]\nname = \"x\"\nfile = \"{}\"\nsize = \"64m\"\n",
            image.display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ioshare"))
        .arg("serve")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // The holder is named: its pid and command line, which names its configuration.
    let holder = format!(
        "process {} ({} serve {})",
        s.child.id(),
        env!("CARGO_BIN_EXE_ioshare"),
        first_dir.path().join("serve.toml").display()
    );
    assert!(
        err.contains("vm1.img") && err.contains(&format!("{holder} holds it")),
        "{err}"
    );
    s.stopped();
}

/// `ioshare serve` on a configuration written to `dir/name`, expected to refuse to
/// start; what it said.
fn refused(dir: &Path, name: &str, config: &str) -> String {
    let cfg = dir.join(name);
    std::fs::write(&cfg, format!("[server]\nunix = \"{name}.sock\"\n{config}")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ioshare"))
        .arg("serve")
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "started: {err}");
    err
}

/// A start that fails after it bound its socket and created images (here: its TCP
/// address is taken) leaves neither behind: no socket file, no image, no marker that
/// would stop the next start from creating the image again.
#[test]
fn a_failed_start_leaves_no_socket_or_created_image_behind() {
    let dir = tempdir();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = taken.local_addr().unwrap();
    let err = refused(
        dir.path(),
        "busy.toml",
        &format!(
            "tcp = \"{at}\"\n[[tenant]]\nname = \"a\"\nfile = \"new.img\"\ncreate = true\nsize = \"1m\"\n"
        ),
    );
    assert!(err.contains("server.tcp"), "{err}");
    assert!(err.contains("removed") && err.contains("new.img"), "{err}");
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "busy.toml")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    // An image that was there before is not the start's to remove.
    std::fs::write(dir.path().join("old.img"), vec![1u8; 4096]).unwrap();
    refused(
        dir.path(),
        "busy.toml",
        &format!("tcp = \"{at}\"\n[[tenant]]\nname = \"a\"\nfile = \"old.img\"\n"),
    );
    assert_eq!(
        std::fs::read(dir.path().join("old.img")).unwrap(),
        vec![1u8; 4096]
    );
    drop(taken);
}

/// A tenant's image may not be the server's own configuration file, under any name.
#[test]
fn an_image_that_is_the_configuration_file_is_refused() {
    let dir = tempdir();
    std::os::unix::fs::symlink(dir.path().join("own.toml"), dir.path().join("disk.img")).unwrap();
    let err = refused(
        dir.path(),
        "own.toml",
        "[[tenant]]\nname = \"a\"\nfile = \"disk.img\"\nsize = \"4k\"\n",
    );
    assert!(
        err.contains("tenant 1 ('a').file: ") && err.contains("is the configuration file"),
        "{err}"
    );
}

/// Images are known by what they are, not by their names: a loop device over a
/// tenant's image, a `mknod` alias of that loop device, and the file behind it are one
/// image, refused as two tenants' — and across servers, a block device is claimed
/// exclusively and its backing file locked, so a second server refuses to start on
/// any of the three names.
#[test]
fn loop_devices_and_their_aliases_are_the_same_image() {
    if skipped_without_mounts("loop_devices_and_their_aliases_are_the_same_image") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let dir = tempdir();
    let file = dir.path().join("shared.img");
    std::fs::write(&file, vec![0u8; 4 << 20]).unwrap();
    let mut m = Mounts::default();
    let out = run(Command::new("losetup").args(["-f", "--show"]).arg(&file));
    let dev = stdout(&out).trim().to_string();
    m.loop_dev = Some(dev.clone());
    let rdev = std::fs::metadata(&dev).unwrap().rdev();
    let alias = dir.path().join("alias");
    let node = std::ffi::CString::new(alias.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; mknod only creates the node.
    let made = unsafe { libc::mknod(node.as_ptr(), libc::S_IFBLK | 0o600, rdev) };
    assert_eq!(made, 0, "mknod: {}", std::io::Error::last_os_error());
    let tenants = |a: &str, b: &str| {
        format!(
            "[[tenant]]\nname = \"a\"\nfile = \"{a}\"\nsize = \"4m\"\n\
             [[tenant]]\nname = \"b\"\nfile = \"{b}\"\nsize = \"4m\"\n"
        )
    };
    let alias = alias.to_str().unwrap();
    let file = file.to_str().unwrap();
    for (i, (a, b)) in [(file, dev.as_str()), (dev.as_str(), alias), (alias, file)]
        .into_iter()
        .enumerate()
    {
        let err = refused(dir.path(), &format!("c{i}.toml"), &tenants(a, b));
        assert!(
            err.contains("tenant 2 ('b').file: ")
                && err.contains("holds the same bytes as tenant 'a''s image"),
            "{a} and {b}: {err}"
        );
    }
    // One server on the loop device; a second on any of the three names is refused.
    let one = "[[tenant]]\nname = \"a\"\nfile = \"{}\"\nsize = \"4m\"\n";
    let s = Server::start(dir.path(), &one.replace("{}", &dev));
    let err = refused(dir.path(), "alias.toml", &one.replace("{}", alias));
    assert!(
        err.contains("busy: mounted, or claimed by another server"),
        "{err}"
    );
    let err = refused(dir.path(), "file.toml", &one.replace("{}", file));
    assert!(err.contains("cannot lock it for this server"), "{err}");
    s.stopped();
    // And the other way round: a server on the file; the loop device over it is refused.
    let s = Server::start(dir.path(), &one.replace("{}", file));
    let err = refused(dir.path(), "dev.toml", &one.replace("{}", &dev));
    assert!(err.contains("through the file behind it"), "{err}");
    s.stopped();
    m.detach();
}

/// Loop devices made by a test, detached in reverse order even when it fails.
#[derive(Default)]
struct Loops(Vec<String>);

impl Loops {
    /// A loop device over `over` (a file or a device).
    fn attach(&mut self, over: &Path) -> String {
        let out = run(Command::new("losetup").args(["-f", "--show"]).arg(over));
        let dev = stdout(&out).trim().to_string();
        self.0.push(dev.clone());
        dev
    }
}

impl Drop for Loops {
    fn drop(&mut self) {
        for dev in self.0.drain(..).rev() {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
    }
}

/// The identity check follows the whole stack: a loop device over a loop device over
/// tenant a's image (and a `mknod` alias of it) is refused as tenant b's image at start
/// and through `ctl add-tenant`; a server on the outer loop device locks the file at
/// the bottom; a loop device whose backing file was deleted is refused, not guessed.
#[test]
fn a_loop_over_a_loop_is_the_file_at_the_bottom() {
    if skipped_without_mounts("a_loop_over_a_loop_is_the_file_at_the_bottom") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let dir = tempdir();
    let file = dir.path().join("a.img");
    std::fs::write(&file, vec![0u8; 4 << 20]).unwrap();
    let mut loops = Loops::default();
    let inner = loops.attach(&file);
    let outer = loops.attach(Path::new(&inner));
    let rdev = std::fs::metadata(&outer).unwrap().rdev();
    let alias = dir.path().join("alias");
    let node = std::ffi::CString::new(alias.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; mknod only creates the node.
    let made = unsafe { libc::mknod(node.as_ptr(), libc::S_IFBLK | 0o600, rdev) };
    assert_eq!(made, 0, "mknod: {}", std::io::Error::last_os_error());
    let tenants = |a: &str, b: &str| {
        format!(
            "[[tenant]]\nname = \"a\"\nfile = \"{a}\"\nsize = \"4m\"\n\
             [[tenant]]\nname = \"b\"\nfile = \"{b}\"\nsize = \"4m\"\n"
        )
    };
    let (file_s, alias_s) = (file.to_str().unwrap(), alias.to_str().unwrap());
    for (i, (a, b)) in [
        (file_s, outer.as_str()),
        (file_s, alias_s),
        (outer.as_str(), file_s),
        (inner.as_str(), alias_s),
    ]
    .into_iter()
    .enumerate()
    {
        let err = refused(dir.path(), &format!("c{i}.toml"), &tenants(a, b));
        assert!(
            err.contains("tenant 2 ('b').file: ")
                && err.contains("holds the same bytes as tenant 'a''s image"),
            "{a} and {b}: {err}"
        );
    }
    // Through the control socket, with a served on its file.
    let s = Server::start(
        dir.path(),
        &format!(
            "control = \"ctl.sock\"\nimage_dirs = [\".\", \"/dev\"]\n[[tenant]]\nname = \"a\"\nfile = \"{file_s}\"\nsize = \"4m\"\n"
        ),
    );
    for b in [outer.as_str(), alias_s] {
        let out = Command::new(env!("CARGO_BIN_EXE_ioshare"))
            .arg("ctl")
            .arg(dir.path().join("ctl.sock"))
            .args(["add-tenant", "name=b", &format!("file={b}"), "size=4m"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("holds the same bytes as tenant 'a''s image"),
            "{b}: {err}"
        );
    }
    s.stopped();
    // A server on the outer loop device holds the file at the bottom.
    let one = "[[tenant]]\nname = \"a\"\nfile = \"{}\"\nsize = \"4m\"\n";
    let s = Server::start(dir.path(), &one.replace("{}", &outer));
    let err = refused(dir.path(), "file.toml", &one.replace("{}", file_s));
    assert!(err.contains("cannot lock it for this server"), "{err}");
    s.stopped();
    // Bound to a file that is gone: refused, with why.
    let gone = dir.path().join("gone.img");
    std::fs::write(&gone, vec![0u8; 1 << 20]).unwrap();
    let orphan = loops.attach(&gone);
    std::fs::remove_file(&gone).unwrap();
    let err = refused(
        dir.path(),
        "orphan.toml",
        &format!("[[tenant]]\nname = \"o\"\nfile = \"{orphan}\"\nsize = \"1m\"\n"),
    );
    assert!(
        err.contains("is bound to a file that no path names any more"),
        "{err}"
    );
}

/// A block device is served as it is: as a tenant's image without `size` (at the
/// device's size) and as `backend.path` (opened, never created).
#[test]
fn block_devices_are_served_at_their_size() {
    if skipped_without_mounts("block_devices_are_served_at_their_size") {
        return;
    }
    let dir = tempdir();
    let mut loops = Loops::default();
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    std::fs::write(&a, vec![0u8; 3 << 20]).unwrap();
    std::fs::write(&b, vec![0u8; 2 << 20]).unwrap();
    let (da, db) = (loops.attach(&a), loops.attach(&b));
    let s = Server::start(
        dir.path(),
        &format!(
            "[backend]\npath = \"{db}\"\n[[tenant]]\nname = \"own\"\nfile = \"{da}\"\n\
             [[tenant]]\nname = \"region\"\noffset = \"1m\"\nsize = \"1m\"\n"
        ),
    );
    let size = |export: &str| {
        stdout(&run(Command::new("nbdinfo")
            .arg("--size")
            .arg(s.uri(export))))
        .trim()
        .to_string()
    };
    assert_eq!(size("own"), (3u64 << 20).to_string());
    assert_eq!(size("region"), (1u64 << 20).to_string());
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x5a 0 64k"])
        .arg(s.uri("region")));
    s.stopped();
    let data = std::fs::read(&b).unwrap();
    assert!(data[1 << 20..(1 << 20) + 65536].iter().all(|&x| x == 0x5a));
}

/// No image is one of the files the server keeps or writes (its pid file, capture,
/// sockets, an image's marker), none is taken from a system folder, and tenants added
/// while running take their images from the configuration's folders or
/// `server.image_dirs` only.
#[test]
fn the_servers_own_files_and_system_files_are_no_images() {
    let dir = tempdir();
    let tenant = |file: &str| {
        format!("[[tenant]]\nname = \"a\"\nfile = \"{file}\"\ncreate = true\nsize = \"1m\"\n")
    };
    let start = |cfg: &str, args: &[&str]| {
        let path = dir.path().join("own.toml");
        std::fs::write(
            &path,
            format!("[server]\nunix = \"own.sock\"\ncontrol = \"ctl.sock\"\n{cfg}"),
        )
        .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_ioshare"))
            .arg("serve")
            .arg(&path)
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let pid = dir.path().join("ioshare.pid");
    let err = start(
        &tenant("ioshare.pid"),
        &["--pidfile", pid.to_str().unwrap()],
    );
    assert!(err.contains("is --pidfile"), "{err}");
    assert!(!pid.exists(), "neither made");
    let capture = dir.path().join("cap.log");
    let err = start(
        &tenant("cap.log"),
        &["--capture", capture.to_str().unwrap()],
    );
    assert!(err.contains("is --capture"), "{err}");
    for (file, says) in [
        ("ctl.sock", "is server.control"),
        ("own.sock", "is server.unix"),
        (".b.img.ioshare", "named as the marker"),
        ("/etc/passwd", "is in /etc, a system folder"),
        ("/usr/bin/ls", "is in /usr, a system folder"),
    ] {
        let err = start(&tenant(file), &[]);
        assert!(err.contains(says), "{file}: {err}");
    }
    // Added while running: from the configuration's folders, or image_dirs.
    let elsewhere = tempdir();
    let other = elsewhere.path().join("x.img");
    let s = Server::start(
        dir.path(),
        &format!("control = \"ctl.sock\"\n{TWO_TENANTS}"),
    );
    let add = |name: &str, file: &Path| {
        Command::new(env!("CARGO_BIN_EXE_ioshare"))
            .arg("ctl")
            .arg(dir.path().join("ctl.sock"))
            .args([
                "add-tenant",
                &format!("name={name}"),
                &format!("file={}", file.display()),
                "size=1m",
                "create=true",
            ])
            .output()
            .unwrap()
    };
    let out = add("x", &other);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("is outside the folders of the configuration's images"),
        "{err}"
    );
    assert!(!other.exists());
    let out = add("shadow", Path::new("/etc/shadow"));
    assert!(!out.status.success());
    let out = add("y", &dir.path().join("y.img"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.stopped();
    let s = Server::start(
        dir.path(),
        &format!(
            "control = \"ctl.sock\"\nimage_dirs = [\".\", \"{}\"]\n{TWO_TENANTS}",
            elsewhere.path().display()
        ),
    );
    let out = add("x", &other);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(other.exists());
    s.stopped();
}

#[test]
fn clients_leaving_with_requests_in_flight_harm_nobody() {
    let dir = tempdir();
    let s = Server::start(dir.path(), TWO_TENANTS);
    for _ in 0..4 {
        let mut c = Raw::connect(&s);
        c.go("vm1");
        for h in 0..64 {
            c.request(0, h, h * (1 << 20) % (64 << 20), 1 << 20, &[]);
        }
        drop(c); // gone before the replies
    }
    let mut c = Raw::connect(&s);
    c.go("vm2");
    c.request(0, 1, 0, 4096, &[]);
    assert_eq!(c.reply(4096), (1, 0));
    let err = s.stopped();
    assert!(err.contains("vm1: ") && err.contains("0 errors"), "{err}");
}

#[test]
fn null_backend_succeeds_at_once_and_reads_zeroes() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        "[backend]\nkind = \"null\"\n[[tenant]]\nname = \"n\"\nsize = \"1m\"\n",
    );
    let mut c = Raw::connect(&s);
    assert_eq!(c.go("n"), vec![3, 3, 1]);
    c.request(1, 1, 0, 4, b"abcd");
    assert_eq!(c.reply(0), (1, 0));
    c.request(3, 2, 0, 0, &[]);
    assert_eq!(c.reply(0), (2, 0));
    c.request(0, 3, 0, 4, &[]);
    let mut h = [0u8; 20];
    c.0.read_exact(&mut h).unwrap();
    assert_eq!(&h[4..8], &[0, 0, 0, 0], "no error");
    assert_eq!(&h[16..], &[0, 0, 0, 0], "zeroes");
    let err = s.stopped();
    assert!(err.contains("n: 3 requests"), "{err}");
}

#[test]
fn serve_out_reports_the_run_like_the_simulator() {
    let dir = tempdir();
    let out = dir.path().join("report");
    let s = Server::start_with(
        dir.path(),
        "policy = \"sfq\"\n[[tenant]]\nname = \"a\"\nweight = 2\nfile = \"a.img\"\ncreate = true\nsize = \"1m\"\n\
         [[tenant]]\nname = \"b\"\nfile = \"b.img\"\ncreate = true\nsize = \"1m\"\n",
        &["--out", out.to_str().unwrap()],
    );
    let mut a = Raw::connect(&s);
    a.go("a");
    for i in 0..3 {
        a.request(1, i, i * 4096, 4096, &[7; 4096]);
        assert_eq!(a.reply(0), (i, 0));
    }
    a.request(3, 9, 0, 0, &[]);
    assert_eq!(a.reply(0), (9, 0));
    let mut b = Raw::connect(&s);
    b.go("b");
    for i in 0..2 {
        b.request(0, i, i * 8192, 8192, &[]);
        assert_eq!(b.reply(8192), (i, 0));
    }
    // Past the end: refused by the codec, never reaches the engine or the report.
    b.request(0, 5, 1 << 20, 4096, &[]);
    assert_ne!(b.reply(0).1, 0);
    let (status, stdout, err) = s.stop_with_stdout();
    assert!(status.success(), "{err}");
    assert!(err.contains("report written to"), "{err}");
    assert!(stdout.contains("scenario live"), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(json["scenario"], "live");
    let run = &json["runs"][0];
    assert_eq!(run["policy"], "sfq");
    assert_eq!(run["sim"]["requests"], 6);
    let tenants = run["tenants"].as_array().unwrap();
    assert_eq!(tenants[0]["name"], "a");
    assert_eq!(tenants[0]["weight"], 2.0);
    assert_eq!(
        (tenants[0]["bytes"].as_u64(), tenants[0]["ios"].as_u64()),
        (Some(3 * 4096), Some(4))
    );
    assert_eq!(
        (tenants[1]["bytes"].as_u64(), tenants[1]["ios"].as_u64()),
        (Some(2 * 8192), Some(2))
    );
    // The timeseries adds up to the totals, interval by interval.
    let csv = std::fs::read_to_string(out.join("timeseries.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some(
            "policy,tenant,interval_start_s,bytes,bandwidth_bytes_per_s,iops,mean_latency_us,device_seconds"
        )
    );
    let mut bytes = [0u64; 2];
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        let moved = f[3].parse::<u64>().unwrap();
        bytes[(f[1] == "b") as usize] += moved;
        // Every interval that moved bytes spent device time (the requests' priced cost).
        let device_s = f[7].parse::<f64>().unwrap();
        assert_eq!(moved > 0, device_s > 0.0, "{line}");
    }
    assert_eq!(bytes, [3 * 4096, 2 * 8192]);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<svg"), "report.html has its plots");
}

#[test]
fn bad_config_names_the_field() {
    let dir = tempdir();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(
        &cfg,
        "[server]\nqueue_depth = 0\n[[tenant]]\nname = \"a\"\nfile = \"a.img\"\ncreate = true\nsize = 4096\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ioshare"))
        .arg("serve")
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("server.queue_depth: must be 1 ..= 4096, got 0"),
        "{err}"
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path` from the metrics endpoint: (status line, body).
fn http_get(port: u16, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of the series `name` (with its labels) in an exposition.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

fn signal(s: &Server, sig: i32) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(s.child.id() as i32, sig) };
}

#[test]
fn metrics_endpoint_and_sighup_reload() {
    let dir = tempdir();
    let port = free_port();
    let s = Server::start(
        dir.path(),
        &format!("metrics = \"127.0.0.1:{port}\"\npolicy = \"feedbac\"\n{TWO_TENANTS}"),
    );
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x5a 0 1M"])
        .arg(s.uri("vm1")));
    let (status, text) = http_get(port, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert_eq!(
        series(&text, "ioshare_policy_info{policy=\"feedbac\"}"),
        Some(1.0)
    );
    assert_eq!(
        series(&text, "ioshare_written_bytes_total{tenant=\"vm1\"}"),
        Some(1048576.0),
        "{text}"
    );
    assert_eq!(
        series(&text, "ioshare_written_bytes_total{tenant=\"vm2\"}"),
        Some(0.0)
    );
    let completed = series(&text, "ioshare_requests_completed_total{tenant=\"vm1\"}").unwrap();
    assert!(completed >= 1.0, "{text}");
    assert_eq!(
        series(
            &text,
            "ioshare_request_latency_seconds_count{tenant=\"vm1\"}"
        ),
        Some(completed)
    );
    assert!(
        text.contains("# TYPE ioshare_policy_credits gauge"),
        "{text}"
    );
    assert!(series(&text, "ioshare_policy_credits{tenant=\"vm2\"}").is_some());
    assert_eq!(http_get(port, "/").0, "HTTP/1.1 404 Not Found");

    // SIGHUP applies a new weight...
    let weight = |port| {
        series(
            &http_get(port, "/metrics").1,
            "ioshare_tenant_weight{tenant=\"vm1\"}",
        )
    };
    assert_eq!(weight(port), Some(2.0));
    let cfg = dir.path().join("serve.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replacen("weight = 2", "weight = 5", 1)).unwrap();
    signal(&s, libc::SIGHUP);
    let t = Instant::now();
    while weight(port) != Some(5.0) {
        assert!(t.elapsed() < Duration::from_secs(10), "reload not applied");
        std::thread::sleep(Duration::from_millis(20));
    }
    // ...but not a change that needs a restart.
    std::fs::write(&cfg, text.replacen("size = \"64m\"", "size = \"128m\"", 1)).unwrap();
    signal(&s, libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(weight(port), Some(5.0), "a refused reload applies nothing");
    let info = stdout(&run(Command::new("qemu-img").arg("info").arg(s.uri("vm1"))));
    assert!(info.contains("(67108864 bytes)"), "{info}");
    let err = s.stopped();
    assert!(err.contains("reload: vm1: weight 2 -> 5"), "{err}");
    assert!(
        err.contains(
            "reload: tenant 1 ('vm1'): size changed, which needs a restart; nothing applied"
        ),
        "{err}"
    );
}

/// `ioshare ctl` against a running server: a tenant added, written and read, its
/// weight changed, drained, removed (no longer listed, its connections refused) and
/// resumed with its data, while a verifying fio on another tenant runs undisturbed; the
/// figures read through the socket; bad requests answered with what is wrong.
#[test]
fn the_control_socket_adds_changes_drains_and_removes_tenants() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        &format!("control = \"ctl.sock\"\npolicy = \"sfq\"\n{TWO_TENANTS}"),
    );
    let sock = dir.path().join("ctl.sock");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the control socket is the owner's alone");
    let ctl = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ioshare"))
            .arg("ctl")
            .arg(&sock)
            .args(args)
            .output()
            .unwrap()
    };
    let ok = |args: &[&str]| {
        let out = ctl(args);
        assert!(
            out.status.success(),
            "ctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout(&out)
    };
    // Another tenant is busy all along.
    let busy = fio_verify(&s.uri("vm1"), "4k", "64m")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let added = ok(&[
        "add-tenant",
        "name=vm3",
        "file=vm3.img",
        "size=16m",
        "create=true",
        "weight=4",
    ]);
    assert_eq!(added.trim(), r#"ok: {"id":2,"name":"vm3"}"#);
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x3c 1M 1M"])
        .arg(s.uri("vm3")));
    let list = stdout(&run(Command::new("nbdinfo")
        .arg("--list")
        .arg(format!("nbd+unix://?socket={}", s.socket.display()))));
    assert!(list.contains("export=\"vm3\""), "{list}");
    ok(&["set-tenant", "vm3", "weight=8", "limit_iops=5000"]);
    let metrics = ok(&["metrics"]);
    assert!(
        metrics.contains("ioshare_tenant_weight{tenant=\"vm3\"} 8"),
        "{metrics}"
    );
    assert!(
        metrics.contains("ioshare_written_bytes_total{tenant=\"vm3\"} 1048576"),
        "{metrics}"
    );
    ok(&["drain-tenant", "vm3"]);
    let refused = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read 0 4k"])
        .arg(s.uri("vm3"))
        .output()
        .unwrap();
    assert!(
        !refused.status.success(),
        "a drained tenant takes no connection"
    );
    ok(&["remove-tenant", "vm3"]);
    let list = stdout(&run(Command::new("nbdinfo")
        .arg("--list")
        .arg(format!("nbd+unix://?socket={}", s.socket.display()))));
    assert!(!list.contains("vm3"), "{list}");
    let tenants = ok(&["tenants"]);
    assert!(
        tenants.contains("vm3") && tenants.contains("removed"),
        "{tenants}"
    );
    ok(&["resume-tenant", "vm3"]);
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0x3c 1M 1M"])
        .arg(s.uri("vm3")));
    for (args, says) in [
        (
            &["set-tenant", "vm9", "weight=2"][..],
            "TenantNotFound: no tenant is named 'vm9'",
        ),
        (
            &["set-tenant", "vm3", "weight=0"][..],
            "weight: must be in (0,",
        ),
        (
            &["add-tenant", "name=vm4", "file=vm1.img", "size=64m"][..],
            "holds the same bytes as tenant 'vm1'",
        ),
        (&["stop"][..], "unknown command 'stop'"),
    ] {
        let out = ctl(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    }
    let fio = busy.wait_with_output().unwrap();
    assert!(
        fio.status.success(),
        "the other tenant's fio: {}",
        String::from_utf8_lossy(&fio.stderr)
    );
    let err = s.stopped();
    assert!(err.contains("control: added tenant 2 ('vm3')"), "{err}");
    assert!(
        err.contains("ioshare: vm3: "),
        "the summary counts it: {err}"
    );
}

/// `--log-format json`: every line the server writes is one JSON object with a
/// timestamp, a level and a message; the closing summary carries each tenant's figures
/// as fields.
#[test]
fn json_logs_are_one_object_a_line_with_fields() {
    let dir = tempdir();
    let s = Server::start_with(dir.path(), TWO_TENANTS, &["--log-format", "json"]);
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 1 0 1M"])
        .arg(s.uri("vm1")));
    let err = s.stopped();
    let mut summary = None;
    for line in err.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        for key in ["timestamp", "level", "message"] {
            assert!(v[key].is_string(), "{key} in {line}");
        }
        assert!(
            !v["message"].as_str().unwrap().starts_with("ioshare: "),
            "{line}"
        );
        if v["tenant"] == "vm1" {
            summary = Some(v);
        }
    }
    let summary = summary.unwrap_or_else(|| panic!("no summary line for vm1: {err}"));
    assert_eq!(summary["written_bytes"], 1048576, "{summary}");
    assert_eq!(summary["errors"], 0, "{summary}");
    assert!(err.contains("\"message\":\"serving 2 export(s)"), "{err}");
}

#[test]
fn sigterm_drain_gives_up_on_what_the_policy_holds_at_the_deadline() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        "policy = \"mclock\"\ndrain_timeout_s = 0.5\n[[tenant]]\nname = \"slow\"\nfile = \"slow.img\"\ncreate = true\nsize = \"1m\"\nlimit_iops = 2.0\n",
    );
    let mut c = Raw::connect(&s);
    assert_eq!(c.go("slow"), vec![3, 3, 1]);
    for h in 0..10 {
        c.request(0, h, h * 4096, 4096, &[]);
    }
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    let err = s.stopped();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "drain took {:?}",
        t.elapsed()
    );
    let replies: Vec<(u64, u32)> = (0..10).map(|_| c.reply(4096)).collect();
    let ok = replies.iter().filter(|r| r.1 == 0).count();
    let shut = replies.iter().filter(|r| r.1 == 108).count();
    // 2 IOPS for 0.7 s: one to three served, the rest answered ESHUTDOWN.
    assert!((1..=3).contains(&ok), "{replies:?}");
    assert_eq!(ok + shut, 10, "{replies:?}");
    let mut handles: Vec<u64> = replies.iter().map(|r| r.0).collect();
    handles.sort();
    assert_eq!(handles, (0..10).collect::<Vec<_>>());
    assert!(err.contains("drain deadline passed"), "{err}");
}

/// Mounts made by the file-system test, undone in reverse order even when it fails.
#[derive(Default)]
struct Mounts {
    fuse: Option<(PathBuf, Child)>,
    loop_dev: Option<String>,
    fs: Option<PathBuf>,
}

impl Mounts {
    fn unmount_fs(&mut self) {
        if let Some(fs) = self.fs.take() {
            run(Command::new("umount").arg(&fs));
        }
    }

    fn detach(&mut self) {
        self.unmount_fs();
        if let Some(dev) = self.loop_dev.take() {
            run(Command::new("losetup").arg("-d").arg(&dev));
        }
        // Unmounted before the child is taken: a failed umount leaves both to Drop.
        if let Some((dir, _)) = &self.fuse {
            run(Command::new("umount").arg(dir));
        }
        if let Some((_, mut child)) = self.fuse.take() {
            assert!(child.wait().unwrap().success(), "nbdfuse failed");
        }
    }
}

impl Mounts {
    /// Unmounts the FUSE file whose NBD server was killed: nbdfuse may exit with an
    /// error then, which is not the test's.
    fn detach_lost_backend(&mut self) {
        if let Some((dir, _)) = &self.fuse {
            run(Command::new("umount").arg(dir));
        }
        if let Some((_, mut child)) = self.fuse.take() {
            let _ = child.wait();
        }
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        if let Some(fs) = self.fs.take() {
            let _ = Command::new("umount").arg("-l").arg(fs).status();
        }
        if let Some(dev) = self.loop_dev.take() {
            let _ = Command::new("losetup").arg("-d").arg(dev).status();
        }
        if let Some((dir, mut child)) = self.fuse.take() {
            let _ = Command::new("umount").arg("-l").arg(dir).status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The export as a file (nbdfuse), a loop device on it, and `fs` mounted from it.
fn attach(m: &mut Mounts, s: &Server, export: &str, dir: &Path) -> String {
    let fuse = dir.join("fuse");
    let pidfile = dir.join("nbdfuse.pid");
    let _ = std::fs::remove_file(&pidfile);
    std::fs::create_dir_all(&fuse).unwrap();
    let child = Command::new("nbdfuse")
        .arg("-P")
        .arg(&pidfile)
        .arg(&fuse)
        .arg(s.uri(export))
        .spawn()
        .expect("nbdfuse (./test.sh installs libnbd-bin)");
    m.fuse = Some((fuse.clone(), child));
    let t = Instant::now();
    while !pidfile.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "nbdfuse did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = run(Command::new("losetup")
        .args(["-f", "--show"])
        .arg(fuse.join("nbd")));
    let dev = stdout(&out).trim().to_string();
    m.loop_dev = Some(dev.clone());
    dev
}

fn mount(m: &mut Mounts, dev: &str, at: &Path) {
    std::fs::create_dir_all(at).unwrap();
    run(Command::new("mount").arg(dev).arg(at));
    m.fs = Some(at.to_path_buf());
}

/// Why this machine cannot run the file-system test, if it cannot (no FUSE device,
/// no loop devices, not allowed to mount).
fn no_mount_support() -> Option<&'static str> {
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse");
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control");
    }
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (mount and losetup need it)");
    }
    None
}

/// Whether `test` must be skipped here (said on stderr); IOSHARE_REQUIRE_MOUNT=1 turns
/// the skip into a failure, for machines where it must run.
fn skipped_without_mounts(test: &str) -> bool {
    let Some(why) = no_mount_support() else {
        return false;
    };
    assert!(
        std::env::var_os("IOSHARE_REQUIRE_MOUNT").is_none(),
        "{test}: cannot run: {why}"
    );
    say_skipped(test, why);
    true
}

/// Says a test was skipped: on stderr, and in `IOSHARE_SKIPPED_LOG` (`./test.sh` lists
/// that file's lines at the end).
fn say_skipped(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
    if let Some(log) = std::env::var_os("IOSHARE_SKIPPED_LOG") {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(log) {
            let _ = writeln!(f, "{test}: {why}");
        }
    }
}

/// A 64 MiB FUSE file (nbdfuse) on nbdkit's memory plugin whose reads and writes each
/// take `delay_s` seconds (its delay filter): nbdkit, the mount, and the folder the
/// file (`nbd`) is in.
fn delayed_fuse_image(dir: &Path, delay_s: u64) -> (Child, Mounts, PathBuf) {
    let socket = dir.join("slow.sock");
    let delay = [format!("rdelay={delay_s}"), format!("wdelay={delay_s}")];
    let nbdkit = Command::new("nbdkit")
        .args(["-f", "-U"])
        .arg(&socket)
        .args(["--filter=delay", "memory", "64M"])
        .args(&delay)
        .spawn()
        .expect("nbdkit (./test.sh installs it)");
    let t = Instant::now();
    while !socket.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "nbdkit did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let fuse = dir.join("fuse");
    std::fs::create_dir_all(&fuse).unwrap();
    let pidfile = dir.join("nbdfuse.pid");
    let nbdfuse = Command::new("nbdfuse")
        .arg("-P")
        .arg(&pidfile)
        .arg(&fuse)
        .arg(format!("nbd+unix:///?socket={}", socket.display()))
        .spawn()
        .expect("nbdfuse (./test.sh installs libnbd-bin)");
    let mut m = Mounts::default();
    m.fuse = Some((fuse.clone(), nbdfuse));
    while !pidfile.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "nbdfuse did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (nbdkit, m, fuse)
}

/// One tenant's image hangs (nbdkit's delay filter at an hour a request, under
/// nbdfuse) with 32 of its reads outstanding: another tenant's reads go on, none slower
/// than a second, a new client of it is served, the hung reads are answered `EIO` at
/// `backend_timeout_s` and logged; once the hung backend dies the server stops cleanly.
/// (200 requests on a hung image had timed out a fresh client of another tenant.)
#[test]
fn a_hung_backend_is_answered_eio_and_stalls_nobody_else() {
    if skipped_without_mounts("a_hung_backend_is_answered_eio_and_stalls_nobody_else") {
        return;
    }
    let dir = tempdir();
    let (mut nbdkit, mut m, fuse) = delayed_fuse_image(dir.path(), 3600);
    let config = format!(
        "backend_timeout_s = 2\n[[tenant]]\nname = \"hung\"\nfile = \"{}\"\nsize = \"64m\"\n\
         [[tenant]]\nname = \"fast\"\nfile = \"fast.img\"\ncreate = true\nsize = \"64m\"\n",
        fuse.join("nbd").display()
    );
    let s = Server::start(dir.path(), &config);
    let mut hung = Raw::connect(&s);
    assert_eq!(hung.go("hung"), vec![3, 3, 1]);
    for i in 0..32u64 {
        hung.request(0, i, i * (1 << 20), 4096, &[]);
    }
    std::thread::sleep(Duration::from_secs(1));
    let beside = read_latencies(&s, "fast", 200, 64 << 20);
    let worst = *beside.iter().max().unwrap();
    println!(
        "fast tenant beside a hung backend: p99 {:?}, slowest {worst:?}",
        p99(beside)
    );
    assert!(worst < Duration::from_secs(1), "a read waited {worst:?}");
    let out = run(Command::new("nbdinfo").arg("--size").arg(s.uri("fast")));
    assert_eq!(stdout(&out).trim(), (64u64 << 20).to_string());
    let errors: Vec<u32> = (0..32).map(|_| hung.reply(0).1).collect();
    assert!(
        errors.iter().all(|&e| e == 5),
        "EIO for every hung read: {errors:?}"
    );
    // The hung backend dies: its operations fail, the server can let the image go.
    let _ = nbdkit.kill();
    let _ = nbdkit.wait();
    let err = s.stopped();
    m.detach_lost_backend();
    assert!(
        err.contains("ioshare: hung: its backend has not answered a read of 4096 bytes"),
        "{err}"
    );
}

/// A block status on an image whose file system hangs (its FUSE daemon stopped) is
/// looked up off the engine's threads: another tenant's reads go on beside it at their
/// pace alone (p99 within twice its value alone, none slower than a second), a new
/// client of that tenant is served, and the block status is answered `EIO` at
/// `backend_timeout_s`. (It had blocked an engine thread: the other tenant completed
/// nothing while the daemon was stopped.)
#[test]
fn a_block_status_on_a_hung_image_stalls_nobody_else() {
    if skipped_without_mounts("a_block_status_on_a_hung_image_stalls_nobody_else") {
        return;
    }
    let dir = tempdir();
    let (mut nbdkit, mut m, fuse) = delayed_fuse_image(dir.path(), 0);
    let config = format!(
        "backend_timeout_s = 2\n[[tenant]]\nname = \"hung\"\nfile = \"{}\"\nsize = \"64m\"\n\
         [[tenant]]\nname = \"fast\"\nfile = \"fast.img\"\ncreate = true\nsize = \"64m\"\n",
        fuse.join("nbd").display()
    );
    let s = Server::start(dir.path(), &config);
    let alone = read_latencies(&s, "fast", 300, 64 << 20);
    let daemon = m.fuse.as_ref().unwrap().1.id() as i32;
    // SAFETY: signalling the test's own child.
    unsafe { libc::kill(daemon, libc::SIGSTOP) };
    let maps: Vec<Child> = (0..4)
        .map(|_| {
            Command::new("nbdinfo")
                .arg("--map")
                .arg(s.uri("hung"))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let beside = read_latencies(&s, "fast", 300, 64 << 20);
    let fresh = Instant::now();
    let out = run(Command::new("nbdinfo").arg("--size").arg(s.uri("fast")));
    assert_eq!(stdout(&out).trim(), (64u64 << 20).to_string());
    let fresh = fresh.elapsed();
    let outcomes: Vec<_> = maps
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    // SAFETY: as above.
    unsafe { libc::kill(daemon, libc::SIGCONT) };
    let (p_alone, p_beside) = (p99(alone.clone()), p99(beside.clone()));
    let worst = *beside.iter().max().unwrap();
    println!(
        "fast tenant beside block status on a hung image: p99 {p_beside:?} (alone {p_alone:?}), slowest {worst:?}, a new client {fresh:?}"
    );
    assert!(worst < Duration::from_secs(1), "a read waited {worst:?}");
    assert!(
        p_beside <= 2 * p_alone.max(Duration::from_micros(500)),
        "p99 {p_beside:?} beside, {p_alone:?} alone"
    );
    assert!(
        fresh < Duration::from_secs(5),
        "a new client took {fresh:?}"
    );
    for o in &outcomes {
        assert!(!o.status.success(), "answered EIO at the timeout");
    }
    let _ = nbdkit.kill();
    let _ = nbdkit.wait();
    let err = s.stopped();
    m.detach_lost_backend();
    assert!(
        err.contains("ioshare: hung: its backend has not answered a block status"),
        "{err}"
    );
}

/// A flood of block status over a fragmented image (a data block every other 4 KiB:
/// 32,768 extents) from 4 connections, 8 in flight each, is its tenant's load: each
/// lookup is dispatched by the policy, walks at most 64 extents off the engine's
/// threads and is charged to its tenant, so another tenant's reads beside it fare as
/// they do beside the same connections flooding 4 KiB reads (measured in the same run).
/// Printed: that tenant's p50 and p99 alone, beside each flood, and each flood's rate
/// (docs/benchmarks.md). Asserted: every read is served, none slower than a second (the
/// status flood had pushed its p99 to 158–281 ms with the walk on the engine thread).
#[test]
fn a_block_status_flood_is_its_tenants_load() {
    let dir = tempdir();
    let frag = dir.path().join("frag.img");
    {
        use std::os::unix::fs::FileExt as _;
        let f = std::fs::File::create(&frag).unwrap();
        f.set_len(256 << 20).unwrap();
        for i in 0..(256u64 << 20) / 8192 {
            f.write_all_at(&[1u8; 4096], i * 8192).unwrap();
        }
    }
    let s = Server::start(
        dir.path(),
        "policy = \"sfq\"\n[[tenant]]\nname = \"frag\"\nfile = \"frag.img\"\n\
         [[tenant]]\nname = \"fast\"\nfile = \"fast.img\"\ncreate = true\nsize = \"64m\"\n",
    );
    let alone = read_latencies(&s, "fast", 1000, 64 << 20);
    let (status, status_rate) = beside_a_flood(&s, true);
    let (reads, read_rate) = beside_a_flood(&s, false);
    let p50 = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    for (what, rate, v) in [
        ("alone", 0.0, &alone),
        ("block status", status_rate, &status),
        ("4 KiB reads", read_rate, &reads),
    ] {
        println!(
            "fast tenant beside {what} ({rate:.0} a second answered): p50 {:?} p99 {:?}, slowest {:?}",
            p50(v.clone()),
            p99(v.clone()),
            v.iter().max().unwrap()
        );
    }
    let worst = *status.iter().max().unwrap();
    assert!(worst < Duration::from_secs(1), "a read waited {worst:?}");
    s.stopped();
}

/// Tenant `fast`'s read latencies while 4 connections of tenant `frag` keep 8 requests
/// each in flight — block status of 1 MiB (`status`) or 4 KiB reads — and the rate
/// those were answered at.
fn beside_a_flood(s: &Server, status: bool) -> (Vec<Duration>, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let flooders: Vec<_> = (0..4)
        .map(|_| {
            let mut c = Raw::connect(s);
            if status {
                c.go_for_status("frag");
            } else {
                assert_eq!(c.go("frag"), vec![3, 3, 1]);
            }
            let (stop, answered) = (stop.clone(), answered.clone());
            std::thread::spawn(move || {
                let ask = |c: &mut Raw, h: u64| {
                    let at = (h * 7919 * 8192) % (255 << 20);
                    if status {
                        c.request(7, h, at, 1 << 20, &[]);
                    } else {
                        c.request(0, h, at, 4096, &[]);
                    }
                };
                let answer = |c: &mut Raw| {
                    if status {
                        let (_, error, extents) = c.status_reply();
                        assert_eq!(error, 0);
                        assert!(extents <= 64, "{extents} extents in one reply");
                    } else {
                        assert_eq!(c.reply(4096).1, 0);
                    }
                };
                for h in 1..=8 {
                    ask(&mut c, h);
                }
                let mut handle = 8;
                while !stop.load(Ordering::Relaxed) {
                    answer(&mut c);
                    answered.fetch_add(1, Ordering::Relaxed);
                    handle += 1;
                    ask(&mut c, handle);
                }
                for _ in 0..8 {
                    answer(&mut c);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let before = answered.load(Ordering::Relaxed);
    let beside = read_latencies(s, "fast", 1000, 64 << 20);
    let rate = (answered.load(Ordering::Relaxed) - before) as f64 / t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    (beside, rate)
}

/// Latencies of `n` 4 KiB reads, one at a time, at spread offsets of `export`.
fn read_latencies(s: &Server, export: &str, n: u64, span: u64) -> Vec<Duration> {
    let mut c = Raw::connect(s);
    assert_eq!(c.go(export), vec![3, 3, 1]);
    (0..n)
        .map(|i| {
            let t = Instant::now();
            c.request(0, i, (i * 7919 * 4096) % span, 4096, &[]);
            assert_eq!(c.reply(4096), (i, 0));
            t.elapsed()
        })
        .collect()
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99).div_ceil(100) - 1]
}

/// One tenant's image on a FUSE file whose reads and writes take 2 s each (nbdkit's
/// delay filter under nbdfuse), with 32 requests of it in flight at all times; another
/// tenant's reads go on beside it. Its requests held every place in the device queue
/// (another tenant stalled for 16–70 s); now a stalled tenant keeps at most its share
/// of the queue and its image's operations go to kernel workers. Asserted: the other
/// tenant's reads all finish, none slower than a second; its p99 alone and beside the
/// slow one are printed (docs/benchmarks.md).
#[test]
fn a_slow_backend_does_not_stall_another_tenant() {
    if skipped_without_mounts("a_slow_backend_does_not_stall_another_tenant") {
        return;
    }
    let dir = tempdir();
    let (mut nbdkit, mut m, fuse) = delayed_fuse_image(dir.path(), 2);
    let config = format!(
        "[[tenant]]\nname = \"slow\"\nfile = \"{}\"\nsize = \"64m\"\n\
         [[tenant]]\nname = \"fast\"\nfile = \"fast.img\"\ncreate = true\nsize = \"64m\"\n",
        fuse.join("nbd").display()
    );
    let s = Server::start(dir.path(), &config);
    let alone = read_latencies(&s, "fast", 300, 64 << 20);
    // 32 requests of the slow tenant in flight, renewed as each returns.
    let stop = Arc::new(AtomicBool::new(false));
    let slow = {
        let (stop, socket) = (stop.clone(), s.socket.clone());
        std::thread::spawn(move || {
            let c = UnixStream::connect(&socket).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            let mut raw = Raw(c);
            let mut greeting = [0u8; 18];
            raw.0.read_exact(&mut greeting).unwrap();
            raw.0.write_all(&3u32.to_be_bytes()).unwrap();
            assert_eq!(raw.go("slow"), vec![3, 3, 1]);
            let mut next = 0u64;
            for _ in 0..32 {
                raw.request(0, next, (next % 16_000) * 4096, 4096, &[]);
                next += 1;
            }
            while !stop.load(Ordering::Relaxed) {
                let _ = raw.reply(4096);
                raw.request(0, next, (next % 16_000) * 4096, 4096, &[]);
                next += 1;
            }
            next
        })
    };
    // Past the first returns: the slow tenant is known to be slow by then.
    std::thread::sleep(Duration::from_secs(5));
    let beside = read_latencies(&s, "fast", 300, 64 << 20);
    stop.store(true, Ordering::Relaxed);
    let worst = *beside.iter().max().unwrap();
    println!(
        "fast tenant, 300 reads: p99 alone {:?}, beside the slow backend {:?} (slowest {worst:?})",
        p99(alone),
        p99(beside.clone())
    );
    let sent = slow.join().unwrap();
    println!("the slow tenant sent {sent} requests");
    assert!(worst < Duration::from_secs(1), "a read waited {worst:?}");
    // The drain waits for the slow tenant's outstanding reads; then nothing holds the
    // image and the file system unmounts (not busy).
    s.stopped();
    m.detach();
    let _ = nbdkit.kill();
    let _ = nbdkit.wait();
}

#[test]
fn ext4_on_an_export_survives_unmount_and_server_restart() {
    if skipped_without_mounts("ext4_on_an_export_survives_unmount_and_server_restart") {
        return;
    }
    let dir = tempdir();
    let config = "policy = \"sfq\"\n[backend]\ncache = \"none\"\n[[tenant]]\nname = \"fs\"\nfile = \"fs.img\"\ncreate = true\nsize = \"96m\"\n[[tenant]]\nname = \"other\"\nfile = \"other.img\"\ncreate = true\nsize = \"16m\"\n";
    let s = Server::start(dir.path(), config);
    let mut m = Mounts::default();
    let dev = attach(&mut m, &s, "fs", dir.path());
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev));
    let root = dir.path().join("mnt");
    mount(&mut m, &dev, &root);
    // Files: one large of pseudo-random bytes, many small ones in a folder.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let big: Vec<u8> = (0..(8 << 20))
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let write = |path: &Path, bytes: &[u8]| {
        let mut f = std::fs::File::create(path).unwrap();
        f.write_all(bytes).unwrap();
        f.sync_all().unwrap();
    };
    write(&root.join("big.bin"), &big);
    std::fs::create_dir(root.join("small")).unwrap();
    for i in 0..200 {
        write(
            &root.join("small").join(format!("{i}.txt")),
            format!("file {i}\n").repeat(i + 1).as_bytes(),
        );
    }
    let check = |root: &Path| {
        assert!(
            std::fs::read(root.join("big.bin")).unwrap() == big,
            "big.bin differs"
        );
        for i in 0..200 {
            let got = std::fs::read_to_string(root.join("small").join(format!("{i}.txt"))).unwrap();
            assert_eq!(got, format!("file {i}\n").repeat(i + 1));
        }
    };
    // Unmount and mount again on the same server...
    m.unmount_fs();
    mount(&mut m, &dev, &root);
    check(&root);
    // ...then take everything down, restart the server, and look once more.
    m.detach();
    s.stopped();
    let s = Server::start(dir.path(), config);
    let dev = attach(&mut m, &s, "fs", dir.path());
    run(Command::new("e2fsck").args(["-f", "-n"]).arg(&dev));
    mount(&mut m, &dev, &root);
    check(&root);
    m.detach();
    // The other export saw none of it.
    let other = std::fs::read(dir.path().join("other.img")).unwrap();
    assert!(
        other.iter().all(|&b| b == 0),
        "the other export was written"
    );
    s.stopped();
}

#[test]
fn a_flooding_client_is_held_back_by_its_queue_bound() {
    let dir = tempdir();
    let port = free_port();
    let s = Server::start(
        dir.path(),
        &format!(
            "policy = \"mclock\"\nqueue_limit = 4\ndrain_timeout_s = 0.2\nmetrics = \"127.0.0.1:{port}\"\n\
             [[tenant]]\nname = \"flood\"\nfile = \"flood.img\"\ncreate = true\nsize = \"64m\"\nlimit_iops = 1.0\n\
             [[tenant]]\nname = \"calm\"\nfile = \"calm.img\"\ncreate = true\nsize = \"1m\"\n"
        ),
    );
    let mut flood = Raw::connect(&s);
    assert_eq!(flood.go("flood"), vec![3, 3, 1]);
    // 64 MiB of writes, sent as fast as the socket takes them, replies never read.
    let mut sender = flood.0.try_clone().unwrap();
    sender
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flooding = {
        let sent = sent.clone();
        std::thread::spawn(move || {
            let payload = vec![0x77u8; 64 << 10];
            for h in 0..1024u64 {
                let mut b = 0x2560_9513u32.to_be_bytes().to_vec();
                b.extend_from_slice(&0u16.to_be_bytes());
                b.extend_from_slice(&1u16.to_be_bytes());
                b.extend_from_slice(&h.to_be_bytes());
                b.extend_from_slice(&(h * (64 << 10)).to_be_bytes());
                b.extend_from_slice(&(64u32 << 10).to_be_bytes());
                b.extend_from_slice(&payload);
                if sender.write_all(&b).is_err() {
                    return;
                }
                sent.fetch_add(b.len(), std::sync::atomic::Ordering::SeqCst);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    // The server holds at most the bound in the engine, its read buffer and one
    // request being assembled: the flood stalls in the socket, megabytes short.
    let stalled = sent.load(std::sync::atomic::Ordering::SeqCst);
    assert!(stalled < 8 << 20, "{stalled} bytes taken in 1.5 s");
    // `queue_limit` bounds what waits in the host; what is on the device is bounded by
    // the queue depth (here 1 at a time: 1 IOPS).
    let text = http_get(port, "/metrics").1;
    let queued = series(&text, "ioshare_tenant_queued{tenant=\"flood\"}").unwrap();
    let in_flight = series(&text, "ioshare_tenant_in_flight{tenant=\"flood\"}").unwrap();
    assert!(
        queued <= 4.0 && in_flight <= 1.0,
        "{queued} queued, {in_flight} in flight\n{text}"
    );
    // The other tenant is served meanwhile.
    let mut calm = Raw::connect(&s);
    assert_eq!(calm.go("calm"), vec![3, 3, 1]);
    let t = Instant::now();
    calm.request(0, 1, 0, 4096, &[]);
    assert_eq!(calm.reply(4096), (1, 0));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    s.stopped();
    drop(flood);
    flooding.join().unwrap();
}

#[test]
fn emulated_backend_never_answers_before_the_model() {
    let dir = tempdir();
    // One request at a time, 2 ms each: the model's clock is easy to check.
    let s = Server::start(
        dir.path(),
        "[backend]\nkind = \"emulated\"\npath = \"data.img\"\n\
         device = { model = \"fixed\", latency_us = 2000, bandwidth_mb_s = 100000, parallelism = 1, capacity_gib = 1 }\n\
         [[tenant]]\nname = \"a\"\noffset = 0\nsize = \"16m\"\n",
    );
    let mut c = Raw::connect(&s);
    assert_eq!(c.go("a"), vec![3, 3, 1]);
    let mut slowest_qd1 = Duration::ZERO;
    for h in 0..10 {
        let t = Instant::now();
        c.request(0, h, h * 4096, 4096, &[]);
        assert_eq!(c.reply(4096), (h, 0));
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(2),
            "request {h} took {took:?}"
        );
        slowest_qd1 = slowest_qd1.max(took);
    }
    // Eight at once on a device that serves one at a time: 16 ms at the least.
    let t = Instant::now();
    for h in 10..18 {
        c.request(0, h, h * 4096, 4096, &[]);
    }
    let mut order = Vec::new();
    for _ in 10..18 {
        order.push(c.reply(4096).0);
    }
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(16), "8 requests in {took:?}");
    // A sanity bound only (this is a shared machine): not seconds.
    assert!(took < Duration::from_secs(2), "8 requests in {took:?}");
    assert!(slowest_qd1 < Duration::from_secs(1), "{slowest_qd1:?}");
    order.sort();
    assert_eq!(order, (10..18).collect::<Vec<_>>());
    let err = s.stopped();
    assert!(err.contains("emulating fixed: 2000 µs"), "{err}");
}

#[test]
fn emulated_aged_ssd_keeps_every_byte() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        "policy = \"feedbac\"\n[backend]\nkind = \"emulated\"\npath = \"data.img\"\n\
         device = { model = \"ssd\", preset = \"nvme-p4500\", precondition = \"aged\", capacity_gib = 1 }\n\
         [[tenant]]\nname = \"a\"\noffset = 0\nsize = \"32m\"\nweight = 2\n\
         [[tenant]]\nname = \"b\"\noffset = \"32m\"\nsize = \"32m\"\n",
    );
    let a = fio_verify(&s.uri("a"), "4k", "16m")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let b = run(&mut fio_verify(&s.uri("b"), "64k", "32m"));
    let a = a.wait_with_output().unwrap();
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    for out in [&a, &b] {
        assert!(stdout(out).contains("err= 0"), "{}", stdout(out));
    }
    let err = s.stopped();
    assert!(
        err.contains("emulating ssd nvme-p4500 (aged), 1 GiB"),
        "{err}"
    );
    assert!(err.contains("0 errors, 0 refused"), "{err}");
}

/// A tenant far above its SLO under TA1: by default the requests its bucket cannot
/// take are held back by the host (the client is slowed down, never failed), and with
/// `refuse = "error"` they are answered with EIO, as the token-bucket paper has it.
#[test]
fn policy_refusals_are_held_back_by_default_and_errors_on_request() {
    const TENANT: &str = r#"
[[tenant]]
name = "vm1"
file = "vm1.img"
create = true
size = "16m"
slo = { iops = 400.0, size = 4096, rt_us = 5000 }
"#;
    let flood = |s: &Server| {
        Command::new("fio")
            .args([
                "--name=flood",
                "--ioengine=nbd",
                &format!("--uri={}", s.uri("vm1")),
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=16",
                "--size=1m",
            ])
            .output()
            .unwrap()
    };
    let counters = |port: u16| {
        let (_, text) = http_get(port, "/metrics");
        (
            series(&text, "ioshare_requests_held_back_total{tenant=\"vm1\"}"),
            series(&text, "ioshare_requests_refused_total{tenant=\"vm1\"}"),
        )
    };
    for (refuse, fails) in [("", false), ("refuse = \"error\"\n", true)] {
        let dir = tempdir();
        let port = free_port();
        let s = Server::start(
            dir.path(),
            &format!("metrics = \"127.0.0.1:{port}\"\npolicy = \"ta1\"\n{refuse}{TENANT}"),
        );
        let out = flood(&s);
        let (held_back, refused) = counters(port);
        if fails {
            assert!(!stdout(&out).contains("err= 0"), "{}", stdout(&out));
            assert!(refused.unwrap() > 0.0, "EIO answers are counted as refused");
        } else {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(stdout(&out).contains("err= 0"), "{}", stdout(&out));
            assert!(
                held_back.unwrap() > 0.0,
                "the bucket refused, the host held back"
            );
            assert_eq!(refused, Some(0.0));
        }
        s.stopped();
    }
}

/// A CA, a server certificate for `localhost` and 127.0.0.1 and a client certificate,
/// in the file names `qemu`'s `tls-creds-x509` and libnbd's `tls-certificates` read:
/// `server/` (ca-cert.pem, server-cert.pem, server-key.pem), `client/` (ca-cert.pem,
/// client-cert.pem, client-key.pem) and `anonymous/` (ca-cert.pem only).
fn make_pki(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ioshare test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |names: Vec<String>, cn: &str| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(
        vec!["localhost".to_string(), "127.0.0.1".to_string()],
        "localhost",
    );
    let (client_cert, client_key) = leaf(vec!["client".to_string()], "client");
    for (sub, files) in [
        (
            "server",
            vec![
                ("server-cert.pem", &server_cert),
                ("server-key.pem", &server_key),
            ],
        ),
        (
            "client",
            vec![
                ("client-cert.pem", &client_cert),
                ("client-key.pem", &client_key),
            ],
        ),
        ("anonymous", vec![]),
    ] {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("ca-cert.pem"), ca.pem()).unwrap();
        for (name, text) in files {
            std::fs::write(d.join(name), text).unwrap();
        }
    }
}

/// TLS on the TCP export (`tls = "require"`, client certificates asked for): qemu-io
/// writes over TLS with a client certificate, nbdinfo reads it back over TLS, what it
/// wrote is what the Unix socket (TLS offered, not required) reads in the clear; a
/// client in the clear, or over TLS without a client certificate, gets nothing.
#[test]
fn tls_exports_serve_qemu_and_libnbd_and_refuse_the_clear() {
    let dir = tempdir();
    let pki = dir.path().join("pki");
    make_pki(&pki);
    let port = free_port();
    let s = Server::start(
        dir.path(),
        &format!(
            "tcp = \"127.0.0.1:{port}\"\ntls = \"require\"\n\
             tls_cert = \"pki/server/server-cert.pem\"\ntls_key = \"pki/server/server-key.pem\"\n\
             tls_client_ca = \"pki/server/ca-cert.pem\"\n{TWO_TENANTS}"
        ),
    );
    let client = pki.join("client");
    let creds = format!(
        "tls-creds-x509,id=tls0,dir={},endpoint=client",
        client.display()
    );
    let image = format!("driver=nbd,host=127.0.0.1,port={port},export=vm1,tls-creds=tls0");
    let out = run(Command::new("qemu-io")
        .args(["--object", &creds, "--image-opts", &image])
        .args(["-c", "write -P 0xa7 1M 3M", "-c", "read -P 0xa7 1M 3M"]));
    assert!(
        !stdout(&out).contains("Pattern verification failed"),
        "{}",
        stdout(&out)
    );
    let tls_uri = |d: &Path| {
        format!(
            "nbds://127.0.0.1:{port}/vm1?tls-certificates={}",
            d.display()
        )
    };
    let info = run(Command::new("nbdinfo").arg("--json").arg(tls_uri(&client)));
    assert!(stdout(&info).contains("\"TLS\": true"), "{}", stdout(&info));
    // What went over TLS is on the export: read back in the clear on the Unix socket.
    let out = run(Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "read -P 0xa7 1M 3M",
            "-c",
            "read -P 0 0 1M",
        ])
        .arg(s.uri("vm1")));
    assert!(
        !stdout(&out).contains("Pattern verification failed"),
        "{}",
        stdout(&out)
    );
    // In the clear over TCP: refused (NBD_REP_ERR_TLS_REQD).
    let clear = Command::new("nbdinfo")
        .arg(format!("nbd://127.0.0.1:{port}/vm1"))
        .output()
        .unwrap();
    assert!(!clear.status.success(), "served in the clear over TCP");
    // Over TLS but without a client certificate: the handshake fails.
    let anonymous = Command::new("nbdinfo")
        .arg(tls_uri(&pki.join("anonymous")))
        .output()
        .unwrap();
    assert!(
        !anonymous.status.success(),
        "served without a client certificate"
    );
    // A client that trusts another CA: it refuses the server's certificate.
    let other = dir.path().join("other-pki");
    make_pki(&other);
    let distrust = Command::new("nbdinfo")
        .arg(tls_uri(&other.join("client")))
        .output()
        .unwrap();
    assert!(
        !distrust.status.success(),
        "a certificate of another CA taken"
    );
    let err = s.stopped();
    // Each failure is logged with its reason (the second client closes without an
    // alert: the server says what that most often means).
    assert!(
        err.contains("TLS handshake: peer sent no certificates"),
        "{err}"
    );
    assert!(
        err.contains("TLS handshake: the client hung up in it"),
        "{err}"
    );
}

/// The metrics endpoint answers a scrape while connections that send nothing are open
/// (it answered one connection at a time, each allowed 2 s: ten idle ones held a
/// scrape for 20 s); they are still open when the scrape is answered, and closed by
/// the server once their time is up.
#[test]
fn idle_metrics_connections_do_not_hold_up_a_scrape() {
    let dir = tempdir();
    let port = free_port();
    let s = Server::start(
        dir.path(),
        &format!("metrics = \"127.0.0.1:{port}\"\n{TWO_TENANTS}"),
    );
    let idle: Vec<std::net::TcpStream> = (0..10)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let (status, text) = http_get(port, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(text.contains("ioshare_policy_info"), "{text}");
    let mut byte = [0u8; 1];
    for c in &idle {
        c.set_nonblocking(true).unwrap();
        let e = (&*c)
            .read(&mut byte)
            .expect_err("nothing was sent to an idle scraper");
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "still open");
    }
    for c in &idle {
        c.set_nonblocking(false).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        assert_eq!(
            (&*c).read(&mut byte).unwrap(),
            0,
            "closed after its deadline"
        );
    }
    s.stopped();
}

/// An image deleted while served is logged at once with how to save it, and a restart
/// with `create = true` refuses to serve an empty disk in its place.
#[test]
fn an_image_deleted_while_served_is_logged_and_not_recreated_empty() {
    let dir = tempdir();
    let s = Server::start(dir.path(), TWO_TENANTS);
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x42 0 1M"])
        .arg(s.uri("vm1")));
    std::fs::remove_file(dir.path().join("vm1.img")).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let err = s.stopped();
    assert!(
        err.contains(&format!(
            "ioshare: vm1: its image {} was deleted while served",
            dir.path().join("vm1.img").display()
        )),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_ioshare"))
        .arg("serve")
        .arg(dir.path().join("serve.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("vm1.img: missing, but a server created or served it before"),
        "{said}"
    );
    assert!(
        !dir.path().join("vm1.img").exists(),
        "no empty disk created"
    );
}

/// One process flooding the Unix socket with connections it drops at once (some 40,000
/// a second): other processes' clients still connect, non-blocking ones included (no
/// `EAGAIN` from a full backlog) and `nbdinfo` each time; the flooder is told it is too
/// fast.
#[test]
#[allow(unsafe_code)]
fn a_connect_flood_from_one_process_turns_nobody_else_away() {
    use std::os::unix::ffi::OsStrExt as _;
    let dir = tempdir();
    let s = Server::start(dir.path(), TWO_TENANTS);
    // The address, made before the fork: the child only makes syscalls.
    // SAFETY: all-zero bytes are a valid sockaddr_un.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, b) in addr
        .sun_path
        .iter_mut()
        .zip(s.socket.as_os_str().as_bytes())
    {
        *d = *b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    let connect_once = |nonblocking: bool| -> i32 {
        let kind = libc::SOCK_STREAM | if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
        // SAFETY: plain syscalls on a socket made here; `addr` outlives them.
        unsafe {
            let fd = libc::socket(libc::AF_UNIX, kind, 0);
            let r = libc::connect(fd, (&raw const addr).cast(), len);
            let e = if r == 0 { 0 } else { *libc::__errno_location() };
            libc::close(fd);
            e
        }
    };
    // SAFETY: the child makes only async-signal-safe syscalls, then _exits.
    let flooder = unsafe { libc::fork() };
    assert!(flooder >= 0);
    if flooder == 0 {
        let until = unsafe {
            let mut t: libc::timespec = std::mem::zeroed();
            libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t);
            t.tv_sec + 8
        };
        // 400 connects each 10 ms at most: some 40,000 a second, twice and more what
        // the issue's flooding script made, and enough to fill the backlog of a server
        // that spends a thread on each.
        let pause = libc::timespec {
            tv_sec: 0,
            tv_nsec: 10_000_000,
        };
        loop {
            for _ in 0..400 {
                connect_once(true);
            }
            // SAFETY: as above.
            unsafe { libc::nanosleep(&pause, std::ptr::null_mut()) };
            // SAFETY: as above.
            let now = unsafe {
                let mut t: libc::timespec = std::mem::zeroed();
                libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t);
                t.tv_sec
            };
            if now >= until {
                // SAFETY: ends the child without running the parent's destructors.
                unsafe { libc::_exit(0) };
            }
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut turned_away = Vec::new();
    for i in 0..25 {
        let e = connect_once(i % 2 == 0);
        if e != 0 {
            turned_away.push((i, std::io::Error::from_raw_os_error(e).to_string()));
        }
        std::thread::sleep(Duration::from_millis(40));
    }
    let mut nbdinfo_failed = Vec::new();
    for _ in 0..5 {
        let out = Command::new("nbdinfo")
            .arg("--size")
            .arg(s.uri("vm1"))
            .output()
            .unwrap();
        if !out.status.success() {
            nbdinfo_failed.push(String::from_utf8_lossy(&out.stderr).to_string());
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(flooder, &mut status, 0) };
    assert!(turned_away.is_empty(), "turned away: {turned_away:?}");
    assert!(nbdinfo_failed.is_empty(), "nbdinfo: {nbdinfo_failed:?}");
    let err = s.stopped();
    assert!(
        err.contains(&format!("local pid {flooder} "))
            && err.contains("opens connections faster than"),
        "{err}"
    );
}

/// Hostile clients cannot blind the metrics endpoint: 16 silent connections and 64 that
/// send one byte and stop, each reconnecting as soon as it is closed (16 silent ones had
/// taken all 16 scrape threads: 0 of 40 scrapes answered). Every one of 40 scrapes is
/// answered; how fast is measured in docs/benchmarks.md, not asserted here.
#[test]
fn hostile_metrics_clients_do_not_blind_the_endpoint() {
    use std::sync::atomic::AtomicU64;
    let dir = tempdir();
    let port = free_port();
    let s = Server::start(
        dir.path(),
        &format!("metrics = \"127.0.0.1:{port}\"\n{TWO_TENANTS}"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let hostile_connects = Arc::new(AtomicU64::new(0));
    let hostile: Vec<_> = (0..80)
        .map(|i| {
            let (stop, connects) = (stop.clone(), hostile_connects.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                        continue;
                    };
                    connects.fetch_add(1, Ordering::Relaxed);
                    if i >= 16 {
                        let _ = c.write_all(b"G");
                    }
                    c.set_read_timeout(Some(Duration::from_millis(200)))
                        .unwrap();
                    let mut byte = [0u8; 1];
                    // Held until the server closes it (or the test ends).
                    while !stop.load(Ordering::Relaxed) {
                        match c.read(&mut byte) {
                            Ok(0) => break,
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                            Err(_) => break,
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let mut slowest = Duration::ZERO;
    for _ in 0..40 {
        let t = Instant::now();
        let (status, text) = http_get(port, "/metrics");
        slowest = slowest.max(t.elapsed());
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(text.contains("ioshare_policy_info"), "{text}");
        std::thread::sleep(Duration::from_millis(25));
    }
    stop.store(true, Ordering::Relaxed);
    for h in hostile {
        h.join().unwrap();
    }
    eprintln!(
        "40 of 40 scrapes answered beside {} hostile connections; slowest {slowest:?}",
        hostile_connects.load(Ordering::Relaxed)
    );
    assert!(
        hostile_connects.load(Ordering::Relaxed) > 80,
        "the hostile clients were closed and reconnected"
    );
    s.stopped();
}

/// CPU time (user and system, in clock ticks) of the server's thread named `name`.
fn thread_ticks(s: &Server, name: &str) -> u64 {
    let tasks = format!("/proc/{}/task", s.child.id());
    for task in std::fs::read_dir(&tasks).unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap();
        let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
        // utime and stime: fields 14 and 15 of stat, 12 and 13 after the command.
        return fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    panic!("no thread named {name} in {tasks}");
}

/// Out of descriptors, the metrics endpoint rests instead of spinning on `accept` (it
/// had spun at a full core), and answers again once descriptors are free.
#[test]
fn metrics_endpoint_out_of_descriptors_rests_and_recovers() {
    let dir = tempdir();
    let port = free_port();
    let s = Server::start_limited(
        dir.path(),
        &format!("metrics = \"127.0.0.1:{port}\"\n{TWO_TENANTS}"),
        &[],
        Some(64),
    );
    // Silent NBD connections take the server's last descriptors.
    let nbd: Vec<UnixStream> = (0..80)
        .map(|_| UnixStream::connect(&s.socket).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let waiting: Vec<std::net::TcpStream> = (0..20)
        .map(|_| {
            // One byte of a request that never ends: accepted, then held to its deadline.
            let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            c.write_all(b"G").unwrap();
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let before = thread_ticks(&s, "metrics");
    std::thread::sleep(Duration::from_secs(2));
    let spent = thread_ticks(&s, "metrics") - before;
    println!("metrics thread: {spent} ticks in 2 s out of descriptors");
    // 200 ticks would be a core spinning for the two seconds.
    assert!(spent < 40, "the metrics thread used {spent} ticks in 2 s");
    drop(nbd);
    drop(waiting);
    let t = Instant::now();
    loop {
        let answered = std::panic::catch_unwind(|| http_get(port, "/metrics"));
        if let Ok((status, _)) = answered {
            assert_eq!(status, "HTTP/1.1 200 OK");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no scrape answered");
        std::thread::sleep(Duration::from_millis(100));
    }
    s.stopped();
}

/// An image truncated while served: a read past its new end is answered with an error
/// (it read back zeroes, which a guest takes for its data) and logged; reads before the
/// end go on.
#[test]
fn a_read_past_a_shrunken_image_is_an_error_not_zeroes() {
    let dir = tempdir();
    let s = Server::start(dir.path(), TWO_TENANTS);
    run(Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "write -P 0x3c 0 1M",
            "-c",
            "write -P 0x3c 8M 1M",
        ])
        .arg(s.uri("vm1")));
    let image = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("vm1.img"))
        .unwrap();
    image.set_len(4 << 20).unwrap();
    let out = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0x3c 8M 4k"])
        .arg(s.uri("vm1"))
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("Input/output error"), "{said}");
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0x3c 0 1M"])
        .arg(s.uri("vm1")));
    let err = s.stopped();
    assert!(
        err.contains("vm1: a read at byte 8388608 met the end of its image"),
        "{err}"
    );
}

/// A client that reconnects in a loop with a bad handshake gets its first lines logged,
/// then about one a second; what was held back is counted with its next line. (Past its
/// burst of new connections it is paced: those are closed at accept, unlogged but for
/// one line saying so.)
#[test]
fn a_client_looping_bad_handshakes_cannot_flood_the_log() {
    let dir = tempdir();
    let s = Server::start(dir.path(), TWO_TENANTS);
    let bad = |s: &Server| {
        let mut c = UnixStream::connect(&s.socket).unwrap();
        let mut greeting = [0u8; 18];
        if c.read_exact(&mut greeting).is_err() {
            return; // closed at accept: paced
        }
        let _ = c.write_all(&0u32.to_be_bytes()); // no FIXED_NEWSTYLE
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
    };
    for _ in 0..300 {
        bad(&s);
    }
    std::thread::sleep(Duration::from_millis(1500));
    bad(&s);
    let err = s.stopped();
    let lines = err.matches("lack FIXED_NEWSTYLE").count();
    // The burst of 20, about one a second of the loop, and the one after the pause.
    assert!((21..=40).contains(&lines), "{lines} lines logged:\n{err}");
    assert!(err.contains("line(s) from local pid "), "{err}");
}

/// The hardening issue's memory target: 200 connections stalled after a 32 MiB write
/// header, plus one client pipelining 1,000 32 MiB reads and reading no reply, hold the
/// server within `max_inflight_bytes` (512 MiB by default) + 64 MiB, and another
/// tenant's 4 KiB reads are all answered meanwhile (their p99 is printed; timing is
/// for benchmarks, not asserted).
#[test]
fn stalled_writes_and_unread_replies_together_stay_within_the_budget() {
    let dir = tempdir();
    // All of the hostile connections are vm1's: its share of the connections is lifted
    // so that the memory budget is what holds them.
    let s = Server::start(
        dir.path(),
        &format!("max_connections_per_tenant = 256\nmax_connections_per_peer = 256\n{TWO_TENANTS}"),
    );
    let pid = s.child.id();
    let mut reader = served_reader(&s);
    let before = rss(pid);
    let stalled = stalled_writers(&s, 200);
    let mut greedy = Raw::connect(&s);
    greedy.go("vm1");
    greedy.pipeline_big_reads(1000);
    let sampler = std::thread::spawn(move || peak_growth(pid, before, 30));
    let mut took = Vec::new();
    for i in 0..200u64 {
        let t = Instant::now();
        reader.request(0, 10 + i, (i % 64) * 4096, 4096, &[]);
        assert_eq!(reader.reply(4096), (10 + i, 0), "another tenant is served");
        took.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(10));
    }
    let grown = sampler.join().unwrap();
    took.sort();
    println!(
        "4 KiB reads beside 200 stalled writes and 1,000 unread 32 MiB reads: p50 {:?}, p99 {:?}, max {:?}; server grew {} MiB",
        took[took.len() / 2],
        took[took.len() * 99 / 100],
        took[took.len() - 1],
        grown >> 20
    );
    assert!(
        grown <= (512 + 64) << 20,
        "the server grew by {} MiB, past max_inflight_bytes + 64 MiB",
        grown >> 20
    );
    drop((stalled, greedy));
    s.stopped();
}

/// One process flooding the Unix socket (the engine-core issue's accept burst): its
/// connections past `max_connections_per_peer`'s default for a local process (a quarter
/// of `max_connections`) are closed at accept, which costs the accept loop no thread,
/// while it reconnects in a loop (some 4,500 a second here); a client in another
/// process is served meanwhile, and the global cap is never reached.
#[test]
fn one_process_flooding_the_unix_socket_leaves_room_for_others() {
    let dir = tempdir();
    let s = Server::start(dir.path(), TWO_TENANTS);
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let (socket, stop) = (s.socket.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut held = std::collections::VecDeque::new();
            let mut made = 0u64;
            while !stop.load(Ordering::SeqCst) {
                if let Ok(c) = UnixStream::connect(&socket) {
                    made += 1;
                    held.push_back(c);
                    if held.len() > 300 {
                        held.pop_front();
                    }
                }
                // Thousands a second: a client stuck reconnecting, not one
                // out-connecting the accept loop on a shared core (which fills the
                // kernel's backlog of 4,096 whatever the server does with what it
                // accepts).
                std::thread::sleep(Duration::from_micros(20));
            }
            made
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..5 {
        let out = run(Command::new("nbdinfo").arg("--size").arg(s.uri("vm2")));
        assert_eq!(stdout(&out).trim(), (32u64 << 20).to_string());
    }
    stop.store(true, Ordering::SeqCst);
    let made = flood.join().unwrap();
    let err = s.stopped();
    println!("the flood made {made} connections");
    assert!(made > 300, "the flood made only {made} connections");
    assert!(
        err.contains(&format!(
            "server.max_connections_per_peer (64) reached by local pid {}",
            std::process::id()
        )),
        "{err}"
    );
    assert!(
        !err.contains("server.max_connections (256) reached"),
        "{err}"
    );
}

/// The hardening issue's connection target: a server limited to 1,024 descriptors,
/// 5,000 connections attempted that never say a word (the handshake timeout set to an
/// hour, so none leaves on its own), and a new client is served all the same: at
/// `max_connections` the connection longest in its handshake makes room. The server
/// never runs out of descriptors.
#[test]
fn a_new_client_is_served_beside_five_thousand_idle_connections() {
    let dir = tempdir();
    let s = Server::start_limited(
        dir.path(),
        &format!("handshake_timeout_s = 3600\nmax_connections_per_peer = 256\n{TWO_TENANTS}"),
        &[],
        Some(1024),
    );
    // This side holds every connection it makes.
    let mut own = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on this process's own limit.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut own) };
    own.rlim_cur = own.rlim_max.min(8192);
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &own) };
    let attempts = (own.rlim_cur as usize).saturating_sub(256).min(5000);
    assert!(
        attempts > 2000,
        "this process may open only {} descriptors",
        own.rlim_cur
    );
    let idle: Vec<UnixStream> = (0..attempts)
        .map(|_| UnixStream::connect(&s.socket).unwrap())
        .collect();
    let t = Instant::now();
    // While the server still works through the idle connections queued before this
    // one, and the ones it evicted are ending, a newcomer past the cap's margin is
    // closed at accept (by design: the accept loop never waits); a client that tries
    // again is served. Under a loaded machine (the whole suite in parallel) that window
    // was hit once; the bound below is what matters.
    let out = loop {
        let out = Command::new("nbdinfo")
            .arg("--size")
            .arg(s.uri("vm2"))
            .output()
            .unwrap();
        if out.status.success() || t.elapsed() > Duration::from_secs(10) {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    println!(
        "nbdinfo beside {attempts} idle connection attempts (nofile 1024): {:?}",
        t.elapsed()
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "served only after {:?}",
        t.elapsed()
    );
    assert_eq!(stdout(&out).trim(), (32u64 << 20).to_string());
    drop(idle);
    let err = s.stopped();
    assert!(!err.contains("cannot accept"), "out of descriptors: {err}");
    assert!(
        err.contains("server.max_connections (256) reached"),
        "{err}"
    );
}

/// TLS with pre-shared keys (`tls_psk`, qemu's `keys.psk` format): qemu-io (its
/// `tls-creds-psk`) and nbdcopy (libnbd's `tls-psk-file`) write and read the export
/// over TLS; an identity the server does not know gets nothing, nor does a client in
/// the clear.
#[test]
fn tls_with_pre_shared_keys_serves_qemu_and_libnbd() {
    let dir = tempdir();
    let key = "9e0fa2c63f1b4d5e8a7c6b5a49382716f0e1d2c3b4a59687a1b2c3d4e5f60718";
    std::fs::write(dir.path().join("keys.psk"), format!("alice:{key}\n")).unwrap();
    std::fs::write(
        dir.path().join("other.psk"),
        format!("mallory:{}\n", &key[..32]),
    )
    .unwrap();
    let port = free_port();
    let s = Server::start(
        dir.path(),
        &format!(
            "tcp = \"127.0.0.1:{port}\"\ntls = \"require\"\ntls_psk = \"keys.psk\"\n{TWO_TENANTS}"
        ),
    );
    let creds = format!(
        "tls-creds-psk,id=tls0,dir={},endpoint=client,username=alice",
        dir.path().display()
    );
    let image = format!("driver=nbd,host=127.0.0.1,port={port},export=vm1,tls-creds=tls0");
    let out = run(Command::new("qemu-io")
        .args(["--object", &creds, "--image-opts", &image])
        .args(["-c", "write -P 0x6e 2M 2M", "-c", "read -P 0x6e 2M 2M"]));
    assert!(
        !stdout(&out).contains("Pattern verification failed"),
        "{}",
        stdout(&out)
    );
    let uri = |user: &str, file: &str| {
        format!(
            "nbds://{user}@127.0.0.1:{port}/vm1?tls-psk-file={}",
            dir.path().join(file).display()
        )
    };
    let copy = dir.path().join("copy.img");
    run(Command::new("nbdcopy")
        .arg(uri("alice", "keys.psk"))
        .arg(&copy));
    let data = std::fs::read(&copy).unwrap();
    assert_eq!(data.len(), 64 << 20);
    assert!(data[2 << 20..4 << 20].iter().all(|&b| b == 0x6e));
    assert!(data[..2 << 20].iter().all(|&b| b == 0));
    let stranger = Command::new("nbdinfo")
        .arg(uri("mallory", "other.psk"))
        .output()
        .unwrap();
    assert!(!stranger.status.success(), "served an unknown identity");
    let clear = Command::new("nbdinfo")
        .arg(format!("nbd://127.0.0.1:{port}/vm1"))
        .output()
        .unwrap();
    assert!(!clear.status.success(), "served in the clear over TCP");
    let err = s.stopped();
    assert!(err.contains("an unknown identity or a wrong key"), "{err}");
}

/// A live export characterized as a block device (nbdfuse and a loop device on it):
/// refused without --destroy-data; with it, the matrix under each of the kernel's
/// schedulers, each switched in for its runs and the old one put back.
#[test]
fn a_live_export_is_characterized_under_the_kernel_schedulers() {
    if skipped_without_mounts("a_live_export_is_characterized_under_the_kernel_schedulers") {
        return;
    }
    let dir = tempdir();
    let config = "[backend]\ncache = \"none\"\n[[tenant]]\nname = \"disk\"\nfile = \"disk.img\"\ncreate = true\nsize = \"32m\"\n";
    let s = Server::start(dir.path(), config);
    let mut m = Mounts::default();
    let dev = attach(&mut m, &s, "disk", dir.path());
    let disk = dev.trim_start_matches("/dev/").to_string();
    let sched = format!("/sys/block/{disk}/queue/scheduler");
    let before = std::fs::read_to_string(&sched).unwrap();
    let characterize = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ioshare"))
            .arg("characterize")
            .arg(&dev)
            .args(["--sizes", "4k", "--duration", "0.2", "-q"])
            .args(extra)
            .output()
            .unwrap()
    };
    let o = characterize(&[]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--destroy-data"));
    let o = characterize(&["--kernel", "all", "--destroy-data"]);
    let text = stdout(&o);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.contains(&format!("(block device {disk})")), "{text}");
    let offered: Vec<String> = before
        .split_whitespace()
        .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
        .collect();
    for k in &offered {
        assert!(
            text.contains(&format!("baseline MB/s, no background, policy kernel:{k}")),
            "{k}: {text}"
        );
    }
    assert_eq!(std::fs::read_to_string(&sched).unwrap(), before, "put back");
    m.detach();
    s.stopped();
}

/// `cache = "pdc"` under a real guest file system: ext4's journal is found (its
/// writes bypass the host cache), the server is SIGKILLed in the middle of
/// fsync-heavy work, and after a restart the file system replays its journal, passes
/// `e2fsck -f -n`, and holds every file whose fsync returned. The server's process
/// dies, not the machine: what this checks is that the direct and cached paths leave
/// the image consistent, not durability across power loss.
#[test]
fn ext4_with_pdc_survives_sigkill_mid_workload() {
    if skipped_without_mounts("ext4_with_pdc_survives_sigkill_mid_workload") {
        return;
    }
    let dir = tempdir();
    let config = "[backend]\ncache = \"pdc\"\n[[tenant]]\nname = \"fs\"\nfile = \"fs.img\"\ncreate = true\nsize = \"256m\"\n";
    let s = Server::start(dir.path(), config);
    let mut m = Mounts::default();
    let dev = attach(&mut m, &s, "fs", dir.path());
    // An 8 MiB journal, written out at mkfs: it wraps every few hundred commits.
    run(Command::new("mkfs.ext4")
        .args([
            "-q",
            "-F",
            "-J",
            "size=8",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
        ])
        .arg(&dev));
    let root = dir.path().join("mnt");
    mount(&mut m, &dev, &root);
    let content = |i: usize| format!("file {i}\n").repeat(1 + i % 700).into_bytes();
    let synced = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let writer = {
        let (root, synced) = (root.clone(), synced.clone());
        std::thread::spawn(move || {
            for i in 0.. {
                let path = root.join(format!("f{i}"));
                let ok = std::fs::File::create(&path).and_then(|mut f| {
                    f.write_all(&content(i))?;
                    f.sync_all()
                });
                if ok.is_err() {
                    return;
                }
                synced.lock().unwrap().push(i);
            }
        })
    };
    // Until the journal has wrapped and been found, and some commits beyond.
    let t = Instant::now();
    while synced.lock().unwrap().len() < 3000 {
        assert!(
            t.elapsed() < Duration::from_secs(240),
            "the writer is too slow"
        );
        assert!(!writer.is_finished(), "the writer stopped early");
        std::thread::sleep(Duration::from_millis(50));
    }
    let err = s.killed();
    // The guest's side of the crash: its I/O fails from here on.
    drop(m);
    writer.join().unwrap();
    // An 8 MiB journal, found as such.
    assert!(
        err.contains("fs: group ") && err.contains("(8 MiB); writes there bypass"),
        "the journal was not found: {err}"
    );
    assert_eq!(err.matches("holds a circular log").count(), 1, "{err}");
    let synced = synced.lock().unwrap().clone();
    let s = Server::start(dir.path(), config);
    let mut m = Mounts::default();
    let dev = attach(&mut m, &s, "fs", dir.path());
    // Mounting replays the journal; then the check must find nothing to fix.
    mount(&mut m, &dev, &root);
    m.unmount_fs();
    run(Command::new("e2fsck").args(["-f", "-n"]).arg(&dev));
    mount(&mut m, &dev, &root);
    for &i in &synced {
        let got = std::fs::read(root.join(format!("f{i}"))).unwrap();
        assert!(got == content(i), "f{i} differs after the crash");
    }
    m.detach();
    s.stopped();
}

/// A self-signed certificate for `localhost` with `key`, in PEM: (certificate, key).
fn self_signed(key: &openssl::pkey::PKey<openssl::pkey::Private>) -> (Vec<u8>, Vec<u8>) {
    use openssl::x509::extension::SubjectAlternativeName;
    use openssl::x509::{X509Builder, X509NameBuilder};
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", "localhost").unwrap();
    let name = name.build();
    let mut b = X509Builder::new().unwrap();
    b.set_version(2).unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(&name).unwrap();
    b.set_pubkey(key).unwrap();
    b.set_not_before(&openssl::asn1::Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    b.set_not_after(&openssl::asn1::Asn1Time::days_from_now(2).unwrap())
        .unwrap();
    let serial = openssl::bn::BigNum::from_u32(7)
        .unwrap()
        .to_asn1_integer()
        .unwrap();
    b.set_serial_number(&serial).unwrap();
    let san = SubjectAlternativeName::new()
        .dns("localhost")
        .build(&b.x509v3_context(None, None))
        .unwrap();
    b.append_extension(san).unwrap();
    let digest = if key.id() == openssl::pkey::Id::ED25519 {
        openssl::hash::MessageDigest::null()
    } else {
        openssl::hash::MessageDigest::sha256()
    };
    b.sign(key, digest).unwrap();
    (
        b.build().to_pem().unwrap(),
        key.private_key_to_pem_pkcs8().unwrap(),
    )
}

/// Keys rustls's provider cannot sign with (a 2432-bit RSA key, as qemu-nbd takes;
/// ECDSA on P-521) serve TLS through OpenSSL, and one it can (Ed25519) through rustls:
/// each is read by nbdinfo over TLS.
#[test]
fn tls_keys_of_every_size_and_curve_are_served() {
    use openssl::ec::{EcGroup, EcKey};
    use openssl::nid::Nid;
    use openssl::pkey::PKey;
    let keys = [
        (
            "rsa-2432",
            PKey::from_rsa(openssl::rsa::Rsa::generate(2432).unwrap()).unwrap(),
        ),
        (
            "p-521",
            PKey::from_ec_key(
                EcKey::generate(&EcGroup::from_curve_name(Nid::SECP521R1).unwrap()).unwrap(),
            )
            .unwrap(),
        ),
        ("ed25519", PKey::generate_ed25519().unwrap()),
    ];
    for (what, key) in keys {
        let dir = tempdir();
        let (cert, key) = self_signed(&key);
        std::fs::write(dir.path().join("cert.pem"), &cert).unwrap();
        std::fs::write(dir.path().join("key.pem"), &key).unwrap();
        let ca = dir.path().join("ca");
        std::fs::create_dir(&ca).unwrap();
        std::fs::write(ca.join("ca-cert.pem"), &cert).unwrap();
        let port = free_port();
        let s = Server::start(
            dir.path(),
            &format!(
                "tcp = \"127.0.0.1:{port}\"\ntls = \"require\"\ntls_cert = \"cert.pem\"\n\
                 tls_key = \"key.pem\"\n{TWO_TENANTS}"
            ),
        );
        let out = run(Command::new("nbdinfo").arg("--json").arg(format!(
            "nbds://localhost:{port}/vm1?tls-certificates={}",
            ca.display()
        )));
        assert!(
            stdout(&out).contains("\"TLS\": true"),
            "{what}: {}",
            stdout(&out)
        );
        s.stopped();
    }
}

/// Pre-shared keys on a loopback address require TLS without being told to: a client in
/// the clear over TCP gets nothing (it would otherwise read the exports without a key),
/// and `tls = "optional"` with `allow_plaintext = true` is how to say otherwise.
#[test]
fn pre_shared_keys_require_tls_on_loopback_unless_said_optional() {
    for (tls, clear_served) in [
        ("", false),
        ("tls = \"optional\"\nallow_plaintext = true\n", true),
    ] {
        let dir = tempdir();
        std::fs::write(
            dir.path().join("keys.psk"),
            "alice:000102030405060708090a0b0c0d0e0f\n",
        )
        .unwrap();
        let port = free_port();
        let s = Server::start(
            dir.path(),
            &format!("tcp = \"127.0.0.1:{port}\"\n{tls}tls_psk = \"keys.psk\"\n{TWO_TENANTS}"),
        );
        let clear = Command::new("nbdinfo")
            .arg(format!("nbd://127.0.0.1:{port}/vm1"))
            .output()
            .unwrap();
        assert_eq!(
            clear.status.success(),
            clear_served,
            "{tls:?}: {}",
            String::from_utf8_lossy(&clear.stderr)
        );
        s.stopped();
    }
}

/// The test plays the service manager: it binds the export socket and a TCP port itself,
/// hands them over as socket activation does (descriptors 3 and 4, `LISTEN_FDS`,
/// `LISTEN_PID`), and listens on a `NOTIFY_SOCKET`. `READY=1` comes once exports accept
/// connections (a client is served at once, on both), `STOPPING=1` when SIGTERM drains;
/// the pid file names the server while it runs; the manager's socket file stays.
#[test]
fn a_service_manager_hands_over_sockets_and_hears_ready_and_stopping() {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::net::{UnixDatagram, UnixListener};
    use std::os::unix::process::CommandExt as _;
    let dir = tempdir();
    let socket = dir.path().join("managed.sock");
    let unix = UnixListener::bind(&socket).unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let notify = dir.path().join("notify");
    let manager = UnixDatagram::bind(&notify).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let cfg = dir.path().join("serve.toml");
    // The configuration names another socket: the handed-over one takes its place.
    std::fs::write(
        &cfg,
        format!(
            "[server]\nunix = \"unused.sock\"\ninterval_s = 0\n{}{TWO_TENANTS}",
            threads_line()
        ),
    )
    .unwrap();
    let pidfile = dir.path().join("ioshare.pid");
    let (ufd, tfd) = (unix.as_raw_fd(), tcp.as_raw_fd());
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg("export LISTEN_PID=$$ LISTEN_FDS=2; exec \"$0\" serve \"$1\" --pidfile \"$2\"")
        .arg(env!("CARGO_BIN_EXE_ioshare"))
        .arg(&cfg)
        .arg(&pidfile)
        .env("NOTIFY_SOCKET", &notify)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: fcntl and dup2 are async-signal-safe; nothing else runs in the child.
    unsafe {
        command.pre_exec(move || {
            let (u, t) = (
                libc::fcntl(ufd, libc::F_DUPFD, 100),
                libc::fcntl(tfd, libc::F_DUPFD, 100),
            );
            if u < 0 || t < 0 || libc::dup2(u, 3) < 0 || libc::dup2(t, 4) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    let mut buf = [0u8; 512];
    let n = manager.recv(&mut buf).expect("READY=1 within a minute");
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(
        ready.starts_with("READY=1\nSTATUS=serving 2 export(s) on unix:"),
        "{ready}"
    );
    assert!(
        ready.contains("managed.sock") && ready.contains(&format!("tcp:127.0.0.1:{port}")),
        "{ready}"
    );
    // Ready means served: on the handed-over Unix socket and TCP port, at once.
    for uri in [
        format!("nbd+unix:///vm1?socket={}", socket.display()),
        format!("nbd://127.0.0.1:{port}/vm1"),
    ] {
        let out = run(Command::new("nbdinfo").arg("--size").arg(&uri));
        assert_eq!(stdout(&out).trim(), (64u64 << 20).to_string(), "{uri}");
    }
    let pid = std::fs::read_to_string(&pidfile).unwrap();
    assert_eq!(pid.trim(), child.id().to_string());
    assert!(!dir.path().join("unused.sock").exists());
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let n = manager.recv(&mut buf).expect("STOPPING=1");
    assert!(
        buf[..n].starts_with(b"STOPPING=1\n"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "{err}");
    assert!(!pidfile.exists(), "the pid file is removed at exit");
    assert!(
        socket.exists(),
        "the manager's socket file is the manager's"
    );
}

/// `contrib/grafana-dashboard.json` asks only for what the server exports: every metric
/// name in every query is one the running server's `/metrics` declares (a histogram's
/// `_bucket`, `_sum` and `_count` series included).
#[test]
fn the_grafana_dashboard_queries_only_metrics_the_server_exports() {
    let dir = tempdir();
    let port = free_port();
    let s = Server::start(
        dir.path(),
        &format!("metrics = \"127.0.0.1:{port}\"\npolicy = \"feedbac\"\n{TWO_TENANTS}"),
    );
    let (status, text) = http_get(port, "/metrics");
    assert!(status.contains("200"), "{status}");
    let mut exported: Vec<String> = Vec::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let mut words = rest.split(' ');
            let (name, kind) = (words.next().unwrap(), words.next().unwrap());
            exported.push(name.to_string());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    exported.push(format!("{name}{suffix}"));
                }
            }
        }
    }
    s.stopped();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/contrib/grafana-dashboard.json"
    );
    let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 6, "{} panels", panels.len());
    let mut named = 0;
    for p in panels {
        for t in p["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("a query");
            let mut rest = expr;
            while let Some(at) = rest.find("ioshare_") {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    exported.contains(&name),
                    "{}: {name} is not exported (exported: {exported:?})",
                    p["title"]
                );
                named += 1;
                rest = &rest[at + name.len()..];
            }
        }
    }
    assert!(named >= 15, "only {named} metric names in the queries");
}

/// Block status (`base:allocation`, over structured replies): on a 1 GiB image with
/// 10 MiB written, `nbdinfo --map` and `qemu-img map` report exactly the written
/// extent as data and the rest as holes, and `nbdcopy` copies the export sparse, every
/// byte the same.
#[test]
fn block_status_maps_holes_and_data_and_nbdcopy_copies_sparse() {
    let dir = tempdir();
    let s = Server::start(
        dir.path(),
        "[[tenant]]\nname = \"vm1\"\nfile = \"vm1.img\"\ncreate = true\nsize = \"1g\"\n",
    );
    let uri = s.uri("vm1");
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x5a 100M 10M"])
        .arg(&uri));
    let map = stdout(&run(Command::new("nbdinfo").arg("--map").arg(&uri)));
    let rows: Vec<Vec<&str>> = map
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let (mib, gib) = (1u64 << 20, 1u64 << 30);
    let want = [
        (0, 100 * mib, "3"),
        (100 * mib, 10 * mib, "0"),
        (110 * mib, gib - 110 * mib, "3"),
    ];
    assert_eq!(rows.len(), want.len(), "{map}");
    for (row, (start, len, flags)) in rows.iter().zip(want) {
        assert_eq!(
            (row[0], row[1], row[2]),
            (start.to_string().as_str(), len.to_string().as_str(), flags),
            "{map}"
        );
    }
    let qmap = stdout(&run(Command::new("qemu-img")
        .args(["map", "--output=json", "-f", "raw"])
        .arg(&uri)));
    assert!(
        qmap.contains("\"start\": 104857600, \"length\": 10485760, \"depth\": 0, \"present\": true, \"zero\": false, \"data\": true"),
        "{qmap}"
    );
    assert_eq!(qmap.matches("\"data\": true").count(), 1, "{qmap}");
    let copy = dir.path().join("copy.img");
    run(Command::new("nbdcopy").arg(&uri).arg(&copy));
    // Compared a megabyte at a time (a gigabyte each is too much to hold twice).
    let (mut a, mut b) = (
        std::fs::File::open(dir.path().join("vm1.img")).unwrap(),
        std::fs::File::open(&copy).unwrap(),
    );
    assert_eq!(a.metadata().unwrap().len(), b.metadata().unwrap().len());
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    for at in 0..1024u64 {
        a.read_exact(&mut x).unwrap();
        b.read_exact(&mut y).unwrap();
        assert!(x == y, "nbdcopy's copy differs in MiB {at}");
    }
    s.stopped();
}

/// A named policy that does not keep what the tenants write says so at start, one line
/// a kind of promise; the default keeps them all and says nothing of the kind.
#[test]
fn a_named_policy_says_which_promises_it_leaves_unenforced() {
    let dir = tempdir();
    let s = Server::start(dir.path(), &format!("policy = \"none\"\n{TWO_TENANTS}"));
    let err = s.stopped();
    assert!(
        err.contains("policy none does not share by weight: the tenants' weights are not enforced"),
        "{err}"
    );
    assert!(
        err.contains("policy none does not keep a tenant's SLO: not enforced for vm1, vm2"),
        "{err}"
    );
    assert!(
        err.contains("policy none does not keep a tenant's reservation: not enforced for vm1, vm2"),
        "{err}"
    );
    let dir = tempdir();
    let err = Server::start(dir.path(), TWO_TENANTS).stopped();
    assert!(!err.contains("does not keep"), "{err}");
    assert!(!err.contains("does not share"), "{err}");
}
