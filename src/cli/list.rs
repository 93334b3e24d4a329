//! `ioshare list`: policies, device presets and workload stand-ins.

use super::*;

/// `ioshare list`.
pub(crate) fn run() -> Result<()> {
    println!("policies:");
    for p in policy::registry() {
        let default = if p.name == policy::DEFAULT_POLICY {
            " (the default)"
        } else {
            ""
        };
        let gated = if p.gated {
            "; limits kept by the gate in front of it"
        } else {
            ""
        };
        println!("  {:<10} {}{gated}{default}", p.name, p.summary);
    }
    println!("ssd presets:");
    for p in ssd::presets() {
        println!("  {:<12} {}", p.name, p.description);
    }
    println!("hdd presets:");
    for p in ioshare::device::hdd::presets() {
        println!("  {:<16} {}", p.name, p.about);
    }
    println!("raid0 presets:");
    for p in ioshare::device::raid0::presets() {
        println!("  {:<16} {}", p.name, p.about);
    }
    println!("workload stand-ins (synthetic: published mix and mean size, not the traces):");
    for w in workload::standins::STANDINS {
        println!("  {:<12} {}", w.name, w.source);
    }
    Ok(())
}
