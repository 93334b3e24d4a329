//! A front of a shared cluster, live (`[cluster]` in `serve`'s configuration): several
//! `ioshare serve` processes, one per host, whose tenants' volumes share one store
//! (a Ceph cluster through the rbd backend), keep one set of weights, reservations and
//! limits per *tenant*, across fronts. The decisions are [`crate::limits::share`]'s
//! (a replica of the governor on every front, each tenant's global limits split across
//! the fronts by demand; its docs say why and how); this file is their live driver:
//! every period it reads the tenants' counters (the server's `LiveStats`: what passed this front
//! and how long the backend took), makes this front's report, sends it to every peer
//! over UDP, takes the reports that came in, and hands the engine each local tenant's
//! part of its limits, which the `limited` policy (the throttle's gate) enforces.
//!
//! **Reading: a small protocol between fronts, not the cluster.** Writing the reports
//! into the cluster (an object per front, watched) would need no addresses, but a
//! period of 100 ms is a write and N reads a period through the same OSDs the tenants
//! are waiting for, and a cluster in trouble would take the exchange down with it. A
//! report is one UDP datagram (JSON, versioned, validated on receipt: a bad one is
//! logged and dropped, never trusted); reports carry cumulative counters, so a lost one
//! costs nothing but a period's freshness. A peer that stays silent keeps its last
//! allocation and is dropped after `gone_after` periods; a front that hears nobody
//! never raises a limit (the exchange's docs).
//!
//! Each local export is one cluster tenant's volume on this front (its name is the
//! tenant's), at most one per tenant and front.

use super::config::ServerConfig;
use super::engine::EngineHandle;
use super::stats::LiveStats;
use crate::config::{Invalid, QosFields};
use crate::limits::governor::{DeviceUsage, Limits, Usage};
use crate::limits::share::{FrontId, FrontShare, ShareParams};
use crate::types::{Nanos, Slo, TenantId, TenantSpec, secs_to_nanos};
use serde::Deserialize;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most bytes a report may take: one UDP datagram.
const MAX_DATAGRAM: usize = 65_507;

/// The most tenants one front may serve: their report must fit one datagram (a tenant
/// takes ~120 bytes of JSON with counters in the billions).
pub const MAX_FRONT_TENANTS: usize = 256;

/// `[cluster]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClusterFile {
    front: Option<FrontId>,
    listen: Option<String>,
    #[serde(default)]
    peers: Vec<String>,
    period_ms: Option<f64>,
    latency_target_ms: Option<f64>,
    #[serde(default)]
    tenant: Vec<ClusterTenantFile>,
}

/// `[[cluster.tenant]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterTenantFile {
    name: String,
    weight: Option<f64>,
    slo: Option<Slo>,
    reservation_iops: Option<f64>,
    limit_iops: Option<f64>,
}

/// `[cluster]`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// This front's id, unique in the cluster.
    pub front: FrontId,
    /// The UDP address reports arrive on.
    pub listen: String,
    /// The other fronts' addresses.
    pub peers: Vec<String>,
    /// The exchange's period, ns.
    pub period: Nanos,
    /// The cluster's mean latency above which it counts as congested (PARDA's
    /// threshold), ns; `None`: the governor's default for the cost model.
    pub latency_target: Option<Nanos>,
    /// Every tenant of the cluster, in the same order on every front (their ids).
    pub tenants: Vec<TenantSpec>,
}

