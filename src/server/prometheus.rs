//! The Prometheus endpoint: `GET /metrics` on a small HTTP listener (loopback in the
//! example config) answers the per-tenant counters, latency histograms and the policy's
//! state in the Prometheus text format (version 0.0.4).
//!
//! One thread serves every connection with `poll`, none of them able to hold up another:
//! * a connection has [`DEADLINE`] from its accept to send its request and take the
//!   answer, then it is closed;
//! * the listener defers the accept until the client has sent something
//!   (`TCP_DEFER_ACCEPT`, [`DEFER_ACCEPT_S`]): a connection that stays silent waits in
//!   the kernel, holding no descriptor and no place here;
//! * at most [`MAX_CONNECTIONS`] are held; past it the oldest that has not sent its whole
//!   request is closed for the new one;
//! * out of descriptors (`EMFILE`, `ENFILE`), the oldest such connection is closed to make
//!   room for the one waiting; with none to close the listener rests [`ACCEPT_REST`]
//!   instead of spinning on an `accept` that fails at once.
//!
//! A scrape's answer is written as soon as its request is complete, in the same turn of
//! the loop. (One thread per connection, at most 16, had let 16 silent clients that
//! reconnect take every thread: no legitimate scrape answered. Before that, one thread
//! answering connections in turn let 10 idle connections delay a scrape by 20 s.)

use super::stats::{LATENCY_BUCKETS_NS, LiveStats, TenantCounters};
use crate::policy::Gauge;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connections held at once.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a connection has, from its accept, to send its request and take the answer.
pub const DEADLINE: Duration = Duration::from_secs(2);
/// Seconds the kernel holds a connection that has sent nothing before handing it over.
pub const DEFER_ACCEPT_S: libc::c_int = 1;
/// How long the listener rests after the process ran out of descriptors.
pub const ACCEPT_REST: Duration = Duration::from_millis(50);
/// The longest request read (an HTTP request line and headers).
const MAX_REQUEST: usize = 16 << 10;
/// Connections accepted in one turn of the loop, so that the ones held are served too.
const ACCEPT_BATCH: usize = 64;

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
    listener.set_nonblocking(true).map_err(listen)?;
    // SAFETY: a valid socket and a c_int option of its size.
    let r = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&DEFER_ACCEPT_S as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(listen(std::io::Error::last_os_error()));
    }
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || serve(&listener, &source))
        .map_err(MetricsError::Thread)?;
    Ok(local)
}

/// One connection: its request as read so far, then its answer as written so far.
struct Scrape {
    stream: TcpStream,
    accepted: Instant,
    request: Vec<u8>,
    answer: Option<(Vec<u8>, usize)>,
}

/// What a turn of I/O left a connection in.
#[derive(PartialEq)]
enum Progress {
    Waiting,
    Done,
}

