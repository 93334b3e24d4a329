//! The Prometheus endpoint: `GET /metrics` on a small HTTP listener (loopback in the
//! example config) answers the per-tenant counters, latency histograms and the policy's
//! state in the Prometheus text format (version 0.0.4).
//!
//! Each connection is answered on a thread of its own, at most [`MAX_SCRAPES`] at once
//! (more are closed as they come), and must send its request within [`DEADLINE`] in
//! all: idle or slow connections cannot hold up a scrape (one thread answering them in
//! turn, 10 idle connections delayed a scrape by 20 s).

use super::stats::{LATENCY_BUCKETS_NS, LiveStats, TenantCounters};
use crate::policy::Gauge;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

/// Connections answered at once.
pub const MAX_SCRAPES: usize = 16;
/// How long a connection has to send its request and take the answer.
pub const DEADLINE: Duration = Duration::from_secs(2);

/// What is exported besides the counters.
pub struct MetricsSource {
    /// The engine's counters.
    pub stats: Arc<LiveStats>,
    /// The policy's label (`ioshare_policy_info`).
    pub policy: String,
}

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address could not be listened on.
    #[error("server.metrics: cannot listen on {0}: {1}")]
    Listen(String, std::io::Error),
    /// Its thread could not be started.
    #[error("server.metrics: cannot start its thread: {0}")]
    Thread(std::io::Error),
}

/// Starts the endpoint; returns the address it listens on.
pub fn spawn(addr: &str, source: MetricsSource) -> Result<SocketAddr, MetricsError> {
    let listen = |e| MetricsError::Listen(addr.to_string(), e);
    let listener = TcpListener::bind(addr).map_err(listen)?;
    let local = listener.local_addr().map_err(listen)?;
    let source = Arc::new(source);
    let busy = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                // Past the cap the connection is closed at once (dropped here).
                let Some(slot) = super::conn::Slot::take(&busy, MAX_SCRAPES) else {
                    continue;
                };
                let source = source.clone();
                let _ = std::thread::Builder::new()
                    .name("metrics-conn".into())
                    .spawn(move || {
                        // A scraper that misbehaves is dropped; the server goes on.
                        let _ = answer(stream, &source);
                        drop(slot);
                    });
            }
        })
        .map_err(MetricsError::Thread)?;
    Ok(local)
}

fn answer(mut stream: TcpStream, source: &MetricsSource) -> std::io::Result<()> {
    let deadline = Instant::now() + DEADLINE;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::TimedOut))
    };
    stream.set_write_timeout(Some(DEADLINE))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        stream.set_read_timeout(Some(left()?))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
        if request.len() > 16 << 10 {
            return respond(&mut stream, "431 Request Header Fields Too Large", "");
        }
    }
    let line = request.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => respond(&mut stream, "200 OK", &render(source)),
        ("GET", _) => respond(&mut stream, "404 Not Found", "only /metrics is here\n"),
        _ => respond(
            &mut stream,
            "405 Method Not Allowed",
            "only GET /metrics is served\n",
        ),
    }
}

