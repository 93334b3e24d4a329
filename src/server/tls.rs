//! TLS for the exports: the NBD protocol's `NBD_OPT_STARTTLS` (its "TLS" section), with
//! X.509 certificates through rustls or pre-shared keys through OpenSSL, as `nbdkit
//! --tls`/`--tls-psk` and qemu's `tls-creds-x509`/`tls-creds-psk` use them.
//!
//! Two libraries because rustls, the project's TLS library, has no external pre-shared
//! keys; OpenSSL's (TLS 1.3 with (EC)DHE, or TLS 1.2 `ECDHE-PSK`/`DHE-PSK`) are what
//! GnuTLS clients such as qemu and libnbd speak. Both sit behind one [`Session`] and
//! one [`relay`].
//!
//! The handshake thread runs the TLS handshake and the option negotiation over it
//! (blocking, under `server.handshake_timeout_s`). Once an export is selected, the
//! engine's io_uring ring serves the connection's plaintext as it serves any other: the
//! thread that ran the handshake stays as the connection's *relay* between the client's
//! socket (TLS records) and one end of a socket pair whose other end the engine holds.
//! The relay takes from the engine one chunk at a time, the next once the last went
//! out, and buffers at most [`RELAY_BUFFER`] of decrypted requests, so the memory
//! budget the engine keeps (`server.max_inflight_bytes`) still bounds what a client can
//! make the server hold; a connection costs a thread while TLS runs on it, as it did
//! while handshaking (bounded by `server.max_connections`).

// poll(2) and fcntl(2) on the relay's descriptors.
#![allow(unsafe_code)]

use super::config::Tls;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Most decrypted client bytes the relay holds for the engine.
pub const RELAY_BUFFER: usize = 256 << 10;
/// How long the relay keeps sending the last replies to a client after the engine
/// closed.
const FINAL_FLUSH: std::time::Duration = std::time::Duration::from_secs(10);
/// Bytes moved per read, either way.
const CHUNK: usize = 64 << 10;

/// Why TLS could not be set up; each names the setting (and file) at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// TLS with certificates but without both of them.
    #[error("server.tls_cert and server.tls_key are needed for TLS")]
    NoPair,
    /// A file a setting names could not be read or holds nothing usable.
    #[error("server.{setting}: {}: {reason}", path.display())]
    File {
        /// The setting (`tls_cert`, `tls_key`, `tls_client_ca`, `tls_psk`).
        setting: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it (for a line, its number first).
        reason: String,
    },
    /// The certificate and key do not go together (or rustls refused them).
    #[error("{what}: {source}")]
    Rustls {
        /// What was being set up.
        what: &'static str,
        /// Why.
        source: rustls::Error,
    },
    /// Neither rustls nor OpenSSL could use the certificate and key.
    #[error(
        "server.tls_cert and server.tls_key: rustls (RSA keys of 2048, 3072 or 4096 bits, ECDSA on P-256 or P-384, Ed25519) refused them: {rustls}; OpenSSL too: {openssl}"
    )]
    Rejected {
        /// Why rustls refused them.
        rustls: String,
        /// Why OpenSSL refused them.
        openssl: String,
    },
    /// OpenSSL refused a setting of a context.
    #[error("OpenSSL {what}: {source}")]
    OpenSsl {
        /// What was being set.
        what: &'static str,
        /// Why.
        source: openssl::error::ErrorStack,
    },
}

impl TlsError {
    fn file(setting: &'static str, path: &Path, reason: impl std::fmt::Display) -> TlsError {
        TlsError::File {
            setting,
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }
}

/// The rustls server configuration `tls` describes: its certificate chain and key, and
/// with `client_ca` a verifier that requires a client certificate signed by those CAs.
pub fn server_config(tls: &Tls) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let (Some(cert), Some(key)) = (&tls.cert, &tls.key) else {
        return Err(TlsError::NoPair);
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|c| c.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::file("tls_cert", cert, e))?;
    if certs.is_empty() {
        return Err(TlsError::file("tls_cert", cert, "no certificate in it"));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::file("tls_key", key, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            what: "TLS protocol versions",
            source,
        })?;
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let bad = |e: &dyn std::fmt::Display| TlsError::file("tls_client_ca", ca, e);
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).map_err(|e| bad(&e))? {
                let c = c.map_err(|e| bad(&e))?;
                roots.add(c).map_err(|e| bad(&e))?;
            }
            if roots.is_empty() {
                return Err(bad(&"no certificate in it"));
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| bad(&e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|source| TlsError::Rustls {
            what: "server.tls_cert and server.tls_key do not make a usable pair",
            source,
        })?;
    Ok(Arc::new(config))
}