impl Scrape {
    /// Reads what has come, answers a complete request, writes what the socket takes.
    fn progress(&mut self, source: &MetricsSource) -> Progress {
        let mut buf = [0u8; 4096];
        while self.answer.is_none() {
            match self.stream.read(&mut buf) {
                Ok(0) if self.request.is_empty() => return Progress::Done,
                // A request cut short is answered as it stands (405 or 404, usually).
                Ok(0) => self.answer = Some((answer(&self.request, source), 0)),
                Ok(n) => {
                    self.request.extend_from_slice(&buf[..n]);
                    if self.request.len() > MAX_REQUEST {
                        let a = respond("431 Request Header Fields Too Large", "");
                        self.answer = Some((a, 0));
                    } else if self.request.windows(4).any(|w| w == b"\r\n\r\n") {
                        self.answer = Some((answer(&self.request, source), 0));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Progress::Waiting,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Progress::Done,
            }
        }
        let Some((bytes, sent)) = &mut self.answer else {
            unreachable!("the loop above ends with an answer")
        };
        while *sent < bytes.len() {
            match self.stream.write(&bytes[*sent..]) {
                Ok(0) => return Progress::Done,
                Ok(n) => *sent += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Progress::Waiting,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Progress::Done,
            }
        }
        Progress::Done
    }
}

/// Closes the oldest connection still sending its request; whether there was one.
fn close_oldest_idle(held: &mut VecDeque<Scrape>) -> bool {
    match held.iter().position(|c| c.answer.is_none()) {
        Some(i) => {
            held.remove(i);
            true
        }
        None => false,
    }
}

fn serve(listener: &TcpListener, source: &MetricsSource) {
    let mut held: VecDeque<Scrape> = VecDeque::new();
    let mut resting_until: Option<Instant> = None;
    let mut fds: Vec<libc::pollfd> = Vec::new();
    loop {
        let now = Instant::now();
        held.retain(|c| now.duration_since(c.accepted) < DEADLINE);
        if resting_until.is_some_and(|t| now >= t) {
            resting_until = None;
        }
        fds.clear();
        fds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: if resting_until.is_none() {
                libc::POLLIN
            } else {
                0
            },
            revents: 0,
        });
        fds.extend(held.iter().map(|c| libc::pollfd {
            fd: c.stream.as_raw_fd(),
            events: if c.answer.is_none() {
                libc::POLLIN
            } else {
                libc::POLLOUT
            },
            revents: 0,
        }));
        // Woken by the first deadline or the end of a rest (rounded up to a whole ms).
        let wake = held
            .iter()
            .map(|c| c.accepted + DEADLINE)
            .chain(resting_until)
            .min();
        let timeout_ms = wake.map_or(-1, |t| {
            let left = t.saturating_duration_since(now);
            i32::try_from(left.as_millis() + 1).unwrap_or(i32::MAX)
        });
        // SAFETY: `fds` is a valid array of pollfd for the call's duration.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n <= 0 {
            continue;
        }
        // The connections first, so that answers are not held behind new arrivals.
        let mut i = 0;
        let mut k = 1;
        while i < held.len() {
            let ready = fds[k].revents != 0;
            k += 1;
            if ready && held[i].progress(source) == Progress::Done {
                held.remove(i);
            } else {
                i += 1;
            }
        }
        if fds[0].revents & libc::POLLIN == 0 {
            continue;
        }
        if let Some(rest) = accept_batch(listener, &mut held, source) {
            resting_until = Some(rest);
        }
    }
}

/// Accepts what waits (at most [`ACCEPT_BATCH`]), answering at once what has its
/// request already; when the listener must rest, until when.
fn accept_batch(
    listener: &TcpListener,
    held: &mut VecDeque<Scrape>,
    source: &MetricsSource,
) -> Option<Instant> {
    for _ in 0..ACCEPT_BATCH {
        match listener.accept() {
            Ok((stream, _)) => {
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                if held.len() >= MAX_CONNECTIONS && !close_oldest_idle(held) {
                    // Every place is writing an answer: the newcomer waits its turn
                    // by being closed (a scraper retries).
                    continue;
                }
                let mut scrape = Scrape {
                    stream,
                    accepted: Instant::now(),
                    request: Vec::new(),
                    answer: None,
                };
                // Its request is usually here already (the accept was deferred).
                if scrape.progress(source) == Progress::Waiting {
                    held.push_back(scrape);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                ) =>
            {
                // A descriptor freed, the next accept can succeed; with none to free,
                // rest rather than spin on an accept that fails at once.
                if !close_oldest_idle(held) {
                    return Some(Instant::now() + ACCEPT_REST);
                }
            }
            // A connection reset before its accept, a signal: the next one.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ECONNABORTED | libc::EINTR | libc::EPROTO)
                ) => {}
            Err(_) => return Some(Instant::now() + ACCEPT_REST),
        }
    }
    None
}

/// The answer to a request (its request line decides).
fn answer(request: &[u8], source: &MetricsSource) -> Vec<u8> {
    let line = request.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => respond("200 OK", &render(source)),
        ("GET", _) => respond("404 Not Found", "only /metrics is here\n"),
        _ => respond("405 Method Not Allowed", "only GET /metrics is served\n"),
    }
}

