//! The rbd backend against a real Ceph cluster that `bench/ceph-up.sh` brings up in a
//! temporary directory (one monitor, one manager, one OSD on a sparse file): fio's
//! verification through NBD, data where the image has it, trims and zeroing, a SIGKILL
//! that loses no acknowledged write, an image added while running, and the errors a
//! user meets (a missing image, a size that differs). `./test.sh` installs Ceph's
//! packages; where they are missing the test says it was skipped, and
//! `IOSHARE_REQUIRE_CEPH=1` makes that a failure.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The cluster, stopped (and its folder removed) when dropped.
struct Cluster {
    dir: tempfile::TempDir,
}

impl Cluster {
    fn conf(&self) -> PathBuf {
        self.dir.path().join("c/ceph.conf")
    }

    fn rbd(&self, args: &[&str]) -> Output {
        run(Command::new("rbd").arg("-c").arg(self.conf()).args(args))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script("ceph-down.sh"))
            .env("CEPH_DIR", self.dir.path().join("c"))
            .env("KILL", "1")
            .output();
    }
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("bench")
        .join(name)
}

/// Starts a cluster with images `a` and `b` (64 MiB each), or says why not.
fn cluster() -> Option<Cluster> {
    let missing: Vec<&str> = ["ceph-mon", "ceph-osd", "ceph-mgr", "rbd", "fio", "qemu-io"]
        .into_iter()
        .filter(|c| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {c}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect();
    if !missing.is_empty() {
        let why = format!(
            "{} not installed (./test.sh installs Ceph's packages)",
            missing.join(", ")
        );
        assert!(
            std::env::var("IOSHARE_REQUIRE_CEPH").as_deref() != Ok("1"),
            "IOSHARE_REQUIRE_CEPH=1 and {why}"
        );
        say_skipped("rbd_backend", &why);
        return None;
    }
    // Short paths: the daemons' admin sockets live in the folder (108 bytes at most).
    let dir = tempfile::Builder::new()
        .prefix("ioshare-ceph")
        .tempdir()
        .unwrap();
    let out = Command::new(script("ceph-up.sh"))
        .env("CEPH_DIR", dir.path().join("c"))
        .env("NUM_OSDS", "1")
        .env("OSD_GB", "4")
        .env("PG_NUM", "8")
        .env("IMAGES", "a:64 b:64")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench/ceph-up.sh failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(Cluster { dir })
}

fn say_skipped(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
    if let Some(log) = std::env::var_os("IOSHARE_SKIPPED_LOG") {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(log) {
            let _ = writeln!(f, "{test}: {why}");
        }
    }
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
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

/// A running `ioshare serve` of rbd images.
struct Server {
    child: Child,
    socket: PathBuf,
}

impl Server {
    fn config(cluster: &Cluster, dir: &Path, tenants: &str) -> PathBuf {
        let cfg = dir.join("serve.toml");
        std::fs::write(
            &cfg,
            format!(
                "[server]\nunix = \"s.sock\"\ninterval_s = 0\ncontrol = \"ctl.sock\"\n[backend]\nkind = \"rbd\"\nconf = \"{}\"\n{tenants}",
                cluster.conf().display()
            ),
        )
        .unwrap();
        cfg
    }

    fn start(cluster: &Cluster, dir: &Path, tenants: &str) -> Server {
        let cfg = Server::config(cluster, dir, tenants);
        let socket = dir.join("s.sock");
        let _ = std::fs::remove_file(&socket);
        let mut child = Command::new(env!("CARGO_BIN_EXE_ioshare"))
            .arg("serve")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while UnixStream::connect(&socket).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                panic!("the server exited ({status}): {err}");
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, socket }
    }

    fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    /// SIGTERM; the server must drain and exit 0.
    fn stop(mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(status.success(), "{err}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fio_verify(uri: &str, bs: &str, size: &str) -> Command {
    let mut c = Command::new("fio");
    c.args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        &format!("--bs={bs}"),
        &format!("--size={size}"),
        "--iodepth=16",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--output-format=terse",
    ]);
    c
}

/// fio's terse line says no error, and that it wrote and read back what it verified.
fn fio_ok(who: &str, out: &Output) {
    let terse = stdout(out);
    let line = terse
        .lines()
        .find(|l| l.starts_with("3;"))
        .unwrap_or_else(|| panic!("{who}: no terse line: {terse}"));
    let fields: Vec<&str> = line.split(';').collect();
    assert_eq!(fields[4], "0", "{who}: fio reports an error: {terse}");
    let (read_kb, write_kb): (u64, u64) = (fields[5].parse().unwrap(), fields[46].parse().unwrap());
    assert!(
        read_kb > 0 && read_kb == write_kb,
        "{who}: read back {read_kb} KiB of {write_kb}: {terse}"
    );
}

const TENANTS: &str = r#"
[[tenant]]
name = "a"
image = "a"
weight = 2
[[tenant]]
name = "b"
image = "b"
size = "64m"
"#;

/// One cluster for every step (it takes 15 s or more to start).
#[test]
fn rbd_backend() {
    let Some(cluster) = cluster() else { return };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    fio_verifies_both_tenants_at_once(&cluster, dir.path());
    bytes_land_where_the_image_has_them(&cluster, dir.path());
    acknowledged_writes_survive_sigkill(&cluster, dir.path());
    trim_and_zeroing(&cluster, dir.path());
    an_image_added_while_running(&cluster, dir.path());
    errors_name_the_image(&cluster, dir.path());
    fronts_keep_one_limit(&cluster, dir.path());
}

fn fio_verifies_both_tenants_at_once(cluster: &Cluster, dir: &Path) {
    let s = Server::start(cluster, dir, TENANTS);
    let a = fio_verify(&s.uri("a"), "4k", "16m")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let b = run(&mut fio_verify(&s.uri("b"), "64k", "32m"));
    let a = a.wait_with_output().unwrap();
    assert!(a.status.success(), "fio on a: {}", stdout(&a));
    fio_ok("a", &a);
    fio_ok("b", &b);
    s.stop();
}

fn bytes_land_where_the_image_has_them(cluster: &Cluster, dir: &Path) {
    let s = Server::start(cluster, dir, TENANTS);
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x5a 41943040 65536"])
        .arg(s.uri("b")));
    s.stop();
    let export = dir.join("b.raw");
    let _ = std::fs::remove_file(&export);
    cluster.rbd(&["export", "rbd/b", export.to_str().unwrap()]);
    let image = std::fs::read(&export).unwrap();
    assert_eq!(image.len(), 64 << 20);
    // fio wrote the first 32 MiB.
    assert!(
        image[40 << 20..(40 << 20) + 65536]
            .iter()
            .all(|&x| x == 0x5a),
        "byte x of the export is byte x of the image"
    );
    assert!(
        image[32 << 20..40 << 20].iter().all(|&x| x == 0),
        "nothing else written"
    );
}

