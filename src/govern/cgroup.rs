//! The kernel's files, read and written: a cgroup's I/O counters and throttle limits for
//! one device (cgroup v2 `io.stat` / `io.max`; v1 `blkio.throttle.io_serviced`,
//! `io_service_bytes` and `{read,write}_{iops,bps}_device`), and the device's own
//! counters (`/proc/diskstats`). The parsing is pure (text in, figures out) and tested
//! on the kernel's formats; [`Cgroup`] does the reading and writing.

use crate::limits::governor::{DeviceUsage, Limits, Usage};
use std::path::{Path, PathBuf};

/// A block device as the kernel numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Dev {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl std::fmt::Display for Dev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// Why a cgroup's or the device's files could not be used; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A file could not be read or written.
    #[error("{}: {source}{hint}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
        /// What to do about it.
        hint: &'static str,
    },
    /// The folder is no cgroup with an I/O controller.
    #[error("{}: no I/O controller here (neither cgroup v2's io.max nor v1's blkio.throttle.*): {why}", path.display())]
    NoController {
        /// The folder.
        path: PathBuf,
        /// What is missing.
        why: String,
    },
    /// A file did not say what the kernel's format says.
    #[error("{}: line {line:?}: {why}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// The line.
        line: String,
        /// What is wrong with it.
        why: String,
    },
    /// The device is not in `/proc/diskstats`.
    #[error("device {0} is not in /proc/diskstats")]
    NoDevice(Dev),
}

/// Which interface a cgroup has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Version {
    /// cgroup v2: `io.stat`, `io.max`.
    V2,
    /// cgroup v1 `blkio`: `blkio.throttle.*`.
    V1,
}

/// One cgroup's I/O files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    /// Its folder.
    pub dir: PathBuf,
    /// Its interface.
    pub version: Version,
}

/// v1's four limit files, in the order of [`Limits`]' fields.
const V1_LIMITS: [&str; 4] = [
    "blkio.throttle.read_iops_device",
    "blkio.throttle.write_iops_device",
    "blkio.throttle.read_bps_device",
    "blkio.throttle.write_bps_device",
];

fn io_error(path: &Path, hint: &'static str) -> impl FnOnce(std::io::Error) -> CgroupError {
    let path = path.to_path_buf();
    move |source| CgroupError::Io { path, source, hint }
}

const PERMISSION_HINT: &str =
    " (writing a cgroup's limits needs root or the cgroup delegated to this user)";

