//! `[sweep]`: one scenario file, many runs. Each key is a dotted path into the scenario
//! document, each value a list; the scenario is expanded into every point of the
//! cartesian product before it is read.

/// The most points one sweep may have.
pub const MAX_POINTS: usize = 10_000;

/// Expands `[sweep]`: each key is a dotted path into the scenario (`device.precondition`,
/// `tenant.B.workload.size`; inside an array of tables a segment picks the entry with
/// that `name`, an index, or `*` for all of them), each value a list. Returns one document per point of the
/// cartesian product, in order (the first key varies slowest), with its label.
pub(super) fn expand_sweep(mut doc: toml::Table) -> Result<Vec<(String, toml::Table)>, String> {
    let Some(sweep) = doc.remove("sweep") else {
        return Ok(vec![(String::new(), doc)]);
    };
    let toml::Value::Table(sweep) = sweep else {
        return Err("must be a table of `path = [values]`".into());
    };
    // The product is counted before anything is built: 100 × 100 × 100 points were
    // built up front and aborted on an allocation.
    let mut count: usize = 1;
    for (path, values) in &sweep {
        if let toml::Value::Array(values) = values {
            count = count.saturating_mul(values.len().max(1));
        } else {
            return Err(format!("'{path}' must be a list of values"));
        }
    }
    if count > MAX_POINTS {
        return Err(format!(
            "{count} points (the product of the lists' lengths), more than {MAX_POINTS}: split the sweep into several files"
        ));
    }
    let mut points: Vec<(String, toml::Table)> = vec![(String::new(), doc)];
    for (path, values) in sweep {
        let toml::Value::Array(values) = values else {
            return Err(format!("'{path}' must be a list of values"));
        };
        if values.is_empty() {
            return Err(format!("'{path}' has no values"));
        }
        let mut next = Vec::with_capacity(points.len() * values.len());
        for (label, doc) in &points {
            for v in &values {
                let mut d = doc.clone();
                set_path(&mut d, &path, v.clone()).map_err(|e| format!("'{path}': {e}"))?;
                let shown = match v {
                    toml::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let l = if label.is_empty() {
                    format!("{path}={shown}")
                } else {
                    format!("{label}, {path}={shown}")
                };
                next.push((l, d));
            }
        }
        points = next;
    }
    Ok(points)
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
