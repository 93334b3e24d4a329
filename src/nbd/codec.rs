//! Server side of one NBD connection as a state machine (sans-I/O, like quiche and
//! rustls): the caller feeds received bytes with [`ServerCodec::receive`], takes events
//! with [`ServerCodec::poll`] and sends what [`ServerCodec::take_output`] hands back.
//!
//! It speaks the fixed newstyle handshake (`OPT_EXPORT_NAME`, `OPT_LIST`, `OPT_INFO`,
//! `OPT_GO`, `OPT_ABORT`, and `OPT_STARTTLS` where TLS is offered or required, the
//! handshake itself run by the caller: [`Event::StartTls`]; `OPT_STRUCTURED_REPLY`, and
//! `OPT_LIST_META_CONTEXT` / `OPT_SET_META_CONTEXT` with the one context `base:allocation`;
//! other options are answered `ERR_UNSUP`) and parses transmission requests, block
//! status ([`Event::BlockStatus`]) where structured replies and `base:allocation` were
//! negotiated for the selected export (the caller encodes replies, structured ones
//! with `proto::chunk`: reads as one data chunk, so `NBD_CMD_FLAG_DF` always holds).
//! What is negotiated in the clear is forgotten when TLS starts. Every request that
//! cannot be served (past the end, over 32 MiB, a write to a read-only export, an
//! unknown command) becomes [`Event::Error`] so the connection answers it and stays
//! usable; a write's payload is consumed even then, so the stream stays in step. Only
//! bytes that break the framing (a wrong magic number, an option too long to skip) are
//! a [`ProtocolError`], after which the connection should be closed.
//!
//! Export names are looked up exactly in the table the codec was given: a name is never
//! a path.

use super::proto::*;
use crate::buffer::IoBuf;
use std::sync::Arc;

/// What the server offers under one name.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportInfo {
    /// Name the client selects the export by (matched exactly).
    pub name: String,
    /// Size of the export in bytes.
    pub size: u64,
    /// Whether the export refuses writes, trims and zeroing.
    pub read_only: bool,
    /// A line about it, sent as `NBD_INFO_DESCRIPTION` when a client asks (empty:
    /// none is sent).
    pub description: String,
    /// The empty export name selects it (the server's `default_export`).
    pub default: bool,
    /// Listed and selectable (`false`: a tenant removed while running, whose place in
    /// the table, its tenant id, stays).
    pub offered: bool,
}

impl ExportInfo {
    /// An export without a description that the empty name does not select.
    pub fn new(name: impl Into<String>, size: u64, read_only: bool) -> Self {
        ExportInfo {
            name: name.into(),
            size,
            read_only,
            description: String::new(),
            default: false,
            offered: true,
        }
    }

    fn transmission_flags(&self) -> u16 {
        let mut f = TFLAG_HAS_FLAGS
            | TFLAG_SEND_FLUSH
            | TFLAG_SEND_FUA
            | TFLAG_CAN_MULTI_CONN
            | TFLAG_SEND_CACHE;
        // A read-only export does not offer what it would refuse.
        if self.read_only {
            f |= TFLAG_READ_ONLY;
        } else {
            f |= TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES | TFLAG_SEND_FAST_ZERO;
        }
        f
    }
}

/// One request to serve.
#[derive(Debug, Clone, PartialEq)]
pub struct Command {
    /// The client's handle, echoed in the reply.
    pub handle: u64,
    /// Start of the range in bytes (0 for a flush).
    pub offset: u64,
    /// Length of the range in bytes (0 for a flush).
    pub len: u32,
    /// What to do with the range.
    pub kind: CommandKind,
}

/// The operation a [`Command`] asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum CommandKind {
    /// Read the range; the data follows the reply.
    Read,
    /// The payload comes in an aligned buffer the server writes from as it is.
    Write {
        /// The payload, exactly `len` bytes.
        data: IoBuf,
        /// Force unit access: the write must be durable before the reply.
        fua: bool,
    },
    /// Make all completed writes durable; covers the whole export.
    Flush,
    /// Discard the range.
    Trim {
        /// Force unit access: the trim must be durable before the reply.
        fua: bool,
    },
    /// Write zeroes to the range.
    WriteZeroes {
        /// Force unit access: the zeroes must be durable before the reply.
        fua: bool,
        /// `NBD_CMD_FLAG_FAST_ZERO`: fail with `ENOTSUP` rather than write zeroes
        /// where the range cannot be zeroed without writing it.
        fast: bool,
    },
}

/// What the codec found in the bytes received.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The handshake is over: requests for export `index` (in the table) follow.
    Selected {
        /// Index of the selected export in the codec's table.
        export: usize,
    },
    /// A request to serve.
    Command(Command),
    /// A request answered at once with success, with nothing to do:
    /// `NBD_CMD_CACHE`, a hint this server takes and does not act on (the page cache
    /// reads ahead on its own; with `cache = "none"` there is no cache to fill).
    Done {
        /// The client's handle, echoed in the reply.
        handle: u64,
    },
    /// `NBD_CMD_BLOCK_STATUS`: the range's allocation (`base:allocation`), answered
    /// by the server from the file's holes and data as (length, `STATE_*` flags)
    /// extents in one structured reply; not scheduled (no data moves).
    BlockStatus {
        /// The client's handle, echoed in the reply.
        handle: u64,
        /// Start of the range in bytes.
        offset: u64,
        /// Length of the range in bytes.
        len: u32,
        /// `NBD_CMD_FLAG_REQ_ONE`: the first extent only.
        req_one: bool,
    },
    /// A request that is answered with this error without being served.
    Error {
        /// The client's handle, echoed in the reply.
        handle: u64,
        /// The reply's error value (`proto::E*`).
        error: u32,
    },
    /// The client is done (`NBD_CMD_DISC`, `NBD_OPT_ABORT`): send what is pending, close.
    Disconnect,
    /// The client asked for TLS (`NBD_OPT_STARTTLS`) and was answered `NBD_REP_ACK`:
    /// send the output in the clear, then run the TLS handshake over the connection
    /// (bytes the client sent already, [`ServerCodec::take_unparsed`], are its first
    /// TLS bytes), then call [`ServerCodec::tls_started`]. Nothing is parsed until then.
    StartTls,
}

/// Whether a connection may or must use TLS (the NBD protocol's "TLS" section: a
/// server without it, one that offers it, and one in *forced TLS* mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPolicy {
    /// `NBD_OPT_STARTTLS` is answered `NBD_REP_ERR_UNSUP`.
    Off,
    /// A client may start TLS; it may also go on in the clear.
    Offered,
    /// Until TLS runs, every option but `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT` is
    /// answered `NBD_REP_ERR_TLS_REQD`, and `NBD_OPT_EXPORT_NAME` (which has no error
    /// reply) closes the connection.
    Required,
}

/// Bytes that break the protocol's framing; the connection must be closed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    /// The client flags (given) lack `NBD_FLAG_C_FIXED_NEWSTYLE`.
    #[error("client flags {0:#x} lack FIXED_NEWSTYLE")]
    NotFixedNewstyle(u32),
    /// An option did not start with `IHAVEOPT` (the magic received is given).
    #[error("bad option magic {0:#018x}")]
    OptionMagic(u64),
    /// An option's payload is longer than [`MAX_OPTION`] bytes.
    #[error("option {option} carries {len} bytes, more than the {MAX_OPTION} accepted")]
    OptionTooLong {
        /// The option's number (`proto::OPT_*`).
        option: u32,
        /// The payload length it announced, in bytes.
        len: u32,
    },
    /// The client set flags this server does not know: the protocol says drop it.
    #[error("client flags {0:#x} include ones this server does not know")]
    UnknownClientFlags(u32),
    /// `NBD_OPT_EXPORT_NAME` before TLS on a connection that requires it; that option
    /// has no error reply, so the protocol says close.
    #[error("NBD_OPT_EXPORT_NAME before NBD_OPT_STARTTLS where TLS is required")]
    TlsRequired,
    /// `NBD_OPT_EXPORT_NAME` named an export not in the table (the name as
    /// `printable` shows it); that option has no error reply.
    #[error("NBD_OPT_EXPORT_NAME for unknown export '{0}'")]
    UnknownExport(String),
    /// A transmission request did not start with the request magic (the magic received
    /// is given).
    #[error("bad request magic {0:#010x}")]
    RequestMagic(u32),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    ClientFlags,
    Options,
    /// `NBD_OPT_STARTTLS` was acknowledged; the TLS handshake runs outside the codec.
    AwaitTls,
    Transmission {
        export: usize,
    },
    /// Discarding the payload of a write that is answered with an error.
    Skipping {
        export: usize,
        left: u64,
    },
    /// Receiving the rest of a write's payload (in `ServerCodec::write`) straight into
    /// its buffer.
    Payload {
        export: usize,
    },
    Closed,
}

/// A write whose header is parsed and whose payload is still arriving.
#[derive(Debug)]
struct PendingWrite {
    handle: u64,
    offset: u64,
    fua: bool,
    data: IoBuf,
    /// Payload bytes received so far.
    filled: usize,
}

