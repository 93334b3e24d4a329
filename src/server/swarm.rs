//! The live engine's core (`server::core`) run on a simulated network and disk with
//! faults, one seed at a time: a deterministic simulation in virtual time in which every
//! byte a client sends, every socket return and every file operation comes from a seeded
//! generator, so a failing seed replays exactly (`ioshare engine-swarm --seed N`).
//!
//! A seed draws a scenario ([`Scenario`]): a policy, 1–4 tenants, the device queue,
//! `queue_limit`, a memory budget small enough to bind, cache modes, tenants whose store
//! is an image (the rbd backend's parts: no host cache, no short transfers, durable when
//! acknowledged) rather than a file, an emulated device model or none (a fixed one that answers at once, a disk that decides later),
//! configuration reloads, and clients that
//! behave well or do not — slow readers, clients that never read their replies, clients
//! that vanish in the middle of a write's payload, clients that send garbage. The
//! network shortens receives and sends and resets connections; the disk shortens
//! transfers, fails them with `EIO` or `ENOSPC`, has latency spikes, and may crash
//! (what was not synced is kept or lost sector by sector: torn writes).
//!
//! Properties, checked after every event:
//! * **memory**: the bytes connections hold stay within `max_inflight_bytes` plus the one
//!   small request each connection holding nothing may take (`EngineCore::memory_bound`);
//! * **replies**: every reply names a request its connection has outstanding; no error
//!   but what a fault explains (`EIO`/`ENOSPC` at most as often as the disk failed that
//!   tenant's operations, `ESHUTDOWN` only once draining); read data is what some write
//!   not yet superseded put there;
//! * **isolation**: every well-behaved client finishes its requests before the time
//!   limit, whatever the hostile clients of its own or other tenants do; and is given a
//!   connection: a flood of idle connections from one peer for one export (twice that
//!   export's share of `max_connections` and more) is held to its export's share and
//!   its peer's limit, as the accepting side holds it, and never takes another export's
//!   place; every place is given back once its connection closes;
//! * **liveness**: after the drain starts, the core is done (every admitted request
//!   answered or its connection closed) by the drain deadline plus the send grace;
//! * **durability**: after a crash, every sector holds a write at least as new as the
//!   newest one the clients were promised was durable (FUA, or acknowledged before a
//!   flush that was acknowledged).

use super::backend::Store;
use super::budget;
use super::core::{CoreConfig, CoreTenant, EngineCore, Intent, SEND_GRACE};
use super::stats::LiveStats;
use crate::host::Refuse;
use crate::io::transfer::{Cache, FileOp, Part, Target};
use crate::journal::JournalParams;
use crate::nbd::{ExportInfo, ServerCodec, proto};
use crate::types::{Nanos, Slo, TenantSpec};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

/// Bytes a sector: the unit in which crashes tear.
const SECTOR: u64 = 512;
/// The unit in which written data names its write, and in which the simulated disk
/// shortens transfers.
const UNIT: u64 = 16;
/// What a socket holds towards a client that does not read (its send buffer).
const WINDOW: usize = 64 << 10;
/// Well-behaved clients must be done by then (virtual time).
const TIME_LIMIT: Nanos = 120_000_000_000;
/// A millisecond.
const MS: Nanos = 1_000_000;

/// How a simulated client behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Sends its requests a few at a time, reads every reply, disconnects.
    Normal,
    /// As `Normal`, but reads its replies a few KiB a millisecond.
    SlowReader,
    /// Sends all its requests and never reads a reply.
    NeverReader,
    /// Vanishes in the middle of a write's payload.
    Vanisher,
    /// Sends a request with a bad magic after its requests.
    Garbage,
    /// Connects and sends nothing, ever (one of a flood of connections from one peer
    /// for one export).
    Idle,
}

/// One client of a scenario.
#[derive(Debug, Clone)]
pub struct ClientPlan {
    /// Its tenant.
    pub tenant: usize,
    /// What it does.
    pub behaviour: Behaviour,
    /// Requests it sends.
    pub requests: u32,
    /// Requests it has outstanding at most.
    pub depth: u32,
    /// When it connects.
    pub start: Nanos,
    /// Where it connects from (the per-peer limit counts by it).
    pub peer: String,
}

/// The device model an emulated backend runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// Fixed latency and bandwidth: every request's finish time is known at once.
    Fixed,
    /// The disk: it reorders its queue and decides later (`Submitted::Queued`).
    Disk,
}

impl Model {
    fn build(self) -> Box<dyn crate::device::DeviceModel> {
        match self {
            Model::Fixed => Box::new(crate::device::fixed::FixedDevice::new(Default::default())),
            Model::Disk => Box::new(crate::device::hdd::HddDevice::new(
                crate::device::hdd::preset("scsi-10k-73g")
                    .expect("the disk preset")
                    .params,
            )),
        }
    }
}

/// What a seed draws.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The seed.
    pub seed: u64,
    /// The policy.
    pub policy: &'static str,
    /// Bytes of each tenant's export.
    pub image: u64,
    /// The core's configuration.
    pub config: CoreConfig,
    /// The clients.
    pub clients: Vec<ClientPlan>,
    /// Probability that a file operation fails with `EIO`, or a write with `ENOSPC`.
    pub io_error: f64,
    /// Probability that a transfer or a socket operation moves fewer bytes than asked.
    pub short: f64,
    /// Probability that a file operation takes 50 ms instead of tens of microseconds.
    pub spike: f64,
    /// Probability that a receive finds the connection reset.
    pub reset: f64,
    /// When the disk crashes, if it does.
    pub crash_at: Option<Nanos>,
    /// Configuration reloads: when, which tenant, its new weight.
    pub reloads: Vec<(Nanos, usize, f64)>,
    /// The emulated backend's device model, if any: replies wait for its finish times
    /// as well as for the file I/O.
    pub model: Option<Model>,
    /// `server.max_connections`.
    pub max_connections: u32,
    /// `server.max_connections_per_peer`.
    pub per_peer: Option<u32>,
    /// Tenants whose store is an image (the rbd backend's kind: parts by
    /// [`crate::io::transfer::Transfer::next_part`], no host cache, no short transfers)
    /// rather than a file.
    pub images: Vec<bool>,
    /// Sectors of every read and write, when they are all of one size (the memory
    /// budget is then drawn just under a whole number of them, where an off-by-one
    /// shows).
    pub fixed_len: Option<u64>,
}

/// Half the runs make every read and write one size and draw the memory budget just
/// under a whole number of them (where an off-by-one shows): that size, in sectors.
fn draw_fixed_len(rng: &mut ChaCha8Rng, config: &mut CoreConfig) -> Option<u64> {
    let fixed_len = rng.random_bool(0.5).then(|| 8 * rng.random_range(1..=8u64));
    if let Some(n) = fixed_len {
        let held = budget::held_by((n * SECTOR) as u32);
        config.max_inflight_bytes =
            rng.random_range(2..=40) * held - u64::from(rng.random_bool(0.75));
    }
    fixed_len
}

