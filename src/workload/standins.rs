//! Named synthetic stand-ins for the papers' workloads. They are *not* the original
//! Filebench personalities or block traces: each is a random-access generator with the
//! published read/write mix and mean request size, which is what the papers report.

/// Statistics of one stand-in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StandIn {
    /// Name a scenario selects it by.
    pub name: &'static str,
    /// Fraction of requests that are reads.
    pub read_mix: f64,
    /// Mean request size in bytes.
    pub mean_size: u32,
    /// Offset and size alignment in bytes.
    pub align: u32,
    /// Where the statistics come from.
    pub source: &'static str,
}

/// Read fraction from a write/read ratio.
const fn from_write_read(w_over_r: f64) -> f64 {
    1.0 / (1.0 + w_over_r)
}

/// Read fraction from a read:write ratio.
const fn from_read_write(r_over_w: f64) -> f64 {
    r_over_w / (1.0 + r_over_w)
}

/// All stand-ins, by name.
pub const STANDINS: &[StandIn] = &[
    StandIn {
        name: "fileserver",
        read_mix: from_write_read(2.0),
        mean_size: 72 * 1024,
        align: 4096,
        source: "MCFQ Table 3 (Filebench fileserver): write/read 2, mean 72 KB",
    },
    StandIn {
        name: "varmail",
        read_mix: from_write_read(1.0),
        mean_size: 24 * 1024,
        align: 4096,
        source: "MCFQ Table 3 (Filebench varmail): write/read 1, mean 24 KB",
    },
    StandIn {
        name: "msn",
        read_mix: from_write_read(66.7),
        mean_size: 23_040,
        align: 512,
        source: "MCFQ Table 3 (MSN block trace): write/read 66.7, mean 22.5 KB",
    },
    StandIn {
        name: "exchange",
        read_mix: from_write_read(1.5),
        mean_size: 12_800,
        align: 512,
        source: "MCFQ Table 3 (Exchange block trace): write/read 1.5, mean 12.5 KB",
    },
    StandIn {
        name: "financial",
        read_mix: from_write_read(0.24),
        mean_size: 2_437,
        align: 512,
        source: "MCFQ Table 3 (Financial block trace): write/read 0.24, mean 2.38 KB",
    },
    StandIn {
        name: "exchange-fb",
        read_mix: from_read_write(0.29),
        mean_size: 12_800,
        align: 512,
        source: "FeedBAC Fig. 4 (Exchange): read:write 0.29:1; size not published, MCFQ's 12.5 KB used",
    },
    StandIn {
        name: "financial-fb",
        read_mix: from_read_write(0.3),
        mean_size: 2_437,
        align: 512,
        source: "FeedBAC Fig. 4 (Financial): read:write 0.3:1; size not published, MCFQ's 2.38 KB used",
    },
    StandIn {
        name: "msnfs",
        read_mix: from_read_write(2.04),
        mean_size: 8 * 1024,
        align: 512,
        source: "FeedBAC Fig. 4 (MSNFS): read:write 2.04:1; size not published, 8 KB assumed",
    },
    StandIn {
        name: "msnmeta",
        read_mix: from_read_write(2.97),
        mean_size: 8 * 1024,
        align: 512,
        source: "FeedBAC Fig. 4 (MSNMeta): read:write 2.97:1; size not published, 8 KB assumed",
    },
];

/// Looks a stand-in up by name.
pub fn standin(name: &str) -> Option<&'static StandIn> {
    STANDINS.iter().find(|s| s.name == name)
}

/// Names of all stand-ins.
pub fn names() -> Vec<&'static str> {
    STANDINS.iter().map(|s| s.name).collect()
}
