//! A client connection once its handshake is done, as the engine's core sees it: its
//! codec, where its input and output stand ([`Input`], [`Output`]), the replies waiting
//! and the one send on its way, and what it holds of the memory budget. No socket here:
//! the shell that drives the core ([`super::engine`] on io_uring, the fault swarm in
//! [`super::swarm`]) owns it and moves bytes in and out of the buffers this lends.
//! The decisions (when to read, what to answer) are [`super::core`]'s.

// iovecs for sendmsg point into this connection's buffers.
#![allow(unsafe_code)]

use crate::buffer::IoBuf;
use crate::nbd::ServerCodec;
use crate::nbd::proto;
use crate::types::TenantId;
use std::os::fd::OwnedFd;

/// Read data this long or longer is sent from its own buffer (one more iovec); shorter
/// data is copied next to the reply headers. Measured (docs/benchmarks.md, "Server CPU
/// per request"): with 16 KiB here, copying each 4 KiB and 8 KiB read cost 10–20 % of
/// its CPU on `O_DIRECT` files (the device wrote the bytes, so the copy read them from
/// memory, not the cache) and ~10 % from the page cache, for nothing on the null
/// backend; an iovec costs the kernel less than copying a sector.
const COPY_BELOW: usize = 512;
/// The most iovecs one `sendmsg` takes (`IOV_MAX`); more go in the next send.
const MAX_IOV: usize = 1024;

/// A place under a cap of open connections, from accept until it is dropped wherever
/// that happens: the exports' connections under `server.max_connections` (handshake
/// thread or engine), the metrics endpoint's under its own.
#[derive(Debug)]
pub struct Slot(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Slot {
    /// Takes a slot when fewer than `max` are taken.
    pub fn take(
        count: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
        max: usize,
    ) -> Option<Slot> {
        use std::sync::atomic::Ordering;
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(count.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let before = self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        assert!(before > 0, "a connection slot is given back once");
    }
}

/// A connection handed to the engine after its handshake.
pub struct Attach {
    /// Number of the connection, for messages.
    pub id: u64,
    /// Who is connected ([`super::logs`]).
    pub peer: std::sync::Arc<str>,
    /// The socket, past its handshake.
    pub fd: OwnedFd,
    /// The codec that ran the handshake; it may already hold requests the client sent
    /// right behind its option.
    pub codec: ServerCodec,
    /// The tenant whose export it selected.
    pub tenant: TenantId,
    /// Its places under `server.max_connections`, its peer's and its export's limits,
    /// given back when it closes.
    pub slots: Vec<Slot>,
}

/// What more may come from a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Bytes may still be received.
    Open,
    /// Nothing more will be received (end of stream, an error, or the server drains);
    /// requests already in the codec are still taken.
    Ended,
    /// No more requests will come: the client disconnected, broke the protocol, its
    /// replies can no longer be delivered, or everything received has been taken.
    Parsed,
}

/// Where a connection's replies stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Replies are sent.
    Open,
    /// The server cut the connection (a client that did not take its replies within
    /// the drain's send grace): the send on its way fails.
    Cut,
    /// A send failed: the client is gone, further replies are dropped.
    Broken,
}