/// Half the runs hold stalled tenants to a share of the queue (the live default), a
/// third answer requests the disk holds too long with `EIO`.
fn draw_backend_guards(rng: &mut ChaCha8Rng, config: &mut CoreConfig) {
    if rng.random_bool(0.5) {
        config.stall = Some(crate::host::Stall {
            after: rng.random_range(5..=200) * MS,
        });
    }
    if rng.random_bool(1.0 / 3.0) {
        config.backend_timeout = Some(rng.random_range(20..=120) * MS);
    }
}

/// A third of the tenants not under pdc (refused on images) are images; drawn from an
/// rng of their own, so the rest of every seed's scenario is what it was.
fn draw_images(seed: u64, config: &CoreConfig) -> Vec<bool> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x1b5d_0000_0000);
    config
        .tenants
        .iter()
        .map(|t| rng.random_bool(1.0 / 3.0) && t.cache != Cache::Pdc)
        .collect()
}

impl Scenario {
    /// The scenario of `seed`.
    pub fn draw(seed: u64) -> Scenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let names = crate::policy::names();
        let policy = names[rng.random_range(0..names.len())];
        let tenants = rng.random_range(1..=4usize);
        let image = 256 << 10;
        let caches = [Cache::Writeback, Cache::None, Cache::Pdc];
        let mut config = CoreConfig {
            queue_depth: rng.random_range(1..=8),
            queue_limit: rng.random_range(1..=8),
            refuse: Refuse::Hold,
            drain_timeout: rng.random_range(200..=2000) * MS,
            stall: None,
            backend_timeout: None,
            max_inflight_bytes: rng.random_range(64..=1024) << 10,
            pdc: JournalParams::default(),
            tenants: (0..tenants)
                .map(|t| CoreTenant {
                    name: format!("t{t}"),
                    size: image,
                    cache: caches[rng.random_range(0..3)],
                })
                .collect(),
            shards: 1 + (seed % 3) as usize, // the seed's, not the rng's: scenarios unchanged
        };
        let fixed_len = draw_fixed_len(&mut rng, &mut config);
        draw_backend_guards(&mut rng, &mut config);
        let mut clients = Vec::new();
        for tenant in 0..tenants {
            for _ in 0..rng.random_range(1..=3) {
                let behaviour = match rng.random_range(0..10) {
                    0..5 => Behaviour::Normal,
                    5 => Behaviour::SlowReader,
                    6 | 7 => Behaviour::NeverReader,
                    8 => Behaviour::Vanisher,
                    _ => Behaviour::Garbage,
                };
                clients.push(ClientPlan {
                    tenant,
                    behaviour,
                    requests: rng.random_range(10..=120),
                    depth: rng.random_range(1..=16),
                    start: rng.random_range(0..50) * MS,
                    peer: format!("peer{}", clients.len()),
                });
            }
        }
        let faulty = rng.random_bool(0.7);
        let images = draw_images(seed, &config);
        let mut sc = Scenario {
            seed,
            policy,
            image,
            config,
            clients,
            io_error: if faulty {
                rng.random_range(0.0..0.05)
            } else {
                0.0
            },
            short: if faulty {
                rng.random_range(0.0..0.3)
            } else {
                0.0
            },
            spike: if faulty {
                rng.random_range(0.0..0.02)
            } else {
                0.0
            },
            reset: if faulty {
                rng.random_range(0.0..0.01)
            } else {
                0.0
            },
            crash_at: rng
                .random_bool(0.35)
                .then(|| rng.random_range(20..400) * MS),
            images,
            fixed_len,
            reloads: (0..rng.random_range(0..4))
                .map(|_| {
                    (
                        rng.random_range(1..300) * MS,
                        rng.random_range(0..tenants),
                        rng.random_range(1..=8) as f64,
                    )
                })
                .collect(),
            model: match rng.random_range(0..4) {
                0 => Some(Model::Fixed),
                1 => Some(Model::Disk),
                _ => None,
            },
            max_connections: 0,
            per_peer: None,
        };
        sc.add_flood(&mut rng);
        sc
    }

    /// The connection limits, and in some seeds a flood of idle connections from one
    /// peer for one export: twice that export's share of `max_connections` and more.
    /// `max_connections` leaves the other clients room beside one export's share (the
    /// default `max_connections_per_tenant`), which is what the limit promises them.
    fn add_flood(&mut self, rng: &mut ChaCha8Rng) {
        let tenants = self.config.tenants.len();
        self.max_connections = 2 * self.clients.len() as u32 + 8;
        self.per_peer = rng.random_bool(0.5).then(|| rng.random_range(2..=6));
        if tenants >= 2 && rng.random_bool(0.5) {
            let tenant = rng.random_range(0..tenants);
            let share = super::config::default_per_tenant(self.max_connections, tenants);
            for _ in 0..2 * share + 2 {
                self.clients.push(ClientPlan {
                    tenant,
                    behaviour: Behaviour::Idle,
                    requests: 0,
                    depth: 1,
                    start: 0,
                    peer: "flood".into(),
                });
            }
        }
    }
}

/// What a seed's run did, when every property held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Requests clients sent.
    pub requests: u64,
    /// Replies clients read.
    pub replies: u64,
    /// Replies with an error.
    pub errors: u64,
    /// File operations the disk failed.
    pub faults: u64,
    /// Sectors checked after a crash.
    pub sectors_checked: u64,
    /// The disk crashed.
    pub crashed: bool,
    /// Connections the limits refused.
    pub refused: u64,
    /// Events handled.
    pub events: u64,
}

/// A property that did not hold, with the seed that replays it.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// What went wrong, when (virtual ns).
    pub what: String,
    /// The scenario, for the reader.
    pub scenario: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "engine swarm seed {}: {}\nreproduce: ioshare engine-swarm --seed {}\n{}",
            self.seed, self.what, self.seed, self.scenario
        )
    }
}

/// Runs seed `seed`.
pub fn run_seed(seed: u64) -> Result<Report, Failure> {
    run_scenario(Scenario::draw(seed), None)
}

/// Runs `seed` with a bug planted in the core (the swarm's own test).
#[cfg(test)]
pub(crate) fn run_planted(seed: u64, bug: super::core::Plant) -> Result<Report, Failure> {
    run_scenario(Scenario::draw(seed), Some(bug))
}

#[cfg(test)]
type PlantArg = Option<super::core::Plant>;
#[cfg(not(test))]
type PlantArg = Option<std::convert::Infallible>;

fn run_scenario(scenario: Scenario, plant: PlantArg) -> Result<Report, Failure> {
    let mut world = World::new(&scenario, plant);
    let result = world.run();
    let seed = scenario.seed;
    result.map(|()| world.report).map_err(|what| Failure {
        seed,
        what: format!("at {} µs: {what}", world.now / 1000),
        scenario: format!("{scenario:#?}"),
    })
}

/// A request a client waits on.
#[derive(Debug, Clone, Copy)]
enum Pending {
    Read {
        offset: u64,
        len: u32,
        sent: u64,
    },
    /// A write, trim or zeroing: its sectors, and when it was sent (which names its
    /// record in each sector's history).
    Change {
        first: u64,
        sectors: u64,
        sent: u64,
    },
    Flush {
        at: usize,
    },
}

/// What a change did to a sector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Wrote data identified by this write number (0: the initial zeroes).
    Write(u64),
    Zero,
    Trim,
}

