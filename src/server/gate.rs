//! The accepting side's decisions, sans-I/O ([`Gate`]): which places a new connection
//! takes under `server.max_connections` and its peer's limit, whether the connection
//! longest in its handshake makes room for it, and its export's place
//! (`server.max_connections_per_tenant`) once it selects one. The accept loop
//! ([`super`]) and the fault swarm ([`super::swarm`]) both ask it; the shell owns the
//! sockets and closes what the gate says to close.

use super::config::ServerConfig;
use super::conn::Slot;
use crate::nbd::ExportInfo;
use crate::types::Nanos;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// Connections over `server.max_connections` while the handshakes closed for them end.
pub const EVICTION_ALLOWANCE: usize = 64;

/// Peers whose new connections the gate paces at once; past this, the peer closest to a
/// full allowance is forgotten for a new one.
pub const MAX_PACED_PEERS: usize = 4096;

/// How many new connections a peer may open in a burst, as a multiple of its limit of
/// open ones (or of `max_connections` where it has none), and at what rate after that:
/// its limit a second.
const BURST_OF_LIMIT: f64 = 2.0;

/// The accepting side's decisions, sans-I/O: the places a new connection takes under
/// `server.max_connections` and its peer's limit, whether the connection longest in its
/// handshake makes room for it, and its export's place once it selects one. The accept
/// loop and the fault swarm (`swarm.rs`) both ask it.
///
/// **Reading: a peer's new connections are paced.** A peer (a local process, a TCP
/// address) opens at most twice its limit of open connections at once and its limit a
/// second after that; past it, a new connection is closed at accept, before a thread
/// or a handshake is spent on it. A process that opens connections and drops them
/// at once never reaches its limit of open ones, and each would otherwise cost the
/// server a handshake thread while the kernel's listen backlog filled and other
/// processes' clients were refused (`EAGAIN`: measured 16 of 25 non-blocking tries
/// beside one flooding process, `nbdinfo` 1 of 5; docs/benchmarks.md, "Hostile
/// clients").
///
/// **Reading: the accept loop never waits.** At the cap a new connection takes the
/// place of the one longest in its handshake (the caller closes that one; its place
/// comes back when its thread ends), going at most [`EVICTION_ALLOWANCE`] over the cap
/// meanwhile; past that the new one is closed and nobody is evicted for it. Waiting for
/// places, as the accept loop once did, lets the kernel's listen backlog overflow, and
/// then new clients of every peer are refused (measured: docs/benchmarks.md, "Hostile
/// clients"). A peer limit of `max_connections` or more is none: it adds nothing to the
/// cap and would keep a peer's new connections from taking its own old handshakes'
/// places.
pub struct Gate {
    max: usize,
    per_peer_tcp: Option<usize>,
    per_peer_local: Option<usize>,
    open: Arc<AtomicUsize>,
    /// Per peer: its connections open and its allowance of new ones; an entry lives
    /// while a connection of it holds a place or its allowance is not full.
    peers: HashMap<Arc<str>, Peer>,
    exports: Arc<ExportPlaces>,
}

/// One peer as the gate counts it.
#[derive(Debug)]
struct Peer {
    /// Connections open (a place each).
    open: Arc<AtomicUsize>,
    /// New connections it may open now (at most `burst`), and when that was counted.
    allowance: f64,
    at: Nanos,
    /// Its burst of new connections, and their rate a second after it.
    burst: f64,
    rate: f64,
}

impl Peer {
    /// A peer seen first at `now`, with its whole burst.
    fn new(now: Nanos, (burst, rate): (f64, f64)) -> Peer {
        Peer {
            open: Arc::default(),
            allowance: burst,
            at: now,
            burst,
            rate,
        }
    }

    /// Its allowance at `now` (refilled, at most its burst).
    fn allowance_at(&self, now: Nanos) -> f64 {
        let gained = now.saturating_sub(self.at) as f64 * 1e-9 * self.rate;
        (self.allowance + gained).min(self.burst)
    }

    /// Whether it has nothing open and its whole allowance back (nothing to remember).
    fn idle(&self, now: Nanos) -> bool {
        Arc::strong_count(&self.open) == 1 && self.allowance_at(now) >= self.burst
    }
}

