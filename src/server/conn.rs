//! A client connection once its handshake is done: the engine thread receives its
//! requests and sends its replies on the same io_uring ring as the file I/O, so a request
//! costs no thread hand-off between socket and device. What the socket side needs to
//! remember lives here; the decisions (when to read, what to answer) are the engine's.

use crate::nbd::ServerCodec;
use crate::nbd::proto;
use std::os::fd::{AsRawFd, OwnedFd};

/// Bytes one receive may bring (a 32 MiB write arrives over several).
const RECEIVE_BUFFER: usize = 256 << 10;

/// A connection handed to the engine after its handshake.
pub struct Attach {
    /// Number of the connection, for messages.
    pub id: u64,
    pub fd: OwnedFd,
    /// The codec that ran the handshake; it may already hold requests the client sent
    /// right behind its option.
    pub codec: ServerCodec,
    pub tenant: u32,
}

/// The engine's view of one connection.
pub struct Conn {
    pub id: u64,
    pub fd: OwnedFd,
    pub tenant: u32,
    pub codec: ServerCodec,
    /// Where a receive on the ring writes.
    pub inbox: Vec<u8>,
    /// A receive is on the ring.
    pub receiving: bool,
    /// Nothing more will be received: end of stream, an error, or the server drains.
    pub eof: bool,
    /// No more requests will come: the client disconnected, broke the protocol, or
    /// everything received has been taken after `eof`.
    pub parsed: bool,
    /// Replies not yet handed to the ring.
    pub out: Vec<u8>,
    /// The replies of the send on the ring (one at a time keeps them in order), and how
    /// many of its bytes went out.
    pub sending: Vec<u8>,
    pub sent: usize,
    pub send_armed: bool,
    /// A send failed: the client is gone, further replies are dropped.
    pub broken: bool,
    /// Requests of this connection inside the engine, not answered yet.
    pub outstanding: u32,
}

impl Conn {
    pub fn new(a: Attach) -> Self {
        Conn {
            id: a.id,
            fd: a.fd,
            tenant: a.tenant,
            codec: a.codec,
            inbox: vec![0; RECEIVE_BUFFER],
            receiving: false,
            eof: false,
            parsed: false,
            out: Vec::with_capacity(64 << 10),
            sending: Vec::with_capacity(64 << 10),
            sent: 0,
            send_armed: false,
            broken: false,
            outstanding: 0,
        }
    }

    /// Queues a simple reply (with its read data) behind the earlier ones.
    pub fn reply(&mut self, handle: u64, error: u32, data: Option<&[u8]>) {
        if self.broken {
            return;
        }
        proto::simple_reply(&mut self.out, handle, error);
        if let Some(d) = data {
            self.out.extend_from_slice(d);
        }
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

    /// The replies to send next, when no send is on the ring: moves them to `sending`.
    pub fn next_send(&mut self) -> Option<&[u8]> {
        if self.send_armed || self.broken || self.out.is_empty() {
            return None;
        }
        std::mem::swap(&mut self.out, &mut self.sending);
        self.out.clear();
        self.sent = 0;
        self.send_armed = true;
        Some(&self.sending)
    }

    /// A send on the ring returned `result`: the bytes still to send (a short send), or
    /// `None` when everything went (or the client is gone).
    pub fn sent(&mut self, result: i32) -> Option<&[u8]> {
        if result == -libc::EINTR || result == -libc::EAGAIN {
            return Some(&self.sending[self.sent..]);
        }
        if result <= 0 {
            self.send_armed = false;
            self.broken = true;
            self.out.clear();
            self.sending.clear();
            return None;
        }
        self.sent += result as usize;
        if self.sent < self.sending.len() {
            return Some(&self.sending[self.sent..]);
        }
        self.send_armed = false;
        None
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
            fd: a.into(),
            codec: ServerCodec::new(Arc::new(vec![ExportInfo {
                name: "x".into(),
                size: 4096,
                read_only: false,
            }])),
            tenant: 0,
        })
    }

    #[test]
    fn replies_go_out_in_order_across_short_sends() {
        let mut c = conn();
        c.reply(1, 0, Some(&[7; 8]));
        let first = c.next_send().unwrap().len();
        assert_eq!(first, 16 + 8);
        // While a send is on the ring, newer replies wait behind it.
        c.reply(2, 5, None);
        assert!(c.next_send().is_none());
        assert_eq!(c.sent(10).unwrap().len(), first - 10);
        assert!(c.sent((first - 10) as i32).is_none());
        assert!(!c.is_finished(), "not parsed yet");
        let second = c.next_send().unwrap().to_vec();
        assert_eq!(second.len(), 16);
        assert_eq!(&second[8..16], &2u64.to_be_bytes());
        assert!(c.sent(16).is_none());
        c.parsed = true;
        assert!(c.is_finished());
    }

    #[test]
    fn a_failed_send_drops_what_is_left() {
        let mut c = conn();
        c.reply(1, 0, None);
        c.next_send().unwrap();
        c.reply(2, 0, None);
        assert!(c.sent(-libc::EPIPE).is_none());
        assert!(c.broken && c.out.is_empty());
        c.reply(3, 0, None);
        assert!(c.next_send().is_none());
        c.parsed = true;
        assert!(c.is_finished());
    }
}
