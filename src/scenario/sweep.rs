//! `[sweep]`: one scenario file, many runs. Each key is a dotted path into the scenario
//! document, each value a list; each point of the cartesian product is built, read and
//! checked when it is asked for, so a sweep never holds more than one point's document.

use crate::config::Invalid;

/// The most points one sweep may have.
pub const MAX_POINTS: usize = 10_000;

/// A scenario document's `[sweep]`: the base document and the lists to combine. Points
/// are built one at a time ([`Sweep::point`]), never all at once.
#[derive(Debug, Clone)]
pub(super) struct Sweep {
    base: toml::Table,
    /// Each key's dotted path and values, in the keys' alphabetical order (TOML tables
    /// are read sorted, whatever the file's order): the first varies slowest.
    axes: Vec<(String, Vec<toml::Value>)>,
    count: usize,
}

impl Sweep {
    /// Takes `[sweep]` out of `doc`: each key is a dotted path into the scenario
    /// (`device.precondition`, `tenant.B.workload.size`; inside an array of tables a
    /// segment picks the entry with that `name`, an index, or `*` for all of them), each
    /// value a list. Without `[sweep]`, one point: the document itself.
    pub(super) fn new(mut doc: toml::Table) -> Result<Sweep, Invalid> {
        let Some(sweep) = doc.remove("sweep") else {
            return Ok(Sweep {
                base: doc,
                axes: Vec::new(),
                count: 1,
            });
        };
        let toml::Value::Table(sweep) = sweep else {
            return Err(Invalid::new(
                "sweep",
                "must be a table of `path = [values]`",
            ));
        };
        // The product is counted before anything is built: 100 × 100 × 100 points were
        // built up front and aborted on an allocation.
        let mut count: usize = 1;
        let mut axes = Vec::with_capacity(sweep.len());
        for (path, values) in sweep {
            let toml::Value::Array(values) = values else {
                return Err(Invalid::new(
                    format!("sweep.'{path}'"),
                    "must be a list of values",
                ));
            };
            if values.is_empty() {
                return Err(Invalid::new(format!("sweep.'{path}'"), "has no values"));
            }
            count = count.saturating_mul(values.len());
            axes.push((path, values));
        }
        if count > MAX_POINTS {
            return Err(Invalid::new(
                "sweep",
                format!(
                    "{count} points (the product of the lists' lengths), more than {MAX_POINTS}: split the sweep into several files"
                ),
            ));
        }
        Ok(Sweep {
            base: doc,
            axes,
            count,
        })
    }

    /// How many points: the product of the lists' lengths (1 without a sweep).
    pub(super) fn len(&self) -> usize {
        self.count
    }

    /// Point `index` (< [`Sweep::len`]) of the cartesian product, the alphabetically
    /// first key varying slowest: its label (`path=value, …`, empty without a sweep)
    /// and document.
    pub(super) fn point(&self, index: usize) -> Result<(String, toml::Table), Invalid> {
        assert!(index < self.count, "point {index} of {}", self.count);
        let mut doc = self.base.clone();
        let mut label = String::new();
        let mut stride = self.count;
        for (path, values) in &self.axes {
            stride /= values.len();
            let v = &values[(index / stride) % values.len()];
            set_path(&mut doc, path, v.clone())
                .map_err(|e| Invalid::new(format!("sweep.'{path}'"), e))?;
            let shown = match v {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if !label.is_empty() {
                label.push_str(", ");
            }
            label.push_str(&format!("{path}={shown}"));
        }
        Ok((label, doc))
    }
}

fn set_path(doc: &mut toml::Table, path: &str, value: toml::Value) -> Result<(), String> {
    let segments: Vec<&str> = path.split('.').collect();
    set_segments(doc, &segments, &value)
}

/// Sets `value` at `segments` under `table`; in an array of tables the next segment picks
/// an entry by `name` or index, or `*` for every entry.
fn set_segments(
    table: &mut toml::Table,
    segments: &[&str],
    value: &toml::Value,
) -> Result<(), String> {
    let (first, rest) = segments.split_first().ok_or("empty path")?;
    if rest.is_empty() {
        table.insert(first.to_string(), value.clone());
        return Ok(());
    }
    let entry = table
        .entry(first.to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    match entry {
        toml::Value::Table(t) => set_segments(t, rest, value),
        toml::Value::Array(items) => {
            let (pick, rest) = rest
                .split_first()
                .filter(|(_, r)| !r.is_empty())
                .ok_or_else(|| {
                    format!("'{first}' is a list: name an entry and a field after it")
                })?;
            let picked: Vec<usize> = if *pick == "*" {
                (0..items.len()).collect()
            } else {
                let idx = items
                    .iter()
                    .position(|it| it.get("name").and_then(|n| n.as_str()) == Some(*pick))
                    .or_else(|| pick.parse::<usize>().ok().filter(|&i| i < items.len()))
                    .ok_or_else(|| format!("no entry '{pick}' in '{first}'"))?;
                vec![idx]
            };
            for i in picked {
                match &mut items[i] {
                    toml::Value::Table(t) => set_segments(t, rest, value)?,
                    _ => return Err(format!("entry {i} of '{first}' is not a table")),
                }
            }
            Ok(())
        }
        _ => Err(format!(
            "'{first}' is not a table (write it as a table to sweep inside it)"
        )),
    }
}
