//! A client connection once its handshake is done: the engine thread receives its
//! requests and sends its replies on the same io_uring ring as the file I/O, so a request
//! costs no thread hand-off between socket and device. What the socket side needs to
//! remember lives here; the decisions (when to read, what to answer) are the engine's.

// io_uring entries point at this connection's buffers; iovecs for sendmsg.
#![allow(unsafe_code)]

use crate::buffer::IoBuf;
use crate::nbd::ServerCodec;
use crate::nbd::proto;
use crate::types::TenantId;
use io_uring::{opcode, squeue, types};
use std::os::fd::{AsRawFd, OwnedFd};

/// Read data this long or longer is sent from its own buffer (one more iovec); shorter
/// data is copied next to the reply headers, which is cheaper than an iovec per 4 KiB.
const COPY_BELOW: usize = 16 << 10;
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

/// The engine's view of one connection.
pub struct Conn {
    /// Connection number (for logs).
    pub id: u64,
    /// Who is connected: its log lines are rate-limited per peer ([`super::logs`]).
    pub peer: std::sync::Arc<str>,
    /// The socket.
    pub fd: OwnedFd,
    /// The tenant whose export it selected.
    pub tenant: TenantId,
    /// Parses requests; a receive on the ring writes into its
    /// [`ServerCodec::receive_buffer`].
    pub codec: ServerCodec,
    /// A receive is on the ring.
    pub receiving: bool,
    /// Nothing more will be received: end of stream, an error, or the server drains.
    pub eof: bool,
    /// No more requests will come: the client disconnected, broke the protocol, or
    /// everything received has been taken after `eof`.
    pub parsed: bool,
    /// Replies not yet handed to the ring: headers (and short read data) in `out`, long
    /// read data as buffers that go after `out[..at]`.
    out: Vec<u8>,
    out_data: Vec<(usize, IoBuf)>,
    /// The send on the ring (one at a time keeps replies in order): its bytes and
    /// buffers, kept until it completes, the iovecs over them, the first iovec not yet
    /// (wholly) sent, and the message header the ring reads.
    sending: Vec<u8>,
    sending_data: Vec<(usize, IoBuf)>,
    iov: Vec<libc::iovec>,
    iov_next: usize,
    msg: Box<libc::msghdr>,
    /// A send is on the ring.
    pub send_armed: bool,
    /// A send failed: the client is gone, further replies are dropped.
    pub broken: bool,
    /// Requests of this connection inside the engine, not answered yet.
    pub outstanding: u32,
    /// Its places under the connection limits (given back on drop).
    _slots: Vec<Slot>,
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
}

