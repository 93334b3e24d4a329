//! Where measurement scenarios run: the simulator on a device model, or a real target
//! (a file or block device on io_uring, [`crate::target`]) in wall time — the same
//! driver, host core and policies either way ([`crate::sim`]).

use super::MeasureError;
use crate::metrics::RunResult;
use crate::scenario::Scenario;
use crate::target::Target;

/// Runs measurement scenarios on one target.
pub trait Runner {
    /// The target, in one line.
    fn describe(&self) -> String;
    /// Its capacity, bytes.
    fn capacity_bytes(&self) -> u64;
    /// The `[device]` table scenarios are written with (the model itself, or a
    /// stand-in of the target's capacity for a real one: its cost model is what a
    /// policy charges there).
    fn device(&self) -> toml::Table;
    /// Runs every policy of every scenario, in order; the results in the same order.
    fn run(
        &mut self,
        scenarios: &[Scenario],
        progress: bool,
    ) -> Result<Vec<RunResult>, MeasureError>;
}

/// The simulator on a device model.
pub struct ModelRunner {
    /// The device, as a scenario's `[device]` table.
    pub device: toml::Table,
}

impl ModelRunner {
    fn spec(&self) -> Result<crate::device::spec::DeviceSpec, MeasureError> {
        let device = |invalid| MeasureError::Device {
            table: "[device]",
            invalid,
        };
        let file: crate::device::spec::DeviceFile = toml::Value::Table(self.device.clone())
            .try_into()
            .map_err(|e: toml::de::Error| device(crate::config::Invalid::whole(e.to_string())))?;
        file.spec().map_err(device)
    }
}

impl Runner for ModelRunner {
    fn describe(&self) -> String {
        self.spec().map(|d| d.describe()).unwrap_or_default()
    }

    fn capacity_bytes(&self) -> u64 {
        self.spec().map(|d| d.capacity_bytes()).unwrap_or(0)
    }

    fn device(&self) -> toml::Table {
        self.device.clone()
    }

    fn run(
        &mut self,
        scenarios: &[Scenario],
        progress: bool,
    ) -> Result<Vec<RunResult>, MeasureError> {
        Ok(crate::sim::run_each(scenarios, progress, crate::sim::RunOptions::default())?.runs)
    }
}

/// A real target in wall time.
pub struct LiveRunner {
    /// The target.
    pub target: Target,
    /// What policies charge on it: a calibrated `[device]` table (`calibrate --out`),
    /// or `None` for a `fixed` stand-in of its capacity.
    pub cost_device: Option<toml::Table>,
}

impl Runner for LiveRunner {
    fn describe(&self) -> String {
        self.target.describe()
    }

    fn capacity_bytes(&self) -> u64 {
        self.target.size
    }

    fn device(&self) -> toml::Table {
        let mut t = self.cost_device.clone().unwrap_or_else(|| {
            let mut t = toml::Table::new();
            t.insert("model".into(), "fixed".into());
            t
        });
        // The scenario's capacity is the target's, so its tenants' regions fall on it
        // (exactly: the size is a multiple of 2 MiB).
        t.insert(
            "capacity_gib".into(),
            toml::Value::Float(self.target.size as f64 / (1u64 << 30) as f64),
        );
        t
    }

    fn run(
        &mut self,
        scenarios: &[Scenario],
        progress: bool,
    ) -> Result<Vec<RunResult>, MeasureError> {
        let total: usize = scenarios.iter().map(|s| s.policies.len()).sum();
        let bar = progress.then(|| {
            let b = indicatif::ProgressBar::new(total as u64);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} runs ({elapsed}, about {eta} left)",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            b.set_prefix(self.target.path.display().to_string());
            b
        });
        let mut out = Vec::with_capacity(total);
        for s in scenarios {
            super::ensure!(
                s.device.capacity_bytes() <= self.target.size,
                "a scenario's device ({} bytes) is larger than the target ({} bytes)",
                s.device.capacity_bytes(),
                self.target.size
            );
            for choice in &s.policies {
                let device = self.target.device()?;
                let failure = device.failure_slot();
                let r = crate::sim::run_policy_with(
                    s,
                    choice,
                    Box::new(device),
                    None,
                    crate::sim::RunOptions::default(),
                )?;
                let failed = failure.lock().expect("failure lock").take();
                if let Some(why) = failed.or_else(crate::target::interrupted) {
                    return Err(crate::target::TargetError::Failed(format!(
                        "{}: {why}",
                        self.target.path.display()
                    ))
                    .into());
                }
                out.push(r);
                if let Some(b) = &bar {
                    b.inc(1);
                }
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        Ok(out)
    }
}