/// The exports as the handshake threads see them: what the codec offers (changed by the
/// control socket: an export added, drained, removed), whether each takes connections,
/// and its served connections under `server.max_connections_per_tenant` (a connection
/// takes its export's place when it selects it).
pub struct ExportPlaces {
    limit: usize,
    /// Per export: its served connections, and whether it takes new ones.
    places: RwLock<Vec<(Arc<AtomicUsize>, bool)>>,
    /// What the codec of a new connection offers (index: the tenant).
    infos: RwLock<Arc<Vec<ExportInfo>>>,
}

impl ExportPlaces {
    /// A place among `export`'s served connections, when it has one free.
    pub fn take(&self, export: usize) -> Option<Slot> {
        Slot::take(&self.places.read().expect("places")[export].0, self.limit)
    }

    /// Whether `export` takes connections (not drained or removed).
    pub fn is_open(&self, export: usize) -> bool {
        self.places.read().expect("places")[export].1
    }

    /// One more export (added while running), taking connections once
    /// [`Self::set_infos`] offers it.
    pub fn add(&self) {
        self.places
            .write()
            .expect("places")
            .push((Arc::default(), true));
    }

    /// Whether `export` takes new connections.
    pub fn set_open(&self, export: usize, open: bool) {
        self.places.write().expect("places")[export].1 = open;
    }

    /// The exports a new connection's codec offers.
    pub fn infos(&self) -> Arc<Vec<ExportInfo>> {
        self.infos.read().expect("infos").clone()
    }

    /// Offers `infos` to the connections that start from now on.
    pub fn set_infos(&self, infos: Vec<ExportInfo>) {
        *self.infos.write().expect("infos") = Arc::new(infos);
    }

    /// `server.max_connections_per_tenant`.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// The exports `config` offers, in tenant order (every one offered).
pub fn infos_of(config: &ServerConfig) -> Vec<ExportInfo> {
    config
        .tenants
        .iter()
        .enumerate()
        .map(|(i, t)| ExportInfo {
            description: t.description.clone(),
            default: config.default_export == Some(i),
            ..ExportInfo::new(t.spec.name.clone(), t.size, t.read_only)
        })
        .collect()
}

/// What the gate says of a new connection.
#[must_use]
#[derive(Debug)]
pub enum Entry {
    /// Let in with its places (given back as they drop); `evicted`: in the place of the
    /// connection longest in its handshake, which the caller closed.
    In {
        /// Its places under `max_connections` and its peer's limit.
        places: Vec<Slot>,
        /// Whether a handshake was closed for it.
        evicted: bool,
    },
    /// Closed at accept: its peer has `limit` connections open.
    PeerFull {
        /// The peer's limit.
        limit: usize,
    },
    /// Closed at accept: its peer opens new connections faster than `per_second` (after
    /// a burst of twice that).
    PeerTooFast {
        /// The rate a peer's new connections are let in at.
        per_second: usize,
        /// How many it may open at once.
        burst: usize,
    },
    /// Closed at accept: `max_connections` reached, and no handshake to close for it
    /// (every connection is served, or too many closed ones have not ended yet).
    Full,
}

impl Gate {
    /// A gate for `max` connections at once, `per_peer_tcp` and `per_peer_local` for one
    /// TCP address or one local process, and `per_export` served connections for each of
    /// `exports` exports.
    pub fn new(
        max: usize,
        (per_peer_tcp, per_peer_local): (Option<usize>, Option<usize>),
        per_export: usize,
        exports: usize,
    ) -> Gate {
        let below_cap = |l: Option<usize>| l.filter(|&l| l < max);
        Gate {
            max,
            per_peer_tcp: below_cap(per_peer_tcp),
            per_peer_local: below_cap(per_peer_local),
            open: Arc::new(AtomicUsize::new(0)),
            peers: HashMap::new(),
            exports: Arc::new(ExportPlaces {
                limit: per_export,
                places: RwLock::new((0..exports).map(|_| (Arc::default(), true)).collect()),
                infos: RwLock::new(Arc::new(Vec::new())),
            }),
        }
    }

    /// The gate `config` describes.
    pub fn of(config: &ServerConfig) -> Gate {
        Gate::new(
            config.max_connections as usize,
            (
                config.max_connections_per_peer.map(|n| n as usize),
                Some(config.local_peer_limit() as usize),
            ),
            config.max_connections_per_tenant as usize,
            config.tenants.len(),
        )
        .offering(infos_of(config))
    }

