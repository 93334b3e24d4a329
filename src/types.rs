//! Core vocabulary shared by every part of ioshare: time, tenants, requests, completions.

use serde::{Deserialize, Serialize};

/// Time in nanoseconds. Virtual time in the simulator, wall time (since server start) live.
pub type Nanos = u64;

/// Nanoseconds per second, for conversions.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Converts seconds (possibly fractional) to nanoseconds, saturating.
pub fn secs_to_nanos(secs: f64) -> Nanos {
    if secs <= 0.0 {
        0
    } else {
        (secs * NANOS_PER_SEC as f64).round().min(u64::MAX as f64) as Nanos
    }
}

/// Converts nanoseconds to seconds.
pub fn nanos_to_secs(nanos: Nanos) -> f64 {
    nanos as f64 / NANOS_PER_SEC as f64
}

/// Index of a tenant in the scenario or server configuration (0-based, dense).
pub type TenantId = u32;

/// A response-time objective `{iops, size, rt}`: while the tenant sends at most `iops`
/// requests of mean size `size` per second, each should complete within `rt`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    /// Agreed mean request rate (requests per second).
    pub iops: f64,
    /// Agreed mean request size in bytes (a file writes it as sizes are written:
    /// `4096`, `"4k"`; under 512 it needs its unit).
    #[serde(deserialize_with = "crate::units::size_u32")]
    pub size: u32,
    /// Required response time in microseconds.
    pub rt_us: u64,
    /// How many requests above `iops` the tenant may send at once and still be
    /// compliant: its arrivals pass a token bucket this deep refilled at `iops` (as
    /// `tc`'s and QEMU's throttles take a burst). `None`: [`Slo::DEFAULT_BURST_S`] of
    /// the rate ([`Slo::burst_requests`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<f64>,
}

impl Slo {
    /// Seconds of its rate a tenant's burst is when its SLO does not say: one, as
    /// QEMU's throttles default to (`bps-max-length`).
    pub const DEFAULT_BURST_S: f64 = 1.0;

    /// An SLO of `iops` requests of `size` bytes a second within `rt_us`, with the
    /// default burst.
    pub fn new(iops: f64, size: u32, rt_us: u64) -> Self {
        Slo {
            iops,
            size,
            rt_us,
            burst: None,
        }
    }

    /// Required response time in nanoseconds.
    pub fn rt_nanos(&self) -> Nanos {
        self.rt_us.saturating_mul(1_000)
    }

    /// The burst in requests: as written, or [`Slo::DEFAULT_BURST_S`] of the rate; at
    /// least one request.
    pub fn burst_requests(&self) -> f64 {
        self.burst
            .unwrap_or(self.iops * Self::DEFAULT_BURST_S)
            .max(1.0)
    }
}

/// What a tenant was promised. Policies read only the fields they implement.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantSpec {
    /// Name (export name when live, label in reports).
    pub name: String,
    /// Proportional-share weight, > 0.
    pub weight: f64,
    /// Optional response-time objective.
    pub slo: Option<Slo>,
    /// Optional reservation (minimum IOPS), mClock style.
    pub reservation_iops: Option<f64>,
    /// Optional limit (maximum IOPS), mClock style.
    pub limit_iops: Option<f64>,
}

impl TenantSpec {
    /// A tenant with a weight and nothing else.
    pub fn weighted(name: impl Into<String>, weight: f64) -> Self {
        TenantSpec {
            name: name.into(),
            weight,
            slo: None,
            reservation_iops: None,
            limit_iops: None,
        }
    }
}

/// Kind of I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Read data from the device.
    Read,
    /// Write data to the device (zeroing included).
    Write,
    /// Make completed writes durable; carries no range.
    Flush,
    /// Discard a range.
    Trim,
    /// Look up where a range holds data and where holes (NBD `BLOCK_STATUS`): moves no
    /// data; what it costs is the file system's walk of its extent map.
    Status,
}

impl Op {
    /// True when the operation moves data to the device (counts as written bytes).
    pub fn is_write(self) -> bool {
        matches!(self, Op::Write)
    }
}

/// One I/O as the engine sees it, whatever its frontend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Unique per run (simulator) or per server (live).
    pub id: u64,
    /// The tenant that issued it.
    pub tenant: TenantId,
    /// What it does.
    pub op: Op,
    /// Byte offset inside the device (the tenant's region already applied).
    pub offset: u64,
    /// Length in bytes (0 for flush).
    pub len: u32,
    /// When the request arrived at the engine.
    pub arrival: Nanos,
    /// What it costs the device, ns of device time by the device's cost model
    /// ([`crate::device::cost`]): stamped by the host when it admits the request (the
    /// frontends leave it 0), so the policy charging it and the recorder counting it
    /// read the same number.
    pub cost: Nanos,
}

/// A request the device has finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The request as it arrived.
    pub request: Request,
    /// When the request was dispatched to the device.
    pub start: Nanos,
    /// When the device finished it.
    pub finish: Nanos,
}

impl Completion {
    /// Response time seen by the tenant: queueing in the engine plus device service.
    pub fn latency(&self) -> Nanos {
        self.finish
            .checked_sub(self.request.arrival)
            .unwrap_or_else(|| panic!("request {} finished before it arrived", self.request.id))
    }
}
