//! The I/O layer under the live server and `target/` (characterize, calibrate on real
//! devices): the io_uring ring with its teardown rule ([`ring`]) and a request's file
//! I/O as a state machine ([`transfer`]), both drivers' alike. (Aligned, pooled request
//! buffers are `crate::buffer`'s, in the core: the NBD codec receives write payloads
//! into them.)

pub mod extents;
pub mod ring;
pub mod transfer;