/// One change to a sector, as its client saw it.
#[derive(Debug, Clone, Copy)]
struct Change {
    kind: Kind,
    fua: bool,
    sent: u64,
    acked: Option<u64>,
    ok: bool,
}

/// A flush as its client saw it.
#[derive(Debug, Clone, Copy)]
struct Flush {
    sent: u64,
    acked_ok: bool,
}

/// One simulated connection: the client and the socket between it and the core.
struct Client {
    plan: ClientPlan,
    slot: Option<usize>,
    /// Bytes on their way to the server, and to the client.
    to_server: VecDeque<u8>,
    to_client: VecDeque<u8>,
    /// The client closed its side (disconnected, vanished).
    closed: bool,
    /// The client is gone: sends to it fail.
    gone: bool,
    /// The server shut its reading side, or cut it.
    shut_read: bool,
    cut: bool,
    /// The server closed the connection.
    server_closed: bool,
    recv_pending: bool,
    send_pending: bool,
    issued: u32,
    next_handle: u64,
    outstanding: HashMap<u64, Pending>,
    /// Reply bytes read and not yet parsed.
    inbox: Vec<u8>,
    /// All its requests answered (well-behaved clients).
    done: bool,
    /// The next time it may read (slow readers).
    read_at: Nanos,
    /// Its places under the connection limits, given back when the server closes it.
    places: Vec<super::conn::Slot>,
}

impl Client {
    fn new(plan: &ClientPlan) -> Client {
        Client {
            plan: plan.clone(),
            slot: None,
            to_server: VecDeque::new(),
            to_client: VecDeque::new(),
            closed: false,
            gone: false,
            shut_read: false,
            cut: false,
            server_closed: false,
            recv_pending: false,
            send_pending: false,
            issued: 0,
            next_handle: 1,
            outstanding: HashMap::new(),
            inbox: Vec::new(),
            done: false,
            read_at: 0,
            places: Vec::new(),
        }
    }
}

/// The simulated disk: one file holding every tenant's export.
struct Disk {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Sectors whose current content may not be durable.
    dirty: std::collections::BTreeSet<u64>,
    /// Operations in flight: (when they return, order, request id).
    ops: BinaryHeap<Reverse<(Nanos, u64, u64)>>,
    order: u64,
}

struct World {
    rng: ChaCha8Rng,
    sc: Scenario,
    core: EngineCore,
    now: Nanos,
    clients: Vec<Client>,
    disk: Disk,
    /// Per tenant, per sector: its changes in the order they were sent.
    history: Vec<Vec<Vec<Change>>>,
    flushes: Vec<Vec<Flush>>,
    /// The core's counters (backend timeouts explain error replies too).
    stats: Arc<LiveStats>,
    /// Per tenant: error replies a disk fault explains, and those seen.
    faults: Vec<u64>,
    fault_replies: Vec<u64>,
    /// The clients' clock: every send and every reply takes a number.
    seq: u64,
    next_write: u64,
    drain_at: Option<Nanos>,
    /// Reloads up to this time were delivered.
    last_reload: Nanos,
    crashed: bool,
    report: Report,
    intents: Vec<Intent>,
    /// The accepting side's limits, as the server keeps them.
    gate: super::gate::Gate,
}

impl World {
    fn new(sc: &Scenario, plant: PlantArg) -> World {
        let tenants = sc.config.tenants.len();
        let specs: Vec<TenantSpec> = (0..tenants)
            .map(|t| TenantSpec {
                slo: Some(Slo::new(20_000.0, 4096, 50_000)),
                ..TenantSpec::weighted(format!("t{t}"), (t + 1) as f64)
            })
            .collect();
        let policy = crate::policy::build(sc.policy, Default::default(), &specs)
            .expect("every policy builds with its defaults");
        let stats = Arc::new(LiveStats::new(
            &specs
                .iter()
                .map(|s| (s.name.clone(), s.weight))
                .collect::<Vec<_>>(),
        ));
        let targets = (0..tenants)
            .map(|t| {
                if sc.images[t] {
                    return Some(Store::Image(t));
                }
                let cache = sc.config.tenants[t].cache;
                Some(Store::File(Target {
                    buffered: 3,
                    direct: (cache != Cache::Writeback).then_some(4),
                    base: t as u64 * sc.image,
                    cache,
                }))
            })
            .collect();
        #[allow(unused_mut)]
        let mut core = EngineCore::new(
            sc.config.clone(),
            targets,
            policy,
            crate::device::cost::CostModel::generic_ssd(),
            sc.model.map(Model::build),
            stats.clone(),
            None,
            false,
        );
        #[cfg(test)]
        if let Some(bug) = plant {
            core.plant(bug);
        }
        #[cfg(not(test))]
        let _ = plant;
        let size = (tenants as u64 * sc.image) as usize;
        let sectors = (sc.image / SECTOR) as usize;
        World {
            rng: ChaCha8Rng::seed_from_u64(sc.seed ^ 0x5157_4152_4d00),
            sc: sc.clone(),
            core,
            stats,
            now: 0,
            clients: sc.clients.iter().map(Client::new).collect(),
            disk: Disk {
                current: vec![0; size],
                durable: vec![0; size],
                dirty: Default::default(),
                ops: BinaryHeap::new(),
                order: 0,
            },
            history: vec![
                vec![
                    vec![Change {
                        kind: Kind::Write(0),
                        fua: true,
                        sent: 0,
                        acked: Some(0),
                        ok: true,
                    }];
                    sectors
                ];
                tenants
            ],
            flushes: vec![Vec::new(); tenants],
            faults: vec![0; tenants],
            fault_replies: vec![0; tenants],
            seq: 1,
            next_write: 1,
            drain_at: None,
            last_reload: 0,
            crashed: false,
            report: Report::default(),
            intents: Vec::new(),
            gate: super::gate::Gate::new(
                sc.max_connections as usize,
                (sc.per_peer.map(|n| n as usize), None),
                super::config::default_per_tenant(sc.max_connections, tenants) as usize,
                tenants,
            ),
        }
    }