/// Request header: magic, flags, type, handle, offset, length.
const REQUEST_HEADER: usize = 4 + 2 + 2 + 8 + 8 + 4;
/// Option header: magic, option, length.
const OPTION_HEADER: usize = 8 + 4 + 4;
/// Room [`ServerCodec::receive_buffer`] offers for requests at least (a receive may
/// bring many small requests at once).
const RECEIVE_ROOM: usize = 64 << 10;
/// Room offered after a large write: enough for the next headers, little of a next
/// payload, which is better received into its own buffer than copied there.
const HEADER_ROOM: usize = 1 << 10;
/// A write this long makes the next receive small (see [`HEADER_ROOM`]).
const LARGE_WRITE: u32 = 64 << 10;

/// The server side of one connection.
#[derive(Debug)]
pub struct ServerCodec {
    exports: Arc<Vec<ExportInfo>>,
    state: State,
    /// Received bytes are `input[pos..end]`; the rest is room for the next receive.
    input: Vec<u8>,
    pos: usize,
    end: usize,
    /// In state `Payload`: the write being received.
    write: Option<PendingWrite>,
    /// The last request was a large write: more are likely to follow.
    after_large_write: bool,
    output: Vec<u8>,
    no_zeroes: bool,
    tls: TlsPolicy,
    /// TLS runs on the connection ([`Self::tls_started`]).
    tls_active: bool,
    /// Right after [`Event::Selected`]: how the export was selected and where in the
    /// output its replies begin, so that the server may still refuse it
    /// ([`Self::refuse_selected`]).
    selecting: Option<(u32, usize)>,
    /// The client asked for structured replies (`NBD_OPT_STRUCTURED_REPLY`).
    structured: bool,
    /// The export `base:allocation` was chosen for (`NBD_OPT_SET_META_CONTEXT`):
    /// block status is served when it is the one selected.
    allocation_for: Option<usize>,
    /// Block status is served on the selected export.
    block_status: bool,
}

impl ServerCodec {
    /// A connection just accepted, without TLS; the greeting is already in the output.
    pub fn new(exports: Arc<Vec<ExportInfo>>) -> Self {
        Self::with_tls(exports, TlsPolicy::Off)
    }

    /// A connection just accepted under `tls`; the greeting is already in the output.
    pub fn with_tls(exports: Arc<Vec<ExportInfo>>, tls: TlsPolicy) -> Self {
        let mut output = Vec::with_capacity(64);
        output.extend_from_slice(&INIT_MAGIC.to_be_bytes());
        output.extend_from_slice(&OPTION_MAGIC.to_be_bytes());
        output.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        ServerCodec {
            exports,
            state: State::ClientFlags,
            input: Vec::new(),
            pos: 0,
            end: 0,
            write: None,
            after_large_write: false,
            output,
            no_zeroes: false,
            selecting: None,
            tls,
            tls_active: false,
            structured: false,
            allocation_for: None,
            block_status: false,
        }
    }

    /// The TLS handshake that [`Event::StartTls`] asked for succeeded: option
    /// negotiation goes on over it, from scratch (nothing negotiated in the clear
    /// carries over; this server keeps no such state).
    pub fn tls_started(&mut self) {
        assert_eq!(self.state, State::AwaitTls, "TLS starts only when asked");
        self.tls_active = true;
        self.state = State::Options;
        // What was negotiated in the clear does not carry over (the NBD document).
        self.structured = false;
        self.allocation_for = None;
    }

    /// The client asked for structured replies: reads are answered with data chunks
    /// and errors with error chunks (`proto::chunk`).
    pub fn structured(&self) -> bool {
        self.structured
    }

    /// Whether TLS runs on the connection.
    pub fn tls_active(&self) -> bool {
        self.tls_active
    }

    /// Takes the bytes received and not parsed: after [`Event::StartTls`], the first
    /// bytes of the client's TLS handshake, if it sent them before reading the reply.
    pub fn take_unparsed(&mut self) -> Vec<u8> {
        let bytes = self.available().to_vec();
        self.pos = self.end;
        bytes
    }

