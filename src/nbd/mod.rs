//! The NBD protocol (the standard network block device protocol, fixed newstyle
//! handshake, simple replies) as a sans-I/O codec: bytes in, events out, bytes to send
//! out. The server owns the sockets; tests and the fuzz target drive the codec with
//! byte slices.

pub(crate) mod codec;
pub mod fuzzing;
pub mod proto;

pub use codec::{Command, CommandKind, Event, ExportInfo, ProtocolError, ServerCodec, TlsPolicy};
