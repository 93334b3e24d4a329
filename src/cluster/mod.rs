//! Many hosts, one cluster: several ioshare fronts serve tenants whose volumes live on a
//! shared Ceph-like cluster, and each tenant's weight, reservation and limit hold
//! across all fronts together ("Beyond one host").
//!
//! * [`crate::limits::share`] — the sans-I/O core every front runs: the reports the fronts exchange
//!   each period, a replica of the governor on their sum, and the split of each
//!   tenant's global limits across the fronts by demand.
//! * [`model`] — the simulated cluster: OSDs (each a device model), replication,
//!   placement by hash, network delay.
//! * [`sim`] — the multi-front simulator: fronts (each a host core with a throttle
//!   taking its limits from its share), the exchange with delay and loss, tenants'
//!   closed-loop workloads spread over fronts; the properties are its tests.

pub mod model;
pub mod sim;