/// `[cluster]`, checked on its own (the exports are checked against it by
/// [`check_exports`]).
pub(crate) fn cluster_section(f: ClusterFile) -> Result<ClusterConfig, Invalid> {
    let front = f.front.ok_or_else(|| {
        Invalid::new(
            "cluster.front",
            "needed: this front's id, unique in the cluster",
        )
    })?;
    let listen = f.listen.ok_or_else(|| {
        Invalid::new(
            "cluster.listen",
            "needed: the UDP address the other fronts send their reports to (e.g. \"0.0.0.0:7400\")",
        )
    })?;
    let period_ms = f.period_ms.unwrap_or(100.0);
    if !(10.0..=10_000.0).contains(&period_ms) {
        return Err(Invalid::new(
            "cluster.period_ms",
            format!("must be 10 ..= 10000, got {period_ms}"),
        ));
    }
    let latency_target = match f.latency_target_ms {
        Some(ms) if !(0.05..=10_000.0).contains(&ms) => {
            return Err(Invalid::new(
                "cluster.latency_target_ms",
                format!("must be 0.05 ..= 10000, got {ms}"),
            ));
        }
        ms => ms.map(|ms| secs_to_nanos(ms / 1000.0)),
    };
    if f.tenant.is_empty() {
        return Err(Invalid::new(
            "cluster.tenant",
            "no [[cluster.tenant]]: list every tenant of the cluster, in the same order on every front",
        ));
    }
    if f.tenant.len() > crate::server::config::MAX_TENANTS {
        return Err(Invalid::new(
            "cluster.tenant",
            format!("at most {} tenants", crate::server::config::MAX_TENANTS),
        ));
    }
    let mut tenants: Vec<TenantSpec> = Vec::new();
    for (i, t) in f.tenant.into_iter().enumerate() {
        let field = format!("cluster.tenant[{}] ('{}')", i + 1, t.name);
        if t.name.is_empty() || tenants.iter().any(|x| x.name == t.name) {
            return Err(Invalid::new(
                field,
                "needs a name no other cluster tenant has",
            ));
        }
        let spec = QosFields {
            weight: t.weight,
            slo: t.slo,
            reservation_iops: t.reservation_iops,
            limit_iops: t.limit_iops,
        }
        .spec(&t.name)
        .map_err(|e| e.within(&field))?;
        tenants.push(spec);
    }
    Ok(ClusterConfig {
        front,
        listen,
        peers: f.peers,
        period: secs_to_nanos(period_ms / 1000.0),
        latency_target,
        tenants,
    })
}

