//! The crate's layers, checked on its source: a module may use what is in its own layer
//! or below, never above. Lowest first:
//!
//! * core — the sans-I/O parts: `types`, `units`, `buffer` (and `slab`, the memory its small
//!   buffers are carved from), `config`, `scenario`, `host`,
//!   `policy`, `limits` (limits others enforce: the governor, the throttle, the fronts'
//!   exchange), `device`, `sim`, `workload`, `metrics`, `nbd`, `journal`, `iolog`,
//!   `trace`, `cluster` (several fronts on one cluster, simulated);
//! * io — `io` (a request's file I/O), `target` (real devices on io_uring), `output` and
//!   `owned_file` (files the project writes for itself);
//! * server — the live NBD server;
//! * tools — `characterize`, `calibrate`, `conformance`, `report`;
//! * cli — `main.rs` and `cli/` (the binary; the library cannot name it).
//!
//! A reference is any `crate::<module>` on a line that is not a comment, outside test
//! code (`tests.rs` files and what follows `#[cfg(test)]` in a file).
//!
//! Beside the layers, two rules of the code's shape are checked here too:
//! `docs/architecture.md` names every module, and no function outside test code is
//! longer than 100 lines.

use std::path::{Path, PathBuf};

const LAYERS: &[(&str, &[&str])] = &[
    (
        "core",
        &[
            "types", "units", "buffer", "slab", "config", "scenario", "host", "policy", "limits",
            "device", "sim", "workload", "metrics", "nbd", "journal", "iolog", "trace", "cluster",
        ],
    ),
    ("io", &["io", "target", "output", "owned_file"]),
    ("server", &["server", "govern"]),
    (
        "tools",
        &["characterize", "calibrate", "conformance", "report"],
    ),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, ms)| ms.contains(&module))
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level modules named as `crate::<name>` in `text`'s non-test, non-comment lines.
fn references(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let name: String = rest[at + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push((i + 1, name));
            }
            rest = &rest[at + 7..];
        }
        // `use crate::{a, b}` names several.
        if let Some(at) = code.find("crate::{") {
            for name in code[at + 8..].split(['}', ',']) {
                let name: String = name
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.push((i + 1, name));
                }
            }
        }
    }
    found
}

#[test]
fn no_module_uses_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut upward = Vec::new();
    let mut checked = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = top.trim_end_matches(".rs").to_string();
        if rel.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        // The binary (main.rs, cli/) is the top layer: it may use anything.
        let Some(own) = layer_of(&module) else {
            assert!(
                ["lib", "main", "cli"].contains(&module.as_str()),
                "{} is in no layer: add its module to LAYERS",
                rel.display()
            );
            continue;
        };
        checked += 1;
        let text = std::fs::read_to_string(f).unwrap();
        for (line, name) in references(&text) {
            if let Some(theirs) = layer_of(&name)
                && theirs > own
            {
                upward.push(format!(
                    "{}:{line}: {} ({}) uses {} ({})",
                    rel.display(),
                    module,
                    LAYERS[own].0,
                    name,
                    LAYERS[theirs].0
                ));
            }
        }
    }
    assert!(checked > 50, "only {checked} files checked");
    assert!(upward.is_empty(), "upward imports:\n{}", upward.join("\n"));
}

/// The checker itself finds what it must: names after `crate::`, grouped imports, and
/// nothing in comments or tests.
#[test]
fn the_reference_finder_sees_paths_groups_and_skips_comments_and_tests() {
    let text = "use crate::server::config;\nuse crate::{policy, report::x};\n// crate::cli\n/// [`crate::target::RingDevice`]\nlet a = crate::sim::run(); // crate::io\n#[cfg(test)]\nuse crate::calibrate;\n";
    let names: Vec<String> = references(text).into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, ["server", "policy", "report", "sim"]);
}

/// `docs/architecture.md` names every module: a directory's `mod.rs` by its path
/// (`src/server/`), any other file by its name (`core.rs`); test files are exempt.
#[test]
fn the_architecture_names_every_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let mut missing = Vec::new();
    for f in files {
        let rel = f.strip_prefix(root).unwrap();
        let name = rel.file_name().unwrap().to_str().unwrap();
        if name == "tests.rs" {
            continue;
        }
        let wanted = if name == "mod.rs" {
            format!("{}/", rel.parent().unwrap().display())
        } else {
            format!("`{name}`")
        };
        let named = doc.contains(&wanted)
            || (name != "mod.rs" && doc.contains(&format!("{}`", rel.display())));
        if !named {
            missing.push(rel.display().to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md does not name: {}",
        missing.join(", ")
    );
}

/// No function outside test code is longer than 100 lines (from its `fn` line to the
/// closing brace at its indentation); `tests.rs` files and what follows `#[cfg(test)]`
/// followed by `mod tests` are test code.
#[test]
fn no_function_is_longer_than_a_hundred_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let mut long = Vec::new();
    for f in files {
        if f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            if t.starts_with("#[cfg(test)]")
                && lines.get(i + 1).is_some_and(|l| l.contains("mod tests"))
            {
                break;
            }
            let is_fn = [
                "fn ",
                "pub fn ",
                "pub(crate) fn ",
                "pub(super) fn ",
                "const fn ",
                "pub const fn ",
                "unsafe fn ",
                "pub unsafe fn ",
            ]
            .iter()
            .any(|p| t.starts_with(p));
            if !is_fn || line.trim_end().ends_with(';') {
                continue;
            }
            let indent = &line[..line.len() - t.len()];
            let close = format!("{indent}}}");
            if let Some(end) = lines[i + 1..].iter().position(|l| *l == close) {
                let n = end + 2;
                if n > 100 {
                    let name: String = t
                        .split("fn ")
                        .nth(1)
                        .unwrap_or("")
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    long.push(format!(
                        "{}:{} {name} ({n} lines)",
                        f.strip_prefix(root).unwrap().display(),
                        i + 1
                    ));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over 100 lines: {}",
        long.join(", ")
    );
}

/// The policies on the scheduling frame (`src/policy/frame.rs`) keep no queues, depth
/// or floor bookkeeping of their own: each names the frame, and none holds
/// `TenantQueues`, a depth or a floor of its own outside test code.
#[test]
fn the_policies_on_the_frame_do_their_bookkeeping_through_it() {
    const ON_THE_FRAME: &[&str] = &[
        "none",
        "sfq",
        "feedbac",
        "bfq",
        "cfq",
        "mclock",
        "token_bucket",
    ];
    const THE_FRAMES_OWN: &[&str] = &["TenantQueues", "self.queues", "self.depth", "self.floor"];
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/policy");
    for name in ON_THE_FRAME {
        let text = std::fs::read_to_string(root.join(format!("{name}.rs"))).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        assert!(code.contains("Frame"), "{name}.rs is not on the frame");
        for (i, line) in code.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for own in THE_FRAMES_OWN {
                assert!(
                    !line.contains(own),
                    "src/policy/{name}.rs:{}: `{own}` is the frame's to do: {line}",
                    i + 1
                );
            }
        }
    }
}