    /// Offers `infos` to new connections.
    pub fn offering(self, infos: Vec<ExportInfo>) -> Gate {
        self.exports.set_infos(infos);
        self
    }

    /// A new connection from `peer` (`local`: on the Unix socket) at `now`;
    /// `evict_oldest` closes the connection longest in its handshake, false when there
    /// is none.
    pub fn arrive(
        &mut self,
        peer: &Arc<str>,
        local: bool,
        now: Nanos,
        evict_oldest: impl FnOnce() -> bool,
    ) -> Entry {
        let limit = if local {
            self.per_peer_local
        } else {
            self.per_peer_tcp
        };
        if !self.peers.contains_key(peer) && self.peers.len() >= MAX_PACED_PEERS {
            self.forget_fullest(now);
        }
        let pace = Self::pace(limit.unwrap_or(self.max));
        let entry = self
            .peers
            .entry(peer.clone())
            .or_insert_with(|| Peer::new(now, pace));
        entry.allowance = entry.allowance_at(now);
        entry.at = entry.at.max(now);
        if entry.allowance < 1.0 {
            return Entry::PeerTooFast {
                per_second: entry.rate as usize,
                burst: entry.burst as usize,
            };
        }
        let peer_place = match limit {
            Some(limit) => match Slot::take(&entry.open, limit) {
                Some(place) => Some(place),
                None => return Entry::PeerFull { limit },
            },
            None => None,
        };
        let (place, evicted) = match Slot::take(&self.open, self.max) {
            Some(place) => (place, false),
            None => match Slot::take(&self.open, self.max + EVICTION_ALLOWANCE) {
                Some(over) if evict_oldest() => (over, true),
                _ => return Entry::Full,
            },
        };
        // Counted only when let in: refusals cost a peer nothing more, so a client that
        // backs off gets back in as the allowance refills.
        entry.allowance -= 1.0;
        Entry::In {
            places: [Some(place), peer_place].into_iter().flatten().collect(),
            evicted,
        }
    }

    /// A peer's burst of new connections and their rate a second, from its limit of
    /// open ones.
    fn pace(limit: usize) -> (f64, f64) {
        let limit = limit.max(1) as f64;
        (BURST_OF_LIMIT * limit, limit)
    }

    /// Room for one more peer: one with nothing open is forgotten first, the one with
    /// the most allowance among them.
    fn forget_fullest(&mut self, now: Nanos) {
        let score = |p: &Peer| (Arc::strong_count(&p.open) == 1, p.allowance_at(now));
        if let Some(key) = self
            .peers
            .iter()
            .max_by(|a, b| {
                let (x, y) = (score(a.1), score(b.1));
                x.0.cmp(&y.0).then(x.1.total_cmp(&y.1))
            })
            .map(|(k, _)| k.clone())
        {
            self.peers.remove(&key);
        }
    }

    /// Forgets peers with no connection open and their whole allowance back.
    pub fn tidy(&mut self, now: Nanos) {
        self.peers.retain(|_, p| !p.idle(now));
    }

    /// The exports' places, for the handshakes.
    pub fn exports(&self) -> &Arc<ExportPlaces> {
        &self.exports
    }