/// Each export's cluster tenant: its name must be one, at most one export a tenant,
/// and the promise is the cluster's (an export's own weight, SLO, reservation or limit
/// would be a second, conflicting one). Answers the exports' specs replaced by the
/// cluster's.
pub(crate) fn check_exports(
    cluster: &ClusterConfig,
    exports: &[(String, bool)],
) -> Result<Vec<TenantSpec>, Invalid> {
    if exports.len() > MAX_FRONT_TENANTS {
        return Err(Invalid::new(
            "tenant",
            format!(
                "a cluster front serves at most {MAX_FRONT_TENANTS} exports (its report is one datagram)"
            ),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    exports
        .iter()
        .enumerate()
        .map(|(i, (name, own_promise))| {
            let field = format!("tenant {} ('{name}')", i + 1);
            let spec = cluster
                .tenants
                .iter()
                .find(|t| &t.name == name)
                .ok_or_else(|| {
                    Invalid::new(
                        &field,
                        "is no [[cluster.tenant]]: a front's exports are the cluster tenants' volumes, named as the tenant",
                    )
                })?;
            if *own_promise {
                return Err(Invalid::new(
                    &field,
                    "a cluster tenant's weight, slo, reservation_iops and limit_iops are its [[cluster.tenant]]'s, for every front",
                ));
            }
            if !seen.insert(name.clone()) {
                return Err(Invalid::new(&field, "a second export of the same cluster tenant"));
            }
            Ok(spec.clone())
        })
        .collect()
}

/// Why the front could not start.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    /// The listening socket.
    #[error("cluster.listen {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// A peer's address does not resolve.
    #[error("cluster.peers: '{addr}': {why}")]
    Peer {
        /// The address.
        addr: String,
        /// Why.
        why: String,
    },
}

/// The front's exchange, bound and ready to run on a thread of its own.
pub struct Front {
    socket: UdpSocket,
    peers: Vec<SocketAddr>,
    share: FrontShare,
    /// Each local export's cluster tenant, by export id.
    tenant_of: Vec<TenantId>,
    stats: Arc<LiveStats>,
    engine: EngineHandle,
    clock: Instant,
}

impl Front {
    /// Binds `cluster.listen` and resolves the peers (errors name the address).
    pub fn bind(
        config: &ServerConfig,
        cluster: &ClusterConfig,
        stats: Arc<LiveStats>,
        engine: EngineHandle,
        clock: Instant,
    ) -> Result<Front, FrontError> {
        let socket = UdpSocket::bind(&cluster.listen).map_err(|source| FrontError::Listen {
            addr: cluster.listen.clone(),
            source,
        })?;
        let peers = cluster
            .peers
            .iter()
            .map(|p| {
                p.to_socket_addrs()
                    .map_err(|e| e.to_string())
                    .and_then(|mut a| a.next().ok_or_else(|| "no address".to_string()))
                    .map_err(|why| FrontError::Peer {
                        addr: p.clone(),
                        why,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let tenant_of: Vec<TenantId> = config
            .tenants
            .iter()
            .map(|t| {
                cluster
                    .tenants
                    .iter()
                    .position(|c| c.name == t.spec.name)
                    .expect("checked by the configuration") as TenantId
            })
            .collect();
        let cost = config.cost_model(None);
        let mut params = ShareParams::for_cluster(&cost);
        params.governor.period = cluster.period;
        if let Some(target) = cluster.latency_target {
            params.governor.target = target;
        }
        let share = FrontShare::new(
            cluster.front,
            &cluster.tenants,
            &tenant_of,
            cost,
            params,
            peers.len() + 1,
        );
        Ok(Front {
            socket,
            peers,
            share,
            tenant_of,
            stats,
            engine,
            clock,
        })
    }

    fn now(&self) -> Nanos {
        self.clock.elapsed().as_nanos() as Nanos
    }

    /// Runs the exchange on a thread of its own (`front`) until the engine stops.
    pub fn spawn(self) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("front".into())
            .spawn(move || self.run())
            .map(drop)
    }

    /// Runs the exchange until the engine stops; then tells the peers this front
    /// leaves.
    pub fn run(mut self) {
        let period = self.share.period();
        let mut next = self.now() + period;
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let mut refused_logged: Option<Nanos> = None;
        loop {
            // Reports until the period's end.
            loop {
                let now = self.now();
                if now >= next {
                    break;
                }
                let wait = Duration::from_nanos((next - now).max(1_000_000));
                let _ = self.socket.set_read_timeout(Some(wait));
                match self.socket.recv_from(&mut buf) {
                    Ok((n, from)) => {
                        if let Err(e) = self.share.receive_bytes(&buf[..n], self.now())
                            && refused_logged.is_none_or(|at| now >= at + 10_000_000_000)
                        {
                            tracing::warn!(
                                "cluster: a report from {from} refused: {e} (said at most every 10 s)"
                            );
                            refused_logged = Some(now);
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(e) => {
                        tracing::warn!("cluster: receiving reports: {e}");
                        std::thread::sleep(wait);
                    }
                }
            }
            let now = self.now();
            next += period;
            if next <= now {
                // Late (a stalled host): the next period from now, not a burst.
                next = now + period;
            }
            let stopping = !self.tick(now, false);
            if stopping {
                let _ = self.tick(self.now(), true);
                return;
            }
        }
    }

    /// One period: the report made and sent, the decision handed to the engine.
    /// `false` once the engine is gone.
    fn tick(&mut self, now: Nanos, leaving: bool) -> bool {
        let counters = self.stats.snapshot();
        let mut device = DeviceUsage::default();
        let mut tenants = Vec::with_capacity(self.tenant_of.len());
        for (export, &tenant) in self.tenant_of.iter().enumerate() {
            let c = &counters[export];
            let usage = Usage {
                read_ios: c.reads,
                write_ios: c.writes,
                read_bytes: c.read_bytes,
                write_bytes: c.written_bytes,
            };
            tenants.push((tenant, usage, c.queued() > 0));
            device.ios += c.reads + c.writes;
            device.writes += c.writes;
            device.latency_ns += c.backend_read_ns + c.backend_write_ns;
            device.write_ns += c.backend_write_ns;
        }
        let report = self.share.report(&tenants, device, leaving, now);
        let bytes = report.encode();
        for p in &self.peers {
            // A peer that is down is the exchange's business (stale, then gone).
            let _ = self.socket.send_to(&bytes, p);
        }
        if leaving {
            return false;
        }
        self.share.decide(now);
        let limits: Vec<(TenantId, Limits)> = self
            .tenant_of
            .iter()
            .enumerate()
            .map(|(export, &tenant)| (export as TenantId, self.share.limits(tenant)))
            .collect();
        self.engine.set_limits(limits)
    }
}

#[cfg(test)]
mod tests {
    use crate::server::config::ServerConfig;
    use std::path::Path;

    fn parse(text: &str) -> Result<ServerConfig, String> {
        ServerConfig::parse(text, Path::new("/srv")).map_err(|e| e.to_string())
    }

    const CLUSTER: &str = r#"
        [cluster]
        front = 2
        listen = "127.0.0.1:7402"
        peers = ["127.0.0.1:7401", "127.0.0.1:7403"]
        latency_target_ms = 5
        [[cluster.tenant]]
        name = "a"
        weight = 1
        [[cluster.tenant]]
        name = "b"
        weight = 4
        reservation_iops = 100
        limit_iops = 2000
    "#;

    /// An export takes its cluster tenant's promise; the policy is the fronts' limits.
    #[test]
    fn exports_are_cluster_tenants_volumes() {
        let c = parse(&format!(
            "{CLUSTER}\n[[tenant]]\nname = \"b\"\nfile = \"b.img\"\nsize = \"1g\"\n"
        ))
        .unwrap();
        let cluster = c.cluster.as_ref().unwrap();
        assert_eq!((cluster.front, cluster.period), (2, 100_000_000));
        assert_eq!(cluster.latency_target, Some(5_000_000));
        assert_eq!(cluster.tenants.len(), 2);
        assert_eq!(c.tenants[0].spec.weight, 4.0);
        assert_eq!(c.tenants[0].spec.limit_iops, Some(2000.0));
        assert_eq!(c.policy.name, "limited");
    }

    /// What does not fit a front is refused, naming the field.
    #[test]
    fn errors_name_what_is_wrong() {
        let with = |export: &str| {
            parse(&format!(
                "{CLUSTER}\n[[tenant]]\n{export}\nfile = \"x.img\"\nsize = \"1g\"\n"
            ))
            .unwrap_err()
        };
        let e = with("name = \"c\"");
        assert!(
            e.contains("'c'") && e.contains("no [[cluster.tenant]]"),
            "{e}"
        );
        let e = with("name = \"a\"\nweight = 3");
        assert!(e.contains("[[cluster.tenant]]'s, for every front"), "{e}");
        let e = parse(&format!(
            "[server]\npolicy = \"mclock\"\n{CLUSTER}\n[[tenant]]\nname = \"a\"\nfile = \"x.img\"\nsize = \"1g\"\n"
        ))
        .unwrap_err();
        assert!(e.contains("server.policy") && e.contains("limited"), "{e}");
        let e = parse(&format!(
            "{CLUSTER}\n[[tenant]]\nname = \"a\"\nfile = \"x.img\"\nsize = \"1g\"\n[[tenant]]\nname = \"a2\"\nfile = \"y.img\"\nsize = \"1g\"\n"
        ))
        .unwrap_err();
        assert!(e.contains("'a2'"), "{e}");
        let e = parse("[cluster]\nlisten = \"127.0.0.1:1\"\n[[cluster.tenant]]\nname = \"a\"\n[[tenant]]\nname = \"a\"\nfile = \"x\"\nsize = \"1g\"\n").unwrap_err();
        assert!(e.contains("cluster.front"), "{e}");
        let e = parse("[cluster]\nfront = 1\nlisten = \"127.0.0.1:1\"\nperiod_ms = 1\n[[cluster.tenant]]\nname = \"a\"\n[[tenant]]\nname = \"a\"\nfile = \"x\"\nsize = \"1g\"\n").unwrap_err();
        assert!(e.contains("cluster.period_ms"), "{e}");
        let e = parse("[cluster]\nfront = 1\nlisten = \"127.0.0.1:1\"\nlatency_target_ms = 0\n[[cluster.tenant]]\nname = \"a\"\n[[tenant]]\nname = \"a\"\nfile = \"x\"\nsize = \"1g\"\n").unwrap_err();
        assert!(e.contains("cluster.latency_target_ms"), "{e}");
        let e = parse("[cluster]\nfront = 1\nlisten = \"127.0.0.1:1\"\n[[cluster.tenant]]\nname = \"a\"\nweight = -1\n[[tenant]]\nname = \"a\"\nfile = \"x\"\nsize = \"1g\"\n").unwrap_err();
        assert!(
            e.contains("cluster.tenant[1] ('a')") && e.contains("weight"),
            "{e}"
        );
    }

    /// A front's exports are fixed: adding one while running is refused, saying why.
    #[test]
    fn no_export_is_added_to_a_front() {
        let c = parse(&format!(
            "{CLUSTER}\n[[tenant]]\nname = \"a\"\nfile = \"a.img\"\nsize = \"1g\"\n"
        ))
        .unwrap();
        let table: toml::Table =
            toml::from_str("name = \"b\"\nfile = \"b.img\"\nsize = \"1g\"\n").unwrap();
        let e = c
            .tenant_to_add(table, Path::new("/srv"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cluster front"), "{e}");
    }
}
