//! Numbers of the NBD protocol (names as in the protocol document, without `NBD_`).

/// "NBDMAGIC": first eight bytes the server sends.
pub const INIT_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle negotiation, and the prefix of each client option.
pub const OPTION_MAGIC: u64 = 0x4948_4156_454f_5054;
/// Prefix of each option reply.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Prefix of each transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Prefix of each simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// Handshake flag (server), `NBD_FLAG_FIXED_NEWSTYLE`: the server supports the fixed newstyle handshake.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag (server), `NBD_FLAG_NO_ZEROES`: the server can omit the 124 zero bytes after the
/// `NBD_OPT_EXPORT_NAME` reply.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag, `NBD_FLAG_C_FIXED_NEWSTYLE`: the client uses the fixed newstyle handshake.
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag, `NBD_FLAG_C_NO_ZEROES`: the server is to omit the 124 zero bytes after the
/// `NBD_OPT_EXPORT_NAME` reply.
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

/// Transmission flag, `NBD_FLAG_HAS_FLAGS`: always set; the flags field is valid.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag, `NBD_FLAG_READ_ONLY`: the export is read-only.
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag, `NBD_FLAG_SEND_FLUSH`: the server supports `NBD_CMD_FLUSH`.
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag, `NBD_FLAG_SEND_FUA`: the server supports `NBD_CMD_FLAG_FUA`.
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag, `NBD_FLAG_SEND_TRIM`: the server supports `NBD_CMD_TRIM`.
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag, `NBD_FLAG_SEND_WRITE_ZEROES`: the server supports `NBD_CMD_WRITE_ZEROES`.
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag, `NBD_FLAG_CAN_MULTI_CONN`: several connections to the export see a
/// consistent view (a flush on one covers writes completed on all).
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

/// Transmission flag, `NBD_FLAG_SEND_DF`: the server takes `NBD_CMD_FLAG_DF` on reads
/// (structured replies only; this server never splits a read's data anyway).
pub const TFLAG_SEND_DF: u16 = 1 << 7;
/// Transmission flag, `NBD_FLAG_SEND_CACHE`: the server takes `NBD_CMD_CACHE`.
pub const TFLAG_SEND_CACHE: u16 = 1 << 10;
/// Transmission flag, `NBD_FLAG_SEND_FAST_ZERO`: the server takes
/// `NBD_CMD_FLAG_FAST_ZERO` on `NBD_CMD_WRITE_ZEROES`.
pub const TFLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Option `NBD_OPT_EXPORT_NAME`: choose an export and end the handshake (no option reply).
pub const OPT_EXPORT_NAME: u32 = 1;
/// Option `NBD_OPT_ABORT`: the client ends the handshake without choosing an export.
pub const OPT_ABORT: u32 = 2;
/// Option `NBD_OPT_LIST`: list the exports.
pub const OPT_LIST: u32 = 3;
/// Option `NBD_OPT_STARTTLS`: upgrade the connection to TLS.
pub const OPT_STARTTLS: u32 = 5;
/// Option `NBD_OPT_INFO`: query an export's information without choosing it.
pub const OPT_INFO: u32 = 6;
/// Option `NBD_OPT_GO`: choose an export, receive its information and enter transmission.
pub const OPT_GO: u32 = 7;
/// Option `NBD_OPT_STRUCTURED_REPLY`: ask for structured replies in transmission.
pub const OPT_STRUCTURED_REPLY: u32 = 8;

/// Option `NBD_OPT_LIST_META_CONTEXT`: which metadata contexts an export has.
pub const OPT_LIST_META_CONTEXT: u32 = 9;
/// Option `NBD_OPT_SET_META_CONTEXT`: choose the metadata contexts of the export to
/// be selected (`NBD_CMD_BLOCK_STATUS` reports them).
pub const OPT_SET_META_CONTEXT: u32 = 10;

/// Option reply `NBD_REP_ACK`: the option succeeded (or its list of replies is complete).
pub const REP_ACK: u32 = 1;
/// Option reply `NBD_REP_SERVER`: one export in reply to `NBD_OPT_LIST`.
pub const REP_SERVER: u32 = 2;
/// Option reply `NBD_REP_INFO`: one item of export information (`NBD_INFO_*`).
pub const REP_INFO: u32 = 3;
/// Option reply `NBD_REP_META_CONTEXT`: one metadata context (its id and name).
pub const REP_META_CONTEXT: u32 = 4;
/// Option error `NBD_REP_ERR_UNSUP`: the option is unknown or not supported.
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
/// Option error `NBD_REP_ERR_POLICY`: the server's policy forbids the option.
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
/// Option error `NBD_REP_ERR_INVALID`: the option is malformed or invalid.
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
/// `NBD_REP_ERR_TLS_REQD`: the server requires TLS before this option.
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
/// Option error `NBD_REP_ERR_UNKNOWN`: the requested export is not available.
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
/// Option error `NBD_REP_ERR_TOO_BIG`: the option's payload is too large.
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

