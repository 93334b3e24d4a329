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

/// Options a client may send before GO: LIST, INFO, STRUCTURED_REPLY, unknown ones,
/// GO/INFO with names that exist, do not, or try a path.
fn any_option() -> impl Strategy<Value = Vec<u8>> {
    let name = prop_oneof![
        Just("vm1".to_string()),
        Just("ro".to_string()),
        Just("tiny".to_string()),
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
    prop_oneof![
        info,
        Just(option(3, &[])),
        Just(option(8, &[])),
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
            let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
            b.extend_from_slice(&(flags & 0x1f).to_be_bytes());
            b.extend_from_slice(&kind.to_be_bytes());
            b.extend_from_slice(&handle.to_be_bytes());
            b.extend_from_slice(&offset.to_be_bytes());
            b.extend_from_slice(&len.to_be_bytes());
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
