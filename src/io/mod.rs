//! The I/O layer under the live server and `target/` (characterize, calibrate on real
//! devices): a request's file I/O as a state machine both drive on their io_uring rings.

pub mod transfer;