/// Information type `NBD_INFO_EXPORT` of `NBD_OPT_INFO`/`NBD_OPT_GO`: export size and
/// transmission flags.
pub const INFO_EXPORT: u16 = 0;
/// Information type `NBD_INFO_NAME`: the export's name (sent when the client asks).
pub const INFO_NAME: u16 = 1;
/// Information type `NBD_INFO_DESCRIPTION`: a line about the export (sent when the
/// client asks and the export has one).
pub const INFO_DESCRIPTION: u16 = 2;
/// Information type `NBD_INFO_BLOCK_SIZE` of `NBD_OPT_INFO`/`NBD_OPT_GO`: minimum, preferred
/// and maximum block sizes.
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Command `NBD_CMD_READ`: read request.
pub const CMD_READ: u16 = 0;
/// Command `NBD_CMD_WRITE`: write request (the data follows the header).
pub const CMD_WRITE: u16 = 1;
/// Command `NBD_CMD_DISC`: disconnect (no reply).
pub const CMD_DISC: u16 = 2;
/// Command `NBD_CMD_FLUSH`: make all completed writes durable.
pub const CMD_FLUSH: u16 = 3;
/// Command `NBD_CMD_TRIM`: discard a range (its contents become unspecified).
pub const CMD_TRIM: u16 = 4;
/// Command `NBD_CMD_CACHE`: a hint that the range will be read soon.
pub const CMD_CACHE: u16 = 5;
/// Command `NBD_CMD_BLOCK_STATUS`: the range's state in the metadata contexts chosen.
pub const CMD_BLOCK_STATUS: u16 = 7;
/// Command `NBD_CMD_WRITE_ZEROES`: write zeroes to a range (no data follows the header).
pub const CMD_WRITE_ZEROES: u16 = 6;

/// Command flag `NBD_CMD_FLAG_FUA`: force unit access; the write is durable before the reply.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag `NBD_CMD_FLAG_NO_HOLE`: `NBD_CMD_WRITE_ZEROES` must not deallocate the range.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;

/// Command flag `NBD_CMD_FLAG_DF`: the read's data must come in one chunk.
pub const CMD_FLAG_DF: u16 = 1 << 2;
/// Command flag `NBD_CMD_FLAG_REQ_ONE`: block status of the first extent only.
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Command flag `NBD_CMD_FLAG_FAST_ZERO`: `NBD_CMD_WRITE_ZEROES` must fail with
/// `NBD_ENOTSUP` at once rather than be slower than a write of zeroes.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Reply error `NBD_EPERM`: operation not permitted (Linux errno numbers, as the protocol fixes
/// them).
pub const EPERM: u32 = 1;
/// Reply error `NBD_EIO`: input/output error.
pub const EIO: u32 = 5;
/// Reply error `NBD_ENOMEM`: out of memory.
pub const ENOMEM: u32 = 12;
/// Reply error `NBD_EINVAL`: invalid argument.
pub const EINVAL: u32 = 22;
/// Reply error `NBD_ENOSPC`: no space left on the device.
pub const ENOSPC: u32 = 28;
/// Reply error `NBD_EOVERFLOW`: value too large.
pub const EOVERFLOW: u32 = 75;
/// Reply error `NBD_ENOTSUP`: operation not supported.
pub const ENOTSUP: u32 = 95;
/// Reply error `NBD_ESHUTDOWN`: the server is shutting down.
pub const ESHUTDOWN: u32 = 108;

/// The name of a reply error value, for messages (`"EIO"`; `"error N"` for another).
pub fn error_name(error: u32) -> std::borrow::Cow<'static, str> {
    match error {
        EPERM => "EPERM".into(),
        EIO => "EIO".into(),
        ENOMEM => "ENOMEM".into(),
        EINVAL => "EINVAL".into(),
        ENOSPC => "ENOSPC".into(),
        EOVERFLOW => "EOVERFLOW".into(),
        ENOTSUP => "ENOTSUP".into(),
        ESHUTDOWN => "ESHUTDOWN".into(),
        other => format!("error {other}").into(),
    }
}

/// The largest request payload served: the protocol's recommended maximum block size.
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// The largest option payload accepted (export names are at most 4 KiB).
pub const MAX_OPTION: u32 = 64 << 10;

/// Length of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Prefix of each structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// Structured reply flag `NBD_REPLY_FLAG_DONE`: the last chunk of the reply.
pub const REPLY_FLAG_DONE: u16 = 1;
/// Chunk type `NBD_REPLY_TYPE_OFFSET_DATA`: an offset, then data read from there.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Chunk type `NBD_REPLY_TYPE_BLOCK_STATUS`: a context id, then (length, flags) pairs.
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Chunk type `NBD_REPLY_TYPE_ERROR`: an error value and a message.
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
/// Length of a structured reply chunk's header.
pub const CHUNK_HEADER_LEN: usize = 20;
/// The longest reply header this server sends (a read's data chunk: the chunk header
/// and the offset), what every request holds of the memory budget for its reply.
pub const MAX_REPLY_HEADER: usize = CHUNK_HEADER_LEN + 8;
/// `base:allocation` state flag `NBD_STATE_HOLE`: the extent is not allocated.
pub const STATE_HOLE: u32 = 1;
/// `base:allocation` state flag `NBD_STATE_ZERO`: the extent reads as zeroes.
pub const STATE_ZERO: u32 = 2;
/// The one metadata context this server has.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Its id in `NBD_REP_META_CONTEXT` and block status replies.
pub const BASE_ALLOCATION_ID: u32 = 1;
/// The most extents one block status reply carries (the client asks again for the
/// rest): 4 + 8 × this bytes of payload.
pub const MAX_EXTENTS: usize = 256;
/// A block status reply's payload at most.
pub const MAX_BLOCK_STATUS_PAYLOAD: u32 = 4 + 8 * MAX_EXTENTS as u32;

/// Encodes a structured reply chunk's header (`len`: the payload that follows).
pub fn chunk(out: &mut Vec<u8>, flags: u16, kind: u16, handle: u64, len: u32) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// Encodes a whole error chunk (no message), the reply's last.
pub fn error_chunk(out: &mut Vec<u8>, handle: u64, error: u32) {
    chunk(out, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, handle, 6);
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
}

/// Encodes a simple reply header (`error` 0: success; read data follows it).
pub fn simple_reply(out: &mut Vec<u8>, handle: u64, error: u32) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
}
