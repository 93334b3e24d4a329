//! The host core in virtual time: admission and back-pressure, dispatch depth, alarms,
//! drain, and the assertions on its counts.

use super::*;
use crate::policy::{self, Dispatch};
use crate::types::Op;

const MS: Nanos = 1_000_000;
const S: Nanos = 1_000 * MS;

/// What the observer saw, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Arrived(u64),
    Refused(u64, Refusal),
    HeldBack(u64),
    Dispatched(u64, Nanos),
    Completed(u64, Status),
}

#[derive(Debug, Default)]
struct Log(Vec<Seen>);

impl Observer for Log {
    fn arrived(&mut self, r: &Request) {
        self.0.push(Seen::Arrived(r.id));
    }
    fn refused(&mut self, r: &Request, reason: Refusal, _now: Nanos) {
        self.0.push(Seen::Refused(r.id, reason));
    }
    fn held_back(&mut self, r: &Request, _now: Nanos) {
        self.0.push(Seen::HeldBack(r.id));
    }
    fn dispatched(&mut self, r: &Request, now: Nanos) {
        self.0.push(Seen::Dispatched(r.id, now));
    }
    fn completed(&mut self, c: &Completion, status: Status) {
        self.0.push(Seen::Completed(c.request.id, status));
    }
}

fn request(id: u64, tenant: TenantId, now: Nanos) -> Request {
    Request {
        id,
        tenant,
        op: Op::Read,
        offset: 0,
        len: 4096,
        arrival: now,
        cost: 0,
    }
}

fn host(
    policy: &str,
    tenants: &[TenantSpec],
    queue_depth: u32,
    queue_limit: Option<u32>,
) -> Host<Log> {
    host_refusing(policy, tenants, queue_depth, queue_limit, Refuse::Error)
}

fn host_refusing(
    policy: &str,
    tenants: &[TenantSpec],
    queue_depth: u32,
    queue_limit: Option<u32>,
    refuse: Refuse,
) -> Host<Log> {
    // TA buckets one response time of the agreed rate deep (not 32 requests), so that
    // a burst of a few requests reaches their queue.
    let params = if policy.starts_with("ta") {
        crate::config::params(toml::toml! { depth_requests = 0.0 }).expect("scalars")
    } else {
        Default::default()
    };
    let policy = policy::build(policy, params, tenants).expect("builds");
    let limits = Limits {
        queue_depth,
        queue_limit,
        refuse,
        stall: None,
    };
    Host::new(
        policy,
        Log::default(),
        limits,
        tenants.len(),
        CostModel::generic_ssd(),
    )
}

fn two() -> Vec<TenantSpec> {
    vec![
        TenantSpec::weighted("a", 1.0),
        TenantSpec::weighted("b", 1.0),
    ]
}

fn done(r: Request, start: Nanos, finish: Nanos) -> Completion {
    Completion {
        request: r,
        start,
        finish,
    }
}

fn drain_dispatch<O: Observer>(h: &mut Host<O>, now: Nanos) -> Vec<Request> {
    std::iter::from_fn(|| h.dispatch(now)).collect()
}

#[test]
fn queue_limit_admits_exactly_the_limit_and_refuses_the_rest() {
    let mut h = host("none", &two(), 1, Some(3));
    let mut answers = Vec::new();
    for id in 1..=5 {
        answers.push(h.admit(request(id, 0, 0), 0));
    }
    assert_eq!(&answers[..3], &[Admission::Queued; 3]);
    assert_eq!(
        &answers[3..],
        &[
            Admission::Refused(request(4, 0, 0), Refusal::QueueFull),
            Admission::Refused(request(5, 0, 0), Refusal::QueueFull)
        ]
    );
    assert_eq!((h.held(0), h.queued()), (3, 3));
    // Back-pressure: no room at the limit, for this tenant only.
    assert!(!h.has_room(0));
    assert!(h.has_room(1));
    assert_eq!(h.admit(request(6, 1, 0), 0), Admission::Queued);
    // A request on the device no longer counts against the limit.
    assert_eq!(drain_dispatch(&mut h, 0).len(), 1);
    assert_eq!((h.held(0), h.tenant_in_flight(0)), (2, 1));
    assert!(h.has_room(0));
    h.check().unwrap();
    let log = &h.observer().0;
    assert_eq!(
        log.iter()
            .filter(|s| matches!(s, Seen::Refused(_, Refusal::QueueFull)))
            .count(),
        2
    );
    assert_eq!(
        log.iter().filter(|s| matches!(s, Seen::Arrived(_))).count(),
        6
    );
}