fn would_block(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
    )
}

/// The TLS library's credentials: X.509 through rustls; pre-shared keys through
/// OpenSSL (rustls has no external PSKs; OpenSSL's are what GnuTLS clients, qemu's and
/// libnbd's, speak); and X.509 through OpenSSL where the key is one rustls's crypto
/// provider (ring) cannot sign with — RSA keys of other sizes than 2048, 3072 and 4096
/// bits (a 2432-bit key qemu-nbd takes, or 8192 bits), ECDSA on P-521.
#[derive(Clone)]
pub enum Credentials {
    /// A certificate chain and key, and maybe client CAs.
    X509(Arc<rustls::ServerConfig>),
    /// Identities and their keys, or a certificate chain and key rustls cannot use.
    OpenSsl(openssl::ssl::SslContext),
}

/// The credentials `tls` names.
pub fn credentials(tls: &Tls) -> Result<Credentials, TlsError> {
    if let Some(path) = &tls.psk {
        return Ok(Credentials::OpenSsl(psk_context(path)?));
    }
    match server_config(tls) {
        Ok(config) => Ok(Credentials::X509(config)),
        // A key rustls cannot sign with: OpenSSL takes every size and curve it knows.
        Err(e @ TlsError::Rustls { .. }) => {
            x509_context(tls)
                .map(Credentials::OpenSsl)
                .map_err(|openssl| TlsError::Rejected {
                    rustls: e.to_string(),
                    openssl: openssl.to_string(),
                })
        }
        Err(e) => Err(e),
    }
}

/// An OpenSSL server context with the certificate chain and key `tls` names, and with
/// `client_ca` a client certificate required.
fn x509_context(tls: &Tls) -> Result<openssl::ssl::SslContext, TlsError> {
    use openssl::ssl::{SslContextBuilder, SslFiletype, SslMethod, SslVerifyMode, SslVersion};
    let (Some(cert), Some(key)) = (&tls.cert, &tls.key) else {
        return Err(TlsError::NoPair);
    };
    let refused = |what| move |source| TlsError::OpenSsl { what, source };
    let mut b = SslContextBuilder::new(SslMethod::tls_server()).map_err(refused("context"))?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(refused("protocol version"))?;
    b.set_certificate_chain_file(cert)
        .map_err(refused("server.tls_cert"))?;
    b.set_private_key_file(key, SslFiletype::PEM)
        .map_err(refused("server.tls_key"))?;
    b.check_private_key()
        .map_err(refused("server.tls_cert and server.tls_key: not a pair"))?;
    if let Some(ca) = &tls.client_ca {
        b.set_ca_file(ca).map_err(refused("server.tls_client_ca"))?;
        b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    }
    common_options(&mut b);
    Ok(b.build())
}

/// What every OpenSSL context of the server sets.
fn common_options(b: &mut openssl::ssl::SslContextBuilder) {
    use openssl::ssl::SslMode;
    b.set_mode(SslMode::ENABLE_PARTIAL_WRITE | SslMode::ACCEPT_MOVING_WRITE_BUFFER);
    // Whole socket reads, not a record header and then its body: fewer system calls.
    b.set_read_ahead(true);
    // A client that hangs up without a TLS close is gone, not an error (OpenSSL 3
    // reports it as one otherwise).
    b.set_options(openssl::ssl::SslOptions::IGNORE_UNEXPECTED_EOF);
}