/// The core's view of one connection.
pub struct Conn {
    /// Connection number (for logs).
    pub id: u64,
    /// Who is connected: its log lines are rate-limited per peer ([`super::logs`]).
    pub peer: std::sync::Arc<str>,
    /// The tenant whose export it selected.
    pub tenant: TenantId,
    /// Parses requests; a receive writes into its [`ServerCodec::receive_buffer`].
    pub codec: ServerCodec,
    /// What more may come.
    pub input: Input,
    /// Where its replies stand.
    pub output: Output,
    /// A receive into the codec's buffer is on its way (the shell owns that buffer
    /// until it returns).
    pub receiving: bool,
    /// Replies not yet handed to the ring: headers (and short read data) in `out`, long
    /// read data as buffers that go after `out[..at]`.
    out: Vec<u8>,
    out_data: Vec<(usize, IoBuf)>,
    /// The send on the ring (one at a time keeps replies in order): its bytes and
    /// buffers, kept until it completes, the iovecs over them and the first iovec not
    /// yet (wholly) sent.
    sending: Vec<u8>,
    sending_data: Vec<(usize, IoBuf)>,
    iov: Vec<libc::iovec>,
    iov_next: usize,
    /// A send is on its way (the shell reads [`Self::send_iov`] until it returns).
    pub send_armed: bool,
    /// Requests of this connection inside the engine, not answered yet.
    pub outstanding: u32,
    /// Data bytes of this connection's requests from their admission until their
    /// replies are sent (or dropped): what it holds of the server's memory budget.
    pub pending_bytes: u64,
    /// Of those, the bytes of replies waiting in `out` and of the send on the ring.
    out_bytes: u64,
    sending_bytes: u64,
    /// Bytes whose replies went out (or were dropped) since the engine last asked.
    released: u64,
    /// Bytes held for the request whose header is being parsed (or whose write
    /// payload is arriving), before it is admitted ([`Self::reserve`]).
    pub reserved: u64,
    /// Bytes of a request taken under the budget's small-request rule beyond the
    /// budget; zero again once the connection holds nothing.
    pub exempt: u64,
}

// SAFETY: the iovecs point only into buffers this `Conn` owns (its reply bytes and the
// data of the replies it holds), which move with it; nothing else holds them.
unsafe impl Send for Conn {}

impl Conn {
    /// A connection the core serves from now on.
    pub fn new(id: u64, peer: std::sync::Arc<str>, tenant: TenantId, codec: ServerCodec) -> Self {
        Conn {
            id,
            peer,
            tenant,
            codec,
            input: Input::Open,
            output: Output::Open,
            receiving: false,
            out: Vec::with_capacity(64 << 10),
            out_data: Vec::new(),
            sending: Vec::with_capacity(64 << 10),
            sending_data: Vec::new(),
            iov: Vec::new(),
            iov_next: 0,
            send_armed: false,
            outstanding: 0,
            pending_bytes: 0,
            out_bytes: 0,
            sending_bytes: 0,
            released: 0,
            reserved: 0,
            exempt: 0,
        }
    }

    /// Holds `bytes` for the request whose header is parsed next, until it is admitted
    /// (then its reply releases them) or the connection ends.
    pub fn reserve(&mut self, bytes: u64) {
        assert_eq!(self.reserved, 0, "one request is reserved for at a time");
        self.pending_bytes += bytes;
        self.reserved = bytes;
    }

    /// The bytes released since the last call (their replies were sent or dropped).
    pub fn take_released(&mut self) -> u64 {
        std::mem::take(&mut self.released)
    }

    /// Gives back what was held for a request that will not be admitted (the
    /// connection ended before it was whole); returns the bytes.
    pub fn drop_reservation(&mut self) -> u64 {
        let bytes = std::mem::take(&mut self.reserved);
        self.pending_bytes = self
            .pending_bytes
            .checked_sub(bytes)
            .expect("a reservation is held");
        if self.pending_bytes == 0 {
            self.exempt = 0;
        }
        bytes
    }

    fn release(&mut self, bytes: u64) {
        self.pending_bytes = self
            .pending_bytes
            .checked_sub(bytes)
            .expect("released no more than the connection holds");
        if self.pending_bytes == 0 {
            self.exempt = 0;
        }
        self.released += bytes;
    }

    /// Queues a reply (with its read data) behind the earlier ones; `bytes`: what the
    /// request held (see [`Self::reserve`]), released once the reply is sent. With
    /// structured replies negotiated, a read (`read_at`: its offset) is answered with a
    /// data chunk, and an error to anything with an error chunk; otherwise simple.
    pub fn reply(
        &mut self,
        handle: u64,
        error: u32,
        data: Option<IoBuf>,
        bytes: u64,
        read_at: Option<u64>,
    ) {
        if self.output == Output::Broken {
            self.release(bytes);
            return;
        }
        self.out_bytes += bytes;
        let structured = self.codec.structured();
        match (structured, error, read_at) {
            (true, 0, Some(offset)) => {
                let len = data.as_ref().map_or(0, |d| d.len());
                proto::chunk(
                    &mut self.out,
                    proto::REPLY_FLAG_DONE,
                    proto::REPLY_TYPE_OFFSET_DATA,
                    handle,
                    8 + len as u32,
                );
                self.out.extend_from_slice(&offset.to_be_bytes());
            }
            (true, e, _) if e != 0 => proto::error_chunk(&mut self.out, handle, e),
            _ => proto::simple_reply(&mut self.out, handle, error),
        }
        match data {
            Some(d) if d.len() >= COPY_BELOW => self.out_data.push((self.out.len(), d)),
            Some(d) => self.out.extend_from_slice(&d),
            None => {}
        }
    }