#[test]
fn no_queue_limit_admits_everything() {
    let mut h = host("none", &two(), 1, None);
    for id in 1..=10_000 {
        assert_eq!(h.admit(request(id, 0, 0), 0), Admission::Queued);
    }
    assert!(h.has_room(0));
    assert_eq!(h.queued(), 10_000);
}

#[test]
fn dispatch_fills_the_device_to_its_depth_and_refills_on_completion() {
    let mut h = host("none", &two(), 2, None);
    for id in 1..=5 {
        assert_eq!(
            h.admit(request(id, (id % 2) as TenantId, 0), 0),
            Admission::Queued
        );
    }
    let first = drain_dispatch(&mut h, 10);
    assert_eq!(first.iter().map(|r| r.id).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(h.in_flight(), 2);
    assert_eq!(h.dispatch(10), None, "the device is full");
    h.complete(&done(first[0], 10, 20), Status::Ok, 20);
    let next = drain_dispatch(&mut h, 20);
    assert_eq!(next.iter().map(|r| r.id).collect::<Vec<_>>(), vec![3]);
    assert_eq!((h.in_flight(), h.queued()), (2, 2));
    h.check().unwrap();
}

#[test]
fn a_policy_refusal_is_passed_on_and_leaves_no_count_behind() {
    // TA1, 1,000 IOPS, rt 10 ms: a burst of 17 at t = 0 holds 15 (10 pass at once, the
    // bucket being one rt deep, 5 wait within half the rt) and refuses 2.
    let tenants = [policy::test_slo_tenant("a", 1000.0, 10_000)];
    let mut h = host("ta1", &tenants, 4, None);
    let refused: Vec<u64> = (1..=17)
        .filter_map(|id| match h.admit(request(id, 0, 0), 0) {
            Admission::Queued => None,
            Admission::Refused(r, reason) => {
                assert_eq!(reason, Refusal::Policy);
                Some(r.id)
            }
        })
        .collect();
    assert_eq!(refused, vec![16, 17]);
    assert_eq!(h.queued(), 15);
    h.check().unwrap();
}

/// With `Refuse::Hold`, what TA1 refuses is held back in the host, counted against the
/// tenant's queue limit (so a live client stops being read), offered again in arrival
/// order as the bucket refills, and never answered with an error; at the drain deadline
/// it is refused like everything else held.
#[test]
fn a_refusal_held_back_is_offered_again_and_served_in_order() {
    let tenants = [policy::test_slo_tenant("a", 1000.0, 10_000)];
    let mut h = host_refusing("ta1", &tenants, 64, Some(20), Refuse::Hold);
    for id in 1..=17 {
        assert_eq!(h.admit(request(id, 0, 0), 0), Admission::Queued, "{id}");
    }
    // 10 pass the bucket, 5 wait in its queue, 2 are held back by the host.
    assert_eq!(h.held(0), 17);
    assert_eq!(h.deferred_total, 2);
    h.check().unwrap();
    // A later arrival queues behind them, whatever the policy would say.
    assert_eq!(h.admit(request(18, 0, 0), 0), Admission::Queued);
    assert_eq!(h.deferred_total, 3);
    // Room for 2 more: the queue limit of 20 counts what is held back.
    assert!(h.has_room(0));
    assert_eq!(h.admit(request(19, 0, 0), 0), Admission::Queued);
    assert_eq!(h.admit(request(20, 0, 0), 0), Admission::Queued);
    assert!(!h.has_room(0));
    let mut sent = Vec::new();
    let mut now = 0;
    while sent.len() < 20 {
        while let Some(r) = h.dispatch(now) {
            sent.push(r.id);
            h.complete(&done(r, now, now + 1), Status::Ok, now + 1);
        }
        h.check().unwrap();
        now += MS;
        h.on_time(now, &mut Vec::new());
    }
    assert_eq!(sent, (1..=20).collect::<Vec<_>>(), "in arrival order");
    assert!(h.is_idle());
    let seen = &h.observer().0;
    assert!(!seen.iter().any(|s| matches!(s, Seen::Refused(..))));
    let held_back: Vec<u64> = seen
        .iter()
        .filter_map(|s| match s {
            Seen::HeldBack(id) => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(held_back, vec![16, 17, 18, 19, 20]);
    // Held back at the drain deadline: refused as stopping, counts back to zero.
    for id in 21..=40 {
        let _ = h.admit(request(id, 0, now), now);
    }
    assert!(h.deferred_total > 0);
    h.start_drain(now, 0);
    let mut refused = Vec::new();
    h.on_deadline(now, &mut refused);
    assert_eq!(refused.len(), 20);
    assert_eq!(h.queued(), 0);
    h.check().unwrap();
}

#[test]
fn the_next_alarm_is_the_policy_wait_and_comes_again_after_it_fired() {
    // mClock with a limit of 2 IOPS: one request now, the next one 0.5 s later.
    let tenants = [TenantSpec {
        limit_iops: Some(2.0),
        ..TenantSpec::weighted("a", 1.0)
    }];
    let mut h = host("mclock", &tenants, 8, None);
    for id in 1..=3 {
        assert_eq!(h.admit(request(id, 0, 0), 0), Admission::Queued);
    }
    assert_eq!(drain_dispatch(&mut h, 0).len(), 1);
    assert_eq!(h.next_alarm(), Some(S / 2));
    // Asked again before it fires: the same alarm.
    assert_eq!(h.dispatch(MS), None);
    assert_eq!(h.next_alarm(), Some(S / 2));
    let mut refused = Vec::new();
    h.on_time(S / 2, &mut refused);
    assert!(refused.is_empty());
    assert_eq!(drain_dispatch(&mut h, S / 2).len(), 1);
    assert_eq!(h.next_alarm(), Some(S));
}

#[test]
fn a_policy_timer_is_the_next_alarm_and_runs_when_due() {
    // MoTS ticks every second.
    let mut h = host("mots", &two(), 8, None);
    assert_eq!(h.admit(request(1, 0, 0), 0), Admission::Queued);
    let _ = drain_dispatch(&mut h, 0);
    assert_eq!(h.next_alarm(), Some(S));
    h.on_time(S, &mut Vec::new());
    assert_eq!(
        h.next_alarm(),
        Some(2 * S),
        "the next tick after the first ran"
    );
}

#[test]
fn drain_withdraws_what_the_policy_holds_at_the_deadline_and_refuses_newcomers() {
    let tenants = [
        TenantSpec {
            limit_iops: Some(2.0),
            ..TenantSpec::weighted("slow", 1.0)
        },
        TenantSpec::weighted("other", 1.0),
    ];
    let mut h = host("mclock", &tenants, 8, None);
    for id in 1..=5 {
        assert_eq!(h.admit(request(id, 0, 0), 0), Admission::Queued);
    }
    let on_device = drain_dispatch(&mut h, 0);
    assert_eq!(on_device.len(), 1);
    h.start_drain(0, S);
    h.start_drain(S / 4, 10 * S); // a second call keeps the first deadline
    assert_eq!(h.deadline(), Some(S));
    assert_eq!(h.next_alarm(), Some(S / 2), "the policy's wait comes first");
    // Before the deadline the policy still releases at its pace.
    let mut refused = Vec::new();
    h.on_time(S / 2, &mut refused);
    assert!(refused.is_empty() && !h.stopped());
    assert_eq!(drain_dispatch(&mut h, S / 2).len(), 1);
    // At the deadline the three still held are withdrawn and refused.
    h.on_time(S, &mut refused);
    assert!(h.stopped());
    assert_eq!(
        refused.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
    assert_eq!(h.queued(), 0);
    assert_eq!(h.dispatch(S), None, "nothing is dispatched once stopped");
    assert_eq!(
        h.admit(request(6, 1, S), S),
        Admission::Refused(request(6, 1, S), Refusal::Stopping)
    );
    // What is on the device still completes.
    assert_eq!(h.in_flight(), 2);
    h.complete(&done(on_device[0], 0, S + 1), Status::Ok, S + 1);
    assert!(!h.is_idle());
    assert_eq!(h.next_alarm(), None, "no deadline once it passed");
    h.check().unwrap();
    let stops = h
        .observer()
        .0
        .iter()
        .filter(|s| matches!(s, Seen::Refused(_, Refusal::Stopping)))
        .count();
    assert_eq!(stops, 4);
}

#[test]
fn every_request_is_seen_arriving_then_refused_or_dispatched_and_completed() {
    let mut h = host("none", &two(), 1, Some(1));
    assert_eq!(h.admit(request(1, 0, 0), 0), Admission::Queued);
    let _ = h.admit(request(2, 0, 0), 0);
    let r = h.dispatch(5).expect("a slot is free");
    h.complete(&done(r, 5, 9), Status::Failed, 9);
    assert_eq!(
        h.observer().0,
        vec![
            Seen::Arrived(1),
            Seen::Arrived(2),
            Seen::Refused(2, Refusal::QueueFull),
            Seen::Dispatched(1, 5),
            Seen::Completed(1, Status::Failed),
        ]
    );
    assert!(h.is_idle());
}

#[test]
#[should_panic(expected = "a completion with nothing in flight")]
fn a_second_completion_of_one_request_is_caught() {
    let mut h = host("none", &two(), 4, None);
    assert_eq!(h.admit(request(1, 0, 0), 0), Admission::Queued);
    let r = h.dispatch(0).expect("dispatched");
    h.complete(&done(r, 0, 1), Status::Ok, 1);
    h.complete(&done(r, 0, 1), Status::Ok, 1);
}

#[test]
#[should_panic(expected = "finished before it started")]
fn a_completion_before_its_dispatch_is_caught() {
    let mut h = host("none", &two(), 4, None);
    assert_eq!(h.admit(request(1, 0, 0), 0), Admission::Queued);
    let r = h.dispatch(10).expect("dispatched");
    h.complete(&done(r, 10, 9), Status::Ok, 10);
}

/// A policy that loses a request: the host's check notices.
struct Leaky(policy::Fifo);

impl Policy for Leaky {
    fn name(&self) -> &'static str {
        "leaky"
    }
    fn enqueue(&mut self, request: Request, now: Nanos) -> Admission {
        let admission = self.0.enqueue(request, now);
        if request.id == 2 {
            let _ = self.0.dispatch(now); // dropped on the floor
        }
        admission
    }
    fn dispatch(&mut self, now: Nanos) -> Dispatch {
        self.0.dispatch(now)
    }
    fn complete(&mut self, c: &Completion, now: Nanos) {
        self.0.complete(c, now)
    }
    fn update_tenant(&mut self, _: TenantId, _: &TenantSpec, _: Nanos) {}
    fn add_tenant(&mut self, spec: &TenantSpec, now: Nanos) -> TenantId {
        self.0.add_tenant(spec, now)
    }
    fn queued(&self) -> usize {
        self.0.queued()
    }
    fn withdraw_all(&mut self) -> Vec<Request> {
        self.0.withdraw_all()
    }
}

#[test]
fn check_finds_a_policy_that_loses_requests() {
    let limits = Limits {
        queue_depth: 4,
        queue_limit: None,
        refuse: Refuse::Error,
        stall: None,
    };
    let mut h = Host::new(
        Box::new(Leaky(policy::Fifo::new(1))),
        (),
        limits,
        1,
        CostModel::generic_ssd(),
    );
    assert_eq!(h.admit(request(1, 0, 0), 0), Admission::Queued);
    h.check().unwrap();
    assert_eq!(h.admit(request(2, 0, 0), 0), Admission::Queued);
    let e = h.check().unwrap_err();
    assert!(
        e.contains(
            "the policy holds 1 requests and the host holds back 0 and parks 0, the host counted 2"
        ),
        "{e}"
    );
}

/// A tenant whose requests do not come back (a hung backend) keeps the others served:
/// once its requests are past twice the stall threshold they give their device slots
/// back, and while it is stalled what the policy releases for it beyond its share of
/// the queue is parked; when its requests complete (late) the parked ones go.
#[test]
fn a_hung_tenant_gives_the_device_queue_back_and_is_held_to_its_share() {
    const MS: Nanos = 1_000_000;
    let limits = Limits {
        queue_depth: 8,
        queue_limit: Some(64),
        refuse: Refuse::Error,
        stall: Some(Stall { after: 100 * MS }),
    };
    let mut h = Host::new(
        policy::build("none", Default::default(), &two()).expect("builds"),
        Log::default(),
        limits,
        2,
        CostModel::generic_ssd(),
    );
    let drain = |h: &mut Host<Log>, now| {
        let mut out = Vec::new();
        while let Some(r) = h.dispatch(now) {
            out.push(r);
            h.check().unwrap();
        }
        out
    };
    // Tenant 0 fills the queue; its backend then hangs.
    for id in 1..=8 {
        assert_eq!(h.admit(request(id, 0, 0), 0), Admission::Queued);
    }
    let hung = drain(&mut h, 0);
    assert_eq!(hung.len(), 8);
    assert_eq!(
        h.next_alarm(),
        Some(200 * MS),
        "slots come back at twice the threshold"
    );
    // Tenant 1 waits: no slot until then.
    assert_eq!(
        h.admit(request(100, 1, 10 * MS), 10 * MS),
        Admission::Queued
    );
    assert!(drain(&mut h, 10 * MS).is_empty());
    assert!(
        drain(&mut h, 150 * MS).is_empty(),
        "stalled, but the slots are still held"
    );
    let got = drain(&mut h, 200 * MS);
    assert_eq!(got.iter().map(|r| r.id).collect::<Vec<_>>(), vec![100]);
    assert_eq!(h.in_flight(), 1, "the hung requests gave their slots back");
    assert_eq!(
        h.tenant_in_flight(0),
        8,
        "still the tenant's until they complete"
    );
    // More from the hung tenant: parked (it holds 8, its share is 4); tenant 1 goes on.
    for id in 9..=12 {
        assert_eq!(
            h.admit(request(id, 0, 210 * MS), 210 * MS),
            Admission::Queued
        );
    }
    assert_eq!(
        h.admit(request(101, 1, 210 * MS), 210 * MS),
        Admission::Queued
    );
    let got = drain(&mut h, 210 * MS);
    assert_eq!(got.iter().map(|r| r.id).collect::<Vec<_>>(), vec![101]);
    assert_eq!(
        h.held(0),
        4,
        "parked requests count against the queue limit"
    );
    // Its backend comes back: the hung requests complete, the parked ones go in order.
    for r in hung {
        h.complete(&done(r, 0, 300 * MS), Status::Ok, 300 * MS);
        h.check().unwrap();
    }
    assert_eq!(h.in_flight(), 2);
    let got = drain(&mut h, 300 * MS);
    assert_eq!(
        got.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![9, 10, 11, 12]
    );
    assert_eq!(h.held(0), 0);
}
