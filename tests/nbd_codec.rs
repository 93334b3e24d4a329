//! Property tests of the NBD codec (the same checks the fuzz target in `fuzz/` runs):
//! random and half-valid byte streams, cut anywhere, give the same events as when whole
//! and never let an unsafe request through.

use ioshare::nbd::fuzzing::check_pieces;
use proptest::prelude::*;

const OPTION_MAGIC: u64 = 0x4948_4156_454F_5054;
const REQUEST_MAGIC: u32 = 0x2560_9513;

fn option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut b = OPTION_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// A request header: magic, flags, type, handle, offset, length.
fn header(kind: u16, flags: u16, handle: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&handle.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

/// A valid request: its header, and for a write (type 1) a payload of `len` bytes with
/// a pattern the check recognizes.
fn valid_bytes(kind: u16, flags: u16, handle: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut b = header(kind, flags, handle, offset, len);
    if kind == 1 {
        b.extend((0..len).map(|i| (i % 251) as u8));
    }
    b
}

/// Options a client may send before GO: LIST, INFO, STRUCTURED_REPLY, unknown ones,
/// GO/INFO with names that exist, do not, or try a path.
fn any_option() -> impl Strategy<Value = Vec<u8>> {
    let name = prop_oneof![
        Just("vm1".to_string()),
        Just("ro".to_string()),
        Just("tiny".to_string()),
        Just("gone".to_string()),
        Just(String::new()),
        Just("../vm1".to_string()),
        "[a-z]{0,6}",
    ];
    let info = (
        name,
        prop::collection::vec(any::<u16>(), 0..3),
        any::<bool>(),
        any::<u8>(),
    )
        .prop_map(|(name, infos, go, junk)| {
            let mut d = (name.len() as u32).to_be_bytes().to_vec();
            d.extend_from_slice(name.as_bytes());
            d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
            for i in &infos {
                d.extend_from_slice(&i.to_be_bytes());
            }
            if junk < 16 {
                d.truncate(d.len().saturating_sub(junk as usize)); // a short option
            }
            option(if go { 7 } else { 6 }, &d)
        });
    // NBD_OPT_SET_META_CONTEXT / LIST_META_CONTEXT for base:allocation, so that block
    // status requests are served too.
    let meta = |o: u32, name: &str| {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&15u32.to_be_bytes());
        d.extend_from_slice(b"base:allocation");
        option(o, &d)
    };
    prop_oneof![
        info,
        Just(option(3, &[])),
        Just(option(8, &[])),
        Just(meta(10, "vm1")),
        Just(meta(10, "tiny")),
        Just(meta(9, "")),
        (9u32..64, prop::collection::vec(any::<u8>(), 0..16)).prop_map(|(o, d)| option(o, &d)),
    ]
}

/// A request with fields near the edges: offsets and lengths around the exports' ends
/// and the 32 MiB cap, every command type and some unknown, flags at random, write
/// payloads of their length (mostly) or not.
fn any_request() -> impl Strategy<Value = Vec<u8>> {
    let offset = prop_oneof![
        Just(0u64),
        Just(1000),
        Just(64 << 10),
        Just((1 << 20) - 512),
        Just(u64::MAX - 10),
        0u64..(2 << 20),
    ];
    let len = prop_oneof![
        Just(0u32),
        Just(1),
        Just(512),
        Just(4096),
        Just(32 << 20),
        Just((32 << 20) + 1),
        0u32..8192,
    ];
    (
        0u16..10,
        any::<u16>(),
        any::<u64>(),
        offset,
        len,
        any::<u8>(),
    )
        .prop_map(|(kind, flags, handle, offset, len, payload)| {
            let mut b = header(kind, flags & 0x1f, handle, offset, len);
            if kind == 1 && len <= 8192 {
                let n = if payload < 200 {
                    len as usize
                } else {
                    payload as usize
                };
                b.extend(std::iter::repeat_n(0xab, n));
            }
            b
        })
}