impl Cgroup {
    /// The cgroup at `dir`, by the files it has. `dir` must be a folder of a mounted
    /// cgroup hierarchy (v2, or v1 with the `blkio` controller: `/proc/self/mountinfo`
    /// says which folders are) reached without a symlink on the way: a state file or
    /// a configuration naming any other folder gets nothing written there.
    pub fn open(dir: &Path) -> Result<Cgroup, CgroupError> {
        let not = |why: &str| CgroupError::NoController {
            path: dir.into(),
            why: why.into(),
        };
        if !dir.is_dir() {
            return Err(not("not a folder"));
        }
        if let Some(link) = symlink_on_the_way(dir) {
            return Err(not(&format!(
                "{} is a symlink: give the cgroup's own path",
                link.display()
            )));
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let absolute = std::path::absolute(dir).map_err(io_error(dir, ""))?;
        if !in_cgroup_hierarchy(&mounts, &absolute) {
            return Err(not(
                "not under a mounted cgroup hierarchy (cgroup v2, or v1 with blkio): give a folder under the v2 mount or under v1's blkio mount",
            ));
        }
        let version = if dir.join("io.max").exists() {
            Version::V2
        } else if dir.join(V1_LIMITS[0]).exists() {
            Version::V1
        } else if dir.join("cgroup.controllers").exists() {
            return Err(not(
                "a v2 cgroup without io.max: enable the io controller in the parent's cgroup.subtree_control (`echo +io > .../cgroup.subtree_control`)",
            ));
        } else {
            return Err(not(
                "give a folder under the v2 mount or under v1's blkio mount",
            ));
        };
        Ok(Cgroup {
            dir: absolute,
            version,
        })
    }

    fn read(&self, file: &str) -> Result<String, CgroupError> {
        let path = self.dir.join(file);
        std::fs::read_to_string(&path).map_err(io_error(&path, ""))
    }

    /// Writes into one of the kernel's files: it must exist (nothing is created) and
    /// must not be a symlink (`O_NOFOLLOW`).
    fn write(&self, file: &str, text: &str) -> Result<(), CgroupError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.dir.join(file);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::ELOOP) {
                    CgroupError::NoController {
                        path: path.clone(),
                        why: "a symlink, not the kernel's file: not written through".into(),
                    }
                } else {
                    io_error(&path, PERMISSION_HINT)(e)
                }
            })?;
        f.write_all(text.as_bytes())
            .map_err(io_error(&path, PERMISSION_HINT))
    }

    /// What the cgroup did on `dev` so far (cumulative).
    pub fn usage(&self, dev: Dev) -> Result<Usage, CgroupError> {
        match self.version {
            Version::V2 => parse_io_stat(&self.read("io.stat")?, dev)
                .map_err(|(line, why)| self.format("io.stat", line, why)),
            Version::V1 => {
                let ios = parse_v1_rw(&self.read("blkio.throttle.io_serviced")?, dev)
                    .map_err(|(line, why)| self.format("blkio.throttle.io_serviced", line, why))?;
                let bytes = parse_v1_rw(&self.read("blkio.throttle.io_service_bytes")?, dev)
                    .map_err(|(line, why)| {
                        self.format("blkio.throttle.io_service_bytes", line, why)
                    })?;
                Ok(Usage {
                    read_ios: ios.0,
                    write_ios: ios.1,
                    read_bytes: bytes.0,
                    write_bytes: bytes.1,
                })
            }
        }
    }

    /// The limits set on `dev` now.
    pub fn limits(&self, dev: Dev) -> Result<Limits, CgroupError> {
        match self.version {
            Version::V2 => parse_io_max(&self.read("io.max")?, dev)
                .map_err(|(line, why)| self.format("io.max", line, why)),
            Version::V1 => {
                let mut v = [None; 4];
                for (slot, file) in v.iter_mut().zip(V1_LIMITS) {
                    *slot = parse_v1_limit(&self.read(file)?, dev)
                        .map_err(|(line, why)| self.format(file, line, why))?;
                }
                Ok(Limits {
                    riops: v[0],
                    wiops: v[1],
                    rbps: v[2],
                    wbps: v[3],
                })
            }
        }
    }

    /// Sets `limits` on `dev` (`None`: no limit).
    pub fn set_limits(&self, dev: Dev, limits: &Limits) -> Result<(), CgroupError> {
        match self.version {
            Version::V2 => self.write("io.max", &io_max_line(dev, limits)),
            Version::V1 => {
                let v = [limits.riops, limits.wiops, limits.rbps, limits.wbps];
                for (value, file) in v.into_iter().zip(V1_LIMITS) {
                    // 0 removes v1's limit; a limit is at least 1.
                    let n = value.map_or(0, |x| x.round().max(1.0) as u64);
                    self.write(file, &format!("{dev} {n}\n"))?;
                }
                Ok(())
            }
        }
    }

    fn format(&self, file: &str, line: String, why: String) -> CgroupError {
        CgroupError::Format {
            path: self.dir.join(file),
            line,
            why,
        }
    }
}

/// The first symlink on the way to `dir` (`dir` itself included), if any.
fn symlink_on_the_way(dir: &Path) -> Option<PathBuf> {
    let absolute = std::path::absolute(dir).ok()?;
    let mut at = PathBuf::new();
    for part in absolute.components() {
        at.push(part);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return Some(at);
        }
    }
    None
}

/// Whether `dir` (absolute, without `.` or `..`) lies in a cgroup hierarchy
/// `mountinfo` (the text of `/proc/self/mountinfo`) lists: the mount it is under,
/// the deepest whose point is a prefix of it, is `cgroup2`, or `cgroup` with the
/// `blkio` controller among its options.
pub fn in_cgroup_hierarchy(mountinfo: &str, dir: &Path) -> bool {
    if dir.components().any(|c| {
        matches!(
            c,
            std::path::Component::ParentDir | std::path::Component::CurDir
        )
    }) {
        return false;
    }
    let mut best: Option<(usize, bool)> = None;
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT POINT OPTIONS [TAGS...] - TYPE SOURCE SUPER-OPTIONS
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = left.split(' ').nth(4) else {
            continue;
        };
        let point = unescape_mount(point);
        if !dir.starts_with(&point) {
            continue;
        }
        let mut r = right.split(' ');
        let kind = r.next().unwrap_or("");
        let options = r.nth(1).unwrap_or("");
        let cgroup =
            kind == "cgroup2" || (kind == "cgroup" && options.split(',').any(|o| o == "blkio"));
        let depth = Path::new(&point).components().count();
        if best.is_none_or(|(d, _)| depth >= d) {
            best = Some((depth, cgroup));
        }
    }
    best.is_some_and(|(_, cgroup)| cgroup)
}