/// Reads a PSK file: one `identity:key` a line, the key in hex (qemu's `keys.psk`,
/// nbdkit's `--tls-psk`, `psktool`'s output). Blank lines and `#` comments are skipped.
pub fn read_psk_file(path: &Path) -> Result<HashMap<Vec<u8>, Vec<u8>>, TlsError> {
    let text = std::fs::read_to_string(path).map_err(|e| TlsError::file("tls_psk", path, e))?;
    let mut keys = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| TlsError::file("tls_psk", path, format!("line {}: {why}", i + 1));
        let Some((identity, hex)) = line.split_once(':') else {
            return Err(bad("expected identity:hexkey"));
        };
        if identity.is_empty() || identity.len() > 128 {
            return Err(bad("the identity must be 1 to 128 bytes"));
        }
        // Hex digits only, checked first: slicing inside a multi-byte character would
        // panic, and from_str_radix takes a sign.
        let key = (hex.bytes().all(|b| b.is_ascii_hexdigit()) && hex.len() % 2 == 0)
            .then(|| {
                (0..hex.len())
                    .step_by(2)
                    .map(|j| u8::from_str_radix(&hex[j..j + 2], 16).ok())
                    .collect::<Option<Vec<u8>>>()
            })
            .flatten()
            .filter(|k| (16..=MAX_PSK).contains(&k.len()))
            .ok_or_else(|| bad(&format!("the key must be 16 to {MAX_PSK} bytes in hex")))?;
        if keys.insert(identity.as_bytes().to_vec(), key).is_some() {
            return Err(bad(&format!("identity '{identity}' given twice")));
        }
    }
    if keys.is_empty() {
        return Err(TlsError::file("tls_psk", path, "no keys in it"));
    }
    Ok(keys)
}

/// The TLS 1.3 cipher suites of pre-shared-key sessions, in the server's order of
/// preference.
pub const PSK_SUITES: &str =
    "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256";

/// The longest key OpenSSL's PSK callback takes (`PSK_MAX_PSK_LEN`).
const MAX_PSK: usize = 256;

fn psk_context(path: &Path) -> Result<openssl::ssl::SslContext, TlsError> {
    use openssl::ssl::{SslContextBuilder, SslMethod, SslVersion};
    let keys = read_psk_file(path)?;
    let refused = |what| move |source| TlsError::OpenSsl { what, source };
    let mut b = SslContextBuilder::new(SslMethod::tls_server()).map_err(refused("context"))?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(refused("protocol version"))?;
    // No certificate: PSK key exchanges only (TLS 1.3 uses its PSK with (EC)DHE).
    b.set_cipher_list("kECDHEPSK:kDHEPSK:!eNULL:!MD5:!RC4:!3DES")
        .map_err(refused("cipher list"))?;
    // TLS 1.3: AES-GCM first and the server's order, as rustls chooses. OpenSSL follows
    // the client's order by default, and GnuTLS clients (qemu, libnbd) put
    // ChaCha20-Poly1305 first with pre-shared keys: measured, the client's nettle
    // ChaCha20 then took 39 % of two cores and a 1 GiB copy ran at 0.27-0.32x clear
    // text (bench/tls.sh), against 0.45x for the certificate sessions' AES-GCM.
    b.set_ciphersuites(PSK_SUITES)
        .map_err(refused("cipher suites"))?;
    b.set_options(openssl::ssl::SslOptions::CIPHER_SERVER_PREFERENCE);
    common_options(&mut b);
    b.set_psk_server_callback(move |_ssl, identity, out| {
        // An unknown identity fails the handshake (no key: zero bytes).
        let key = identity.and_then(|id| keys.get(id));
        match key {
            Some(k) if k.len() <= out.len() => {
                out[..k.len()].copy_from_slice(k);
                Ok(k.len())
            }
            _ => Ok(0),
        }
    });
    Ok(b.build())
}