/// A conversation: client flags, options, then requests, with stray bytes here and
/// there.
fn conversation() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![Just(3u32), Just(1), any::<u32>()],
        prop::collection::vec(any_option(), 0..4),
        prop::collection::vec(any_request(), 0..12),
        prop::collection::vec(any::<u8>(), 0..4),
        any::<bool>(),
    )
        .prop_map(|(flags, options, requests, stray, garble)| {
            let mut b = flags.to_be_bytes().to_vec();
            for o in options {
                b.extend(o);
            }
            let go = {
                let mut d = 3u32.to_be_bytes().to_vec();
                d.extend_from_slice(b"vm1");
                d.extend_from_slice(&0u16.to_be_bytes());
                option(7, &d)
            };
            b.extend(go);
            for (i, r) in requests.into_iter().enumerate() {
                if garble && i == 3 {
                    b.extend_from_slice(&stray);
                }
                b.extend(r);
            }
            b
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_cut_anywhere(
        input in prop::collection::vec(any::<u8>(), 0..256),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        check_pieces(&input, &cuts);
    }

    #[test]
    fn conversations_cut_anywhere(
        input in conversation(),
        cuts in prop::collection::vec(any::<usize>(), 0..16),
    ) {
        check_pieces(&input, &cuts);
    }
}

/// One valid request for `vm1` (1 MiB, writable): its bytes, and the command the codec
/// must hand out for it (kind number, handle, offset, length, FUA).
type Valid = (Vec<u8>, (u16, u64, u64, u32, bool));

/// Requests the protocol allows on a writable 1 MiB export: every command type,
/// lengths from 1 byte to 64 KiB, offsets anywhere up to the very end (often exactly
/// there), FUA on what may carry it.
fn valid_request() -> impl Strategy<Value = Valid> {
    const SIZE: u64 = 1 << 20;
    (
        prop_oneof![Just(0u16), Just(1), Just(3), Just(4), Just(6)],
        any::<u64>(),
        1u32..=(64 << 10),
        prop_oneof![Just(None), (0u64..SIZE).prop_map(Some)],
        any::<bool>(),
    )
        .prop_map(|(kind, handle, len, at, fua)| {
            let len = if kind == 3 { 0 } else { len };
            // `None`: the request ends exactly at the export's end.
            let offset = match at {
                _ if kind == 3 => 0,
                None => SIZE - len as u64,
                Some(o) => o.min(SIZE - len as u64),
            };
            let fua = fua && kind != 0 && kind != 3;
            let flags: u16 = if fua { 1 } else { 0 };
            let b = valid_bytes(kind, flags, handle, offset, len);
            (b, (kind, handle, offset, len, fua))
        })
}

/// The positive oracle: a client that follows the protocol gets every request through,
/// unchanged and in order, however its bytes are cut.
fn accepts_every_valid_request(requests: &[Valid], cuts: &[usize]) {
    use ioshare::nbd::{CommandKind, Event};
    let mut input = 3u32.to_be_bytes().to_vec(); // FIXED_NEWSTYLE | NO_ZEROES
    let mut go = 3u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"vm1");
    go.extend_from_slice(&0u16.to_be_bytes());
    input.extend(option(7, &go));
    for (bytes, _) in requests {
        input.extend_from_slice(bytes);
    }
    let exports = ioshare::nbd::fuzzing::exports();
    let t = ioshare::nbd::fuzzing::run(&exports, &input, cuts);
    let mut events = t.events.iter();
    assert!(
        matches!(events.next(), Some(Ok(Event::Selected { export: 0 }))),
        "{:?}",
        t.events.first()
    );
    for (i, (_, (kind, handle, offset, len, fua))) in requests.iter().enumerate() {
        let Some(Ok(Event::Command(c))) = events.next() else {
            panic!(
                "request {i} ({kind}, {offset}+{len}) was not accepted: {:?}",
                t.events
            );
        };
        assert_eq!(c.handle, *handle, "request {i}");
        let want_range = if *kind == 3 { (0, 0) } else { (*offset, *len) };
        assert_eq!((c.offset, c.len), want_range, "request {i}");
        match (&c.kind, kind) {
            (CommandKind::Read, 0) | (CommandKind::Flush, 3) => {}
            (CommandKind::Write { data, fua: f }, 1) => {
                assert_eq!(f, fua, "request {i}");
                assert!(
                    data.iter().enumerate().all(|(j, &b)| b == (j % 251) as u8),
                    "request {i}: payload changed"
                );
                assert_eq!(data.len(), *len as usize);
            }
            (CommandKind::Trim { fua: f }, 4) | (CommandKind::WriteZeroes { fua: f, .. }, 6) => {
                assert_eq!(f, fua, "request {i}")
            }
            (other, k) => panic!("request {i}: type {k} came out as {other:?}"),
        }
    }
    assert!(
        events.next().is_none(),
        "more events than requests: {:?}",
        t.events
    );
}

#[test]
fn a_request_ending_exactly_at_the_export_end_is_accepted() {
    // Every kind, 4 KiB and 1 byte long, ending at byte 1 MiB of a 1 MiB export.
    let mut requests = Vec::new();
    for (handle, (kind, len)) in [
        (0u16, 4096u32),
        (1, 4096),
        (4, 4096),
        (6, 4096),
        (0, 1),
        (1, 1),
    ]
    .into_iter()
    .enumerate()
    {
        let offset = (1u64 << 20) - len as u64;
        let b = valid_bytes(kind, 0, handle as u64, offset, len);
        requests.push((b, (kind, handle as u64, offset, len, false)));
    }
    accepts_every_valid_request(&requests, &[]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn valid_requests_are_all_accepted(
        requests in prop::collection::vec(valid_request(), 1..24),
        cuts in prop::collection::vec(any::<usize>(), 0..16),
    ) {
        accepts_every_valid_request(&requests, &cuts);
    }
}
