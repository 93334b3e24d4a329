//! Where in a scenario or server configuration file a field is: the line a user should look at when an error
//! names `tenant 2 ('b').workload.size` or `device.preset`. The file is parsed into a
//! table (the sweep rewrites it) before it is checked, so spans are gone by the time a
//! problem is found; this finds the line again in the text, by the field's path.
//!
//! Readings: a tenant is the n-th `[[tenant]]` header; inside it (up to the next
//! `[[tenant]]` or a table that is not the tenant's own), the first line that sets the
//! path's first key names it (`size = ...`, or `[tenant.workload]` for `workload.x`, or
//! an inline `workload = { ..., size = 4 }` line that holds the last key); a table
//! (`device.x`) is its `[device]` header's section; a top-level key is the line that
//! sets it before the first header. Not found: the tenant's header, the table's
//! header, or nothing.

/// 1-based line of `field` (as [`crate::config::ConfigError::field`] writes it) in
/// `text`.
pub fn line_of(text: &str, field: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let (section, keys): (Option<(usize, usize)>, Vec<&str>) =
        if let Some(rest) = field.strip_prefix("tenant ") {
            // "2 ('b').workload.size"
            let n: usize = rest.split(' ').next()?.parse().ok()?;
            let keys = rest.split_once(").").map_or(vec![], |(_, k)| key_path(k));
            (Some(nth_tenant(&lines, n)?), keys)
        } else {
            let keys = key_path(field);
            match keys.first() {
                Some(table) if header_line(&lines, &format!("[{table}]")).is_some() => {
                    let start = header_line(&lines, &format!("[{table}]"))?;
                    let end = next_header(&lines, start + 1);
                    (Some((start, end)), keys[1..].to_vec())
                }
                _ => (None, keys),
            }
        };
    let (start, end) = section.unwrap_or((0, next_header(&lines, 0)));
    let first = keys.first().copied();
    let last = keys.last().copied();
    let found = first.and_then(|k| {
        (start..end).find(|&i| {
            let l = lines[i].trim_start();
            sets(l, k) || l.starts_with(&format!("[tenant.{k}")) || l.starts_with(&format!("[{k}"))
        })
    });
    // An inline table on one line: the line holding the last key, if it does.
    let found = match (found, last) {
        (Some(i), Some(k)) if keys.len() > 1 && lines[i].contains(&format!("{k} =")) => Some(i),
        (Some(i), Some(k)) if keys.len() > 1 => (i..end)
            .find(|&j| sets(lines[j].trim_start(), k))
            .or(Some(i)),
        (f, _) => f,
    };
    found.or(section.map(|(s, _)| s)).map(|i| i + 1)
}

/// `workload.phases[1].size` → `["workload", "phases", "size"]`.
fn key_path(field: &str) -> Vec<&str> {
    field
        .split('.')
        .map(|k| k.split('[').next().unwrap_or(k).trim_matches('`'))
        .filter(|k| !k.is_empty())
        .collect()
}

/// Whether the line sets `key` (`key = ...`, `"key" = ...`).
fn sets(line: &str, key: &str) -> bool {
    let rest = line
        .strip_prefix(key)
        .or_else(|| line.strip_prefix(&format!("\"{key}\"")));
    rest.is_some_and(|r| r.trim_start().starts_with('='))
}

fn header_line(lines: &[&str], header: &str) -> Option<usize> {
    lines.iter().position(|l| l.trim() == header)
}

/// The line index of the next `[...]` header from `from` (or the end).
fn next_header(lines: &[&str], from: usize) -> usize {
    (from..lines.len())
        .find(|&i| lines[i].trim_start().starts_with('['))
        .unwrap_or(lines.len())
}

/// The n-th (1-based) `[[tenant]]` section: its header and where it ends.
fn nth_tenant(lines: &[&str], n: usize) -> Option<(usize, usize)> {
    let start = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.trim() == "[[tenant]]")
        .nth(n.checked_sub(1)?)?
        .0;
    let end = (start + 1..lines.len())
        .find(|&i| {
            let l = lines[i].trim_start();
            l.starts_with('[') && !l.starts_with("[tenant.") && !l.starts_with("[[tenant.")
        })
        .unwrap_or(lines.len());
    Some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "duration_s = 1\nseed = 3\n[device]\nmodel = \"ssd\"\npreset = \"x\"\n[[tenant]]\nname = \"a\"\nworkload = { pattern = \"randread\", size = 4 }\n[[tenant]]\nname = \"b\"\nwieght = 3\n[tenant.workload]\npattern = \"randread\"\nsize = 4\n[[tenant.workload.phases]]\nduration_s = 1\n[sweep]\nx = 1\n";

    #[test]
    fn fields_are_found_on_their_lines() {
        assert_eq!(line_of(TEXT, "seed"), Some(2));
        assert_eq!(line_of(TEXT, "device.preset"), Some(5));
        assert_eq!(
            line_of(TEXT, "device.capacity_gib"),
            Some(3),
            "the table's header"
        );
        assert_eq!(line_of(TEXT, "tenant 1 ('a').workload.size"), Some(8));
        assert_eq!(line_of(TEXT, "tenant 2 ('b')"), Some(9));
        assert_eq!(line_of(TEXT, "tenant 2 ('b').wieght"), Some(11));
        assert_eq!(line_of(TEXT, "tenant 2 ('b').workload.size"), Some(14));
        assert_eq!(
            line_of(TEXT, "tenant 2 ('b').workload.phases[0].duration_s"),
            Some(16)
        );
        assert_eq!(line_of(TEXT, "tenant 3 ('c')"), None);
        assert_eq!(line_of(TEXT, "nothing"), None);
    }
}
