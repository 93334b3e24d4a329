//! TLS for the exports: the NBD protocol's `NBD_OPT_STARTTLS` (its "TLS" section), with
//! X.509 certificates as `nbdkit --tls` and `qemu-nbd --tls-creds` use them, through
//! rustls.
//!
//! The handshake thread runs the TLS handshake and the option negotiation over it
//! (blocking, under `server.handshake_timeout_s`). Once an export is selected, the
//! engine's io_uring ring serves the connection's plaintext as it serves any other: the
//! thread that ran the handshake stays as the connection's *relay* between the client's
//! socket (TLS records) and one end of a socket pair whose other end the engine holds.
//! The relay reads from the engine only while rustls has nothing left to send and
//! buffers at most [`RELAY_BUFFER`] of decrypted requests, so the memory budget the
//! engine keeps (`server.max_inflight_bytes`) still bounds what a client can make the
//! server hold; a connection costs a thread while TLS runs on it, as it did while
//! handshaking (bounded by `server.max_connections`).
//!
//! Not supported: TLS pre-shared keys (`--tls-psk`, `tls-creds-psk`): rustls has no
//! external PSKs.

// poll(2) and fcntl(2) on the relay's descriptors.
#![allow(unsafe_code)]

use super::config::Tls;
use anyhow::Context as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// Most decrypted client bytes the relay holds for the engine.
pub const RELAY_BUFFER: usize = 256 << 10;
/// Bytes moved per read, either way.
const CHUNK: usize = 64 << 10;

/// The rustls server configuration `tls` describes: its certificate chain and key, and
/// with `client_ca` a verifier that requires a client certificate signed by those CAs.
pub fn server_config(tls: &Tls) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let (Some(cert), Some(key)) = (&tls.cert, &tls.key) else {
        anyhow::bail!("server.tls_cert and server.tls_key are needed for TLS");
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|c| c.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("server.tls_cert: {}", cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!("server.tls_cert: {}: no certificate in it", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("server.tls_key: {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca)
                .with_context(|| format!("server.tls_client_ca: {}", ca.display()))?
            {
                let c = c.with_context(|| format!("server.tls_client_ca: {}", ca.display()))?;
                roots
                    .add(c)
                    .with_context(|| format!("server.tls_client_ca: {}", ca.display()))?;
            }
            if roots.is_empty() {
                anyhow::bail!(
                    "server.tls_client_ca: {}: no certificate in it",
                    ca.display()
                );
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .with_context(|| format!("server.tls_client_ca: {}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .context("server.tls_cert and server.tls_key do not make a usable pair")?;
    Ok(Arc::new(config))
}

fn would_block(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
    )
}

/// Relays between a client's TLS socket `net` and the engine's end of a socket pair
/// (`local` is this side's) until both sides are done. `tls` has finished its
/// handshake; plaintext it already decrypted goes to the engine first. Returns when the
/// engine closed its end (after a TLS close to the client) or the client went away
/// (the engine then reads end of stream and finishes what it holds).
pub fn relay<S: Read + Write + AsRawFd>(
    mut tls: rustls::ServerConnection,
    mut net: S,
    mut local: std::os::unix::net::UnixStream,
) -> std::io::Result<()> {
    local.set_nonblocking(true)?;
    set_nonblocking(net.as_raw_fd())?;
    // Bounded by reading from the engine only when nothing waits to be sent.
    tls.set_buffer_limit(None);
    let mut to_engine: Vec<u8> = Vec::with_capacity(CHUNK);
    let mut at = 0usize;
    let mut chunk = vec![0u8; CHUNK];
    let (mut client_done, mut engine_done, mut engine_told) = (false, false, false);
    loop {
        // Take what rustls decrypted (up to the bound: the rest stays with it).
        {
            while to_engine.len() < RELAY_BUFFER {
                match tls.reader().read(&mut chunk) {
                    Ok(0) => {
                        client_done = true;
                        break;
                    }
                    Ok(n) => to_engine.extend_from_slice(&chunk[..n]),
                    Err(e) if would_block(&e) => break,
                    // Closed without a TLS close: the client is gone all the same.
                    Err(_) => {
                        client_done = true;
                        break;
                    }
                }
            }
        }
        while at < to_engine.len() {
            match local.write(&to_engine[at..]) {
                Ok(n) => at += n,
                Err(e) if would_block(&e) => break,
                // The engine closed its end: nothing more goes to it.
                Err(_) => {
                    engine_done = true;
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
        while tls.wants_write() {
            match tls.write_tls(&mut net) {
                Ok(_) => {}
                Err(e) if would_block(&e) => break,
                Err(_) => return Ok(()),
            }
        }
        if engine_done && !tls.wants_write() {
            return Ok(());
        }
        let net_in = !client_done && to_engine.len() < RELAY_BUFFER;
        let local_in = !engine_done && !tls.wants_write();
        let net_out = tls.wants_write();
        let mut fds = [
            libc::pollfd {
                // A client that is done is not polled (its hang-up would wake every
                // poll) unless something still goes to it.
                fd: if net_in || net_out {
                    net.as_raw_fd()
                } else {
                    -1
                },
                events: (if net_in { libc::POLLIN } else { 0 })
                    | (if net_out { libc::POLLOUT } else { 0 }),
                revents: 0,
            },
            libc::pollfd {
                fd: local.as_raw_fd(),
                events: (if local_in { libc::POLLIN } else { 0 })
                    | (if to_engine.is_empty() {
                        0
                    } else {
                        libc::POLLOUT
                    }),
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds on descriptors this function holds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if would_block(&e) {
                continue;
            }
            return Err(e);
        }
        let ready = |f: &libc::pollfd, what: libc::c_short| {
            f.revents & (what | libc::POLLHUP | libc::POLLERR) != 0
        };
        if net_in && ready(&fds[0], libc::POLLIN) {
            match tls.read_tls(&mut net) {
                Ok(0) => client_done = true,
                Ok(_) => {
                    if let Err(e) = tls.process_new_packets() {
                        // Send the alert, then give up on the client.
                        let _ = tls.write_tls(&mut net);
                        let _ = local.shutdown(std::net::Shutdown::Write);
                        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
                    }
                }
                Err(e) if would_block(&e) => {}
                Err(_) => client_done = true,
            }
        }
        if ready(&fds[1], libc::POLLIN) && !engine_done {
            match local.read(&mut chunk) {
                Ok(0) => {
                    engine_done = true;
                    tls.send_close_notify();
                }
                Ok(n) => tls.writer().write_all(&chunk[..n])?,
                Err(e) if would_block(&e) => {}
                Err(_) => {
                    engine_done = true;
                    tls.send_close_notify();
                }
            }
        }
    }
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
