//! Why the server could not start, or stopped on its own: the server layer's boundary
//! error ([`ServeError`]), each variant naming the setting or file at fault, and the
//! errors of one connection's handshake ([`ConnectionError`]), which end that
//! connection only and are logged per peer.

use super::backend::BackendError;
use super::capture::CaptureError;
use super::engine::EngineError;
use super::prometheus::MetricsError;
use super::tls::TlsError;
use crate::policy::PolicyError;
use std::path::PathBuf;

/// Why `serve` returned an error. Set-up errors come before anything is served; the
/// engine's mean it stopped while serving, and the server stopped with it.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The cluster front's exchange could not start (`[cluster]`).
    #[error(transparent)]
    Front(#[from] super::front::FrontError),
    /// `--out`'s folder could not be created.
    #[error("--out: cannot create {}: {source}", dir.display())]
    Output {
        /// The folder.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The configuration meets the files this run writes (an image that is the pid
    /// file or the capture).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// `server.policy` does not build.
    #[error("server.policy: {0}")]
    Policy(#[from] PolicyError),
    /// An image could not be opened, locked or sized.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The TLS credentials could not be loaded.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A listener could not be set up (`setting` is `server.tcp` or `server.unix`).
    #[error("{setting}: cannot listen on {at}: {source}")]
    Listen {
        /// The setting.
        setting: &'static str,
        /// The address or path.
        at: String,
        /// Why.
        source: std::io::Error,
    },
    /// The unix socket's path holds something that must not be replaced.
    #[error("server.unix: {} {why}", path.display())]
    SocketPath {
        /// The path.
        path: PathBuf,
        /// What is there.
        why: &'static str,
    },
    /// Listening sockets handed over by a service manager could not be taken.
    #[error("socket activation: {0}")]
    Activation(#[from] super::service::ActivationError),
    /// `--pidfile` could not be written, or names a server that still runs.
    #[error("--pidfile: {0}")]
    PidFile(String),
    /// The metrics endpoint could not start.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// The capture file could not be opened.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// The engine could not start, or failed while serving.
    #[error("the engine failed: {0}")]
    Engine(#[from] EngineError),
    /// The engine's thread could not be started.
    #[error("cannot start the engine's thread: {0}")]
    Thread(std::io::Error),
    /// The engine ended while serving without being asked to.
    #[error("the engine stopped without being asked to")]
    EngineStopped,
    /// The engine panicked (its message).
    #[error("the engine panicked: {0}")]
    EnginePanicked(String),
}

/// Why one connection ended before it was served: its peer's business, logged per peer
/// (a peer that hung up or sat silent is not logged at all: [`ConnectionError::is_gone`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectionError {
    /// Reading from or writing to the client failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The client broke the handshake's protocol.
    #[error("handshake: {0}")]
    Protocol(#[from] crate::nbd::ProtocolError),
    /// The client hung up during the TLS handshake.
    #[error(
        "TLS handshake: the client hung up in it ({0}); does it trust this server's certificate (its CA, and a name matching the host it connects to)?"
    )]
    TlsHungUp(std::io::Error),
    /// The TLS handshake failed.
    #[error("TLS handshake{hint}: {reason}")]
    Tls {
        /// What the reason may mean (empty, or a parenthesis).
        hint: &'static str,
        /// The library's reason.
        reason: String,
    },
}

impl ConnectionError {
    /// A TLS library's refusal, with what it may mean.
    pub(crate) fn tls(hint: &'static str, reason: impl std::fmt::Display) -> Self {
        ConnectionError::Tls {
            hint,
            reason: reason.to_string(),
        }
    }

    /// A socket error during the TLS handshake. A client that hangs up in the middle of
    /// it (after its ClientHello) most often refused this server's certificate without
    /// an alert: said so, unlike a client gone in the clear. Silence past the timeout
    /// stays what it is.
    pub(crate) fn tls_io(e: std::io::Error) -> Self {
        use std::io::ErrorKind::*;
        match e.kind() {
            BrokenPipe | ConnectionReset | UnexpectedEof => ConnectionError::TlsHungUp(e),
            kind if gone(kind) => ConnectionError::Io(e),
            _ => ConnectionError::tls("", e),
        }
    }

    /// Whether the TLS handshake failed (however).
    pub(crate) fn in_tls_handshake(&self) -> bool {
        matches!(
            self,
            ConnectionError::TlsHungUp(_) | ConnectionError::Tls { .. }
        )
    }

    /// The client went away or said nothing in time: not news.
    pub(crate) fn is_gone(&self) -> bool {
        matches!(self, ConnectionError::Io(e) if gone(e.kind()))
    }
}

/// An error kind that says the client hung up or sat silent past its timeout.
fn gone(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        kind,
        BrokenPipe | ConnectionReset | UnexpectedEof | WouldBlock | TimedOut
    )
}