/// A mount point as mountinfo writes it: space, tab, newline and backslash as `\ooo`.
fn unescape_mount(text: &str) -> PathBuf {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(digits) = std::str::from_utf8(&b[i + 1..i + 4])
            && let Ok(v) = u8::from_str_radix(digits, 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// The line `io.max` takes for `limits` on `dev`.
pub fn io_max_line(dev: Dev, l: &Limits) -> String {
    let v = |x: Option<f64>| {
        x.map_or("max".to_string(), |x| {
            format!("{}", x.round().max(1.0) as u64)
        })
    };
    format!(
        "{dev} rbps={} wbps={} riops={} wiops={}\n",
        v(l.rbps),
        v(l.wbps),
        v(l.riops),
        v(l.wiops)
    )
}

/// A parse failure: the line and what is wrong.
type Bad = (String, String);

fn dev_of(word: &str) -> Option<Dev> {
    let (a, b) = word.split_once(':')?;
    Some(Dev {
        major: a.parse().ok()?,
        minor: b.parse().ok()?,
    })
}

/// Hands each `key=value` of `dev`'s line in a v2 file (`io.stat`, `io.max`) to `each`,
/// which says what is wrong with a value; no line for the device: nothing is handed.
fn device_fields(
    text: &str,
    dev: Dev,
    mut each: impl FnMut(&str, &str) -> Result<(), String>,
) -> Result<(), Bad> {
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next().and_then(dev_of) != Some(dev) {
            continue;
        }
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                return Err((line.into(), format!("'{w}' is not key=value")));
            };
            each(k, v).map_err(|why| (line.to_string(), why))?;
        }
    }
    Ok(())
}

/// v2 `io.stat`: `MAJ:MIN rbytes=… wbytes=… rios=… wios=… dbytes=… dios=…`; a device
/// without a line has done nothing.
pub fn parse_io_stat(text: &str, dev: Dev) -> Result<Usage, Bad> {
    let mut u = Usage::default();
    device_fields(text, dev, |k, v| {
        let n = || {
            v.parse::<u64>()
                .map_err(|_| format!("{k}={v}: not a count"))
        };
        match k {
            "rbytes" => u.read_bytes = n()?,
            "wbytes" => u.write_bytes = n()?,
            "rios" => u.read_ios = n()?,
            "wios" => u.write_ios = n()?,
            _ => {}
        }
        Ok(())
    })?;
    Ok(u)
}

/// v2 `io.max`: `MAJ:MIN rbps=… wbps=… riops=… wiops=…` (`max`: none); no line: none.
pub fn parse_io_max(text: &str, dev: Dev) -> Result<Limits, Bad> {
    let mut l = Limits::default();
    device_fields(text, dev, |k, v| {
        let value = match v {
            "max" => None,
            n => Some(
                n.parse::<u64>()
                    .map_err(|_| format!("{k}={v}: not a number"))? as f64,
            ),
        };
        match k {
            "rbps" => l.rbps = value,
            "wbps" => l.wbps = value,
            "riops" => l.riops = value,
            "wiops" => l.wiops = value,
            _ => {}
        }
        Ok(())
    })?;
    Ok(l)
}

/// v1 `blkio.throttle.io_serviced` / `io_service_bytes`: lines `MAJ:MIN Read N`,
/// `MAJ:MIN Write N` (and Sync, Async, Discard, Total, which are not needed): (read,
/// write).
pub fn parse_v1_rw(text: &str, dev: Dev) -> Result<(u64, u64), Bad> {
    let (mut r, mut w) = (0, 0);
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [d, kind, n] = words[..] else {
            continue;
        };
        if dev_of(d) != Some(dev) {
            continue;
        }
        let n: u64 = n
            .parse()
            .map_err(|_| (line.to_string(), format!("{n}: not a count")))?;
        match kind {
            "Read" => r = n,
            "Write" => w = n,
            _ => {}
        }
    }
    Ok((r, w))
}

/// A v1 limit file: lines `MAJ:MIN N`; none for the device: no limit.
pub fn parse_v1_limit(text: &str, dev: Dev) -> Result<Option<f64>, Bad> {
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let [d, n] = words[..] else {
            continue;
        };
        if dev_of(d) == Some(dev) {
            let n: u64 = n
                .parse()
                .map_err(|_| (line.to_string(), format!("{n}: not a number")))?;
            return Ok((n > 0).then_some(n as f64));
        }
    }
    Ok(None)
}

/// `/proc/diskstats`' line of `dev`: requests completed and the time spent on them
/// (cumulative; ms reading + ms writing, as ns).
pub fn parse_diskstats(text: &str, dev: Dev) -> Option<DeviceUsage> {
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() < 11 {
            continue;
        }
        let (Ok(major), Ok(minor)) = (w[0].parse::<u32>(), w[1].parse::<u32>()) else {
            continue;
        };
        if (Dev { major, minor }) != dev {
            continue;
        }
        let n = |i: usize| w[i].parse::<u64>().ok();
        let (reads, ms_reading, writes, ms_writing) = (n(3)?, n(6)?, n(7)?, n(10)?);
        return Some(DeviceUsage {
            ios: reads + writes,
            latency_ns: (ms_reading + ms_writing) * 1_000_000,
            writes,
            write_ns: ms_writing * 1_000_000,
        });
    }
    None
}