    /// Bytes received from the client (a copy; a server receiving from a socket uses
    /// [`Self::receive_buffer`] instead).
    pub fn receive(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = self.receive_buffer();
            let n = room.len().min(bytes.len());
            room[..n].copy_from_slice(&bytes[..n]);
            self.received(n);
            bytes = &bytes[n..];
        }
    }

    /// Where the next bytes from the client go: the rest of a write's payload while one
    /// is arriving (so its bytes land in the buffer the server writes from), otherwise
    /// room after the bytes not yet parsed (little of it after a large write, so that
    /// most of the next large payload goes straight into its buffer too). Tell
    /// [`Self::received`] how many arrived; the slice stays where it is until then.
    pub fn receive_buffer(&mut self) -> &mut [u8] {
        if self.payload_arriving() {
            let w = self.write.as_mut().expect("arriving");
            return &mut w.data[w.filled..];
        }
        if self.pos == self.end {
            (self.pos, self.end) = (0, 0);
        }
        if self.input.len() - self.end < RECEIVE_ROOM {
            // Move what is left to the front, grow when that does not make room.
            self.input.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
            if self.input.len() - self.end < RECEIVE_ROOM {
                self.input.resize(self.end + RECEIVE_ROOM, 0);
            }
        }
        if self.after_large_write {
            return &mut self.input[self.end..self.end + HEADER_ROOM];
        }
        &mut self.input[self.end..]
    }

    /// `n` bytes arrived in the slice [`Self::receive_buffer`] gave.
    pub fn received(&mut self, n: usize) {
        if self.payload_arriving() {
            let w = self.write.as_mut().expect("arriving");
            w.filled += n;
            assert!(w.filled <= w.data.len(), "received past the payload");
        } else {
            self.end += n;
            assert!(self.end <= self.input.len(), "received past the buffer");
        }
    }

    /// Bytes to send to the client (handshake replies); empty once transmission runs,
    /// where the caller encodes replies itself ([`super::proto::simple_reply`]).
    pub fn take_output(&mut self) -> Vec<u8> {
        self.selecting = None;
        std::mem::take(&mut self.output)
    }

    /// Refuses the export [`Event::Selected`] just named, before its replies are taken
    /// from the output (the server's own limits: too many connections to it). After
    /// `NBD_OPT_GO` the client hears `NBD_REP_ERR_POLICY` with `message` instead of the
    /// export's information and may go on negotiating; after `NBD_OPT_EXPORT_NAME`,
    /// which has no way to say no, the connection is over (the caller closes it).
    ///
    /// # Panics
    /// When no selection is pending: called twice, after [`Self::take_output`] or a
    /// poll that went on.
    pub fn refuse_selected(&mut self, message: &str) {
        let (option, at) = self
            .selecting
            .take()
            .expect("a selection to refuse, right after Event::Selected");
        self.output.truncate(at);
        if option == OPT_GO {
            self.error(option, REP_ERR_POLICY, message);
            self.state = State::Options;
        } else {
            self.state = State::Closed;
        }
    }

    /// True once the connection is over (after a disconnect or a protocol error).
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// A write's payload is still short of bytes (one that is complete but not yet
    /// polled takes no more: what follows is the next request).
    fn payload_arriving(&self) -> bool {
        self.write.as_ref().is_some_and(|w| w.filled < w.data.len())
    }

    /// Bytes received and not yet consumed (for back-pressure: a connection stops
    /// reading while a large write is still being assembled only up to its size).
    pub fn buffered(&self) -> usize {
        self.end - self.pos
    }

    /// The request the next [`Self::poll`] parses, once its header is whole: the data
    /// bytes serving it takes a buffer for (the length of a read or write that will be
    /// served: a write's payload buffer is allocated when its header is parsed, a read's
    /// when it is served; the most a block status reply carries; 0 for anything else,
    /// answered or not). `None` while no whole
    /// header waits (nothing received, a header not yet whole, a write payload still
    /// arriving, the handshake). Decided by the same rules as the poll itself (the
    /// codec's one `classify`). A server checks this against its memory budget before
    /// polling; every request it announces is answered with one reply, except a
    /// disconnect and bytes that break the framing.
    pub fn next_request(&self) -> Option<u32> {
        // While a refused write's payload is skipped, the next header is behind it (one
        // poll skips the rest and parses that header).
        let (export, at) = match self.state {
            State::Transmission { export } => (export, 0),
            State::Skipping { export, left } => (export, usize::try_from(left).ok()?),
            _ => return None,
        };
        let head = self.available().get(at..at.checked_add(REQUEST_HEADER)?)?;
        let head: &[u8; REQUEST_HEADER] = head.try_into().expect("sized");
        Some(match classify(head, &self.exports[export], self.caps()) {
            Ok((h, Verdict::Serve(CommandKind::Read) | Verdict::Write { .. })) => h.len,
            // Its reply carries extents: held like data until it is sent.
            Ok((_, Verdict::BlockStatus { .. })) => MAX_BLOCK_STATUS_PAYLOAD,
            _ => 0,
        })
    }

    /// The next event the received bytes make, `Ok(None)` when more bytes are needed.
    pub fn poll(&mut self) -> Result<Option<Event>, ProtocolError> {
        let polled = self.next_event();
        match &polled {
            // A selection stays refusable until something after it is parsed.
            Ok(Some(Event::Selected { .. })) => {}
            Ok(None) if matches!(self.state, State::Transmission { .. }) => {}
            _ => self.selecting = None,
        }
        polled
    }

    fn next_event(&mut self) -> Result<Option<Event>, ProtocolError> {
        loop {
            let result = match self.state {
                // Whatever follows a disconnect or an error is ignored.
                State::Closed | State::AwaitTls => return Ok(None),
                State::ClientFlags => self.client_flags(),
                State::Options => self.option(),
                State::Transmission { export } => self.request(export),
                State::Skipping { export, left } => {
                    let n = (self.buffered() as u64).min(left);
                    self.pos += n as usize;
                    if n == left {
                        self.state = State::Transmission { export };
                        continue;
                    }
                    self.state = State::Skipping {
                        export,
                        left: left - n,
                    };
                    return Ok(None);
                }
                State::Payload { export } => {
                    let w = self.write.as_ref().expect("a write is arriving");
                    if w.filled < w.data.len() {
                        return Ok(None);
                    }
                    let w = self.write.take().expect("checked");
                    self.state = State::Transmission { export };
                    Ok(Step::Event(Event::Command(Command {
                        handle: w.handle,
                        offset: w.offset,
                        len: w.data.len() as u32,
                        kind: CommandKind::Write {
                            data: w.data,
                            fua: w.fua,
                        },
                    })))
                }
            };
            match result {
                // A step that consumed bytes without an event (an option answered).
                Ok(Step::Again) => continue,
                Ok(Step::Event(e)) => {
                    if e == Event::Disconnect {
                        self.state = State::Closed;
                    }
                    return Ok(Some(e));
                }
                Ok(Step::NeedMore) => return Ok(None),
                Err(e) => {
                    self.state = State::Closed;
                    return Err(e);
                }
            }
        }
    }

    fn available(&self) -> &[u8] {
        &self.input[self.pos..self.end]
    }

    fn client_flags(&mut self) -> Result<Step, ProtocolError> {
        let Some(flags) = self.available().get(..4).map(be32) else {
            return Ok(Step::NeedMore);
        };
        self.pos += 4;
        if flags & CLIENT_FIXED_NEWSTYLE == 0 {
            return Err(ProtocolError::NotFixedNewstyle(flags));
        }
        // The protocol: a server MUST drop a client that sets flags it does not know.
        if flags & !(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES) != 0 {
            return Err(ProtocolError::UnknownClientFlags(flags));
        }
        self.no_zeroes = flags & CLIENT_NO_ZEROES != 0;
        self.state = State::Options;
        Ok(Step::Again)
    }

    fn option(&mut self) -> Result<Step, ProtocolError> {
        let head = self.available();
        if head.len() < OPTION_HEADER {
            return Ok(Step::NeedMore);
        }
        let magic = be64(&head[..8]);
        let option = be32(&head[8..12]);
        let len = be32(&head[12..16]);
        if magic != OPTION_MAGIC {
            return Err(ProtocolError::OptionMagic(magic));
        }
        if len > MAX_OPTION {
            return Err(ProtocolError::OptionTooLong { option, len });
        }
        if head.len() < OPTION_HEADER + len as usize {
            return Ok(Step::NeedMore);
        }
        let data = head[OPTION_HEADER..OPTION_HEADER + len as usize].to_vec();
        self.pos += OPTION_HEADER + len as usize;
        let clear = self.tls == TlsPolicy::Required && !self.tls_active;
        match option {
            OPT_STARTTLS => {
                if self.tls == TlsPolicy::Off {
                    self.error(
                        option,
                        REP_ERR_UNSUP,
                        "TLS is not configured on this server",
                    );
                } else if self.tls_active {
                    self.error(option, REP_ERR_INVALID, "TLS is already running");
                } else if !data.is_empty() {
                    self.error(option, REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data");
                } else {
                    self.reply(option, REP_ACK, &[]);
                    self.state = State::AwaitTls;
                    return Ok(Step::Event(Event::StartTls));
                }
                Ok(Step::Again)
            }
            OPT_EXPORT_NAME if clear => Err(ProtocolError::TlsRequired),
            OPT_ABORT => {
                self.reply(option, REP_ACK, &[]);
                Ok(Step::Event(Event::Disconnect))
            }
            _ if clear => {
                self.error(
                    option,
                    REP_ERR_TLS_REQD,
                    "this server requires TLS: send NBD_OPT_STARTTLS first",
                );
                Ok(Step::Again)
            }
            OPT_EXPORT_NAME => {
                let Some(index) = self.find_bytes(&data) else {
                    return Err(ProtocolError::UnknownExport(printable(&data)));
                };
                let e = &self.exports[index];
                let (size, flags) = (e.size, e.transmission_flags());
                self.selecting = Some((option, self.output.len()));
                self.output.extend_from_slice(&size.to_be_bytes());
                self.output.extend_from_slice(&flags.to_be_bytes());
                if !self.no_zeroes {
                    self.output.extend_from_slice(&[0; 124]);
                }
                self.state = State::Transmission { export: index };
                self.block_status = self.structured && self.allocation_for == Some(index);
                Ok(Step::Event(Event::Selected { export: index }))
            }
            OPT_LIST => {
                self.list(&data);
                Ok(Step::Again)
            }
            OPT_INFO | OPT_GO => self.info_or_go(option, &data),
            OPT_STRUCTURED_REPLY if !data.is_empty() => {
                self.error(
                    option,
                    REP_ERR_INVALID,
                    "NBD_OPT_STRUCTURED_REPLY takes no data",
                );
                Ok(Step::Again)
            }
            OPT_STRUCTURED_REPLY => {
                self.structured = true;
                self.reply(option, REP_ACK, &[]);
                Ok(Step::Again)
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.meta_context(option, &data);
                Ok(Step::Again)
            }
            _ => {
                self.error(option, REP_ERR_UNSUP, "unknown option");
                Ok(Step::Again)
            }
        }
    }

    fn info_or_go(&mut self, option: u32, data: &[u8]) -> Result<Step, ProtocolError> {
        let parsed = (|| {
            let name_len = be32(data.get(..4)?) as usize;
            let name = data.get(4..4 + name_len)?;
            let count = be16(data.get(4 + name_len..6 + name_len)?) as usize;
            let rest = data.get(6 + name_len..)?;
            (rest.len() == 2 * count).then(|| (name, rest.chunks(2).map(be16).collect::<Vec<_>>()))
        })();
        let Some((name, asked)) = parsed else {
            self.error(option, REP_ERR_INVALID, "malformed NBD_OPT_INFO/GO request");
            return Ok(Step::Again);
        };
        let Some(index) = self.find_bytes(name) else {
            self.error(
                option,
                REP_ERR_UNKNOWN,
                &format!("no export named '{}'", printable(name)),
            );
            return Ok(Step::Again);
        };
        let e = self.exports[index].clone();
        let at = self.output.len();
        let mut info = Vec::with_capacity(12);
        info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        info.extend_from_slice(&e.size.to_be_bytes());
        let df = if self.structured { TFLAG_SEND_DF } else { 0 };
        info.extend_from_slice(&(e.transmission_flags() | df).to_be_bytes());
        self.reply(option, REP_INFO, &info);
        // Any size is served (unaligned requests included); 4 KiB is what is fast.
        let mut block = Vec::with_capacity(14);
        block.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        block.extend_from_slice(&1u32.to_be_bytes());
        block.extend_from_slice(&4096u32.to_be_bytes());
        block.extend_from_slice(&MAX_PAYLOAD.to_be_bytes());
        self.reply(option, REP_INFO, &block);
        // The name (the export's own, also when the empty name selected it) and the
        // description, when asked for; a description only where there is one.
        if asked.contains(&INFO_NAME) {
            let mut d = INFO_NAME.to_be_bytes().to_vec();
            d.extend_from_slice(e.name.as_bytes());
            self.reply(option, REP_INFO, &d);
        }
        if asked.contains(&INFO_DESCRIPTION) && !e.description.is_empty() {
            let mut d = INFO_DESCRIPTION.to_be_bytes().to_vec();
            d.extend_from_slice(e.description.as_bytes());
            self.reply(option, REP_INFO, &d);
        }
        self.reply(option, REP_ACK, &[]);
        if option == OPT_GO {
            self.selecting = Some((option, at));
            self.state = State::Transmission { export: index };
            self.block_status = self.structured && self.allocation_for == Some(index);
            return Ok(Step::Event(Event::Selected { export: index }));
        }
        Ok(Step::Again)
    }

    /// `NBD_OPT_LIST`: every export by name.
    fn list(&mut self, data: &[u8]) {
        if !data.is_empty() {
            self.error(OPT_LIST, REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
            return;
        }
        for e in self.exports.clone().iter().filter(|e| e.offered) {
            let mut d = Vec::with_capacity(4 + e.name.len());
            d.extend_from_slice(&(e.name.len() as u32).to_be_bytes());
            d.extend_from_slice(e.name.as_bytes());
            self.reply(OPT_LIST, REP_SERVER, &d);
        }
        self.reply(OPT_LIST, REP_ACK, &[]);
    }

    /// `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`: the one context this
    /// server has is `base:allocation`; a list without queries, or asking for `base:`,
    /// lists it; setting it (structured replies first) lets block status be asked of
    /// that export.
    fn meta_context(&mut self, option: u32, data: &[u8]) {
        let parsed = (|| {
            let name_len = be32(data.get(..4)?) as usize;
            let name = data.get(4..4 + name_len)?;
            let mut at = 4 + name_len;
            let count = be32(data.get(at..at + 4)?) as usize;
            at += 4;
            let mut queries = Vec::new();
            for _ in 0..count {
                let len = be32(data.get(at..at + 4)?) as usize;
                queries.push(data.get(at + 4..at + 4 + len)?);
                at += 4 + len;
            }
            (at == data.len()).then_some((name, queries))
        })();
        let Some((name, queries)) = parsed else {
            self.error(option, REP_ERR_INVALID, "malformed meta context request");
            return;
        };
        if option == OPT_SET_META_CONTEXT && !self.structured {
            self.error(
                option,
                REP_ERR_INVALID,
                "ask for structured replies (NBD_OPT_STRUCTURED_REPLY) first",
            );
            return;
        }
        let Some(index) = self.find_bytes(name) else {
            let message = format!("no export named '{}'", printable(name));
            self.error(option, REP_ERR_UNKNOWN, &message);
            return;
        };
        let wanted = |q: &&[u8]| {
            *q == BASE_ALLOCATION.as_bytes() || (option == OPT_LIST_META_CONTEXT && *q == b"base:")
        };
        let chosen = if option == OPT_LIST_META_CONTEXT && queries.is_empty() {
            true
        } else {
            queries.iter().any(wanted)
        };
        if option == OPT_SET_META_CONTEXT {
            self.allocation_for = chosen.then_some(index);
        }
        if chosen {
            let mut d = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
            d.extend_from_slice(BASE_ALLOCATION.as_bytes());
            self.reply(option, REP_META_CONTEXT, &d);
        }
        self.reply(option, REP_ACK, &[]);
    }

    /// An export by its name's exact bytes (a name that is not UTF-8 names none).
    fn find_bytes(&self, name: &[u8]) -> Option<usize> {
        std::str::from_utf8(name).ok().and_then(|n| self.find(n))
    }

    fn caps(&self) -> Caps {
        Caps {
            structured: self.structured,
            block_status: self.block_status,
        }
    }

    /// An export by exact name; the empty name picks the default export, when there is
    /// one.
    fn find(&self, name: &str) -> Option<usize> {
        if name.is_empty() {
            return self.exports.iter().position(|e| e.default && e.offered);
        }
        self.exports
            .iter()
            .position(|e| e.name == name && e.offered)
    }

    fn reply(&mut self, option: u32, kind: u32, data: &[u8]) {
        self.output.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
        self.output.extend_from_slice(&option.to_be_bytes());
        self.output.extend_from_slice(&kind.to_be_bytes());
        self.output
            .extend_from_slice(&(data.len() as u32).to_be_bytes());
        self.output.extend_from_slice(data);
    }

    /// An error reply with a message for the client's log.
    fn error(&mut self, option: u32, kind: u32, message: &str) {
        self.reply(option, kind, message.as_bytes());
    }

    fn request(&mut self, export: usize) -> Result<Step, ProtocolError> {
        let Some(head) = self.available().get(..REQUEST_HEADER) else {
            return Ok(Step::NeedMore);
        };
        let head: [u8; REQUEST_HEADER] = head.try_into().expect("sized");
        let (h, verdict) = classify(&head, &self.exports[export], self.caps())?;
        // A refused write's payload is skipped in large receives.
        self.after_large_write = false;
        self.pos += REQUEST_HEADER;
        let kind = match verdict {
            Verdict::Disconnect => return Ok(Step::Event(Event::Disconnect)),
            Verdict::Refuse { error, skip } => {
                if skip > 0 {
                    // The payload follows whatever the answer.
                    self.state = State::Skipping {
                        export,
                        left: u64::from(skip),
                    };
                }
                return Ok(Step::Event(Event::Error {
                    handle: h.handle,
                    error,
                }));
            }
            Verdict::Write { fua } => {
                // What came with the header is copied; the rest is received into place.
                self.after_large_write = h.len >= LARGE_WRITE;
                let len = h.len as usize;
                let arrived = self.available();
                let have = arrived.len().min(len);
                let mut data = IoBuf::for_overwrite(len);
                data[..have].copy_from_slice(&arrived[..have]);
                self.pos += have;
                self.write = Some(PendingWrite {
                    handle: h.handle,
                    offset: h.offset,
                    fua,
                    data,
                    filled: have,
                });
                self.state = State::Payload { export };
                return Ok(Step::Again);
            }
            Verdict::Done => return Ok(Step::Event(Event::Done { handle: h.handle })),
            Verdict::BlockStatus { req_one } => {
                return Ok(Step::Event(Event::BlockStatus {
                    handle: h.handle,
                    offset: h.offset,
                    len: h.len,
                    req_one,
                }));
            }
            Verdict::Serve(kind) => kind,
        };
        // A flush covers the whole export; what a client put in its offset and length
        // (zeroes, by the protocol) must not count as bytes to a policy.
        let (offset, len) = if kind == CommandKind::Flush {
            (0, 0)
        } else {
            (h.offset, h.len)
        };
        Ok(Step::Event(Event::Command(Command {
            handle: h.handle,
            offset,
            len,
            kind,
        })))
    }
}

/// A request header's fields.
struct Header {
    handle: u64,
    offset: u64,
    len: u32,
}

/// What a whole request header asks for.
enum Verdict {
    /// `NBD_CMD_DISC`.
    Disconnect,
    /// Answered with `error`; a write's `skip` payload bytes follow all the same.
    Refuse { error: u32, skip: u32 },
    /// A write that will be served; its payload follows.
    Write { fua: bool },
    /// A command without payload that will be served (`Write` never appears here).
    Serve(CommandKind),
    /// Answered at once with success (`NBD_CMD_CACHE`).
    Done,
    /// `NBD_CMD_BLOCK_STATUS`, to be answered by the server.
    BlockStatus { req_one: bool },
}

/// The rules a request is served or refused by, in one place: the poll and
/// [`ServerCodec::next_request`] both read a header through this. Only a wrong magic
/// number is an error (the framing is lost); everything else the connection answers.
fn classify(
    head: &[u8; REQUEST_HEADER],
    e: &ExportInfo,
    caps: Caps,
) -> Result<(Header, Verdict), ProtocolError> {
    let magic = be32(&head[..4]);
    if magic != REQUEST_MAGIC {
        return Err(ProtocolError::RequestMagic(magic));
    }
    let flags = be16(&head[4..6]);
    let kind = be16(&head[6..8]);
    let h = Header {
        handle: be64(&head[8..16]),
        offset: be64(&head[16..24]),
        len: be32(&head[24..28]),
    };
    let fua = flags & CMD_FLAG_FUA != 0;
    // FUA is valid on every command (the NBD document: the server MUST accept it, even by
    // ignoring it); NO_HOLE only on WRITE_ZEROES, as nbdkit holds it.
    let unknown_flags = flags & !KNOWN_CMD_FLAGS != 0
        || (flags & (CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO) != 0 && kind != CMD_WRITE_ZEROES)
        || (flags & CMD_FLAG_DF != 0 && !(kind == CMD_READ && caps.structured))
        || (flags & CMD_FLAG_REQ_ONE != 0 && kind != CMD_BLOCK_STATUS);
    let fast = flags & CMD_FLAG_FAST_ZERO != 0;
    let past_end = h
        .offset
        .checked_add(u64::from(h.len))
        .is_none_or(|end| end > e.size);
    let refuse = |error| Verdict::Refuse { error, skip: 0 };
    let verdict = match kind {
        CMD_WRITE => {
            // A write of nothing is refused as nbdkit refuses it (the NBD document
            // leaves it open; the backend would call it a short write).
            let problem = if h.len > MAX_PAYLOAD || h.len == 0 || unknown_flags {
                Some(EINVAL)
            } else if e.read_only {
                Some(EPERM)
            } else if past_end {
                Some(ENOSPC)
            } else {
                None
            };
            match problem {
                Some(error) => Verdict::Refuse { error, skip: h.len },
                None => Verdict::Write { fua },
            }
        }
        CMD_DISC => Verdict::Disconnect,
        _ if unknown_flags => refuse(EINVAL),
        CMD_READ | CMD_TRIM | CMD_WRITE_ZEROES | CMD_CACHE if h.len == 0 => refuse(EINVAL),
        CMD_READ if h.len > MAX_PAYLOAD || past_end => refuse(EINVAL),
        CMD_READ => Verdict::Serve(CommandKind::Read),
        CMD_CACHE if past_end => refuse(EINVAL),
        CMD_CACHE => Verdict::Done,
        // Only after structured replies and base:allocation were negotiated.
        CMD_BLOCK_STATUS if !caps.block_status || h.len == 0 || past_end => refuse(EINVAL),
        CMD_BLOCK_STATUS => Verdict::BlockStatus {
            req_one: flags & CMD_FLAG_REQ_ONE != 0,
        },
        CMD_FLUSH => Verdict::Serve(CommandKind::Flush),
        CMD_TRIM | CMD_WRITE_ZEROES if e.read_only => refuse(EPERM),
        // A range past the end is the client's mistake for a trim (EINVAL, as nbdkit
        // and qemu-nbd answer it); for zeroes it is a write with no room (ENOSPC).
        CMD_TRIM if past_end => refuse(EINVAL),
        CMD_WRITE_ZEROES if past_end => refuse(ENOSPC),
        CMD_TRIM => Verdict::Serve(CommandKind::Trim { fua }),
        CMD_WRITE_ZEROES => Verdict::Serve(CommandKind::WriteZeroes { fua, fast }),
        _ => refuse(EINVAL),
    };
    Ok((h, verdict))
}

enum Step {
    Again,
    NeedMore,
    Event(Event),
}

/// Command flags this server acts on (FUA; NO_HOLE, which zeroing always honours;
/// FAST_ZERO); a request with any other, or with NO_HOLE or FAST_ZERO on anything but
/// WRITE_ZEROES, is answered `EINVAL`.
const KNOWN_CMD_FLAGS: u16 =
    CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO | CMD_FLAG_DF | CMD_FLAG_REQ_ONE;

/// What the connection negotiated that decides how a request is read.
#[derive(Debug, Clone, Copy)]
struct Caps {
    /// Structured replies.
    structured: bool,
    /// Block status on the selected export.
    block_status: bool,
}

/// Longest client-supplied string put in a message or a log line, in bytes.
const PRINTABLE_BYTES: usize = 64;

/// A client-supplied string fit for a log line: escaped (no control characters, no
/// terminal escapes, invalid UTF-8 as `\xNN`) and cut to 64 bytes.
pub fn printable(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(PRINTABLE_BYTES)];
    let mut s: String = cut.escape_ascii().to_string();
    if bytes.len() > PRINTABLE_BYTES {
        s.push_str(&format!("… ({} bytes)", bytes.len()));
    }
    s
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().expect("2 bytes"))
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exports() -> Arc<Vec<ExportInfo>> {
        Arc::new(vec![
            ExportInfo::new("a", 1 << 20, false),
            ExportInfo::new("ro", 4096, true),
        ])
    }

    fn option(option: u32, data: &[u8]) -> Vec<u8> {
        let mut b = OPTION_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        b
    }

    fn go(name: &str) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        option(OPT_GO, &d)
    }

    fn request(kind: u16, flags: u16, handle: u64, offset: u64, len: u32) -> Vec<u8> {
        let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&handle.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b
    }

    /// Option replies in `out`: (option, type, data).
    fn replies(mut out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut r = Vec::new();
        while out.len() >= 20 {
            assert_eq!(be64(out), REPLY_MAGIC);
            let len = be32(&out[16..]) as usize;
            r.push((
                be32(&out[8..]),
                be32(&out[12..]),
                out[20..20 + len].to_vec(),
            ));
            out = &out[20 + len..];
        }
        assert!(out.is_empty(), "trailing bytes {out:?}");
        r
    }

    fn events(c: &mut ServerCodec) -> Vec<Event> {
        std::iter::from_fn(|| c.poll().unwrap()).collect()
    }

    /// A codec with export "a" selected and its handshake replies taken.
    fn transmitting() -> ServerCodec {
        let mut c = negotiating();
        c.receive(&go("a"));
        events(&mut c);
        c.take_output();
        c
    }

    /// A codec past the greeting and client flags.
    fn negotiating() -> ServerCodec {
        let mut c = ServerCodec::new(exports());
        let greeting = c.take_output();
        assert_eq!(&greeting[..8], b"NBDMAGIC");
        assert_eq!(&greeting[8..16], b"IHAVEOPT");
        assert_eq!(be16(&greeting[16..]), FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        c.receive(&(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).to_be_bytes());
        assert_eq!(events(&mut c), vec![]);
        c
    }

    /// A withdrawn export (a tenant removed while running) keeps its place, so ids stay
    /// put, but is not listed and not selectable, by name or as the default.
    #[test]
    fn a_withdrawn_export_is_neither_listed_nor_selected() {
        let exports = Arc::new(vec![
            ExportInfo::new("a", 1 << 20, false),
            ExportInfo {
                offered: false,
                default: true,
                ..ExportInfo::new("gone", 4096, false)
            },
        ]);
        let mut c = ServerCodec::new(exports.clone());
        c.take_output();
        c.receive(&(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).to_be_bytes());
        c.receive(&option(OPT_LIST, &[]));
        assert_eq!(events(&mut c), vec![]);
        let listed: Vec<Vec<u8>> = replies(&c.take_output())
            .into_iter()
            .filter(|r| r.1 == REP_SERVER)
            .map(|r| r.2[4..].to_vec())
            .collect();
        assert_eq!(listed, vec![b"a".to_vec()]);
        for name in ["gone", ""] {
            c.receive(&go(name));
            assert_eq!(events(&mut c), vec![], "{name:?} selected nothing");
            let r = replies(&c.take_output());
            assert_eq!(r.last().map(|r| r.1), Some(REP_ERR_UNKNOWN), "{name:?}");
        }
        c.receive(&go("a"));
        assert_eq!(events(&mut c), vec![Event::Selected { export: 0 }]);
    }

    #[test]
    fn protocol_details_follow_the_nbd_document() {
        // A read-only export does not advertise trim or zeroing.
        assert_eq!(exports()[1].transmission_flags() & TFLAG_SEND_TRIM, 0);
        assert_eq!(
            exports()[1].transmission_flags() & TFLAG_SEND_WRITE_ZEROES,
            0
        );
        assert_ne!(exports()[0].transmission_flags() & TFLAG_SEND_TRIM, 0);
        // Client flags it does not know: the connection is dropped.
        let mut c = ServerCodec::new(exports());
        c.receive(&(CLIENT_FIXED_NEWSTYLE | 1 << 7).to_be_bytes());
        assert_eq!(c.poll(), Err(ProtocolError::UnknownClientFlags(0x81)));
        // An export name that is not UTF-8 names no export, and is shown escaped.
        let mut c = negotiating();
        c.receive(&option(OPT_EXPORT_NAME, b"a\xff\x1b[31m"));
        assert_eq!(
            c.poll(),
            Err(ProtocolError::UnknownExport("a\\xff\\x1b[31m".into()))
        );
        assert_eq!(printable(&[b'x'; 100]).len(), 64 + "… (100 bytes)".len());
        // Command flags it does not know: EINVAL, and a write's payload is skipped.
        let mut c = transmitting();
        c.receive(&request(CMD_READ, 1 << 5, 1, 0, 512));
        let mut write = request(CMD_WRITE, 1 << 6, 2, 0, 4);
        write.extend_from_slice(b"abcd");
        c.receive(&write);
        c.receive(&request(CMD_READ, CMD_FLAG_FUA, 3, 0, 512));
        // NO_HOLE belongs to WRITE_ZEROES: on a read, a write (payload skipped) or a
        // flush it is EINVAL; on WRITE_ZEROES it is served. FUA goes with anything.
        c.receive(&request(CMD_READ, CMD_FLAG_NO_HOLE, 4, 0, 512));
        let mut write = request(CMD_WRITE, CMD_FLAG_NO_HOLE, 5, 0, 4);
        write.extend_from_slice(b"abcd");
        c.receive(&write);
        c.receive(&request(CMD_FLUSH, CMD_FLAG_NO_HOLE, 6, 0, 0));
        c.receive(&request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 7, 0, 512));
        c.receive(&request(CMD_FLUSH, CMD_FLAG_FUA, 8, 0, 0));
        assert_eq!(
            events(&mut c),
            vec![
                Event::Error {
                    handle: 1,
                    error: EINVAL
                },
                Event::Error {
                    handle: 2,
                    error: EINVAL
                },
                Event::Command(Command {
                    handle: 3,
                    offset: 0,
                    len: 512,
                    kind: CommandKind::Read
                }),
                Event::Error {
                    handle: 4,
                    error: EINVAL
                },
                Event::Error {
                    handle: 5,
                    error: EINVAL
                },
                Event::Error {
                    handle: 6,
                    error: EINVAL
                },
                Event::Command(Command {
                    handle: 7,
                    offset: 0,
                    len: 512,
                    kind: CommandKind::WriteZeroes {
                        fua: false,
                        fast: false
                    }
                }),
                Event::Command(Command {
                    handle: 8,
                    offset: 0,
                    len: 0,
                    kind: CommandKind::Flush
                }),
            ]
        );
    }

    #[test]
    fn list_then_go_selects_the_export() {
        let mut c = negotiating();
        c.receive(&option(OPT_LIST, &[]));
        assert_eq!(events(&mut c), vec![]);
        let r = replies(&c.take_output());
        assert_eq!(r.len(), 3);
        assert_eq!(r[0], (OPT_LIST, REP_SERVER, b"\0\0\0\x01a".to_vec()));
        assert_eq!(r[1], (OPT_LIST, REP_SERVER, b"\0\0\0\x02ro".to_vec()));
        assert_eq!(r[2], (OPT_LIST, REP_ACK, vec![]));
        c.receive(&go("ro"));
        assert_eq!(events(&mut c), vec![Event::Selected { export: 1 }]);
        let r = replies(&c.take_output());
        assert_eq!(r[0].1, REP_INFO);
        assert_eq!(be16(&r[0].2), INFO_EXPORT);
        assert_eq!(be64(&r[0].2[2..]), 4096);
        assert_ne!(be16(&r[0].2[10..]) & TFLAG_READ_ONLY, 0);
        assert_eq!(be16(&r[1].2), INFO_BLOCK_SIZE);
        assert_eq!(r[2], (OPT_GO, REP_ACK, vec![]));
    }

    #[test]
    fn unknown_export_and_unknown_option_get_error_replies() {
        let mut c = negotiating();
        c.receive(&go("../etc/passwd"));
        c.receive(&option(OPT_STRUCTURED_REPLY, b"x"));
        c.receive(&option(99, b"xyz"));
        c.receive(&option(OPT_INFO, b"\0\0\0\x09tooshort"));
        assert_eq!(events(&mut c), vec![]);
        let kinds: Vec<_> = replies(&c.take_output())
            .into_iter()
            .map(|(o, k, _)| (o, k))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (OPT_GO, REP_ERR_UNKNOWN),
                (OPT_STRUCTURED_REPLY, REP_ERR_INVALID),
                (99, REP_ERR_UNSUP),
                (OPT_INFO, REP_ERR_INVALID),
            ]
        );
        // Still negotiating: a good GO works.
        c.receive(&go("a"));
        assert_eq!(events(&mut c), vec![Event::Selected { export: 0 }]);
    }

    fn negotiating_with(tls: TlsPolicy) -> ServerCodec {
        let mut c = ServerCodec::with_tls(exports(), tls);
        let _ = c.take_output();
        c.receive(&(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).to_be_bytes());
        assert_eq!(events(&mut c), vec![]);
        c
    }

    /// Forced TLS (the NBD document's "TLS" section): before `NBD_OPT_STARTTLS` every
    /// option but `NBD_OPT_ABORT` is answered `NBD_REP_ERR_TLS_REQD`, and
    /// `NBD_OPT_EXPORT_NAME` closes; `NBD_OPT_STARTTLS` is acknowledged, nothing is
    /// parsed until the caller's handshake is done, the client's early TLS bytes are
    /// handed over, and then options are served; a second `NBD_OPT_STARTTLS` is invalid.
    #[test]
    fn forced_tls_answers_nothing_before_starttls() {
        let mut c = negotiating_with(TlsPolicy::Required);
        c.receive(&option(OPT_LIST, &[]));
        c.receive(&go("a"));
        assert_eq!(events(&mut c), vec![]);
        let r = replies(&c.take_output());
        assert_eq!(
            r.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>(),
            vec![(OPT_LIST, REP_ERR_TLS_REQD), (OPT_GO, REP_ERR_TLS_REQD)]
        );
        let mut starttls = option(OPT_STARTTLS, &[]);
        starttls.extend_from_slice(b"\x16\x03\x01client hello");
        c.receive(&starttls);
        assert_eq!(events(&mut c), vec![Event::StartTls]);
        assert_eq!(
            replies(&c.take_output()),
            vec![(OPT_STARTTLS, REP_ACK, vec![])]
        );
        assert_eq!(c.take_unparsed(), b"\x16\x03\x01client hello");
        c.receive(&go("a"));
        assert_eq!(
            events(&mut c),
            vec![],
            "nothing parsed before the handshake"
        );
        c.tls_started();
        assert!(c.tls_active());
        assert_eq!(events(&mut c), vec![Event::Selected { export: 0 }]);
        let r = replies(&c.take_output());
        assert_eq!(r.last().map(|x| (x.0, x.1)), Some((OPT_GO, REP_ACK)));
        // NBD_OPT_EXPORT_NAME has no error reply: before TLS it closes.
        let mut c = negotiating_with(TlsPolicy::Required);
        c.receive(&option(OPT_EXPORT_NAME, b"a"));
        assert_eq!(c.poll(), Err(ProtocolError::TlsRequired));
        // Aborting needs no TLS.
        let mut c = negotiating_with(TlsPolicy::Required);
        c.receive(&option(OPT_ABORT, &[]));
        assert_eq!(events(&mut c), vec![Event::Disconnect]);
    }

    #[test]
    fn starttls_twice_or_unconfigured_or_with_data_is_refused() {
        let mut c = negotiating_with(TlsPolicy::Offered);
        c.receive(&option(OPT_STARTTLS, b"x"));
        c.receive(&option(OPT_STARTTLS, &[]));
        assert_eq!(events(&mut c), vec![Event::StartTls]);
        c.tls_started();
        c.receive(&option(OPT_STARTTLS, &[]));
        assert_eq!(events(&mut c), vec![]);
        let kinds: Vec<u32> = replies(&c.take_output()).iter().map(|x| x.1).collect();
        assert_eq!(kinds, vec![REP_ERR_INVALID, REP_ACK, REP_ERR_INVALID]);
        // Offered, a client may also go on in the clear.
        let mut c = negotiating_with(TlsPolicy::Offered);
        c.receive(&go("a"));
        assert_eq!(events(&mut c), vec![Event::Selected { export: 0 }]);
        let mut c = negotiating();
        c.receive(&option(OPT_STARTTLS, &[]));
        assert_eq!(events(&mut c), vec![]);
        assert_eq!(replies(&c.take_output())[0].1, REP_ERR_UNSUP);
    }

    /// A selection the server refuses (its own limits): after GO the client hears
    /// ERR_POLICY with the reason and may select again; after EXPORT_NAME, closed.
    #[test]
    fn a_refused_selection_is_an_error_reply_or_a_close() {
        let mut c = negotiating();
        c.receive(&go("a"));
        assert_eq!(events(&mut c), vec![Event::Selected { export: 0 }]);
        c.refuse_selected("export 'a' is at its connection limit");
        assert_eq!(
            replies(&c.take_output()),
            vec![(
                OPT_GO,
                REP_ERR_POLICY,
                b"export 'a' is at its connection limit".to_vec()
            )]
        );
        assert!(!c.is_closed());
        // No request is parsed: the connection is still negotiating.
        assert_eq!(c.next_request(), None);
        c.receive(&go("a"));
        assert_eq!(events(&mut c), vec![Event::Selected { export: 0 }]);
        let kinds: Vec<u32> = replies(&c.take_output()).iter().map(|r| r.1).collect();
        assert_eq!(kinds, vec![REP_INFO, REP_INFO, REP_ACK]);
        c.receive(&request(CMD_READ, 0, 1, 0, 512));
        assert!(matches!(c.poll(), Ok(Some(Event::Command(_)))));
        let mut c = negotiating();
        c.receive(&option(OPT_EXPORT_NAME, b"a"));
        assert_eq!(events(&mut c), vec![Event::Selected { export: 0 }]);
        c.refuse_selected("full");
        assert!(c.take_output().is_empty(), "EXPORT_NAME has no error reply");
        assert!(c.is_closed());
    }

    #[test]
    #[should_panic(expected = "a selection to refuse")]
    fn only_a_pending_selection_can_be_refused() {
        let mut c = negotiating();
        c.receive(&go("a"));
        events(&mut c);
        c.take_output();
        c.refuse_selected("too late");
    }

    #[test]
    fn export_name_answers_without_zeroes_and_closes_on_unknown() {
        let mut c = negotiating();
        c.receive(&option(OPT_EXPORT_NAME, b"a"));
        assert_eq!(events(&mut c), vec![Event::Selected { export: 0 }]);
        let out = c.take_output();
        assert_eq!(out.len(), 10);
        assert_eq!(be64(&out), 1 << 20);
        let mut c = negotiating();
        c.receive(&option(OPT_EXPORT_NAME, b"nope"));
        assert_eq!(c.poll(), Err(ProtocolError::UnknownExport("nope".into())));
        assert!(c.is_closed());
    }

    #[test]
    fn abort_acks_and_disconnects() {
        let mut c = negotiating();
        c.receive(&option(OPT_ABORT, &[]));
        assert_eq!(events(&mut c), vec![Event::Disconnect]);
        assert_eq!(
            replies(&c.take_output()),
            vec![(OPT_ABORT, REP_ACK, vec![])]
        );
    }

    #[test]
    fn a_request_and_the_data_it_takes_are_known_before_it_is_parsed() {
        let mut c = transmitting();
        assert_eq!(c.next_request(), None, "nothing received");
        let header = request(CMD_WRITE, 0, 1, 0, 8192);
        c.receive(&header[..27]);
        assert_eq!(c.next_request(), None, "a header not yet whole");
        c.receive(&header[27..]);
        assert_eq!(c.next_request(), Some(8192));
        assert!(matches!(c.poll(), Ok(None)), "the payload is still to come");
        assert_eq!(c.next_request(), None, "the payload is arriving");
        c.receive(&[1; 8192]);
        assert!(matches!(c.poll(), Ok(Some(Event::Command(_)))));
        c.receive(&request(CMD_READ, 0, 2, 4096, 4096));
        assert_eq!(c.next_request(), Some(4096));
        let _ = c.poll();
        // Requests answered with an error or moving no data take no buffer, and are
        // announced all the same (each has a reply).
        for (kind, len) in [
            (CMD_READ, MAX_PAYLOAD + 1),
            (CMD_FLUSH, 0),
            (CMD_TRIM, 4096),
            (CMD_DISC, 0),
        ] {
            c.receive(&request(kind, 0, 3, 0, len));
            assert_eq!(c.next_request(), Some(0), "kind {kind}");
            let _ = c.poll();
        }
        let mut ro = negotiating();
        ro.receive(&go("ro"));
        events(&mut ro);
        ro.receive(&request(CMD_WRITE, 0, 4, 0, 4));
        assert_eq!(ro.next_request(), Some(0), "a write to a read-only export");
        // Behind a refused write's payload: the header after it, once it is all there.
        let mut c = transmitting();
        c.receive(&request(CMD_WRITE, 0, 5, (1 << 20) - 2, 4)); // past the end: skipped
        assert!(matches!(c.poll(), Ok(Some(Event::Error { .. }))));
        c.receive(b"abc");
        assert_eq!(
            c.next_request(),
            None,
            "the skipped payload is not all there"
        );
        c.receive(b"d");
        c.receive(&request(CMD_WRITE, 0, 6, 0, 4));
        assert_eq!(
            c.next_request(),
            Some(4),
            "the write behind the skipped payload"
        );
        c.receive(b"wxyz");
        assert!(matches!(c.poll(), Ok(Some(Event::Command(_)))));
    }

    #[test]
    fn a_write_payload_is_received_into_its_own_buffer() {
        let mut c = transmitting();
        let mut head = request(CMD_WRITE, 0, 5, 4096, 8192);
        head.extend_from_slice(&[1; 100]);
        c.receive(&head);
        assert_eq!(c.poll(), Ok(None));
        // What came with the header is in; the rest goes straight into the payload.
        let room = c.receive_buffer();
        assert_eq!(room.len(), 8192 - 100);
        room.fill(2);
        c.received(8192 - 100);
        // Complete but not polled yet: what follows is the next request.
        c.receive(&request(CMD_FLUSH, 0, 6, 0, 0));
        let got = events(&mut c);
        let payload = [vec![1; 100], vec![2; 8192 - 100]].concat();
        assert_eq!(
            got,
            vec![
                Event::Command(Command {
                    handle: 5,
                    offset: 4096,
                    len: 8192,
                    kind: CommandKind::Write {
                        data: IoBuf::copy_of(&payload),
                        fua: false
                    }
                }),
                Event::Command(Command {
                    handle: 6,
                    offset: 0,
                    len: 0,
                    kind: CommandKind::Flush
                })
            ]
        );
        let Event::Command(Command {
            kind: CommandKind::Write { data, .. },
            ..
        }) = &got[0]
        else {
            unreachable!()
        };
        assert_eq!(data.as_ptr() as usize % crate::buffer::IO_ALIGN, 0);
        assert!(c.receive_buffer().len() >= RECEIVE_ROOM);
    }

    #[test]
    fn after_a_large_write_the_next_receive_is_small() {
        let mut c = transmitting();
        let len = LARGE_WRITE as usize;
        c.receive(&request(CMD_WRITE, 0, 1, 0, len as u32));
        c.receive(&vec![9; len]);
        assert!(matches!(events(&mut c)[..], [Event::Command(_)]));
        // The next header, and little of the next payload, go to the input.
        assert_eq!(c.receive_buffer().len(), HEADER_ROOM);
        c.receive(&request(CMD_WRITE, 0, 2, 0, len as u32));
        c.receive(&[8; 100]);
        assert_eq!(events(&mut c), vec![]);
        assert_eq!(c.receive_buffer().len(), len - 100);
        c.receive(&vec![8; len - 100]);
        assert_eq!(events(&mut c).len(), 1);
        // A small request after it: back to the full room.
        c.receive(&request(CMD_READ, 0, 3, 0, 4096));
        assert_eq!(events(&mut c).len(), 1);
        assert!(c.receive_buffer().len() >= RECEIVE_ROOM);
        // A large write that is refused is skipped in large receives.
        c.receive(&request(CMD_WRITE, 0, 4, 1 << 20, len as u32)); // past the end
        assert!(matches!(
            events(&mut c)[..],
            [Event::Error { handle: 4, .. }]
        ));
        assert!(c.receive_buffer().len() >= RECEIVE_ROOM);
    }

    #[test]
    fn requests_arrive_in_pieces_and_bad_ones_are_answered() {
        let mut c = transmitting();
        let mut bytes = request(CMD_WRITE, CMD_FLAG_FUA, 7, 4096, 3);
        bytes.extend_from_slice(b"xyz");
        bytes.extend(request(CMD_READ, 0, 8, (1 << 20) - 512, 1024)); // past the end
        bytes.extend(request(CMD_WRITE, 0, 9, 0, MAX_PAYLOAD + 1)); // too big: skipped
        bytes.extend(vec![0xAB; MAX_PAYLOAD as usize + 1]);
        bytes.extend(request(CMD_WRITE, 0, 10, (1 << 20) - 1, 2)); // past the end
        bytes.extend_from_slice(b"!!");
        bytes.extend(request(42, 0, 11, 0, 0)); // unknown command
        // Zero-length data requests (a write of nothing has no payload).
        for (kind, handle) in [
            (CMD_WRITE, 14),
            (CMD_READ, 15),
            (CMD_TRIM, 16),
            (CMD_WRITE_ZEROES, 17),
        ] {
            bytes.extend(request(kind, 0, handle, 4096, 0));
        }
        bytes.extend(request(CMD_READ, 0, 12, 0, 512));
        bytes.extend(request(CMD_DISC, 0, 13, 0, 0));
        let mut got = Vec::new();
        for chunk in bytes.chunks(7_000_001) {
            c.receive(chunk);
            got.extend(events(&mut c));
        }
        assert_eq!(
            got,
            vec![
                Event::Command(Command {
                    handle: 7,
                    offset: 4096,
                    len: 3,
                    kind: CommandKind::Write {
                        data: IoBuf::copy_of(b"xyz"),
                        fua: true
                    }
                }),
                Event::Error {
                    handle: 8,
                    error: EINVAL
                },
                Event::Error {
                    handle: 9,
                    error: EINVAL
                },
                Event::Error {
                    handle: 10,
                    error: ENOSPC
                },
                Event::Error {
                    handle: 11,
                    error: EINVAL
                },
                Event::Error {
                    handle: 14,
                    error: EINVAL
                },
                Event::Error {
                    handle: 15,
                    error: EINVAL
                },
                Event::Error {
                    handle: 16,
                    error: EINVAL
                },
                Event::Error {
                    handle: 17,
                    error: EINVAL
                },
                Event::Command(Command {
                    handle: 12,
                    offset: 0,
                    len: 512,
                    kind: CommandKind::Read
                }),
                Event::Disconnect,
            ]
        );
        assert!(c.is_closed());
    }

    #[test]
    fn read_only_export_refuses_writes_and_bad_magic_closes() {
        let mut c = negotiating();
        c.receive(&go("ro"));
        events(&mut c);
        let mut bytes = request(CMD_WRITE, 0, 1, 0, 2);
        bytes.extend_from_slice(b"hi");
        bytes.extend(request(CMD_TRIM, 0, 2, 0, 4096));
        bytes.extend(request(CMD_FLUSH, 0, 3, 0, 0));
        c.receive(&bytes);
        assert_eq!(
            events(&mut c),
            vec![
                Event::Error {
                    handle: 1,
                    error: EPERM
                },
                Event::Error {
                    handle: 2,
                    error: EPERM
                },
                Event::Command(Command {
                    handle: 3,
                    offset: 0,
                    len: 0,
                    kind: CommandKind::Flush
                }),
            ]
        );
        c.receive(&[0xde, 0xad, 0xbe, 0xef]);
        c.receive(&[0; 24]);
        assert_eq!(c.poll(), Err(ProtocolError::RequestMagic(0xdead_beef)));
    }

    #[test]
    fn old_style_clients_and_garbage_options_are_refused() {
        let mut c = ServerCodec::new(exports());
        c.receive(&0u32.to_be_bytes());
        assert_eq!(c.poll(), Err(ProtocolError::NotFixedNewstyle(0)));
        let mut c = negotiating();
        c.receive(&[0x55; 16]);
        assert!(matches!(c.poll(), Err(ProtocolError::OptionMagic(_))));
        let mut c = negotiating();
        let mut huge = option(OPT_GO, &[]);
        huge[12..16].copy_from_slice(&(MAX_OPTION + 1).to_be_bytes());
        c.receive(&huge);
        assert!(matches!(c.poll(), Err(ProtocolError::OptionTooLong { .. })));
    }

    /// `NBD_CMD_CACHE` is taken and answered at once (advertised; a range past the end
    /// or of nothing is EINVAL); fast zero rides on write-zeroes only; a trim past the
    /// end is the client's mistake (EINVAL), zeroes past it find no room (ENOSPC).
    #[test]
    fn cache_fast_zero_and_ranges_past_the_end() {
        let flags = exports()[0].transmission_flags();
        assert_ne!(flags & TFLAG_SEND_CACHE, 0);
        assert_ne!(flags & TFLAG_SEND_FAST_ZERO, 0);
        assert_eq!(
            exports()[1].transmission_flags() & TFLAG_SEND_FAST_ZERO,
            0,
            "read-only"
        );
        let mut c = transmitting();
        let end = 1u64 << 20;
        let mut bytes = request(CMD_CACHE, 0, 1, 0, 65536);
        bytes.extend(request(CMD_CACHE, 0, 2, end - 512, 1024));
        bytes.extend(request(CMD_CACHE, 0, 3, 0, 0));
        bytes.extend(request(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 4, 0, 8192));
        bytes.extend(request(CMD_READ, CMD_FLAG_FAST_ZERO, 5, 0, 512));
        bytes.extend(request(CMD_TRIM, 0, 6, end - 512, 1024));
        bytes.extend(request(CMD_WRITE_ZEROES, 0, 7, end - 512, 1024));
        c.receive(&bytes);
        assert_eq!(
            events(&mut c),
            vec![
                Event::Done { handle: 1 },
                Event::Error {
                    handle: 2,
                    error: EINVAL
                },
                Event::Error {
                    handle: 3,
                    error: EINVAL
                },
                Event::Command(Command {
                    handle: 4,
                    offset: 0,
                    len: 8192,
                    kind: CommandKind::WriteZeroes {
                        fua: false,
                        fast: true
                    },
                }),
                Event::Error {
                    handle: 5,
                    error: EINVAL
                },
                Event::Error {
                    handle: 6,
                    error: EINVAL
                },
                Event::Error {
                    handle: 7,
                    error: ENOSPC
                },
            ]
        );
    }

    /// The empty name selects the export marked default, and none without one; a
    /// client asking for the name and description gets them (no description where
    /// there is none).
    #[test]
    fn the_default_export_and_its_name_and_description() {
        let info = |name: &str, asked: &[u16]| {
            let mut d = (name.len() as u32).to_be_bytes().to_vec();
            d.extend_from_slice(name.as_bytes());
            d.extend_from_slice(&(asked.len() as u16).to_be_bytes());
            for a in asked {
                d.extend_from_slice(&a.to_be_bytes());
            }
            option(OPT_INFO, &d)
        };
        let described = Arc::new(vec![
            ExportInfo::new("a", 4096, false),
            ExportInfo {
                description: "the second".into(),
                default: true,
                ..ExportInfo::new("b", 8192, false)
            },
        ]);
        let mut c = ServerCodec::new(described);
        c.take_output();
        c.receive(&(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).to_be_bytes());
        c.receive(&info("", &[INFO_NAME, INFO_DESCRIPTION]));
        assert_eq!(events(&mut c), vec![]);
        let r = replies(&c.take_output());
        let infos: Vec<&Vec<u8>> = r.iter().filter(|x| x.1 == REP_INFO).map(|x| &x.2).collect();
        assert_eq!(be64(&infos[0][2..]), 8192, "the empty name chose b");
        assert!(infos.contains(&&[&INFO_NAME.to_be_bytes()[..], b"b"].concat()));
        assert!(infos.contains(&&[&INFO_DESCRIPTION.to_be_bytes()[..], b"the second"].concat()));
        assert_eq!(r.last().unwrap().1, REP_ACK);
        // No description asked, none sent; "a" has none to send.
        c.receive(&info("a", &[INFO_DESCRIPTION]));
        assert_eq!(events(&mut c), vec![]);
        let r = replies(&c.take_output());
        assert_eq!(
            r.iter().filter(|x| x.1 == REP_INFO).count(),
            2,
            "export and block size only"
        );
        // Without a default the empty name names nothing.
        let mut c = negotiating();
        c.receive(&info("", &[]));
        assert_eq!(events(&mut c), vec![]);
        assert_eq!(replies(&c.take_output())[0].1, REP_ERR_UNKNOWN);
    }

    fn meta(option: u32, export: &str, queries: &[&str]) -> Vec<u8> {
        let mut d = (export.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(export.as_bytes());
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        self::option(option, &d)
    }

    /// Structured replies are taken; `base:allocation` is listed and set (after
    /// structured replies only); block status is served on the export it was set for,
    /// refused (EINVAL) without it, and DF / REQ_ONE ride only where they belong.
    #[test]
    fn structured_replies_meta_contexts_and_block_status() {
        let mut c = negotiating();
        // Setting a context before structured replies is refused.
        c.receive(&meta(OPT_SET_META_CONTEXT, "a", &[BASE_ALLOCATION]));
        assert_eq!(events(&mut c), vec![]);
        assert_eq!(replies(&c.take_output())[0].1, REP_ERR_INVALID);
        c.receive(&option(OPT_STRUCTURED_REPLY, &[]));
        events(&mut c);
        assert_eq!(
            replies(&c.take_output()),
            vec![(OPT_STRUCTURED_REPLY, REP_ACK, vec![])]
        );
        assert!(c.structured());
        // Listing: everything, "base:", or the name; an unknown context lists nothing.
        for (queries, listed) in [
            (vec![], true),
            (vec!["base:"], true),
            (vec![BASE_ALLOCATION], true),
            (vec!["qemu:dirty-bitmap:x"], false),
        ] {
            c.receive(&meta(OPT_LIST_META_CONTEXT, "a", &queries));
            events(&mut c);
            let r = replies(&c.take_output());
            let contexts: Vec<&Vec<u8>> = r
                .iter()
                .filter(|x| x.1 == REP_META_CONTEXT)
                .map(|x| &x.2)
                .collect();
            assert_eq!(contexts.len(), usize::from(listed), "{queries:?}");
            if listed {
                assert_eq!(be32(contexts[0]), BASE_ALLOCATION_ID);
                assert_eq!(&contexts[0][4..], BASE_ALLOCATION.as_bytes());
            }
            assert_eq!(r.last().unwrap().1, REP_ACK);
        }
        c.receive(&meta(OPT_SET_META_CONTEXT, "a", &[BASE_ALLOCATION]));
        events(&mut c);
        let r = replies(&c.take_output());
        assert_eq!((r[0].1, r[1].1), (REP_META_CONTEXT, REP_ACK));
        c.receive(&go("a"));
        assert_eq!(events(&mut c), vec![Event::Selected { export: 0 }]);
        let r = replies(&c.take_output());
        let flags = be16(&r[0].2[10..]);
        assert_ne!(
            flags & TFLAG_SEND_DF,
            0,
            "DF offered with structured replies"
        );
        let mut bytes = request(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 1, 4096, 65536);
        bytes.extend(request(CMD_BLOCK_STATUS, 0, 2, (1 << 20) - 4096, 8192)); // past end
        bytes.extend(request(CMD_READ, CMD_FLAG_DF, 3, 0, 512));
        bytes.extend(request(CMD_READ, CMD_FLAG_REQ_ONE, 4, 0, 512));
        c.receive(&bytes);
        assert_eq!(
            events(&mut c),
            vec![
                Event::BlockStatus {
                    handle: 1,
                    offset: 4096,
                    len: 65536,
                    req_one: true
                },
                Event::Error {
                    handle: 2,
                    error: EINVAL
                },
                Event::Command(Command {
                    handle: 3,
                    offset: 0,
                    len: 512,
                    kind: CommandKind::Read
                }),
                Event::Error {
                    handle: 4,
                    error: EINVAL
                },
            ]
        );
        // Without structured replies (or without the context): block status and DF are
        // EINVAL.
        let mut plain = transmitting();
        assert!(!plain.structured());
        let mut bytes = request(CMD_BLOCK_STATUS, 0, 5, 0, 4096);
        bytes.extend(request(CMD_READ, CMD_FLAG_DF, 6, 0, 512));
        plain.receive(&bytes);
        assert_eq!(
            events(&mut plain),
            vec![
                Event::Error {
                    handle: 5,
                    error: EINVAL
                },
                Event::Error {
                    handle: 6,
                    error: EINVAL
                },
            ]
        );
        // The context set for one export does not carry to another.
        let mut other = negotiating();
        other.receive(&option(OPT_STRUCTURED_REPLY, &[]));
        other.receive(&meta(OPT_SET_META_CONTEXT, "a", &[BASE_ALLOCATION]));
        other.receive(&go("ro"));
        events(&mut other);
        other.take_output();
        other.receive(&request(CMD_BLOCK_STATUS, 0, 7, 0, 4096));
        assert_eq!(
            events(&mut other),
            vec![Event::Error {
                handle: 7,
                error: EINVAL
            }]
        );
    }
}