fn acknowledged_writes_survive_sigkill(cluster: &Cluster, dir: &Path) {
    let s = Server::start(cluster, dir, TENANTS);
    // Written and acknowledged, no flush: with the client's cache off, an
    // acknowledged write is on the cluster.
    run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0xc3 8192 131072"])
        .arg(s.uri("a")));
    drop(s); // SIGKILL
    let s = Server::start(cluster, dir, TENANTS);
    let out = run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "read -P 0xc3 8192 131072"])
        .arg(s.uri("a")));
    assert!(
        !stdout(&out).contains("Pattern verification failed"),
        "{}",
        stdout(&out)
    );
    s.stop();
}

fn trim_and_zeroing(cluster: &Cluster, dir: &Path) {
    let s = Server::start(cluster, dir, TENANTS);
    let uri = s.uri("a");
    run(Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "write -P 0x11 4194304 1048576",
            "-c",
            "flush",
        ])
        .arg(&uri));
    run(Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "write -z 4194304 65536",
            "-c",
            "write -z -u 4259840 65536",
        ])
        .arg(&uri));
    let out = run(Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "read -P 0 4194304 131072",
            "-c",
            "read -P 0x11 4325376 65536",
        ])
        .arg(&uri));
    assert!(
        !stdout(&out).contains("Pattern verification failed"),
        "zeroing: {}",
        stdout(&out)
    );
    // A trim is advisory in NBD; what was not trimmed keeps its data.
    run(Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            "-c",
            "discard 4390912 65536",
            "-c",
            "read -P 0x11 5177344 65536",
        ])
        .arg(&uri));
    let map = stdout(&run(Command::new("nbdinfo").arg("--map").arg(&uri)));
    assert!(map.contains("data"), "an image's extents are data: {map}");
    s.stop();
}

