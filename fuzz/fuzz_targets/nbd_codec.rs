//! Fuzzes the NBD server codec: the first byte says how many cut points follow (two
//! bytes each); the rest is what a client sends. The input cut there must give the
//! same events and handshake bytes as whole, and no unsafe request may come out.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = (n as usize % 16).min(rest.len() / 2);
    let (cuts, input) = rest.split_at(n * 2);
    let cuts: Vec<usize> = cuts
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]) as usize)
        .collect();
    ioshare::nbd::fuzzing::check_pieces(input, &cuts);
});
