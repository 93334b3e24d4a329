//! What each tenant got on the live server: counters and latency histograms written by
//! the engine, read by the periodic terminal line.

use crate::types::{Completion, Op};
use hdrhistogram::Histogram;
use std::sync::Mutex;

#[derive(Debug, Clone)]
pub struct TenantCounters {
    pub name: String,
    pub weight: f64,
    pub arrived: u64,
    pub completed: u64,
    pub errors: u64,
    pub refused: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Latency of completions, µs.
    pub latency: Histogram<u64>,
}

/// Shared between the engine (writer) and the reporting loop.
#[derive(Debug)]
pub struct LiveStats {
    tenants: Mutex<Vec<TenantCounters>>,
}

impl LiveStats {
    pub fn new(tenants: &[(String, f64)]) -> Self {
        LiveStats {
            tenants: Mutex::new(
                tenants
                    .iter()
                    .map(|(name, weight)| TenantCounters {
                        name: name.clone(),
                        weight: *weight,
                        arrived: 0,
                        completed: 0,
                        errors: 0,
                        refused: 0,
                        read_bytes: 0,
                        written_bytes: 0,
                        latency: Histogram::new_with_bounds(1, 60_000_000, 2)
                            .expect("histogram bounds"),
                    })
                    .collect(),
            ),
        }
    }

    pub fn arrived(&self, tenant: u32) {
        self.tenants.lock().expect("stats lock")[tenant as usize].arrived += 1;
    }

    pub fn refused(&self, tenant: u32) {
        self.tenants.lock().expect("stats lock")[tenant as usize].refused += 1;
    }

    pub fn completed(&self, c: &Completion, ok: bool) {
        let mut all = self.tenants.lock().expect("stats lock");
        let t = &mut all[c.request.tenant as usize];
        t.completed += 1;
        if !ok {
            t.errors += 1;
            return;
        }
        match c.request.op {
            Op::Read => t.read_bytes += c.request.len as u64,
            Op::Write => t.written_bytes += c.request.len as u64,
            Op::Flush | Op::Trim => {}
        }
        t.latency.saturating_record((c.latency() / 1000).max(1));
    }

    /// A copy of the counters now.
    pub fn snapshot(&self) -> Vec<TenantCounters> {
        self.tenants.lock().expect("stats lock").clone()
    }
}

/// One line per tenant for the interval between two snapshots: bandwidth, IOPS, p99 of
/// the whole run so far, and the tenant's share of the bandwidth against its weight's
/// share among the tenants that moved data in the interval.
pub fn interval_lines(before: &[TenantCounters], now: &[TenantCounters], secs: f64) -> Vec<String> {
    let bytes: Vec<u64> = before
        .iter()
        .zip(now)
        .map(|(b, n)| (n.read_bytes + n.written_bytes) - (b.read_bytes + b.written_bytes))
        .collect();
    let total: u64 = bytes.iter().sum();
    let active_weight: f64 = now
        .iter()
        .zip(&bytes)
        .filter(|(_, b)| **b > 0)
        .map(|(t, _)| t.weight)
        .sum();
    now.iter()
        .zip(before)
        .zip(&bytes)
        .map(|((n, b), &bytes)| {
            let ios = n.completed - b.completed;
            let share = if total > 0 { 100.0 * bytes as f64 / total as f64 } else { 0.0 };
            let ideal = if bytes > 0 && active_weight > 0.0 { 100.0 * n.weight / active_weight } else { 0.0 };
            format!(
                "{:<12} {:>9.1} MB/s {:>8.0} IOPS  p99 {:>8} µs  share {:>5.1}% (ideal {:>5.1}%)  errors {} refused {}",
                n.name,
                bytes as f64 / secs / 1e6,
                ios as f64 / secs,
                n.latency.value_at_quantile(0.99),
                share,
                ideal,
                n.errors,
                n.refused
            )
        })
        .collect()
}