fn an_image_added_while_running(cluster: &Cluster, dir: &Path) {
    let s = Server::start(cluster, dir, TENANTS);
    let added = run(Command::new(env!("CARGO_BIN_EXE_ioshare"))
        .arg("ctl")
        .arg(dir.join("ctl.sock"))
        .args(["add-tenant", "name=c", "image=c", "create=true", "size=16m"]));
    assert!(stdout(&added).contains("\"c\""), "{}", stdout(&added));
    fio_ok("c", &run(&mut fio_verify(&s.uri("c"), "8k", "8m")));
    s.stop();
    let info = stdout(&cluster.rbd(&["info", "rbd/c"]));
    assert!(info.contains("16 MiB"), "{info}");
}

/// What `serve` says on stderr when it refuses to start with `tenants`.
fn refused(cluster: &Cluster, dir: &Path, tenants: &str) -> String {
    let cfg = Server::config(cluster, dir, tenants);
    let out = Command::new(env!("CARGO_BIN_EXE_ioshare"))
        .arg("serve")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success(), "served {tenants}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn errors_name_the_image(cluster: &Cluster, dir: &Path) {
    let err = refused(
        cluster,
        dir,
        "[[tenant]]\nname = \"m\"\nimage = \"missing\"\nsize = \"8m\"\n",
    );
    assert!(
        err.contains("rbd:rbd/missing") && err.contains("No such file"),
        "a missing image, without create: {err}"
    );
    let err = refused(
        cluster,
        dir,
        "[[tenant]]\nname = \"a\"\nimage = \"a\"\nsize = \"32m\"\n",
    );
    assert!(
        err.contains("rbd:rbd/a") && err.contains("64 MiB"),
        "a size that is not the image's: {err}"
    );
}

/// fio's read IOPS over its run, from its JSON.
fn read_iops(out: &Output) -> f64 {
    let text = stdout(out);
    let json = &text[text.find('{').unwrap_or_else(|| panic!("no JSON: {text}"))..];
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    v["jobs"][0]["read"]["iops"].as_f64().unwrap()
}

fn fio_reads(uri: &str, seconds: u32) -> Child {
    Command::new("fio")
        .args([
            "--name=r",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randread",
            "--bs=4k",
            "--size=32m",
            "--iodepth=8",
            "--time_based",
            &format!("--runtime={seconds}"),
            "--output-format=json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finished(c: Child) -> Output {
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "fio: {}", stdout(&out));
    out
}

/// Two fronts share tenant `a`'s limit of 400 reads a second (its volumes on both,
/// driven hard): together they stay within it. Front 2 killed, front 1 keeps its part
/// and never goes past the whole limit, and serves `b` all along.
fn fronts_keep_one_limit(cluster: &Cluster, dir: &Path) {
    for image in ["fa1", "fa2", "fb1"] {
        cluster.rbd(&["create", &format!("rbd/{image}"), "--size", "32M"]);
    }
    let ports = [free_udp_port(), free_udp_port()];
    let front = |n: usize, exports: &str| {
        let d = dir.join(format!("front{n}"));
        std::fs::create_dir_all(&d).unwrap();
        let tenants = format!(
            "[cluster]\nfront = {n}\nlisten = \"127.0.0.1:{}\"\npeers = [\"127.0.0.1:{}\"]\n[[cluster.tenant]]\nname = \"a\"\nlimit_iops = 400\n[[cluster.tenant]]\nname = \"b\"\n{exports}",
            ports[n - 1],
            ports[2 - n]
        );
        Server::start(cluster, &d, &tenants)
    };
    let f1 = front(
        1,
        "[[tenant]]\nname = \"a\"\nimage = \"fa1\"\n[[tenant]]\nname = \"b\"\nimage = \"fb1\"\n",
    );
    let f2 = front(2, "[[tenant]]\nname = \"a\"\nimage = \"fa2\"\n");
    let (a1, a2) = (fio_reads(&f1.uri("a"), 8), fio_reads(&f2.uri("a"), 8));
    let a = read_iops(&finished(a1)) + read_iops(&finished(a2));
    assert!(
        (200.0..=440.0).contains(&a),
        "a's volumes on two fronts: {a:.0} reads/s against its limit of 400"
    );
    drop(f2); // SIGKILL: no leaving report
    let (a1, b1) = (fio_reads(&f1.uri("a"), 6), fio_reads(&f1.uri("b"), 6));
    let (a, b) = (read_iops(&finished(a1)), read_iops(&finished(b1)));
    assert!(a <= 440.0, "a on the front left: {a:.0} reads/s, limit 400");
    assert!(b > 400.0, "b is served beside it: {b:.0} reads/s");
    f1.stop();
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
