//! Hostile sizes in every field that takes one, in scenarios and in the server's
//! configuration: each is refused before anything runs, and the message names the file
//! and the line, the tenant (its number and name) where the field is a tenant's, and the
//! field — so a user finds the mistake without reading the parser. A bare number under
//! 512 (`size = 4`: four bytes, or 4 KiB meant?) is refused with the unit to write.

use ioshare::scenario::Scenario;
use ioshare::server::config::ServerConfig;

/// Bad values for a size, and a word each message must hold besides the place.
const HOSTILE: &[(&str, &str)] = &[
    ("4", "without a unit"),
    ("511", "without a unit"),
    ("-4", "negative"),
    ("\"4q\"", "unknown size suffix 'q'"),
    ("\"-4k\"", "is not a size"),
    ("\"\"", "is not a size"),
    ("\"k\"", "is not a size"),
    ("\"1.5.5k\"", "is not a size"),
    ("true", "invalid type"),
    ("[4096]", "invalid type"),
];

const SCENARIO: &str = r#"duration_s = 1
[device]
model = "fixed"
capacity_gib = 4

[[tenant]]
name = "x"
workload = { pattern = "randread", size = "4k", iodepth = 1 }

[[tenant]]
name = "y"
offset = "1g"
size = "1g"
slo = { iops = 10.0, size = "4k", rt_us = 5000 }
[tenant.workload]
pattern = "randrw"
size_mean = "16k"
align = "4k"
iodepth = 1
"#;

/// (the line as the template has it, the key to give a bad value, its line, the field
/// as the message names it).
const SCENARIO_FIELDS: &[(&str, &str, usize, &str)] = &[
    (
        "workload = { pattern = \"randread\", size = \"4k\", iodepth = 1 }",
        "workload = { pattern = \"randread\", size = VALUE, iodepth = 1 }",
        8,
        "tenant 1 ('x').workload.size",
    ),
    (
        "offset = \"1g\"",
        "offset = VALUE",
        12,
        "tenant 2 ('y').offset",
    ),
    ("size = \"1g\"", "size = VALUE", 13, "tenant 2 ('y').size"),
    (
        "slo = { iops = 10.0, size = \"4k\", rt_us = 5000 }",
        "slo = { iops = 10.0, size = VALUE, rt_us = 5000 }",
        14,
        "tenant 2 ('y').slo.size",
    ),
    (
        "size_mean = \"16k\"",
        "size_mean = VALUE",
        17,
        "tenant 2 ('y').workload.size_mean",
    ),
    (
        "align = \"4k\"",
        "align = VALUE",
        18,
        "tenant 2 ('y').workload.align",
    ),
];

/// Writes `template` with each field of `fields` given each [`HOSTILE`] value into
/// `path` and checks that `load` refuses it naming `file:line: field: ` and the problem.
fn every_value_refused(
    path: &std::path::Path,
    template: &str,
    fields: &[(&str, &str, usize, &str)],
    load: impl Fn(&std::path::Path) -> Result<(), String>,
) {
    std::fs::write(path, template).unwrap();
    load(path).expect("the template loads");
    let file = path.file_name().unwrap().to_string_lossy();
    let mut checked = 0;
    for (line, with, at, field) in fields {
        assert!(template.contains(line), "{line}");
        for (value, word) in HOSTILE {
            let text = template.replacen(line, &with.replace("VALUE", value), 1);
            std::fs::write(path, &text).unwrap();
            let e = load(path).expect_err(&format!("{field} = {value} was accepted"));
            let place = format!("{file}:{at}: {field}: ");
            assert!(
                e.contains(&place),
                "{field} = {value}: wanted `{place}` in: {e}"
            );
            assert!(
                e.contains(word),
                "{field} = {value}: wanted `{word}` in: {e}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, fields.len() * HOSTILE.len());
}

#[test]
fn every_hostile_size_in_a_scenario_is_refused_with_its_line_tenant_and_field() {
    let dir = tempfile::tempdir().unwrap();
    every_value_refused(&dir.path().join("s.toml"), SCENARIO, SCENARIO_FIELDS, |p| {
        Scenario::load_points(p)
            .and_then(|points| points.get(0))
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
}

const SERVER: &str = r#"[server]
max_inflight_bytes = "512m"

[backend]
kind = "file"
path = "shared.img"
size = "2g"
pdc = { group = "128m", min_run = "4m" }

[[tenant]]
name = "a"
file = "a.img"
create = true
size = "1g"

[[tenant]]
name = "b"
offset = "1g"
size = "1g"
"#;

const SERVER_FIELDS: &[(&str, &str, usize, &str)] = &[
    (
        "max_inflight_bytes = \"512m\"",
        "max_inflight_bytes = VALUE",
        2,
        "server.max_inflight_bytes",
    ),
    ("size = \"2g\"", "size = VALUE", 7, "backend.size"),
    (
        "pdc = { group = \"128m\", min_run = \"4m\" }",
        "pdc = { group = VALUE, min_run = \"4m\" }",
        8,
        "backend.pdc.group",
    ),
    (
        "size = \"1g\"\n\n",
        "size = VALUE\n\n",
        14,
        "tenant 1 ('a').size",
    ),
    (
        "offset = \"1g\"",
        "offset = VALUE",
        18,
        "tenant 2 ('b').offset",
    ),
];

#[test]
fn every_hostile_size_in_a_server_configuration_is_refused_with_its_line_tenant_and_field() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing is opened at load.
    every_value_refused(&dir.path().join("c.toml"), SERVER, SERVER_FIELDS, |p| {
        ServerConfig::load(p).map(|_| ()).map_err(|e| e.to_string())
    });
    // Nothing was created by loading.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["c.toml"]);
}
