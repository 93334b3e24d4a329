//! Drives the codec as a connection does, for the fuzz target (`fuzz/`) and the
//! property tests: any input, cut into any pieces, must give the same events and the
//! same handshake bytes as the whole input at once, every request the codec lets
//! through must be one the server can execute safely, and every read or write must have
//! been announced by [`ServerCodec::next_request`] before the poll that took it, with the
//! data it takes (the server's memory budget depends on it).

use super::proto::MAX_BLOCK_STATUS_PAYLOAD;
use super::{CommandKind, Event, ExportInfo, ProtocolError, ServerCodec};
use std::sync::Arc;

/// The largest request the codec accepts (the block-size maximum it advertises).
const MAX_REQUEST: u32 = 32 << 20;

/// Everything a codec said to one input.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcript {
    /// Every event and protocol error polled, in order.
    pub events: Vec<Result<Event, ProtocolError>>,
    /// Handshake bytes sent, all together.
    pub output: Vec<u8>,
}

/// The exports the fuzz target serves: a writable one, a read-only one, a tiny one, and
/// one withdrawn (a tenant removed while running: listed nowhere, selectable never).
pub fn exports() -> Arc<Vec<ExportInfo>> {
    Arc::new(vec![
        ExportInfo {
            description: "the first".into(),
            default: true,
            ..ExportInfo::new("vm1", 1 << 20, false)
        },
        ExportInfo::new("ro", 64 << 10, true),
        ExportInfo::new("tiny", 1000, false),
        ExportInfo {
            offered: false,
            ..ExportInfo::new("gone", 1 << 20, false)
        },
    ])
}

/// Feeds `input` cut at `cuts` (positions, taken modulo the length, in any order),
/// polling after every piece as the server's reader does.
pub fn run(exports: &Arc<Vec<ExportInfo>>, input: &[u8], cuts: &[usize]) -> Transcript {
    let mut codec = ServerCodec::new(exports.clone());
    let mut t = Transcript {
        events: Vec::new(),
        output: codec.take_output(),
    };
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    points.sort_unstable();
    points.push(input.len());
    let mut at = 0;
    // What the server holds of its memory budget for the request being parsed: taken
    // from `next_request` before a poll, as the server does, and due on its command.
    let mut held: Option<u32> = None;
    for p in points {
        codec.receive(&input[at..p]);
        at = p;
        loop {
            if held.is_none() {
                held = codec.next_request();
            }
            let polled = codec.poll();
            t.output.extend(codec.take_output());
            match &polled {
                // Every request answered was announced, with the data it takes.
                Ok(Some(Event::Command(c))) => {
                    let data = match c.kind {
                        CommandKind::Read | CommandKind::Write { .. } => c.len,
                        _ => 0,
                    };
                    assert_eq!(
                        held.take(),
                        Some(data),
                        "a request was not announced by next_request"
                    );
                }
                Ok(Some(Event::BlockStatus { .. })) => assert_eq!(
                    held.take(),
                    Some(MAX_BLOCK_STATUS_PAYLOAD),
                    "a block status was not announced with its reply's size"
                ),
                Ok(Some(Event::Error { .. } | Event::Done { .. })) => assert_eq!(
                    held.take(),
                    Some(0),
                    "a request answered at once was not announced by next_request"
                ),
                // A payload still arriving keeps what its header was announced with.
                Ok(None) => {}
                // Whatever else ends the request (a disconnect, broken framing): the
                // server gives back what it held.
                _ => held = None,
            }
            match polled {
                Ok(Some(e)) => t.events.push(Ok(e)),
                Ok(None) => break,
                Err(e) => t.events.push(Err(e)),
            }
        }
    }
    t
}

/// Panics unless the transcript keeps the codec's promises: requests only after an
/// export is selected, inside it, reads and writes at most 32 MiB, writes carrying
/// exactly their length, flushes without a range, nothing that changes a read-only
/// export, nothing after the end.
pub fn check(exports: &[ExportInfo], t: &Transcript) {
    let mut selected: Option<&ExportInfo> = None;
    let mut over = false;
    for e in &t.events {
        assert!(!over, "an event after the connection ended: {e:?}");
        match e {
            Ok(Event::Selected { export }) => {
                assert!(selected.is_none(), "a second export selected");
                assert!(exports[*export].offered, "a withdrawn export selected");
                selected = Some(&exports[*export]);
            }
            Ok(Event::Command(c)) => {
                let x = selected.expect("a request before an export was selected");
                // Trims and zeroing carry no payload and may be larger.
                if matches!(c.kind, CommandKind::Read | CommandKind::Write { .. }) {
                    assert!(c.len <= MAX_REQUEST, "{} bytes let through", c.len);
                }
                if c.kind == CommandKind::Flush {
                    assert_eq!((c.offset, c.len), (0, 0), "a flush with a range");
                } else {
                    let end = c.offset.checked_add(c.len as u64);
                    assert!(
                        end.is_some_and(|end| end <= x.size),
                        "request {}+{} past {}",
                        c.offset,
                        c.len,
                        x.size
                    );
                }
                match &c.kind {
                    CommandKind::Write { data, .. } => {
                        assert_eq!(data.len(), c.len as usize, "payload length");
                        assert!(!x.read_only, "write to a read-only export");
                    }
                    CommandKind::Trim { .. } | CommandKind::WriteZeroes { .. } => {
                        assert!(!x.read_only, "change to a read-only export")
                    }
                    CommandKind::Read | CommandKind::Flush => {}
                }
            }
            Ok(Event::Error { .. } | Event::Done { .. }) => {
                assert!(selected.is_some(), "a request answered before transmission");
            }
            Ok(Event::BlockStatus { offset, len, .. }) => {
                let x = selected.expect("a block status before an export was selected");
                assert!(*len > 0, "a block status of nothing");
                let end = offset.checked_add(u64::from(*len));
                assert!(
                    end.is_some_and(|end| end <= x.size),
                    "block status past the end"
                );
            }
            Ok(Event::StartTls) => {
                assert!(selected.is_none(), "TLS started during transmission");
                // The codec parses nothing more until the caller's TLS handshake.
                over = true;
            }
            Ok(Event::Disconnect) | Err(_) => over = true,
        }
    }
}

/// The fuzz target's body: `input` whole and cut at `cuts` says the same, and keeps
/// the promises of [`check`].
pub fn check_pieces(input: &[u8], cuts: &[usize]) {
    let exports = exports();
    let whole = run(&exports, input, &[]);
    check(&exports, &whole);
    let pieces = run(&exports, input, cuts);
    assert_eq!(whole, pieces, "cut at {cuts:?}");
}
