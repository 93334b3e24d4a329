//! Policy cost: CPU time per request for enqueue + dispatch + complete, for every
//! registered policy with 4, 64 and 1,024 backlogged tenants (weights cycling 10:7:4:1,
//! and with 1,024 spread over 1–1000 as in the conformance suite). A closed loop keeps
//! 32 requests in the (imaginary) device and 8 queued per tenant; simulated time
//! advances 1 µs per request, so periods, slices and timers fire as they would at 1 M
//! IOPS. The target: at 1,024 tenants no more than twice the cost at 4.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ioshare::policy::{Admission, Dispatch, Policy, build, names};
use ioshare::types::{Completion, Nanos, Op, Request, TenantSpec};
use std::collections::VecDeque;
use std::hint::black_box;

const DEVICE_DEPTH: usize = 32;
const QUEUED_PER_TENANT: usize = 8;
const STEP_NS: Nanos = 1_000;

struct Loop {
    policy: Box<dyn Policy>,
    in_flight: VecDeque<(Request, Nanos)>,
    now: Nanos,
    next_id: u64,
}

impl Loop {
    fn new(name: &str, tenants: usize) -> Self {
        let weights = [10.0, 7.0, 4.0, 1.0];
        let specs: Vec<TenantSpec> = (0..tenants)
            .map(|i| {
                let w = if tenants > 64 {
                    1.0 + 999.0 * i as f64 / (tenants - 1) as f64
                } else {
                    weights[i % 4]
                };
                TenantSpec::weighted(format!("t{i}"), w)
            })
            .collect();
        let policy = build(name, Default::default(), &specs).expect("default parameters");
        let mut l = Loop {
            policy,
            in_flight: VecDeque::with_capacity(DEVICE_DEPTH),
            now: 0,
            next_id: 0,
        };
        for _ in 0..QUEUED_PER_TENANT {
            for t in 0..tenants as u32 {
                l.enqueue(t);
            }
        }
        l
    }

    fn enqueue(&mut self, tenant: u32) {
        let r = Request {
            id: self.next_id,
            tenant,
            op: Op::Read,
            offset: (self.next_id % 1024) * 4096,
            len: 4096,
            arrival: self.now,
            // What the host would stamp: about a 4 KiB read on a flash drive.
            cost: 10_000,
        };
        self.next_id += 1;
        // No tenant has an SLO: nothing is refused.
        assert_eq!(self.policy.enqueue(r, self.now), Admission::Queued);
    }

    /// One request's worth of work: complete the oldest in flight, its tenant sends the
    /// next request, then the policy refills the device.
    fn step(&mut self) {
        self.now += STEP_NS;
        if let Some(t) = self.policy.next_timer()
            && t <= self.now
        {
            self.policy.on_timer(self.now);
        }
        if let Some((request, start)) = self.in_flight.pop_front() {
            let c = Completion {
                request,
                start,
                finish: self.now,
            };
            self.policy.complete(&c, self.now);
            self.enqueue(request.tenant);
        }
        while self.in_flight.len() < DEVICE_DEPTH {
            match self.policy.dispatch(self.now) {
                Dispatch::Request(r) => self.in_flight.push_back((r, self.now)),
                Dispatch::Wait(t) => {
                    // Nothing in flight to complete: jump to the policy's wake-up.
                    if self.in_flight.is_empty() {
                        self.now = self.now.max(t);
                        self.policy.on_timer(self.now);
                        continue;
                    }
                    break;
                }
                Dispatch::Idle => break,
            }
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("policy");
    group.throughput(Throughput::Elements(1));
    for name in names() {
        for tenants in [4usize, 64, 1024] {
            let mut l = Loop::new(name, tenants);
            // Reach steady state (forecasts, slices) before measuring.
            l.step();
            let before = l.next_id;
            for _ in 0..200_000 {
                l.step();
            }
            // Every step must complete a request and admit the tenant's next one.
            assert_eq!(l.next_id - before, 200_000, "{name}/{tenants} stalled");
            group.bench_with_input(BenchmarkId::new(name, tenants), &tenants, |b, _| {
                b.iter(|| {
                    l.step();
                    black_box(l.in_flight.len())
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
