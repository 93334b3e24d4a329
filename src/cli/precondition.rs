//! `ioshare precondition`: an SSD model built and aged, and how long that took.

use super::*;

/// `ioshare precondition`.
pub(crate) fn run(
    preset: String,
    capacity_gib: Option<f64>,
    passes: f64,
    seed: u64,
    force: bool,
) -> Result<()> {
    let p = ssd::preset(&preset).with_context(|| format!("unknown preset '{preset}'"))?;
    let mut params = p.params;
    if let Some(c) = capacity_gib {
        // The scenario's own range (4 KiB of pages to 4 TiB).
        if !(c.is_finite() && c * 1024.0 * 1024.0 >= 4.0 && c <= 4096.0) {
            bail!("--capacity-gib must be in [4 KiB, 4096] GiB, got {c}");
        }
        params.capacity_gib = c;
    }
    if !(passes.is_finite() && passes > 0.0 && passes <= 100.0) {
        bail!("--passes must be in (0, 100], got {passes}");
    }
    let limits = Limits::default();
    let memory = params.capacity_gib * cost::SSD_BYTES_PER_GIB;
    let aging = params.capacity_gib * passes * cost::AGING_SECONDS_PER_GIB_PASS;
    if !force && (memory > limits.memory_bytes || aging > limits.aging_seconds) {
        bail!(
            "not run: about {:.1} GiB of memory and {aging:.0} s of aging (limits {:.0} GiB, {:.0} s); give --force to run it anyway",
            memory / (1u64 << 30) as f64,
            limits.memory_bytes / (1u64 << 30) as f64,
            limits.aging_seconds
        );
    }
    let t = Instant::now();
    let mut d = SsdDevice::new(params);
    let built = t.elapsed();
    d.precondition(Precondition::Aged, passes, seed);
    let aged = t.elapsed();
    let g = d.ftl().geometry();
    println!(
        "{preset}: {:.1} GiB, {} dies × {} blocks × {} pages; allocated in {:.2} s, aged ({} passes) in {:.2} s",
        d.capacity_bytes() as f64 / (1u64 << 30) as f64,
        g.dies,
        g.blocks_per_die,
        g.pages_per_block,
        built.as_secs_f64(),
        passes,
        aged.as_secs_f64()
    );
    Ok(())
}