impl Conn {
    /// A connection the engine serves from now on.
    pub fn new(a: Attach) -> Self {
        Conn {
            id: a.id,
            peer: a.peer,
            fd: a.fd,
            tenant: a.tenant,
            codec: a.codec,
            receiving: false,
            eof: false,
            parsed: false,
            out: Vec::with_capacity(64 << 10),
            out_data: Vec::new(),
            sending: Vec::with_capacity(64 << 10),
            sending_data: Vec::new(),
            iov: Vec::new(),
            iov_next: 0,
            // SAFETY: an all-zero msghdr is a valid empty message.
            msg: Box::new(unsafe { std::mem::zeroed() }),
            send_armed: false,
            broken: false,
            outstanding: 0,
            _slots: a.slots,
            pending_bytes: 0,
            out_bytes: 0,
            sending_bytes: 0,
            released: 0,
            reserved: 0,
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
        bytes
    }

    fn release(&mut self, bytes: u64) {
        self.pending_bytes = self
            .pending_bytes
            .checked_sub(bytes)
            .expect("released no more than the connection holds");
        self.released += bytes;
    }

    /// Queues a simple reply (with its read data) behind the earlier ones; `bytes`: what
    /// the request held (see [`Self::reserve`]), released once the reply is sent.
    pub fn reply(&mut self, handle: u64, error: u32, data: Option<IoBuf>, bytes: u64) {
        if self.broken {
            self.release(bytes);
            return;
        }
        self.out_bytes += bytes;
        proto::simple_reply(&mut self.out, handle, error);
        match data {
            Some(d) if d.len() >= COPY_BELOW => self.out_data.push((self.out.len(), d)),
            Some(d) => self.out.extend_from_slice(&d),
            None => {}
        }
    }

    /// A receive of the client's next bytes into the codec's buffer.
    pub fn receive_entry(&mut self, user_data: u64) -> squeue::Entry {
        let fd = types::Fd(self.fd.as_raw_fd());
        let room = self.codec.receive_buffer();
        opcode::Recv::new(fd, room.as_mut_ptr(), room.len() as u32)
            .build()
            .user_data(user_data)
    }

    /// Stops receiving: a receive on the ring returns at once (with what is there, or
    /// end of stream).
    pub fn stop_receiving(&mut self) {
        self.eof = true;
        if self.receiving {
            // SAFETY: plain syscall on a descriptor we own.
            unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RD) };
        }
    }

    /// Makes a send stuck on a client that stopped reading fail.
    pub fn cut(&mut self) {
        // SAFETY: as above.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
    }

    /// Nothing left to do: the engine may close it.
    pub fn is_finished(&self) -> bool {
        self.parsed
            && !self.receiving
            && !self.send_armed
            && self.outstanding == 0
            && (self.out.is_empty() || self.broken)
    }

    /// When no send is on the ring and replies wait: makes them the next send and
    /// returns true (then [`Self::send_entry`] puts it on the ring).
    pub fn next_send(&mut self) -> bool {
        if self.send_armed || self.broken || self.out.is_empty() {
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

    /// The send of what is left of the current message (at most `MAX_IOV` iovecs).
    pub fn send_entry(&mut self, user_data: u64) -> squeue::Entry {
        let rest = &self.iov[self.iov_next..];
        self.msg.msg_iov = rest.as_ptr() as *mut libc::iovec;
        self.msg.msg_iovlen = rest.len().min(MAX_IOV) as _;
        opcode::SendMsg::new(types::Fd(self.fd.as_raw_fd()), &*self.msg)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build()
            .user_data(user_data)
    }

    /// A send on the ring returned `result`: true when bytes are left to send (a short
    /// send, or more iovecs than one message takes), false when everything went or the
    /// client is gone. The buffers of a finished send go back to the pool.
    pub fn sent(&mut self, result: i32) -> bool {
        if result == -libc::EINTR || result == -libc::EAGAIN {
            return true;
        }
        if result <= 0 {
            self.send_armed = false;
            self.broken = true;
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
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        Conn::new(Attach {
            id: 1,
            peer: "local".into(),
            fd: a.into(),
            codec: ServerCodec::new(Arc::new(vec![ExportInfo {
                name: "x".into(),
                size: 4096,
                read_only: false,
            }])),
            tenant: 0,
            slots: vec![Slot::take(&Default::default(), 1).expect("a free slot")],
        })
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
        c.reply(1, 0, Some(IoBuf::copy_of(&[7; 8])), 0);
        assert!(c.next_send());
        let first = [header(1, 0), vec![7; 8]].concat();
        assert_eq!(c.unsent(), first);
        // While a send is on the ring, newer replies wait behind it.
        c.reply(2, 5, None, 0);
        assert!(!c.next_send());
        assert!(c.sent(10));
        assert_eq!(c.unsent(), first[10..]);
        assert!(!c.sent((first.len() - 10) as i32));
        assert!(!c.is_finished(), "not parsed yet");
        assert!(c.next_send());
        assert_eq!(c.unsent(), header(2, 5));
        assert!(!c.sent(16));
        c.parsed = true;
        assert!(c.is_finished());
    }

    #[test]
    fn long_read_data_is_sent_from_its_own_buffer_in_order() {
        let mut c = conn();
        let long = |byte| IoBuf::copy_of(&vec![byte; COPY_BELOW + 5]);
        c.reply(1, 0, Some(long(1)), 0);
        c.reply(2, 0, Some(IoBuf::copy_of(b"short")), 0);
        c.reply(3, 0, Some(long(3)), 0);
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
            c.reply(h, 0, Some(IoBuf::zeroed(COPY_BELOW)), 0);
        }
        assert!(c.next_send());
        assert_eq!(c.iov.len(), 2 * n);
        c.send_entry(0);
        assert_eq!(c.msg.msg_iovlen as u64, MAX_IOV as u64);
        let first: usize = c.iov[..MAX_IOV].iter().map(|v| v.iov_len).sum();
        assert!(c.sent(first as i32), "the second half is still to go");
        c.send_entry(0);
        assert_eq!(c.msg.msg_iovlen as u64, MAX_IOV as u64);
        assert_eq!(
            c.msg.msg_iov as *const libc::iovec,
            c.iov[MAX_IOV..].as_ptr()
        );
        assert!(!c.sent(first as i32));
    }

    #[test]
    fn a_failed_send_drops_what_is_left() {
        let mut c = conn();
        c.reply(1, 0, None, 0);
        assert!(c.next_send());
        c.reply(2, 0, None, 0);
        assert!(!c.sent(-libc::EPIPE));
        assert!(c.broken && c.out.is_empty());
        c.reply(3, 0, None, 0);
        assert!(!c.next_send());
        c.parsed = true;
        assert!(c.is_finished());
    }
}