    /// Connections open (handshaking or served).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Peers the gate counts.
    #[cfg(test)]
    pub fn peers(&self) -> usize {
        self.peers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gate in virtual time: a local process past its limit is refused while others
    /// are let in; a peer limit at the cap is none; at the cap the oldest handshake makes
    /// room up to the allowance, past which nobody is evicted; places come back on drop.
    #[test]
    fn the_gate_admits_evicts_and_refuses_as_documented() {
        let a: Arc<str> = "local pid 1 (uid 0)".into();
        let b: Arc<str> = "local pid 2 (uid 0)".into();
        let mut gate = Gate::new(4, (None, Some(2)), 3, 2);
        // A second between arrivals: no peer is paced here.
        let clock = std::cell::Cell::new(0);
        let tick = || {
            clock.set(clock.get() + 1_000_000_000);
            clock.get()
        };
        let never = || -> bool { panic!("nobody is evicted below the cap") };
        let mut held = Vec::new();
        for _ in 0..2 {
            match gate.arrive(&a, true, tick(), never) {
                Entry::In { places, evicted } => {
                    assert!(!evicted);
                    assert_eq!(places.len(), 2, "a global place and the peer's");
                    held.push(places);
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            gate.arrive(&a, true, tick(), never),
            Entry::PeerFull { limit: 2 }
        ));
        // Over TCP no peer limit is set: one place each.
        for _ in 0..2 {
            match gate.arrive(&b, false, tick(), never) {
                Entry::In { places, .. } => {
                    assert_eq!(places.len(), 1);
                    held.push(places);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(gate.open(), 4);
        // At the cap: a handshake to close lets the new one in, over the cap.
        let mut evictions = 0;
        let mut over = Vec::new();
        for _ in 0..EVICTION_ALLOWANCE {
            match gate.arrive(&b, false, tick(), || {
                evictions += 1;
                true
            }) {
                Entry::In { places, evicted } => {
                    assert!(evicted);
                    over.push(places);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(evictions, EVICTION_ALLOWANCE);
        // Past the allowance: closed, and nobody evicted for it.
        assert!(matches!(gate.arrive(&b, false, tick(), never), Entry::Full));
        over.clear();
        // Every connection served: nothing to evict, closed.
        assert!(matches!(
            gate.arrive(&b, false, tick(), || false),
            Entry::Full
        ));
        assert_eq!(gate.open(), 4, "a refused connection holds no place");
        held.clear();
        assert_eq!(gate.open(), 0);
        gate.tidy(tick());
        assert_eq!(gate.peers(), 0, "peers with nothing open are forgotten");
        // A peer limit at or over the cap is none.
        let mut gate = Gate::new(2, (Some(2), Some(5)), 2, 1);
        for local in [true, false] {
            match gate.arrive(&a, local, tick(), never) {
                Entry::In { places, .. } => assert_eq!(places.len(), 1),
                other => panic!("{other:?}"),
            }
        }
        // Exports' places.
        let first = gate.exports().take(0);
        let second = gate.exports().take(0);
        assert!(first.is_some() && second.is_some());
        assert!(gate.exports().take(0).is_none());
        drop(first);
        assert!(gate.exports().take(0).is_some());
    }

    /// In virtual time: a process that opens connections and drops them gets twice its
    /// limit at once, then its limit a second; refusals cost it nothing more; another
    /// process is let in all along; the table of paced peers stays bounded and forgets
    /// a peer once its allowance is whole again.
    #[test]
    fn a_peers_new_connections_are_paced() {
        const S: Nanos = 1_000_000_000;
        let flooder: Arc<str> = "local pid 7 (uid 0)".into();
        let other: Arc<str> = "local pid 8 (uid 0)".into();
        let mut gate = Gate::new(256, (None, Some(4)), 16, 1);
        let no = || -> bool { panic!("nobody is evicted below the cap") };
        let let_in = |gate: &mut Gate, peer: &Arc<str>, at: Nanos| {
            match gate.arrive(peer, true, at, no) {
                Entry::In { .. } => true, // dropped at once: its places come back
                Entry::PeerTooFast { per_second, burst } => {
                    assert_eq!((per_second, burst), (4, 8));
                    false
                }
                e => panic!("{e:?}"),
            }
        };
        let burst = (0..100).filter(|_| let_in(&mut gate, &flooder, 0)).count();
        assert_eq!(burst, 8, "twice its limit at once");
        assert!(let_in(&mut gate, &other, 0), "another process is let in");
        // Refused tries do not push its allowance back: a quarter second later, one.
        let later = (0..100)
            .filter(|_| let_in(&mut gate, &flooder, S / 4))
            .count();
        assert_eq!(later, 1);
        let second = (0..100)
            .filter(|_| let_in(&mut gate, &flooder, S / 4 + S))
            .count();
        assert_eq!(second, 4, "its limit a second");
        gate.tidy(S / 4 + S);
        assert_eq!(
            gate.peers(),
            1,
            "the flooder is owed allowance, the other not"
        );
        gate.tidy(10 * S);
        assert_eq!(gate.peers(), 0, "whole again: forgotten");
        // Bounded: peers past the table's size take the place of whole ones.
        for i in 0..(MAX_PACED_PEERS + 10) {
            let p: Arc<str> = format!("10.0.{}.{}", i / 256, i % 256).into();
            assert!(matches!(
                gate.arrive(&p, false, 20 * S, no),
                Entry::In { .. }
            ));
        }
        assert!(gate.peers() <= MAX_PACED_PEERS);
    }
}