/// Bytes the client sent before the TLS handshake began, read before the socket's.
#[derive(Debug)]
pub struct Prepended<S> {
    early: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Prepended<S> {
    /// `early` first, then `inner`.
    pub fn new(early: Vec<u8>, inner: S) -> Self {
        Prepended {
            early,
            at: 0,
            inner,
        }
    }

    /// The socket.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Read> Read for Prepended<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at < self.early.len() {
            let n = buf.len().min(self.early.len() - self.at);
            buf[..n].copy_from_slice(&self.early[self.at..self.at + n]);
            self.at += n;
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

impl<S: Write> Write for Prepended<S> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A TLS session the relay drives over a non-blocking socket.
pub trait Session {
    /// Decrypted bytes into `buf`: `Some(n)` (0: the client closed), `None` when
    /// nothing more can be had until the socket is ready.
    fn read_plain(&mut self, buf: &mut [u8]) -> std::io::Result<Option<usize>>;
    /// Takes plaintext for the client; 0 while what it took before still waits for
    /// the socket.
    fn write_plain(&mut self, buf: &[u8]) -> std::io::Result<usize>;
    /// Sends what waits for the socket; true when nothing does.
    fn flush(&mut self) -> std::io::Result<bool>;
    /// Starts the TLS close (the engine is done).
    fn close(&mut self);
    /// The socket.
    fn fd(&self) -> std::os::fd::RawFd;
}

/// rustls over a socket.
pub struct RustlsSession<S> {
    /// The connection, its handshake done.
    pub conn: rustls::ServerConnection,
    /// The client's socket.
    pub net: S,
}

impl<S: Read + Write + AsRawFd> Session for RustlsSession<S> {
    fn read_plain(&mut self, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
        loop {
            match self.conn.reader().read(buf) {
                Ok(n) => return Ok(Some(n)),
                Err(e) if would_block(&e) => {}
                // Closed without a TLS close: the client is gone all the same.
                Err(_) => return Ok(Some(0)),
            }
            match self.conn.read_tls(&mut self.net) {
                Ok(0) => return Ok(Some(0)),
                Ok(_) => {
                    if let Err(e) = self.conn.process_new_packets() {
                        // Send the alert, then give up on the client.
                        let _ = self.conn.write_tls(&mut self.net);
                        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
                    }
                }
                Err(e) if would_block(&e) => return Ok(None),
                Err(_) => return Ok(Some(0)),
            }
        }
    }

    fn write_plain(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Bounded: more is taken only once what was taken went out.
        if self.conn.wants_write() {
            return Ok(0);
        }
        // What rustls takes (a KeyUpdate it queued counts against its limit too).
        self.conn.writer().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<bool> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.net) {
                Ok(_) => {}
                Err(e) if would_block(&e) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn close(&mut self) {
        self.conn.send_close_notify();
    }

    fn fd(&self) -> std::os::fd::RawFd {
        self.net.as_raw_fd()
    }
}

/// OpenSSL (pre-shared keys) over a socket.
pub struct OpensslSession<S> {
    /// The stream, its handshake done.
    pub ssl: openssl::ssl::SslStream<Prepended<S>>,
    /// A write waits for the socket to take what OpenSSL has of it.
    pub blocked: bool,
}

impl<S: Read + Write + AsRawFd> OpensslSession<S> {
    fn failed(&mut self, e: openssl::ssl::Error) -> std::io::Result<Option<usize>> {
        use openssl::ssl::ErrorCode;
        match e.code() {
            ErrorCode::WANT_READ => Ok(None),
            ErrorCode::WANT_WRITE => {
                self.blocked = true;
                Ok(None)
            }
            ErrorCode::ZERO_RETURN => Ok(Some(0)),
            ErrorCode::SYSCALL if e.io_error().is_none() => Ok(Some(0)),
            _ => match e.into_io_error() {
                Ok(io) if would_block(&io) => Ok(None),
                Ok(io) => Err(io),
                Err(e) => Err(std::io::Error::other(e)),
            },
        }
    }
}

impl<S: Read + Write + AsRawFd> Session for OpensslSession<S> {
    fn read_plain(&mut self, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
        // A WANT_WRITE of an earlier attempt is retried by this one.
        self.blocked = false;
        match self.ssl.ssl_read(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) => self.failed(e),
        }
    }

    fn write_plain(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.blocked = false;
        match self.ssl.ssl_write(buf) {
            Ok(n) => {
                self.blocked = false;
                Ok(n)
            }
            // WANT_WRITE marks the write blocked (`failed`); WANT_READ waits for the
            // socket to be readable, which the relay polls for anyway.
            Err(e) => self.failed(e).map(|_| 0),
        }
    }

    fn flush(&mut self) -> std::io::Result<bool> {
        // OpenSSL writes to the socket itself; what it could not is retried with the
        // same bytes by the next `write_plain`.
        Ok(!self.blocked)
    }

    fn close(&mut self) {
        let _ = self.ssl.shutdown();
    }

    fn fd(&self) -> std::os::fd::RawFd {
        self.ssl.get_ref().get_ref().as_raw_fd()
    }
}

/// Relays between a client's TLS `session` and the engine's end of a socket pair
/// (`local` is this side's) until both sides are done. The session's handshake is
/// done; its socket is made non-blocking here. Returns when the engine closed its end
/// (after a TLS close to the client) or the client went away (the engine then reads
/// end of stream and finishes what it holds).
pub fn relay(
    mut session: impl Session,
    mut local: std::os::unix::net::UnixStream,
) -> std::io::Result<()> {
    local.set_nonblocking(true)?;
    set_nonblocking(session.fd())?;
    let mut to_engine: Vec<u8> = Vec::with_capacity(CHUNK);
    let mut at = 0usize;
    let mut from_engine: Vec<u8> = Vec::with_capacity(CHUNK);
    let mut out_at = 0usize;
    let mut chunk = vec![0u8; CHUNK];
    let (mut client_done, mut engine_done, mut engine_told) = (false, false, false);
    let mut closed_at: Option<std::time::Instant> = None;
    loop {
        // Client to engine: what the session decrypts, up to the bound.
        while !client_done && to_engine.len() < RELAY_BUFFER {
            match session.read_plain(&mut chunk) {
                Ok(Some(0)) => client_done = true,
                Ok(Some(n)) => to_engine.extend_from_slice(&chunk[..n]),
                Ok(None) => break,
                // A broken session ends the client's side; what it sent whole still
                // goes to the engine.
                Err(_) => client_done = true,
            }
        }
        while at < to_engine.len() {
            match local.write(&to_engine[at..]) {
                Ok(n) => at += n,
                Err(e) if would_block(&e) => break,
                // The engine takes nothing more (a drain shut its reading side):
                // requests stop here, its replies still go out until it closes.
                Err(_) => {
                    client_done = true;
                    at = to_engine.len();
                }
            }
        }
        if at == to_engine.len() {
            to_engine.clear();
            at = 0;
        }
        if client_done && to_engine.is_empty() && !engine_told {
            let _ = local.shutdown(std::net::Shutdown::Write);
            engine_told = true;
        }
        // Engine to client: a chunk at a time, the next read once it was all taken.
        if !engine_done && from_engine.is_empty() {
            from_engine.resize(CHUNK, 0);
            match local.read(&mut from_engine) {
                Ok(n) if n > 0 => from_engine.truncate(n),
                Err(e) if would_block(&e) => from_engine.clear(),
                // End of stream or an error: the engine is done with the connection.
                _ => {
                    from_engine.clear();
                    engine_done = true;
                    session.close();
                }
            }
        }
        let flushed = send_to_client(&mut session, &from_engine, &mut out_at)?;
        if out_at == from_engine.len() {
            from_engine.clear();
            out_at = 0;
        }
        if engine_done && from_engine.is_empty() && flushed {
            return Ok(());
        }
        // A client that does not take the last replies is not waited for long: the
        // engine has closed and this thread holds no connection slot any more.
        if engine_done {
            let since = *closed_at.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() > FINAL_FLUSH {
                return Ok(());
            }
        }
        let net_in = !client_done && to_engine.len() < RELAY_BUFFER;
        // Plaintext waits only behind what the session could not send yet.
        let net_out = !flushed;
        let engine_in = !engine_done && from_engine.is_empty();
        wait_for(
            (session.fd(), net_in, net_out),
            (local.as_raw_fd(), engine_in, !to_engine.is_empty()),
        )?;
    }
}

/// Sends what the engine wrote to the client through the session, twice if need be:
/// sending what waited may make room for the rest (rustls takes more only once it sent
/// what it had). Returns whether the session sent everything it holds.
fn send_to_client(
    session: &mut impl Session,
    from_engine: &[u8],
    out_at: &mut usize,
) -> std::io::Result<bool> {
    let mut flushed = false;
    for _ in 0..2 {
        while *out_at < from_engine.len() {
            let n = session.write_plain(&from_engine[*out_at..])?;
            if n == 0 {
                break;
            }
            *out_at += n;
        }
        flushed = session.flush()?;
        if !flushed || *out_at == from_engine.len() {
            break;
        }
    }
    Ok(flushed)
}

/// Waits up to a second for the client's socket (`net`: its descriptor, whether to
/// read, whether to write) or the engine's end (`engine`: the same).
fn wait_for(
    (net_fd, net_in, net_out): (std::os::fd::RawFd, bool, bool),
    (engine_fd, engine_in, engine_out): (std::os::fd::RawFd, bool, bool),
) -> std::io::Result<()> {
    let mut fds = [
        libc::pollfd {
            // A client that is done is not polled (its hang-up would wake every poll)
            // unless something still goes to it.
            fd: if net_in || net_out { net_fd } else { -1 },
            events: (if net_in { libc::POLLIN } else { 0 })
                | (if net_out { libc::POLLOUT } else { 0 }),
            revents: 0,
        },
        libc::pollfd {
            fd: engine_fd,
            events: (if engine_in { libc::POLLIN } else { 0 })
                | (if engine_out { libc::POLLOUT } else { 0 }),
            revents: 0,
        },
    ];
    // Nothing wanted of the engine's end: leave it out (a closed one reports a hang-up
    // at once, every time).
    if fds[1].events == 0 {
        fds[1].fd = -1;
    }
    // SAFETY: two valid pollfds on descriptors the caller holds.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if !would_block(&e) {
            return Err(e);
        }
    }
    Ok(())
}