    /// Queues a block status reply: one chunk of `base:allocation` extents, (length,
    /// `STATE_*` flags) each; `bytes` as for [`Self::reply`].
    pub fn reply_block_status(&mut self, handle: u64, extents: &[(u32, u32)], bytes: u64) {
        if self.output == Output::Broken {
            self.release(bytes);
            return;
        }
        assert!(
            !extents.is_empty() && extents.len() <= proto::MAX_EXTENTS,
            "a block status reply carries 1 to {} extents",
            proto::MAX_EXTENTS
        );
        self.out_bytes += bytes;
        let len = 4 + 8 * extents.len() as u32;
        proto::chunk(
            &mut self.out,
            proto::REPLY_FLAG_DONE,
            proto::REPLY_TYPE_BLOCK_STATUS,
            handle,
            len,
        );
        self.out
            .extend_from_slice(&proto::BASE_ALLOCATION_ID.to_be_bytes());
        for (length, flags) in extents {
            self.out.extend_from_slice(&length.to_be_bytes());
            self.out.extend_from_slice(&flags.to_be_bytes());
        }
    }

    /// Nothing more is received: `Open` becomes `Ended`. Returns whether a receive is on
    /// its way, which the shell must make return (shut the socket's reading side).
    pub fn stop_receiving(&mut self) -> bool {
        if self.input == Input::Open {
            self.input = Input::Ended;
        }
        self.receiving
    }

    /// Nothing left to do: the engine may close it.
    pub fn is_finished(&self) -> bool {
        self.input == Input::Parsed
            && !self.receiving
            && !self.send_armed
            && self.outstanding == 0
            && (self.out.is_empty() || self.output == Output::Broken)
    }

    /// When no send is on the ring and replies wait: makes them the next send and
    /// returns true (then the shell sends [`Self::send_iov`]).
    pub fn next_send(&mut self) -> bool {
        if self.send_armed || self.output == Output::Broken || self.out.is_empty() {
            return false;
        }
        std::mem::swap(&mut self.out, &mut self.sending);
        std::mem::swap(&mut self.out_data, &mut self.sending_data);
        self.out.clear();
        self.sending_bytes = std::mem::take(&mut self.out_bytes);
        let iovec = |bytes: &[u8]| libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        self.iov.clear();
        let mut from = 0;
        for (at, data) in &self.sending_data {
            if *at > from {
                self.iov.push(iovec(&self.sending[from..*at]));
            }
            self.iov.push(iovec(data));
            from = *at;
        }
        if from < self.sending.len() {
            self.iov.push(iovec(&self.sending[from..]));
        }
        self.iov_next = 0;
        self.send_armed = true;
        true
    }

    /// What is left of the current send, at most `MAX_IOV` iovecs: the buffers they
    /// point to stay in place until the send returns ([`Self::sent`]).
    pub fn send_iov(&self) -> &[libc::iovec] {
        let rest = &self.iov[self.iov_next..];
        &rest[..rest.len().min(MAX_IOV)]
    }

