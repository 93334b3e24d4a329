//! The server's memory budget (`server.max_inflight_bytes`) as one rule, without I/O:
//! whether a connection may take its next request, given what it and the server hold.
//! A request holds its data (a write's payload, a read's reply data) and its reply's
//! header from the moment its header is whole until its reply is sent, so a client that
//! never reads its replies, errors included, cannot make the server hold more for it.
//! The engine asks [`may_take`] before it parses a header; a `false` leaves the
//! connection unread (back-pressure).

use crate::nbd::proto;

/// Request data one connection may hold (requests in the server, replies not yet sent)
/// before it stops being read: a client that does not read its replies cannot make the
/// server hold more for it, nor take the whole budget from the other connections.
pub const CONN_BYTES_LIMIT: u64 = 64 << 20;
/// What a reply's header holds of the budget until it is sent.
pub const REPLY_BYTES: u64 = proto::MAX_REPLY_HEADER as u64;
/// A connection holding nothing may always take a request this small, budget or not, so
/// that small requests are served while large ones wait for room.
pub const ALWAYS_BYTES: u64 = 1 << 20;

/// What a request whose header announces `data` bytes holds of the budget.
pub fn held_by(data: u32) -> u64 {
    u64::from(data) + REPLY_BYTES
}

/// Whether a connection holding `pending` bytes may take a request holding `next`,
/// with `inflight` held over all connections under `max_inflight`: it fits the
/// connection's share and the budget, or the connection holds nothing and it is small.
pub fn may_take(pending: u64, next: u64, inflight: u64, max_inflight: u64) -> bool {
    let small = pending == 0 && next <= ALWAYS_BYTES;
    small || fits(pending, next, inflight, max_inflight)
}

/// Whether the request fits the connection's share and the budget (without the
/// small-request rule).
pub fn fits(pending: u64, next: u64, inflight: u64, max_inflight: u64) -> bool {
    pending + next <= CONN_BYTES_LIMIT && inflight + next <= max_inflight
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_budget_holds_at_its_exact_bound() {
        let max = 512 * MIB;
        let next = held_by(32 << 20);
        // Exactly at the budget: taken; one byte over: not.
        assert!(may_take(MIB, next, max - next, max));
        assert!(!may_take(MIB, next, max - next + 1, max));
    }

    #[test]
    fn a_connection_holds_at_most_its_share() {
        let next = held_by(4096);
        assert!(may_take(CONN_BYTES_LIMIT - next, next, 0, u64::MAX));
        assert!(!may_take(CONN_BYTES_LIMIT - next + 1, next, 0, u64::MAX));
    }

    #[test]
    fn a_connection_holding_nothing_may_take_a_small_request_past_the_budget() {
        let full = 512 * MIB;
        assert!(may_take(0, held_by(4096), full, full));
        assert!(may_take(0, ALWAYS_BYTES, full, full));
        assert!(!may_take(0, ALWAYS_BYTES + 1, full, full));
        // Holding anything, it waits like the others.
        assert!(!may_take(1, held_by(4096), full, full));
    }

    #[test]
    fn every_request_holds_its_reply() {
        // The longest header: a structured read's data chunk, 20 bytes and its offset.
        assert_eq!(held_by(0), 28, "an error reply or a flush holds its header");
        assert_eq!(held_by(4096), 4096 + 28);
    }
}