fn respond(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
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
const SERIES: [(&str, &str, &str, Field); 18] = [
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
        "ioshare_backend_timeouts_total",
        "counter",
        "Requests answered EIO because the backend had not answered within server.backend_timeout_s (its backend is degraded); counted in ioshare_request_errors_total too",
        |t| t.backend_timeouts as f64,
    ),
    (
        "ioshare_writes_fenced_total",
        "counter",
        "Writes answered EIO at once because an older write answered EIO past the backend timeout had not come back from the backend; counted in ioshare_request_errors_total too",
        |t| t.fenced as f64,
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
        "ioshare_tenant_serving",
        "gauge",
        "1 while the tenant's export takes connections; 0 once drained or removed through the control socket",
        |t| f64::from(u8::from(t.state == super::stats::TenantState::Serving)),
    ),
    (
        "ioshare_tenant_connections",
        "gauge",
        "Connections the engine serves for the tenant now",
        |t| t.connections as f64,
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
    render_cpu(&mut out, process_cpu());
    render_answered_errors(&mut out, &tenants, &names);
    render_latency(&mut out, &tenants, &names);
    render_gauges(&mut out, &source.stats.policy_gauges(), &names);
    out
}

/// The CPU the server's process has used so far, every thread of it (user, system),
/// seconds: divided by the requests completed, what a request costs.
#[allow(unsafe_code)]
fn process_cpu() -> (f64, f64) {
    // SAFETY: getrusage fills the zeroed struct it is given; nothing else is touched.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return (0.0, 0.0);
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (seconds(usage.ru_utime), seconds(usage.ru_stime))
}

/// `ioshare_cpu_seconds_total` by mode.
fn render_cpu(out: &mut String, (user, system): (f64, f64)) {
    let h = "ioshare_cpu_seconds_total";
    header(
        out,
        h,
        "counter",
        "CPU time the server has used, all of its threads, by mode (user, system): its rate over the rate of ioshare_requests_completed_total is the CPU a request costs",
    );
    let _ = writeln!(out, "{h}{{mode=\"user\"}} {user}");
    let _ = writeln!(out, "{h}{{mode=\"system\"}} {system}");
}

/// Every reply that carried an error, per tenant and error (all of them, zeroes
/// included, so that a rate of each is defined from the start).
fn render_answered_errors(out: &mut String, tenants: &[TenantCounters], names: &[String]) {
    let h = "ioshare_replies_with_error_total";
    header(
        out,
        h,
        "counter",
        "Requests answered with an error, by the error: refused by the protocol's rules (EINVAL: past the end, zero length, unknown command or flag; EPERM: a change to a read-only export; ENOSPC: a write past the end), refused at admission (EIO), cancelled at shutdown (ESHUTDOWN), failed or timed out on the backend",
    );
    let reasons: Vec<String> = super::stats::REPLY_ERRORS
        .iter()
        .map(|&e| crate::nbd::proto::error_name(e).into_owned())
        .chain(std::iter::once("other".to_string()))
        .collect();
    for (t, n) in tenants.iter().zip(names) {
        for (reason, count) in reasons.iter().zip(t.answered_errors) {
            let _ = writeln!(out, "{h}{{tenant=\"{n}\",error=\"{reason}\"}} {count}");
        }
    }
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

    /// The two series of `ioshare_cpu_seconds_total` in `text`, summed.
    fn cpu_seconds(text: &str) -> f64 {
        let series: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with("ioshare_cpu_seconds_total{mode="))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(series.len(), 2, "user and system: {text}");
        series.iter().sum()
    }

    #[test]
    fn cpu_seconds_count_the_work_done_between_two_scrapes() {
        let source = MetricsSource {
            stats: Arc::new(LiveStats::new(&[("vm".to_string(), 1.0)])),
            policy: "none".to_string(),
        };
        let before = cpu_seconds(&render(&source));
        // Burn CPU until the series show 50 ms more (a shared machine may give this
        // thread little of its wall time; 20 s is far more than it needs).
        let start = std::time::Instant::now();
        let mut x = 1u64;
        let mut after = before;
        while after < before + 0.05 && start.elapsed() < Duration::from_secs(20) {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            after = cpu_seconds(&render(&source));
        }
        assert!(after >= before + 0.05, "{before} -> {after}");
        assert!(render(&source).contains("# TYPE ioshare_cpu_seconds_total counter"));
    }

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
        stats.answered_error(1, crate::nbd::proto::EINVAL);
        stats.answered_error(1, crate::nbd::proto::EINVAL);
        stats.answered_error(1, 1000);
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
        // Every reply with an error, per tenant and reason; the ones not seen are 0.
        let e = "ioshare_replies_with_error_total";
        assert!(
            has(&format!("{e}{{tenant=\"vm2\",error=\"EINVAL\"}} 2")),
            "{text}"
        );
        assert!(has(&format!("{e}{{tenant=\"vm2\",error=\"other\"}} 1")));
        assert!(has(&format!("{e}{{tenant=\"vm2\",error=\"EIO\"}} 0")));
        assert!(has(&format!(
            "{e}{{tenant=\"vm\\\"1\",error=\"EINVAL\"}} 0"
        )));
    }
}