/// The device's counters now.
pub fn device_usage(dev: Dev) -> Result<DeviceUsage, CgroupError> {
    let path = Path::new("/proc/diskstats");
    let text = std::fs::read_to_string(path).map_err(io_error(path, ""))?;
    parse_diskstats(&text, dev).ok_or(CgroupError::NoDevice(dev))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VDA: Dev = Dev {
        major: 254,
        minor: 0,
    };

    #[test]
    fn only_folders_of_a_mounted_cgroup_hierarchy_are_cgroups() {
        let mounts = "\
22 1 254:1 / / rw,relatime - ext4 /dev/vda1 rw
30 22 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
32 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 30 0:29 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
34 22 0:30 / /mnt/with\\040space rw - cgroup2 cgroup2 rw
";
        let yes = |p: &str| in_cgroup_hierarchy(mounts, Path::new(p));
        assert!(yes("/sys/fs/cgroup/blkio/a"));
        assert!(yes("/sys/fs/cgroup/blkio"));
        assert!(yes("/sys/fs/cgroup/unified/x/y"));
        assert!(yes("/mnt/with space/t"));
        assert!(!yes("/sys/fs/cgroup/cpu/a"), "v1 without blkio");
        assert!(!yes("/sys/fs/cgroup"), "the tmpfs above them");
        assert!(
            !yes("/sys/fs/cgroup/blkiox"),
            "a prefix of a name is not a folder"
        );
        assert!(!yes("/tmp/io"));
        assert!(!yes("/etc"));
        assert!(
            !yes("/sys/fs/cgroup/blkio/../../../../etc"),
            "no way out by .."
        );
    }

    #[test]
    fn v2_files_are_read_and_written_in_the_kernels_format() {
        let stat = "8:0 rbytes=1 wbytes=2 rios=3 wios=4 dbytes=0 dios=0\n254:0 rbytes=4096000 wbytes=8192 rios=1000 wios=2 dbytes=0 dios=0\n";
        assert_eq!(
            parse_io_stat(stat, VDA),
            Ok(Usage {
                read_ios: 1000,
                write_ios: 2,
                read_bytes: 4_096_000,
                write_bytes: 8192
            })
        );
        assert_eq!(parse_io_stat("", VDA), Ok(Usage::default()));
        assert!(
            parse_io_stat("254:0 rbytes=x", VDA)
                .unwrap_err()
                .1
                .contains("not a count")
        );
        let max = "254:0 rbps=max wbps=1048576 riops=2000 wiops=max\n";
        let l = parse_io_max(max, VDA).unwrap();
        assert_eq!(
            l,
            Limits {
                riops: Some(2000.0),
                wiops: None,
                rbps: None,
                wbps: Some(1_048_576.0)
            }
        );
        assert_eq!(
            io_max_line(VDA, &l),
            "254:0 rbps=max wbps=1048576 riops=2000 wiops=max\n"
        );
        assert_eq!(parse_io_max(&io_max_line(VDA, &l), VDA), Ok(l));
    }

    #[test]
    fn v1_files_are_read_in_the_kernels_format() {
        let serviced = "254:0 Read 1000\n254:0 Write 20\n254:0 Sync 5\n254:0 Async 1015\n254:0 Discard 0\n254:0 Total 1020\n8:0 Read 7\nTotal 1027\n";
        assert_eq!(parse_v1_rw(serviced, VDA), Ok((1000, 20)));
        assert_eq!(parse_v1_rw("Total 0\n", VDA), Ok((0, 0)));
        assert_eq!(parse_v1_limit("254:0 500\n", VDA), Ok(Some(500.0)));
        assert_eq!(parse_v1_limit("8:0 500\n", VDA), Ok(None));
        assert!(parse_v1_limit("254:0 lots\n", VDA).is_err());
    }

    #[test]
    fn diskstats_give_completions_and_their_time() {
        let text = " 254       0 vda 1000 10 80000 500 200 5 16000 300 0 700 800 0 0 0 0\n 253 0 zram0 1 0 8 0 0 0 0 0 0 0 0\n";
        assert_eq!(
            parse_diskstats(text, VDA),
            Some(DeviceUsage {
                ios: 1200,
                latency_ns: 800_000_000,
                writes: 200,
                write_ns: 300_000_000,
            })
        );
        assert_eq!(parse_diskstats(text, Dev { major: 7, minor: 0 }), None);
    }
}