    fn run(&mut self) -> Result<(), String> {
        loop {
            self.report.events += 1;
            self.connect()?;
            for c in 0..self.clients.len() {
                self.client_step(c)?;
            }
            self.network()?;
            self.disk_due()?;
            self.reload();
            self.core.turn(self.now);
            self.apply()?;
            self.check()?;
            if let Some(at) = self.sc.crash_at
                && !self.crashed
                && self.now >= at
            {
                return self.crash();
            }
            if self.drain_at.is_none() {
                let well = self
                    .clients
                    .iter()
                    .filter(|c| well_behaved(c.plan.behaviour));
                // A client whose connection was reset is finished too.
                if well.clone().all(|c| c.done || c.gone) {
                    self.drain_at = Some(self.now);
                    self.core.drain(self.now);
                    self.apply()?;
                } else if self.now > TIME_LIMIT {
                    let stuck: Vec<String> = self
                        .clients
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| well_behaved(c.plan.behaviour) && !c.done && !c.gone)
                        .map(|(i, c)| {
                            format!(
                                "client {i} (tenant {}): {} of {} sent, {} outstanding",
                                c.plan.tenant,
                                c.issued,
                                c.plan.requests,
                                c.outstanding.len()
                            )
                        })
                        .collect();
                    return Err(format!(
                        "isolation: well-behaved clients stalled: {}",
                        stuck.join("; ")
                    ));
                }
            }
            if self.core.is_done() {
                let open = self.gate.open();
                if open != 0 {
                    return Err(format!("limits: {open} connection place(s) not given back"));
                }
                return Ok(());
            }
            if let Some(deadline) = self.core.deadline()
                && self.now > deadline + SEND_GRACE + 500 * MS
            {
                return Err(format!(
                    "liveness: not done {} ms after the drain deadline plus the send grace: {} request(s) and {} connection(s) left",
                    (self.now - deadline - SEND_GRACE) / MS,
                    self.core.live_requests(),
                    self.core.connections()
                ));
            }
            self.advance()?;
        }
    }

    /// Moves the clock to the next thing that happens.
    fn advance(&mut self) -> Result<(), String> {
        let mut next: Vec<Nanos> = Vec::new();
        if let Some(&Reverse((at, _, _))) = self.disk.ops.peek() {
            next.push(at);
        }
        next.extend(self.core.next_wake());
        next.extend(self.sc.crash_at.filter(|_| !self.crashed));
        for c in &self.clients {
            if c.slot.is_none() && !c.server_closed {
                next.push(c.plan.start);
            }
            let movable = (c.recv_pending && (!c.to_server.is_empty() || c.closed || c.shut_read))
                || (c.send_pending && (c.gone || c.cut || c.to_client.len() < WINDOW));
            if movable {
                next.push(self.now + 5_000);
            }
            let reads = !matches!(c.plan.behaviour, Behaviour::NeverReader) && !c.gone;
            if reads && !c.to_client.is_empty() {
                next.push(c.read_at.max(self.now + 1_000));
            }
        }
        if let Some(d) = self.core.deadline() {
            next.push(d + SEND_GRACE + 600 * MS);
        }
        let at = next.into_iter().filter(|&t| t > self.now).min();
        match at {
            Some(t) => {
                self.now = t;
                Ok(())
            }
            None => Err(format!(
                "stuck: nothing left to happen and the core is not done ({} request(s), {} connection(s), drain {:?}); clients: {}",
                self.core.live_requests(),
                self.core.connections(),
                self.drain_at,
                self.clients
                    .iter()
                    .enumerate()
                    .map(|(i, c)| format!(
                        "{i} {:?} slot {:?} sent {}/{} outstanding {} recv {} send {} closed {} to_server {} to_client {} done {}",
                        c.plan.behaviour,
                        c.slot,
                        c.issued,
                        c.plan.requests,
                        c.outstanding.len(),
                        c.recv_pending,
                        c.send_pending,
                        c.closed,
                        c.to_server.len(),
                        c.to_client.len(),
                        c.done
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
        }
    }

    /// Reloads whose time has come reach the core.
    fn reload(&mut self) {
        for &(at, tenant, weight) in &self.sc.reloads {
            if at <= self.now && at > self.last_reload {
                let spec = TenantSpec {
                    slo: Some(Slo::new(20_000.0, 4096, 50_000)),
                    ..TenantSpec::weighted(format!("t{tenant}"), weight)
                };
                self.core.update(tenant as u32, &spec, self.now);
            }
        }
        self.last_reload = self.now;
    }

    fn connect(&mut self) -> Result<(), String> {
        for i in 0..self.clients.len() {
            let c = &self.clients[i];
            if c.slot.is_some() || c.server_closed || self.now < c.plan.start {
                continue;
            }
            let (tenant, peer) = (c.plan.tenant, c.plan.peer.clone());
            match self.places(tenant, &peer) {
                Ok(places) => self.clients[i].places = places,
                Err(limit) => {
                    // Refused a place: what a flood of its own export's connections
                    // may cost a client, never another export's.
                    let flooded = self
                        .clients
                        .iter()
                        .any(|o| o.plan.behaviour == Behaviour::Idle && o.plan.tenant == tenant);
                    let c = &mut self.clients[i];
                    if well_behaved(c.plan.behaviour) && !flooded {
                        return Err(format!(
                            "isolation: client {i} of tenant {tenant} refused by {limit} ({} open)",
                            self.gate.open()
                        ));
                    }
                    c.server_closed = true;
                    c.gone = true;
                    c.closed = true;
                    self.report.refused += 1;
                    continue;
                }
            }
            let codec = handshake(&self.sc, tenant);
            match self
                .core
                .attach(i as u64, peer.into(), tenant as u32, codec, self.now)
            {
                Some(slot) => self.clients[i].slot = Some(slot),
                None => {
                    let c = &mut self.clients[i];
                    c.server_closed = true;
                    c.places.clear();
                }
            }
        }
        Ok(())
    }

    /// The places a new connection takes, from the server's own [`super::gate::Gate`]
    /// (its peer a TCP address: no local default; no handshake to evict, since the
    /// swarm's clients select their export at once), and its export's place; or the
    /// limit that refused it.
    fn places(
        &mut self,
        tenant: usize,
        peer: &str,
    ) -> Result<Vec<super::conn::Slot>, &'static str> {
        use super::gate::Entry;
        let mut places = match self.gate.arrive(&peer.into(), false, self.now, || false) {
            Entry::In { places, .. } => places,
            Entry::PeerFull { .. } => return Err("max_connections_per_peer"),
            Entry::PeerTooFast { .. } => return Err("a peer's new connections paced"),
            Entry::Full => return Err("max_connections"),
        };
        places.push(
            self.gate
                .exports()
                .take(tenant)
                .ok_or("max_connections_per_tenant")?,
        );
        Ok(places)
    }

    fn client_of(&self, slot: usize) -> usize {
        self.clients
            .iter()
            .position(|c| c.slot == Some(slot))
            .expect("a slot belongs to a client")
    }

    /// Carries out the core's intents.
    fn apply(&mut self) -> Result<(), String> {
        let mut intents = std::mem::take(&mut self.intents);
        self.core.take_intents(&mut intents);
        let _ = self.core.take_logs();
        for &i in &intents {
            match i {
                Intent::Receive(slot) => {
                    let c = self.client_of(slot);
                    assert!(!self.clients[c].recv_pending, "one receive at a time");
                    self.clients[c].recv_pending = true;
                }
                Intent::Send(slot) => {
                    let c = self.client_of(slot);
                    assert!(!self.clients[c].send_pending, "one send at a time");
                    self.clients[c].send_pending = true;
                }
                Intent::Io(id) => {
                    let latency = if self.rng.random_bool(self.sc.spike) {
                        50 * MS
                    } else {
                        self.rng.random_range(10_000..300_000)
                    };
                    self.disk.order += 1;
                    self.disk
                        .ops
                        .push(Reverse((self.now + latency, self.disk.order, id)));
                }
                Intent::ShutRead(slot) => {
                    let c = self.client_of(slot);
                    self.clients[c].shut_read = true;
                }
                Intent::Cut(slot) => {
                    let c = self.client_of(slot);
                    self.clients[c].cut = true;
                    self.clients[c].shut_read = true;
                }
                // The simulated disk has no holes: all data.
                Intent::BlockStatus(id) => {
                    let ask = self.core.block_status_ask(id);
                    self.core
                        .block_status_done(id, Ok(vec![(ask.len, 0)]), self.now);
                }
                Intent::Close(slot) => {
                    let c = self.client_of(slot);
                    let cl = &mut self.clients[c];
                    if cl.recv_pending || cl.send_pending {
                        return Err(format!(
                            "client {c}: closed with a receive or send on its way"
                        ));
                    }
                    cl.slot = None;
                    cl.server_closed = true;
                    cl.places.clear();
                }
            }
        }
        intents.clear();
        self.intents = intents;
        Ok(())
    }

    /// Receives and sends that can return do.
    fn network(&mut self) -> Result<(), String> {
        for i in 0..self.clients.len() {
            let Some(slot) = self.clients[i].slot else {
                continue;
            };
            if self.clients[i].recv_pending {
                let c = &mut self.clients[i];
                let result = if c.shut_read || (c.to_server.is_empty() && c.closed) {
                    Some(0)
                } else if !c.to_server.is_empty() && self.rng.random_bool(self.sc.reset) {
                    c.gone = true;
                    c.closed = true;
                    Some(-libc::ECONNRESET)
                } else if !c.to_server.is_empty() {
                    let buf = self.core.receive_buffer(slot);
                    let mut n = buf.len().min(c.to_server.len());
                    if self.rng.random_bool(self.sc.short) {
                        n = self.rng.random_range(1..=n);
                    }
                    for (b, x) in buf.iter_mut().zip(c.to_server.drain(..n)) {
                        *b = x;
                    }
                    Some(n as i32)
                } else {
                    None
                };
                if let Some(r) = result {
                    self.clients[i].recv_pending = false;
                    self.core.received(slot, r, self.now);
                    self.apply()?;
                }
            }
            let Some(slot) = self.clients[i].slot else {
                continue;
            };
            if self.clients[i].send_pending {
                let c = &self.clients[i];
                let result = if c.gone || c.cut {
                    Some(-libc::EPIPE)
                } else if c.to_client.len() < WINDOW {
                    let mut n = WINDOW - c.to_client.len();
                    if self.rng.random_bool(self.sc.short) {
                        n = self.rng.random_range(1..=n);
                    }
                    let bytes = self.core.send_bytes(slot, n);
                    self.clients[i].to_client.extend(&bytes);
                    Some(bytes.len() as i32)
                } else {
                    None
                };
                if let Some(r) = result {
                    self.clients[i].send_pending = false;
                    self.core.sent(slot, r, self.now);
                    self.apply()?;
                }
            }
        }
        Ok(())
    }

    /// File operations whose time has come are performed and returned.
    fn disk_due(&mut self) -> Result<(), String> {
        while let Some(&Reverse((at, _, id))) = self.disk.ops.peek() {
            if at > self.now {
                break;
            }
            self.disk.ops.pop();
            let result = self.perform(id);
            self.core.io_done(id, result, self.now);
            self.apply()?;
        }
        Ok(())
    }

    /// One file operation on the simulated disk, faults included.
    fn perform(&mut self, id: u64) -> i32 {
        let fault = self.rng.random_bool(self.sc.io_error);
        let short = self.rng.random_bool(self.sc.short);
        let cut = self.rng.random_range(0.0..1.0);
        let image = self.sc.image;
        let (io, store) = self.core.transfer(id);
        let target = match store {
            Store::File(target) => target,
            Store::Image(tenant) => {
                let part = io.next_part(tenant as u64 * image);
                let result = self.disk.perform_part(part, fault, cut);
                if fault {
                    self.faults[tenant] += 1;
                    self.report.faults += 1;
                }
                return result;
            }
        };
        let tenant = (target.base / image) as usize;
        let d = &mut self.disk;
        let op = io.next_op(target);
        if fault {
            let errno = match op {
                FileOp::Write { .. } if cut < 0.5 => libc::ENOSPC,
                _ => libc::EIO,
            };
            if !matches!(op, FileOp::DropCache { .. }) {
                self.faults[tenant] += 1;
                self.report.faults += 1;
            }
            return -errno;
        }
        match op {
            FileOp::Read { at, buf, .. } => {
                let n = shorten(buf.len(), short, cut);
                let at = at as usize;
                buf[..n].copy_from_slice(&d.current[at..at + n]);
                n as i32
            }
            FileOp::Write {
                at, data, dsync, ..
            } => {
                let n = shorten(data.len(), short, cut);
                let a = at as usize;
                d.current[a..a + n].copy_from_slice(&data[..n]);
                d.touch(at, n as u64, dsync);
                n as i32
            }
            FileOp::Sync { .. } => {
                d.sync();
                0
            }
            FileOp::DropCache { .. } => 0,
            FileOp::PunchHole { at, len, .. } | FileOp::ZeroRange { at, len, .. } => {
                let a = at as usize;
                d.current[a..a + len as usize].fill(0);
                d.touch(at, u64::from(len), false);
                0
            }
        }
    }

    /// The properties that hold after every event.
    fn check(&self) -> Result<(), String> {
        let (held, bound) = (self.core.inflight_bytes(), self.core.memory_bound());
        if held > bound {
            return Err(format!(
                "memory: connections hold {held} bytes, over the bound {bound}"
            ));
        }
        for t in 0..self.faults.len() {
            let timeouts = self.stats.timed_out_or_fenced(t as crate::types::TenantId);
            if self.fault_replies[t] > self.faults[t] + timeouts {
                return Err(format!(
                    "replies: tenant {t} got {} EIO/ENOSPC replies for {} disk faults and {timeouts} backend timeouts",
                    self.fault_replies[t], self.faults[t]
                ));
            }
        }
        Ok(())
    }

    /// A client's turn: read replies, send requests.
    fn client_step(&mut self, i: usize) -> Result<(), String> {
        if self.clients[i].slot.is_none() && !self.clients[i].server_closed {
            return Ok(());
        }
        self.read_replies(i)?;
        let c = &self.clients[i];
        if c.closed || c.server_closed {
            if c.server_closed
                && c.to_client.is_empty()
                && well_behaved(c.plan.behaviour)
                && !c.done
            {
                // The server closed a well-behaved client: only a crash, a reset or the
                // drain explains it.
                if !(self.crashed || c.gone || self.drain_at.is_some()) {
                    return Err(format!(
                        "client {i}: closed by the server before its requests were done"
                    ));
                }
            }
            return Ok(());
        }
        if self.drain_at.is_some() {
            return Ok(());
        }
        self.send_requests(i);
        Ok(())
    }

    fn send_requests(&mut self, i: usize) {
        let plan = self.clients[i].plan.clone();
        if plan.behaviour == Behaviour::Idle {
            return;
        }
        let depth = match plan.behaviour {
            Behaviour::NeverReader => u32::MAX,
            _ => plan.depth,
        };
        while self.clients[i].issued < plan.requests
            && (self.clients[i].outstanding.len() as u32) < depth
        {
            if plan.behaviour == Behaviour::Vanisher && self.clients[i].issued == plan.requests / 2
            {
                // Half a write's payload, then gone.
                let mut bytes = request_header(proto::CMD_WRITE, 0, 999_999, 0, 8192);
                bytes.extend(std::iter::repeat_n(7u8, 3000));
                let c = &mut self.clients[i];
                c.to_server.extend(bytes);
                c.closed = true;
                c.gone = true;
                return;
            }
            self.send_one(i);
        }
        let c = &mut self.clients[i];
        if c.issued == plan.requests && c.outstanding.is_empty() && !c.closed {
            match plan.behaviour {
                Behaviour::Garbage => c.to_server.extend([0xde; 28]),
                _ => c
                    .to_server
                    .extend(request_header(proto::CMD_DISC, 0, 0, 0, 0)),
            }
            c.closed = true;
            c.done = true;
        }
    }

    /// One request of client `i`, drawn at random.
    fn send_one(&mut self, i: usize) {
        let tenant = self.clients[i].plan.tenant;
        let sectors = self.sc.image / SECTOR;
        let len_sectors = match self.sc.fixed_len {
            Some(n) => n,
            None if self.rng.random_bool(0.5) => 8 * self.rng.random_range(1..=8u64),
            None => self.rng.random_range(1..=64u64),
        };
        let len_sectors = len_sectors.min(sectors);
        let first = if self.rng.random_bool(0.5) {
            8 * self.rng.random_range(0..=(sectors - len_sectors) / 8)
        } else {
            self.rng.random_range(0..=sectors - len_sectors)
        };
        let (offset, len) = (first * SECTOR, (len_sectors * SECTOR) as u32);
        let fua = self.rng.random_bool(0.2);
        let flags = if fua { proto::CMD_FLAG_FUA } else { 0 };
        let sent = self.seq;
        self.seq += 1;
        let c = &mut self.clients[i];
        let handle = c.next_handle;
        c.next_handle += 1;
        c.issued += 1;
        self.report.requests += 1;
        let (bytes, pending) = match self.rng.random_range(0..20) {
            0..8 => (
                request_header(proto::CMD_READ, 0, handle, offset, len),
                Pending::Read { offset, len, sent },
            ),
            8..16 => {
                let id = self.next_write;
                self.next_write += 1;
                let mut bytes = request_header(proto::CMD_WRITE, flags, handle, offset, len);
                for s in first..first + len_sectors {
                    bytes.extend(sector_data(id, s));
                }
                (
                    bytes,
                    self.change(tenant, first, len_sectors, Kind::Write(id), fua, sent),
                )
            }
            16 | 17 => {
                self.flushes[tenant].push(Flush {
                    sent,
                    acked_ok: false,
                });
                (
                    request_header(proto::CMD_FLUSH, 0, handle, 0, 0),
                    Pending::Flush {
                        at: self.flushes[tenant].len() - 1,
                    },
                )
            }
            18 => (
                request_header(proto::CMD_TRIM, flags, handle, offset, len),
                self.change(tenant, first, len_sectors, Kind::Trim, fua, sent),
            ),
            _ => (
                request_header(proto::CMD_WRITE_ZEROES, flags, handle, offset, len),
                self.change(tenant, first, len_sectors, Kind::Zero, fua, sent),
            ),
        };
        self.clients[i].to_server.extend(bytes);
        self.clients[i].outstanding.insert(handle, pending);
    }

    fn change(
        &mut self,
        tenant: usize,
        first: u64,
        sectors: u64,
        kind: Kind,
        fua: bool,
        sent: u64,
    ) -> Pending {
        let h = &mut self.history[tenant];
        for s in first..first + sectors {
            h[s as usize].push(Change {
                kind,
                fua,
                sent,
                acked: None,
                ok: false,
            });
        }
        Pending::Change {
            first,
            sectors,
            sent,
        }
    }

    /// Reads what the client may read and checks each reply.
    fn read_replies(&mut self, i: usize) -> Result<(), String> {
        let c = &mut self.clients[i];
        let reads = match c.plan.behaviour {
            Behaviour::NeverReader | Behaviour::Idle => false,
            Behaviour::Vanisher => !c.gone,
            Behaviour::SlowReader => self.now >= c.read_at,
            _ => true,
        };
        if !reads || c.to_client.is_empty() {
            return Ok(());
        }
        let take = match c.plan.behaviour {
            Behaviour::SlowReader => {
                c.read_at = self.now + MS;
                c.to_client.len().min(4096)
            }
            _ => c.to_client.len(),
        };
        c.inbox.extend(c.to_client.drain(..take));
        loop {
            let c = &mut self.clients[i];
            if c.inbox.len() < 16 {
                return Ok(());
            }
            let magic = u32::from_be_bytes(c.inbox[0..4].try_into().unwrap());
            let error = u32::from_be_bytes(c.inbox[4..8].try_into().unwrap());
            let handle = u64::from_be_bytes(c.inbox[8..16].try_into().unwrap());
            if magic != proto::SIMPLE_REPLY_MAGIC {
                return Err(format!("client {i}: a reply with magic {magic:#x}"));
            }
            let Some(&pending) = c.outstanding.get(&handle) else {
                return Err(format!(
                    "client {i}: a reply to handle {handle}, which is not outstanding"
                ));
            };
            let data = match pending {
                Pending::Read { len, .. } if error == 0 => len as usize,
                _ => 0,
            };
            if c.inbox.len() < 16 + data {
                return Ok(());
            }
            let bytes: Vec<u8> = c.inbox.drain(..16 + data).skip(16).collect();
            c.outstanding.remove(&handle);
            let tenant = c.plan.tenant;
            self.reply(i, tenant, pending, error, &bytes)?;
        }
    }

    fn reply(
        &mut self,
        i: usize,
        tenant: usize,
        pending: Pending,
        error: u32,
        data: &[u8],
    ) -> Result<(), String> {
        let seq = self.seq;
        self.seq += 1;
        self.report.replies += 1;
        if error != 0 {
            self.report.errors += 1;
            match error {
                proto::EIO | proto::ENOSPC => self.fault_replies[tenant] += 1,
                proto::ESHUTDOWN if self.drain_at.is_some() => {}
                e => return Err(format!("client {i}: error {e} for a valid request")),
            }
        }
        match pending {
            Pending::Read { offset, len, sent } => {
                if error == 0 {
                    for k in 0..u64::from(len) / SECTOR {
                        let s = offset / SECTOR + k;
                        let bytes = &data[(k * SECTOR) as usize..((k + 1) * SECTOR) as usize];
                        let found = identify(bytes, s)
                            .map_err(|e| format!("client {i}: read of sector {s}: {e}"))?;
                        let h = &self.history[tenant][s as usize];
                        let promised = |c: &Change| c.ok && c.acked.is_some_and(|a| a < sent);
                        if !found.iter().all(|&f| allowed(h, f, promised, seq)) {
                            return Err(format!(
                                "client {i}: read of tenant {tenant}'s sector {s} found {found:?}, which a newer acknowledged write superseded (history {h:?})"
                            ));
                        }
                    }
                }
            }
            Pending::Change {
                first,
                sectors,
                sent,
            } => {
                for s in first..first + sectors {
                    let rec = self.history[tenant][s as usize]
                        .iter_mut()
                        .find(|c| c.sent == sent)
                        .expect("a change is in its sectors' history");
                    rec.acked = Some(seq);
                    rec.ok = error == 0;
                }
            }
            Pending::Flush { at } => self.flushes[tenant][at].acked_ok = error == 0,
        }
        let c = &mut self.clients[i];
        if well_behaved(c.plan.behaviour) && c.issued == c.plan.requests && c.outstanding.is_empty()
        {
            c.done = true;
        }
        Ok(())
    }

    /// The disk crashes: what is in flight is lost, each sector not synced keeps its
    /// durable or its current content; then every sector is checked against what the
    /// clients were promised.
    fn crash(&mut self) -> Result<(), String> {
        self.crashed = true;
        self.report.crashed = true;
        let dirty: Vec<u64> = self.disk.dirty.iter().copied().collect();
        for s in dirty {
            if self.rng.random_bool(0.5) {
                let a = (s * SECTOR) as usize;
                let (cur, dur) = (&self.disk.current, &mut self.disk.durable);
                dur[a..a + SECTOR as usize].copy_from_slice(&cur[a..a + SECTOR as usize]);
            }
        }
        let end = self.seq;
        for t in 0..self.history.len() {
            let flushes = &self.flushes[t];
            for s in 0..self.history[t].len() {
                let base = t as u64 * self.sc.image + s as u64 * SECTOR;
                let bytes = &self.disk.durable[base as usize..(base + SECTOR) as usize];
                let found = identify(bytes, s as u64)
                    .map_err(|e| format!("after the crash, tenant {t}'s sector {s}: {e}"))?;
                let h = &self.history[t][s];
                let durable = |c: &Change| {
                    c.ok && c
                        .acked
                        .is_some_and(|a| c.fua || flushes.iter().any(|f| f.acked_ok && f.sent > a))
                };
                if !found.iter().all(|&f| allowed(h, f, durable, end)) {
                    return Err(format!(
                        "durability: after the crash tenant {t}'s sector {s} holds {found:?}, older than a write promised durable (history {h:?})"
                    ));
                }
                self.report.sectors_checked += 1;
            }
        }
        Ok(())
    }
}

impl Disk {
    /// One part of an image tenant's request on the simulated disk, as librbd answers
    /// it: faults, never a short transfer.
    fn perform_part(&mut self, part: Part<'_>, fault: bool, cut: f64) -> i32 {
        let d = self;
        if fault {
            let errno = match part {
                Part::Write { .. } | Part::ZeroWrite { .. } if cut < 0.5 => libc::ENOSPC,
                _ => libc::EIO,
            };
            return -errno;
        }
        match part {
            Part::Read { at, buf } => {
                let at = at as usize;
                let n = buf.len();
                buf.copy_from_slice(&d.current[at..at + n]);
                n as i32
            }
            Part::Write { at, data, .. } | Part::ZeroWrite { at, data, .. } => {
                let a = at as usize;
                d.current[a..a + data.len()].copy_from_slice(data);
                // With the client's cache off, an acknowledged write is durable.
                d.touch(at, data.len() as u64, true);
                data.len() as i32
            }
            Part::Flush => {
                d.sync();
                0
            }
            Part::DropCache { .. } => unreachable!("no image is under pdc"),
            Part::Discard { at, len } | Part::WriteZeroes { at, len } => {
                let a = at as usize;
                d.current[a..a + len as usize].fill(0);
                d.touch(at, u64::from(len), true);
                0
            }
        }
    }

    /// Bytes at `at` changed: dirty, or durable at once with `dsync`.
    fn touch(&mut self, at: u64, len: u64, dsync: bool) {
        let (first, last) = (at / SECTOR, (at + len).div_ceil(SECTOR));
        for s in first..last {
            if dsync {
                let a = (s * SECTOR) as usize;
                self.durable[a..a + SECTOR as usize]
                    .copy_from_slice(&self.current[a..a + SECTOR as usize]);
                self.dirty.remove(&s);
            } else {
                self.dirty.insert(s);
            }
        }
    }

    fn sync(&mut self) {
        for &s in &self.dirty {
            let a = (s * SECTOR) as usize;
            self.durable[a..a + SECTOR as usize]
                .copy_from_slice(&self.current[a..a + SECTOR as usize]);
        }
        self.dirty.clear();
    }
}

/// A transfer of `n` bytes, shortened (to whole units) when `short`.
fn shorten(n: usize, short: bool, cut: f64) -> usize {
    let units = n / UNIT as usize;
    if !short || units < 2 {
        return n;
    }
    (1 + (cut * (units - 1) as f64) as usize) * UNIT as usize
}

fn well_behaved(b: Behaviour) -> bool {
    matches!(b, Behaviour::Normal | Behaviour::SlowReader)
}

/// Whether a sector's content `found` (a write number, 0 for zeroes) may be there, given
/// its history `h`: the newest change that `promised` holds of (the read was sent after
/// it was acknowledged, or it was promised durable) and everything not acknowledged
/// before that change was sent, among what was sent before `before`. A trim among them
/// allows anything.
fn allowed(h: &[Change], found: Kind, promised: impl Fn(&Change) -> bool, before: u64) -> bool {
    let newest = h
        .iter()
        .filter(|c| promised(c))
        .max_by_key(|c| c.acked)
        .expect("the initial zeroes are promised");
    let candidates = h
        .iter()
        .filter(|c| c.sent < before && c.acked.is_none_or(|a| a >= newest.sent));
    let mut any = false;
    for c in candidates {
        any = true;
        match (c.kind, found) {
            (Kind::Trim, _) => return true,
            (Kind::Zero, Kind::Write(0)) => return true,
            (k, f) if k == f => return true,
            _ => {}
        }
    }
    debug_assert!(any, "the newest promised change is a candidate");
    false
}

/// The data write `id` puts in sector `s`: units of [`UNIT`] bytes, each naming the
/// write and its own place, so that a sector two writes tore between is read as both.
fn sector_data(id: u64, s: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(SECTOR as usize);
    for u in 0..SECTOR / UNIT {
        b.extend(id.to_le_bytes());
        b.extend((s * (SECTOR / UNIT) + u).to_le_bytes());
    }
    b
}

/// The writes whose data `bytes` (sector `s`) holds, unit by unit: `Write(0)` for
/// zeroes.
fn identify(bytes: &[u8], s: u64) -> Result<Vec<Kind>, String> {
    let mut found = Vec::new();
    for (u, unit) in bytes.chunks(UNIT as usize).enumerate() {
        let kind = if unit.iter().all(|&b| b == 0) {
            Kind::Write(0)
        } else {
            let id = u64::from_le_bytes(unit[0..8].try_into().unwrap());
            let place = u64::from_le_bytes(unit[8..16].try_into().unwrap());
            if id == 0 || place != s * (SECTOR / UNIT) + u as u64 {
                return Err(format!(
                    "bytes that no write put there (unit {u}: {unit:?})"
                ));
            }
            Kind::Write(id)
        };
        if !found.contains(&kind) {
            found.push(kind);
        }
    }
    Ok(found)
}

pub(crate) fn request_header(kind: u16, flags: u16, handle: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut b = proto::REQUEST_MAGIC.to_be_bytes().to_vec();
    b.extend(flags.to_be_bytes());
    b.extend(kind.to_be_bytes());
    b.extend(handle.to_be_bytes());
    b.extend(offset.to_be_bytes());
    b.extend(len.to_be_bytes());
    b
}

/// A codec past the handshake, with `tenant`'s export selected, as the accepting side
/// hands it over.
fn handshake(sc: &Scenario, tenant: usize) -> ServerCodec {
    handshaken(&sc.config, tenant)
}

/// A codec past the handshake on `config`'s exports, with `tenant`'s selected.
pub(crate) fn handshaken(config: &CoreConfig, tenant: usize) -> ServerCodec {
    handshaken_asking(config, tenant, false)
}

/// [`handshaken`], with structured replies and the `base:allocation` context asked for
/// first when `block_status` (the client may then ask for block status).
pub(crate) fn handshaken_asking(
    config: &CoreConfig,
    tenant: usize,
    block_status: bool,
) -> ServerCodec {
    let exports = Arc::new(
        config
            .tenants
            .iter()
            .map(|t| ExportInfo::new(t.name.clone(), t.size, false))
            .collect::<Vec<_>>(),
    );
    let mut codec = ServerCodec::new(exports);
    let _ = codec.take_output();
    codec.receive(&(proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES).to_be_bytes());
    let name = &config.tenants[tenant].name;
    let option = |kind: u32, data: &[u8]| {
        let mut o = proto::OPTION_MAGIC.to_be_bytes().to_vec();
        o.extend(kind.to_be_bytes());
        o.extend((data.len() as u32).to_be_bytes());
        o.extend(data);
        o
    };
    if block_status {
        codec.receive(&option(proto::OPT_STRUCTURED_REPLY, &[]));
        let context = b"base:allocation";
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend(name.as_bytes());
        d.extend(1u32.to_be_bytes());
        d.extend((context.len() as u32).to_be_bytes());
        d.extend(context);
        codec.receive(&option(proto::OPT_SET_META_CONTEXT, &d));
        while let Ok(Some(_)) = codec.poll() {}
        let _ = codec.take_output();
    }
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend(name.as_bytes());
    data.extend(0u16.to_be_bytes());
    let mut option = proto::OPTION_MAGIC.to_be_bytes().to_vec();
    option.extend(proto::OPT_GO.to_be_bytes());
    option.extend((data.len() as u32).to_be_bytes());
    option.extend(data);
    codec.receive(&option);
    loop {
        match codec.poll() {
            Ok(Some(crate::nbd::Event::Selected { .. })) => break,
            Ok(Some(_)) => {}
            other => panic!("the simulated handshake selects its export: {other:?}"),
        }
    }
    let _ = codec.take_output();
    codec
}

/// Keeps the budget's small-request rule in sight: the swarm's requests are all small.
const _: () = assert!(64 * SECTOR + budget::REPLY_BYTES <= budget::ALWAYS_BYTES);

#[cfg(test)]
mod tests {
    use super::super::core::Plant;
    use super::*;

    /// The seeds `./test.sh` runs; `IOSHARE_ENGINE_SWARM_CASES` runs more.
    fn cases() -> u64 {
        std::env::var("IOSHARE_ENGINE_SWARM_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(32)
    }

    #[test]
    fn the_swarm_holds_its_properties() {
        if let Ok(seed) = std::env::var("IOSHARE_ENGINE_SWARM_SEED") {
            let seed = seed.parse().expect("IOSHARE_ENGINE_SWARM_SEED is a number");
            if let Err(f) = run_seed(seed) {
                panic!("{f}");
            }
            return;
        }
        let mut total = Report::default();
        for seed in 0..cases() {
            match run_seed(seed) {
                Ok(r) => {
                    total.requests += r.requests;
                    total.replies += r.replies;
                    total.faults += r.faults;
                    total.sectors_checked += r.sectors_checked;
                    total.crashed |= r.crashed;
                    total.refused += r.refused;
                }
                Err(f) => panic!("{f}"),
            }
        }
        // The swarm exercised what it claims to.
        assert!(total.requests > 1000, "{total:?}");
        assert!(
            total.faults > 0 && total.crashed && total.sectors_checked > 0,
            "{total:?}"
        );
        assert!(
            total.refused > 0,
            "floods met the connection limits: {total:?}"
        );
    }

    /// Image tenants (the rbd backend's parts) are drawn, faults and crashes
    /// included, and hold every property: crashed images keep what was acknowledged.
    #[test]
    fn image_tenants_hold_the_properties() {
        let seeds: Vec<u64> = (0..400)
            .filter(|&s| Scenario::draw(s).images.contains(&true))
            .take(40)
            .collect();
        assert_eq!(seeds.len(), 40, "image tenants are drawn");
        let mut checked = 0;
        for seed in seeds {
            let r = run_seed(seed).unwrap_or_else(|f| panic!("seed {seed}: {}", f.what));
            checked += r.sectors_checked;
        }
        assert!(checked > 0, "some of these runs crashed and were checked");
    }

    #[test]
    fn identical_seeds_give_identical_runs() {
        let a = run_seed(7).expect("seed 7 holds");
        let b = run_seed(7).expect("seed 7 holds");
        assert_eq!(a, b);
    }

    /// Each planted bug is caught by some seed of the first hundred, without a socket.
    fn caught(bug: Plant) -> String {
        for seed in 0..100 {
            if let Err(f) = run_planted(seed, bug) {
                eprintln!("{bug:?}: caught by seed {seed}: {}", f.what);
                return f.what;
            }
        }
        panic!("{bug:?} survived 100 seeds");
    }

    #[test]
    fn a_core_that_ignores_has_room_is_caught() {
        let what = caught(Plant::IgnoreHasRoom);
        assert!(what.contains("EIO/ENOSPC replies"), "{what}");
    }

    #[test]
    fn a_budget_off_by_one_is_caught() {
        let what = caught(Plant::BudgetOffByOne);
        assert!(what.contains("memory:"), "{what}");
    }

    #[test]
    fn a_flush_that_does_not_sync_is_caught() {
        let what = caught(Plant::FlushWithoutSync);
        assert!(what.contains("durability:"), "{what}");
    }

    #[test]
    fn a_sector_holds_what_was_promised() {
        let c = |kind, sent, acked: Option<u64>, ok| Change {
            kind,
            fua: false,
            sent,
            acked,
            ok,
        };
        let h = vec![
            c(Kind::Write(0), 0, Some(0), true),
            c(Kind::Write(1), 1, Some(2), true),
            c(Kind::Write(2), 3, None, false),
        ];
        let acked_before = |at: u64| move |c: &Change| c.ok && c.acked.is_some_and(|a| a < at);
        // Sent after write 1 was acknowledged: 1, or 2 in flight; never the zeroes.
        assert!(allowed(&h, Kind::Write(1), acked_before(3), 10));
        assert!(allowed(&h, Kind::Write(2), acked_before(3), 10));
        assert!(!allowed(&h, Kind::Write(0), acked_before(3), 10));
        // Sent before write 1 was: the zeroes too.
        assert!(allowed(&h, Kind::Write(0), acked_before(2), 10));
        // Write 2 was sent after the reply: not yet.
        assert!(!allowed(&h, Kind::Write(2), acked_before(3), 3));
    }
}