fn set_nonblocking(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller holds.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client that puts ChaCha20-Poly1305 first (as GnuTLS does with pre-shared keys)
    /// still gets AES-GCM: the server's order.
    #[test]
    fn psk_sessions_take_aes_gcm_before_a_clients_chacha20() {
        use openssl::ssl::{SslConnector, SslMethod};
        let dir = tempfile::tempdir().unwrap();
        let key = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        let path = dir.path().join("keys.psk");
        std::fs::write(&path, format!("alice:{key}\n")).unwrap();
        let server = psk_context(&path).unwrap();
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let accepting = std::thread::spawn(move || {
            let ssl = openssl::ssl::Ssl::new(&server).unwrap();
            let s = ssl.accept(a).unwrap();
            s.ssl().current_cipher().unwrap().name().to_string()
        });
        let mut c = SslConnector::builder(SslMethod::tls_client()).unwrap();
        c.set_ciphersuites(
            "TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384",
        )
        .unwrap();
        c.set_cipher_list("kECDHEPSK").unwrap();
        let secret: Vec<u8> = (0..key.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&key[i..i + 2], 16).unwrap())
            .collect();
        c.set_psk_client_callback(move |_, _hint, identity, psk| {
            identity[..6].copy_from_slice(b"alice\0");
            psk[..secret.len()].copy_from_slice(&secret);
            Ok(secret.len())
        });
        let mut config = c.build().configure().unwrap();
        config.set_verify_hostname(false);
        let client = config.connect("localhost", b).unwrap();
        let chosen = client.ssl().current_cipher().unwrap().name().to_string();
        assert!(
            chosen.starts_with("TLS_AES_") && chosen.contains("_GCM_"),
            "{chosen}"
        );
        assert_eq!(accepting.join().unwrap(), chosen);
    }

    #[test]
    fn psk_files_are_read_as_qemu_writes_them_and_mistakes_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = |text: &str| {
            let p = dir.path().join("keys.psk");
            std::fs::write(&p, text).unwrap();
            p
        };
        let key = "00112233445566778899aabbccddeeff";
        let keys = read_psk_file(&file(&format!(
            "# comment\nalice:{key}\n\nbob:{key}{key}\n"
        )))
        .unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[b"alice".as_slice()].len(), 16);
        assert_eq!(keys[b"bob".as_slice()][..2], [0x00, 0x11]);
        for (text, says) in [
            ("alice\n", "line 1: expected identity:hexkey"),
            (
                "alice:0011\n",
                "line 1: the key must be 16 to 256 bytes in hex",
            ),
            (&format!("alice:{key}x\n"), "line 1: the key must be"),
            (
                &format!("alice:{}\n", "zz".repeat(16)),
                "line 1: the key must be",
            ),
            (
                &format!("alice:{key}\nalice:{key}\n"),
                "line 2: identity 'alice' given twice",
            ),
            (&format!(":{key}\n"), "the identity must be 1 to 128 bytes"),
            ("# nothing\n", "no keys in it"),
            (
                &format!("alice:é{}\n", &key[..30]),
                "line 1: the key must be",
            ),
            (
                &format!("alice:+f{}\n", &key[..30]),
                "line 1: the key must be",
            ),
        ] {
            let e = read_psk_file(&file(text)).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}