    /// A copy of up to `max` bytes of what [`Self::send_iov`] points to, in order (a
    /// simulated socket's view of the send).
    pub fn send_bytes(&self, max: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        for v in self.send_iov() {
            if bytes.len() >= max {
                break;
            }
            // SAFETY: the iovecs point into buffers this connection keeps, unchanged
            // while the send is on its way.
            let s = unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) };
            bytes.extend_from_slice(&s[..s.len().min(max - bytes.len())]);
        }
        bytes
    }

    /// A send returned `result` (bytes sent, or a negative errno): true when bytes are
    /// left to send (a short send, or more iovecs than one message takes), false when
    /// everything went or the client is gone. The buffers of a finished send go back to
    /// the pool.
    pub fn sent(&mut self, result: i32) -> bool {
        assert!(self.send_armed, "a send returns once");
        if result == -libc::EINTR || result == -libc::EAGAIN {
            return true;
        }
        if result <= 0 {
            self.send_armed = false;
            self.output = Output::Broken;
            self.out.clear();
            self.out_data.clear();
            let dropped = std::mem::take(&mut self.out_bytes);
            self.release(dropped);
            self.finish_send();
            return false;
        }
        let mut n = result as usize;
        while n > 0 {
            let v = &mut self.iov[self.iov_next];
            if n >= v.iov_len {
                n -= v.iov_len;
                self.iov_next += 1;
            } else {
                // SAFETY: `n < iov_len` stays inside the iovec's buffer.
                v.iov_base = unsafe { v.iov_base.cast::<u8>().add(n) }.cast();
                v.iov_len -= n;
                n = 0;
            }
        }
        if self.iov_next < self.iov.len() {
            return true;
        }
        self.send_armed = false;
        self.finish_send();
        false
    }

    fn finish_send(&mut self) {
        let sent = std::mem::take(&mut self.sending_bytes);
        self.release(sent);
        self.iov.clear();
        self.iov_next = 0;
        self.sending.clear();
        self.sending_data.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbd::ExportInfo;
    use std::sync::Arc;

    fn conn() -> Conn {
        Conn::new(
            1,
            "local".into(),
            0,
            ServerCodec::new(Arc::new(vec![ExportInfo::new("x", 4096, false)])),
        )
    }

    impl Conn {
        /// The bytes the current send still has to deliver, in order.
        fn unsent(&self) -> Vec<u8> {
            let mut bytes = Vec::new();
            for v in &self.iov[self.iov_next..] {
                // SAFETY: the iovecs point into buffers the connection keeps.
                let s = unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) };
                bytes.extend_from_slice(s);
            }
            bytes
        }
    }

    fn header(handle: u64, error: u32) -> Vec<u8> {
        let mut h = Vec::new();
        proto::simple_reply(&mut h, handle, error);
        h
    }

    #[test]
    fn replies_go_out_in_order_across_short_sends() {
        let mut c = conn();
        c.reply(1, 0, Some(IoBuf::copy_of(&[7; 8])), 0, None);
        assert!(c.next_send());
        let first = [header(1, 0), vec![7; 8]].concat();
        assert_eq!(c.unsent(), first);
        assert_eq!(c.send_bytes(usize::MAX), first);
        assert_eq!(c.send_bytes(10), first[..10]);
        // While a send is on the ring, newer replies wait behind it.
        c.reply(2, 5, None, 0, None);
        assert!(!c.next_send());
        assert!(c.sent(10));
        assert_eq!(c.unsent(), first[10..]);
        assert!(!c.sent((first.len() - 10) as i32));
        assert!(!c.is_finished(), "not parsed yet");
        assert!(c.next_send());
        assert_eq!(c.unsent(), header(2, 5));
        assert!(!c.sent(16));
        c.input = Input::Parsed;
        assert!(c.is_finished());
    }

    #[test]
    fn long_read_data_is_sent_from_its_own_buffer_in_order() {
        let mut c = conn();
        let long = |byte| IoBuf::copy_of(&vec![byte; COPY_BELOW + 5]);
        c.reply(1, 0, Some(long(1)), 0, None);
        c.reply(2, 0, Some(IoBuf::copy_of(b"short")), 0, None);
        c.reply(3, 0, Some(long(3)), 0, None);
        let data_at = c.out_data[0].1.as_ptr();
        assert!(c.next_send());
        let expected = [
            header(1, 0),
            vec![1; COPY_BELOW + 5],
            header(2, 0),
            b"short".to_vec(),
            header(3, 0),
            vec![3; COPY_BELOW + 5],
        ]
        .concat();
        // Headers and short data share iovecs; long data is not copied.
        assert_eq!(c.iov.len(), 4);
        assert_eq!(c.iov[1].iov_base as *const u8, data_at);
        assert_eq!(c.unsent(), expected);
        // Short sends ending inside an iovec and on its boundary.
        let mut sent = 0;
        for n in [3, 13, COPY_BELOW, 6, 37, 1] {
            assert!(c.sent(n as i32));
            sent += n;
            assert_eq!(c.unsent(), expected[sent..], "after {sent} bytes");
        }
        assert!(!c.sent((expected.len() - sent) as i32));
        assert!(c.iov.is_empty() && c.sending_data.is_empty());
    }

    #[test]
    fn a_send_takes_at_most_iov_max_iovecs() {
        let mut c = conn();
        let n = MAX_IOV; // two iovecs per reply
        for h in 0..n as u64 {
            c.reply(h, 0, Some(IoBuf::zeroed(COPY_BELOW)), 0, None);
        }
        assert!(c.next_send());
        assert_eq!(c.iov.len(), 2 * n);
        assert_eq!(c.send_iov().len(), MAX_IOV);
        let first: usize = c.iov[..MAX_IOV].iter().map(|v| v.iov_len).sum();
        assert!(c.sent(first as i32), "the second half is still to go");
        assert_eq!(c.send_iov().len(), MAX_IOV);
        assert_eq!(c.send_iov().as_ptr(), c.iov[MAX_IOV..].as_ptr());
        assert!(!c.sent(first as i32));
    }

    #[test]
    fn a_failed_send_drops_what_is_left() {
        let mut c = conn();
        c.reply(1, 0, None, 0, None);
        assert!(c.next_send());
        c.reply(2, 0, None, 0, None);
        assert!(!c.sent(-libc::EPIPE));
        assert!(c.output == Output::Broken && c.out.is_empty());
        c.reply(3, 0, None, 0, None);
        assert!(!c.next_send());
        c.input = Input::Parsed;
        assert!(c.is_finished());
    }

    /// With structured replies, a read's data comes in one data chunk carrying its
    /// offset, an error in an error chunk, block status in its chunk; other successes
    /// stay simple.
    #[test]
    fn structured_replies_are_encoded_as_the_protocol_says() {
        let mut codec = ServerCodec::new(Arc::new(vec![ExportInfo::new("x", 4096, false)]));
        let _ = codec.take_output();
        let mut hello = (proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES)
            .to_be_bytes()
            .to_vec();
        hello.extend_from_slice(&proto::OPTION_MAGIC.to_be_bytes());
        hello.extend_from_slice(&proto::OPT_STRUCTURED_REPLY.to_be_bytes());
        hello.extend_from_slice(&0u32.to_be_bytes());
        codec.receive(&hello);
        while let Ok(Some(_)) = codec.poll() {}
        assert!(codec.structured());
        let mut c = Conn::new(1, "local".into(), 0, codec);
        c.reply(1, 0, Some(IoBuf::copy_of(b"abcd")), 0, Some(512));
        c.reply(2, proto::EIO, None, 0, Some(0));
        c.reply(3, 0, None, 0, None);
        c.reply_block_status(4, &[(4096, proto::STATE_HOLE | proto::STATE_ZERO)], 0);
        assert!(c.next_send());
        let out = c.unsent();
        let mut want = Vec::new();
        proto::chunk(&mut want, 1, proto::REPLY_TYPE_OFFSET_DATA, 1, 12);
        want.extend_from_slice(&512u64.to_be_bytes());
        want.extend_from_slice(b"abcd");
        proto::chunk(&mut want, 1, proto::REPLY_TYPE_ERROR, 2, 6);
        want.extend_from_slice(&proto::EIO.to_be_bytes());
        want.extend_from_slice(&0u16.to_be_bytes());
        proto::simple_reply(&mut want, 3, 0);
        proto::chunk(&mut want, 1, proto::REPLY_TYPE_BLOCK_STATUS, 4, 12);
        want.extend_from_slice(&proto::BASE_ALLOCATION_ID.to_be_bytes());
        want.extend_from_slice(&4096u32.to_be_bytes());
        want.extend_from_slice(&3u32.to_be_bytes());
        assert_eq!(out, want);
        assert_eq!(&out[..4], &0x668e_33efu32.to_be_bytes());
    }
}
