//! The accepting side's decisions, sans-I/O ([`Gate`]): which places a new connection
//! takes under `server.max_connections` and its peer's limit, whether the connection
//! longest in its handshake makes room for it, and its export's place
//! (`server.max_connections_per_tenant`) once it selects one. The accept loop
//! ([`super`]) and the fault swarm ([`super::swarm`]) both ask it; the shell owns the
//! sockets and closes what the gate says to close.

use super::config::ServerConfig;
use super::conn::Slot;
use crate::nbd::ExportInfo;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// Connections over `server.max_connections` while the handshakes closed for them end.
pub const EVICTION_ALLOWANCE: usize = 64;

/// The accepting side's decisions, sans-I/O: the places a new connection takes under
/// `server.max_connections` and its peer's limit, whether the connection longest in its
/// handshake makes room for it, and its export's place once it selects one. The accept
/// loop and the fault swarm (`swarm.rs`) both ask it.
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
    /// Connections open per peer; an entry lives while a connection of it holds a place.
    peers: HashMap<Arc<str>, Arc<AtomicUsize>>,
    exports: Arc<ExportPlaces>,
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

    /// A new connection from `peer` (`local`: on the Unix socket); `evict_oldest` closes
    /// the connection longest in its handshake, false when there is none.
    pub fn arrive(
        &mut self,
        peer: &Arc<str>,
        local: bool,
        evict_oldest: impl FnOnce() -> bool,
    ) -> Entry {
        let limit = if local {
            self.per_peer_local
        } else {
            self.per_peer_tcp
        };
        let peer_place = match limit {
            Some(limit) => {
                let count = self.peers.entry(peer.clone()).or_default();
                match Slot::take(count, limit) {
                    Some(place) => Some(place),
                    None => return Entry::PeerFull { limit },
                }
            }
            None => None,
        };
        let (place, evicted) = match Slot::take(&self.open, self.max) {
            Some(place) => (place, false),
            None => match Slot::take(&self.open, self.max + EVICTION_ALLOWANCE) {
                Some(over) if evict_oldest() => (over, true),
                _ => return Entry::Full,
            },
        };
        Entry::In {
            places: [Some(place), peer_place].into_iter().flatten().collect(),
            evicted,
        }
    }

    /// Forgets peers with no connection open.
    pub fn tidy(&mut self) {
        self.peers.retain(|_, count| Arc::strong_count(count) > 1);
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
        let never = || -> bool { panic!("nobody is evicted below the cap") };
        let mut held = Vec::new();
        for _ in 0..2 {
            match gate.arrive(&a, true, never) {
                Entry::In { places, evicted } => {
                    assert!(!evicted);
                    assert_eq!(places.len(), 2, "a global place and the peer's");
                    held.push(places);
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            gate.arrive(&a, true, never),
            Entry::PeerFull { limit: 2 }
        ));
        // Over TCP no peer limit is set: one place each.
        for _ in 0..2 {
            match gate.arrive(&b, false, never) {
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
            match gate.arrive(&b, false, || {
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
        assert!(matches!(gate.arrive(&b, false, never), Entry::Full));
        over.clear();
        // Every connection served: nothing to evict, closed.
        assert!(matches!(gate.arrive(&b, false, || false), Entry::Full));
        assert_eq!(gate.open(), 4, "a refused connection holds no place");
        held.clear();
        assert_eq!(gate.open(), 0);
        gate.tidy();
        assert_eq!(gate.peers(), 0, "peers with nothing open are forgotten");
        // A peer limit at or over the cap is none.
        let mut gate = Gate::new(2, (Some(2), Some(5)), 2, 1);
        for local in [true, false] {
            match gate.arrive(&a, local, never) {
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
}
