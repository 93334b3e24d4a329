//! The server's log: every line is a `tracing` event, written to stderr as a line of
//! text (`--log-format human`, the default: `ioshare: ` and the message, as it always
//! was) or as one JSON object (`--log-format json`: `timestamp`, `level`, `message`, and
//! the event's fields — `tenant` on the per-interval lines with their figures), for a
//! journal or a log shipper to parse.
//!
//! Log lines a client can cause (a bad handshake, a protocol error, a failed send), at
//! most [`BURST`] at once and [`PER_SECOND`] after that per peer: a client reconnecting
//! in a loop with garbage cannot fill the disk with the server's log, and the lines of
//! everyone else still get through. What is held back is counted and said with the
//! peer's next line.
//!
//! A peer is a TCP client's address without its port (a client can take new ports at
//! will; for IPv6 its /64, which one client can fill with addresses) or `local` for the
//! Unix socket. The table is bounded ([`MAX_PEERS`]); when every peer in it is being
//! held back, a new one is held back too.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;
use tracing::field::{Field, Visit};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The target of the per-interval lines (written without the `ioshare: ` prefix in the
/// human format, as a table's rows).
pub const INTERVAL: &str = "ioshare::interval";

/// How log lines are written (`serve --log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// `ioshare: ` and the message, a line each.
    #[default]
    Human,
    /// One JSON object a line: timestamp, level, message and the event's fields.
    Json,
}

/// Sends the server's log events to stderr in `format`, from now on (the first call
/// of a process decides; later ones change nothing).
pub fn install(format: LogFormat) {
    if format == LogFormat::Json {
        JSON.store(true, Ordering::SeqCst);
    }
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO);
    let _ = match format {
        LogFormat::Human => {
            tracing::subscriber::set_global_default(builder.event_format(Human).finish())
        }
        LogFormat::Json => tracing::subscriber::set_global_default(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .finish(),
        ),
    };
}

/// Whether JSON logs were installed: an error that ends the process is then a JSON
/// line too (a configuration error at start-up included), not plain text a log
/// collector cannot parse.
pub fn json() -> bool {
    JSON.load(Ordering::SeqCst)
}

static JSON: AtomicBool = AtomicBool::new(false);

/// A line made in the human format's words (`ioshare: …`: the engine core's lines, the
/// image watcher's) as a warning event.
pub fn warn_line(text: &str) {
    tracing::warn!("{}", text.strip_prefix("ioshare: ").unwrap_or(text));
}

/// The human format: `ioshare: MESSAGE` (the interval lines without the prefix).
struct Human;

/// An event's message.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        }
    }
}

impl<S, N> FormatEvent<S, N> for Human
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let mut m = Message(String::new());
        event.record(&mut m);
        let text = escape_controls(&m.0);
        if event.metadata().target() == INTERVAL {
            writeln!(writer, "{text}")
        } else {
            writeln!(writer, "ioshare: {text}")
        }
    }
}

/// `text` with every control character written as an escape (`\n`, `\u{1b}`), as the
/// JSON format writes them: a name an operator or a client gave (a tenant added over
/// the control socket, an export a client asked for) can neither start a line of its
/// own nor reach the terminal as an escape sequence. One event is one line.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Lines a peer may log at once.
pub const BURST: f64 = 20.0;
/// Lines a peer may log per second after its burst.
pub const PER_SECOND: f64 = 1.0;
/// Peers remembered; past that, those back at a full burst are forgotten first.
pub const MAX_PEERS: usize = 4096;

#[derive(Debug)]
struct Budget {
    tokens: f64,
    last: Instant,
    held_back: u64,
}

/// Per-peer log budgets.
#[derive(Debug, Default)]
pub struct PeerLog {
    peers: Mutex<HashMap<String, Budget>>,
}

impl PeerLog {
    /// The server's table.
    pub fn global() -> &'static PeerLog {
        static LOG: OnceLock<PeerLog> = OnceLock::new();
        LOG.get_or_init(PeerLog::default)
    }

    /// Whether `peer` may log a line at `now`; `Some(n)`: yes, after saying that `n`
    /// of its lines were held back since its last one.
    pub fn admit(&self, peer: &str, now: Instant) -> Option<u64> {
        let mut peers = self.peers.lock().expect("peer log");
        if !peers.contains_key(peer) && peers.len() >= MAX_PEERS {
            let full = |b: &Budget| {
                b.tokens + now.duration_since(b.last).as_secs_f64() * PER_SECOND >= BURST
            };
            peers.retain(|_, b| !full(b));
            if peers.len() >= MAX_PEERS {
                // Every remembered peer is being held back: a new one is too, rather
                // than everyone getting a fresh burst.
                return None;
            }
        }
        let b = peers.entry(peer.to_string()).or_insert(Budget {
            tokens: BURST,
            last: now,
            held_back: 0,
        });
        b.tokens = (b.tokens + now.duration_since(b.last).as_secs_f64() * PER_SECOND).min(BURST);
        b.last = now;
        if b.tokens < 1.0 {
            b.held_back += 1;
            return None;
        }
        b.tokens -= 1.0;
        Some(std::mem::take(&mut b.held_back))
    }

    /// Writes `line()` to stderr if `peer` may log now.
    pub fn line(&self, peer: &str, line: impl FnOnce() -> String) {
        if let Some(held_back) = self.admit(peer, Instant::now()) {
            if held_back > 0 {
                tracing::warn!("{held_back} line(s) from {peer} were not logged (too many)");
            }
            warn_line(&line());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_peer_gets_its_burst_then_a_line_a_second_and_the_count_of_what_was_held() {
        let log = PeerLog::default();
        let t0 = Instant::now();
        for _ in 0..BURST as usize {
            assert_eq!(log.admit("10.0.0.1", t0), Some(0));
        }
        assert_eq!(log.admit("10.0.0.1", t0), None);
        assert_eq!(log.admit("10.0.0.1", t0), None);
        assert_eq!(log.admit("local", t0), Some(0), "others are not held back");
        let later = t0 + Duration::from_millis(1500);
        assert_eq!(log.admit("10.0.0.1", later), Some(2), "two were held back");
        assert_eq!(log.admit("10.0.0.1", later), None);
    }

    /// A name with a newline or an escape sequence stays inside its own line.
    #[test]
    fn names_cannot_forge_lines_or_reach_the_terminal() {
        assert_eq!(escape_controls("vm1"), "vm1");
        assert_eq!(
            escape_controls("a\nioshare: forged\u{1b}[2J\u{7f}\u{9b}é"),
            "a\\nioshare: forged\\u{1b}[2J\\u{7f}\\u{9b}é"
        );
        let out = std::sync::Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .event_format(Human)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let name = "t5\nioshare: tenant root added\u{1b}]0;x\u{7}";
            tracing::info!("tenant {name} added");
        });
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text}"
        );
        assert!(text.starts_with("ioshare: tenant t5\\nioshare: "), "{text}");
    }

    /// A writer into a shared buffer.
    struct Sink(std::sync::Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_table_stays_bounded() {
        let log = PeerLog::default();
        let t0 = Instant::now();
        for i in 0..(MAX_PEERS + 10) {
            let _ = log.admit(&format!("peer{i}"), t0);
        }
        assert!(log.peers.lock().unwrap().len() <= MAX_PEERS);
    }
}