fn respond(stream: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

/// A label value with `\`, `"` and newlines escaped as the text format wants.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A per-tenant value of [`TenantCounters`].
type Field = fn(&TenantCounters) -> f64;

/// The per-tenant series: name, type, help, value.
const SERIES: [(&str, &str, &str, Field); 14] = [
    (
        "ioshare_requests_arrived_total",
        "counter",
        "Requests received from clients",
        |t| t.arrived as f64,
    ),
    (
        "ioshare_requests_completed_total",
        "counter",
        "Requests the backend finished, with or without error",
        |t| t.completed as f64,
    ),
    (
        "ioshare_request_errors_total",
        "counter",
        "Requests the backend finished with an error",
        |t| t.errors as f64,
    ),
    (
        "ioshare_requests_refused_total",
        "counter",
        "Requests refused at admission: queue full, or the policy could not meet their response time with refuse = \"error\" (answered EIO)",
        |t| t.refused as f64,
    ),
    (
        "ioshare_requests_held_back_total",
        "counter",
        "Requests the policy refused and the host held back to offer again (refuse = \"hold\"): served late, not failed",
        |t| t.held_back as f64,
    ),
    (
        "ioshare_requests_cancelled_total",
        "counter",
        "Requests still held by the policy at the drain deadline (answered ESHUTDOWN)",
        |t| t.cancelled as f64,
    ),
    ("ioshare_read_bytes_total", "counter", "Bytes read", |t| {
        t.read_bytes as f64
    }),
    (
        "ioshare_written_bytes_total",
        "counter",
        "Bytes written",
        |t| t.written_bytes as f64,
    ),
    (
        "ioshare_tenant_weight",
        "gauge",
        "The tenant's proportional-share weight",
        |t| t.weight,
    ),
    (
        "ioshare_tenant_queued",
        "gauge",
        "Requests held by the policy",
        |t| t.queued() as f64,
    ),
    (
        "ioshare_tenant_in_flight",
        "gauge",
        "Requests on the backend",
        |t| t.in_flight() as f64,
    ),
    (
        "ioshare_journal_groups",
        "gauge",
        "cache = \"pdc\": groups of the export found to hold the guest's journal (each a detection event; a group stays marked)",
        |t| t.journal_groups as f64,
    ),
    (
        "ioshare_journal_writes_total",
        "counter",
        "cache = \"pdc\": journal writes that bypassed the host cache",
        |t| t.journal_writes as f64,
    ),
    (
        "ioshare_journal_bypassed_bytes_total",
        "counter",
        "cache = \"pdc\": bytes of journal writes that bypassed the host cache",
        |t| t.journal_bytes as f64,
    ),
];

/// The whole exposition: per-tenant series, then the policy's gauges.
pub fn render(source: &MetricsSource) -> String {
    let tenants = source.stats.snapshot();
    let names: Vec<String> = tenants.iter().map(|t| label(&t.name)).collect();
    let mut out = String::with_capacity(4096);
    header(
        &mut out,
        "ioshare_policy_info",
        "gauge",
        "The scheduling policy in use",
    );
    let _ = writeln!(
        out,
        "ioshare_policy_info{{policy=\"{}\"}} 1",
        label(&source.policy)
    );
    for (name, kind, help, field) in SERIES {
        header(&mut out, name, kind, help);
        for (t, n) in tenants.iter().zip(&names) {
            let _ = writeln!(out, "{name}{{tenant=\"{n}\"}} {}", field(t));
        }
    }
    render_latency(&mut out, &tenants, &names);
    render_gauges(&mut out, &source.stats.policy_gauges(), &names);
    out
}

/// The latency histogram of successful requests, per tenant.
fn render_latency(out: &mut String, tenants: &[TenantCounters], names: &[String]) {
    let h = "ioshare_request_latency_seconds";
    header(
        out,
        h,
        "histogram",
        "Time from a request's arrival to its completion, successful requests",
    );
    for (t, n) in tenants.iter().zip(names) {
        let mut cumulative = 0;
        for (bound, count) in LATENCY_BUCKETS_NS.iter().zip(&t.latency_buckets) {
            cumulative += count;
            let _ = writeln!(
                out,
                "{h}_bucket{{tenant=\"{n}\",le=\"{}\"}} {cumulative}",
                *bound as f64 / 1e9
            );
        }
        cumulative += t.latency_buckets[LATENCY_BUCKETS_NS.len()];
        let _ = writeln!(out, "{h}_bucket{{tenant=\"{n}\",le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(
            out,
            "{h}_sum{{tenant=\"{n}\"}} {}",
            t.latency_sum_ns as f64 / 1e9
        );
        let _ = writeln!(out, "{h}_count{{tenant=\"{n}\"}} {cumulative}");
    }
}

/// The policy's gauges, grouped by name (one HELP/TYPE per metric).
fn render_gauges(out: &mut String, gauges: &[Gauge], tenants: &[String]) {
    let mut done: Vec<&str> = Vec::new();
    for g in gauges {
        if done.contains(&g.name) {
            continue;
        }
        done.push(g.name);
        let name = format!("ioshare_policy_{}", g.name);
        let kind = if g.is_counter() { "counter" } else { "gauge" };
        header(out, &name, kind, g.help);
        for x in gauges.iter().filter(|x| x.name == g.name) {
            match x.tenant.and_then(|t| tenants.get(t as usize)) {
                Some(t) => {
                    let _ = writeln!(out, "{name}{{tenant=\"{t}\"}} {}", x.value);
                }
                None => {
                    let _ = writeln!(out, "{name} {}", x.value);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Completion, Op, Request};

    #[test]
    fn exposition_has_counters_histograms_and_policy_state() {
        let stats = Arc::new(LiveStats::new(&[
            ("vm\"1".to_string(), 2.0),
            ("vm2".to_string(), 1.0),
        ]));
        for (id, latency) in [
            (1u64, 40_000u64),
            (2, 50_000),
            (3, 3_000_000),
            (4, 20_000_000_000),
        ] {
            stats.arrived(0);
            stats.dispatched(0);
            let request = Request {
                id,
                tenant: 0,
                op: Op::Read,
                offset: 0,
                len: 4096,
                arrival: 0,
                cost: 0,
            };
            let c = Completion {
                request,
                start: 0,
                finish: latency,
            };
            stats.completed(&c, true);
        }
        stats.arrived(1);
        stats.journal_group(1);
        stats.journal_write(1, 8192);
        stats.journal_write(1, 4096);
        stats.publish_policy(vec![
            Gauge::tenant("credits", "Credits left", 0, 5.5),
            Gauge::tenant("credits", "Credits left", 1, 0.0),
            Gauge::policy("periods_total", "Periods", 7.0),
        ]);
        let text = render(&MetricsSource {
            stats,
            policy: "feedbac".into(),
        });
        let has = |line: &str| text.lines().any(|l| l == line);
        assert!(has("ioshare_policy_info{policy=\"feedbac\"} 1"), "{text}");
        assert!(has(
            "ioshare_requests_completed_total{tenant=\"vm\\\"1\"} 4"
        ));
        assert!(has("ioshare_read_bytes_total{tenant=\"vm\\\"1\"} 16384"));
        assert!(has("ioshare_tenant_queued{tenant=\"vm2\"} 1"));
        assert!(has("ioshare_tenant_in_flight{tenant=\"vm\\\"1\"} 0"));
        assert!(has("ioshare_journal_groups{tenant=\"vm2\"} 1"), "{text}");
        assert!(has("ioshare_journal_writes_total{tenant=\"vm2\"} 2"));
        assert!(has(
            "ioshare_journal_bypassed_bytes_total{tenant=\"vm2\"} 12288"
        ));
        assert!(has(
            "ioshare_journal_bypassed_bytes_total{tenant=\"vm\\\"1\"} 0"
        ));
        // 40 µs and exactly 50 µs fall in the first bucket; 3 ms in le=0.005; 20 s
        // only in +Inf.
        let b = "ioshare_request_latency_seconds_bucket{tenant=\"vm\\\"1\",le=";
        assert!(has(&format!("{b}\"0.00005\"}} 2")), "{text}");
        assert!(has(&format!("{b}\"0.0025\"}} 2")));
        assert!(has(&format!("{b}\"0.005\"}} 3")));
        assert!(has(&format!("{b}\"10\"}} 3")));
        assert!(has(&format!("{b}\"+Inf\"}} 4")));
        assert!(has(
            "ioshare_request_latency_seconds_count{tenant=\"vm\\\"1\"} 4"
        ));
        assert!(has(
            "ioshare_request_latency_seconds_sum{tenant=\"vm\\\"1\"} 20.00309"
        ));
        assert!(has("# TYPE ioshare_policy_credits gauge"));
        assert!(has("ioshare_policy_credits{tenant=\"vm\\\"1\"} 5.5"));
        assert!(has("# TYPE ioshare_policy_periods_total counter"));
        assert!(has("ioshare_policy_periods_total 7"));
        assert_eq!(text.matches("# TYPE ioshare_policy_credits").count(), 1);
    }
}
