//! The README and the reference pages it links are the code's:
//! * the README's first screen names the two commands, and every page it links exists;
//! * `docs/scenarios.md`'s example parses (every point of its sweep), and every key the
//!   scenario parser accepts, in every table and device model, is named in its "Scenario
//!   format" section;
//! * every key the server's configuration accepts is named in `docs/serve.md`'s table,
//!   and the README's live walkthrough's configuration loads with the tenants it names;
//! * every `ioshare` subcommand the README and the pages name exists.
//!
//! The parsers' own "unknown field, expected one of …" messages are the lists of keys, so
//! a key added to the code without the page fails here.

use ioshare::scenario::Scenario;
use std::path::Path;

fn page(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn section() -> String {
    let doc = page("docs/scenarios.md");
    let start = doc
        .find("## Scenario format")
        .expect("a 'Scenario format' section");
    let rest = &doc[start + 3..];
    let end = rest.find("\n## ").map_or(rest.len(), |e| e);
    rest[..end].to_string()
}

const BASE: &str = r#"duration_s = 1
[device]
model = "fixed"
[[tenant]]
name = "a"
workload = { pattern = "randread", size = "4k", iodepth = 1 }
"#;

/// Puts an unknown key into one table of [`BASE`].
type Edit = fn(&str) -> String;

/// The keys the parser lists when it meets an unknown one in the table `edit` puts it in.
fn known_keys(edit: Edit) -> Vec<String> {
    let text = edit(BASE);
    let e = Scenario::parse(&text, "probe.toml", "probe")
        .expect_err("an unknown key is an error")
        .to_string();
    listed(&e)
}

/// The keys a parser's message lists: after "expected one of " (serde) or in
/// "(known: ...)" (the scenario's own checks).
fn listed(e: &str) -> Vec<String> {
    let list = if let Some(i) = e.find("expected one of ") {
        &e[i + "expected one of ".len()..]
    } else if let Some(i) = e.find("(known: ") {
        let l = &e[i + "(known: ".len()..];
        &l[..l.find(')').expect("closing parenthesis")]
    } else {
        panic!("no list of keys in: {e}")
    };
    let list = list.lines().next().unwrap_or("");
    list.split(", ")
        .map(|k| k.trim().trim_matches('`').to_string())
        .filter(|k| !k.is_empty())
        .collect()
}

fn named(text: &str, key: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(key).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + key.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

#[test]
fn every_scenario_key_is_in_the_scenario_page() {
    let readme = section();
    let probes: [(&str, Edit); 8] = [
        ("top level", |b: &str| format!("zzz = 1\n{b}")),
        ("[device] fixed", |b: &str| {
            b.replace("model = \"fixed\"", "model = \"fixed\"\nzzz = 1")
        }),
        ("[device] ssd", |b: &str| {
            b.replace("model = \"fixed\"", "model = \"ssd\"\nzzz = 1")
        }),
        ("[device] hdd", |b: &str| {
            b.replace("model = \"fixed\"", "model = \"hdd\"\nzzz = 1")
        }),
        ("[device] raid0", |b: &str| {
            b.replace("model = \"fixed\"", "model = \"raid0\"\nzzz = 1")
        }),
        ("[[tenant]]", |b: &str| {
            b.replace("name = \"a\"", "name = \"a\"\nzzz = 1")
        }),
        ("tenant slo", |b: &str| {
            b.replace("name = \"a\"", "name = \"a\"\nslo = { zzz = 1 }")
        }),
        ("tenant workload", |b: &str| {
            b.replace("iodepth = 1 }", "iodepth = 1, zzz = 1 }")
        }),
    ];
    let mut missing = Vec::new();
    for (table, edit) in &probes {
        let keys = known_keys(*edit);
        assert!(keys.len() >= 3, "{table}: too few keys parsed: {keys:?}");
        for k in keys {
            if !named(&readme, &k) {
                missing.push(format!("{table}: {k}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "keys the parser accepts that docs/scenarios.md's 'Scenario format' does not name: {missing:?}"
    );
}

#[test]
fn the_scenario_pages_example_parses() {
    let readme = section();
    let start = readme.find("```toml\n").expect("a toml example") + "```toml\n".len();
    let example = &readme[start..start + readme[start..].find("```").expect("its end")];
    let points = Scenario::points(example, "README example", "example")
        .unwrap_or_else(|e| panic!("docs/scenarios.md's example does not parse: {e}"));
    assert!(points.len() > 1, "the example shows a sweep");
    for p in points.iter() {
        p.unwrap_or_else(|e| panic!("a point of docs/scenarios.md's example: {e}"));
    }
}

/// The keys the server's configuration lists when it meets an unknown one in `table`.
fn server_keys(config: &str) -> Vec<String> {
    let base = Path::new("/nonexistent");
    let e = match ioshare::server::config::ServerConfig::parse(config, base) {
        Ok(_) => panic!("an unknown key is accepted: {config}"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("expected one of "), "no list in: {e}");
    listed(&e)
}

#[test]
fn every_server_key_is_in_the_server_page() {
    let doc = page("docs/serve.md");
    let tenant = "[[tenant]]\nname = \"a\"\nfile = \"a.img\"\n";
    let mut missing = Vec::new();
    for (table, config) in [
        ("server", format!("[server]\nzzz = 1\n{tenant}")),
        ("backend", format!("[backend]\nzzz = 1\n{tenant}")),
        ("tenant", format!("{tenant}zzz = 1\n")),
    ] {
        let keys = server_keys(&config);
        assert!(keys.len() >= 5, "{table}: too few keys: {keys:?}");
        for k in keys {
            let shown = match table {
                "tenant" => named(&doc, &k),
                _ => doc.contains(&format!("`{table}.{k}")) || named(&doc, &format!("{table}.{k}")),
            };
            if !shown {
                missing.push(format!("{table}.{k}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "keys the server accepts that docs/serve.md does not name: {missing:?}"
    );
}

#[test]
fn the_readme_opens_on_the_two_commands_and_links_pages_that_exist() {
    let readme = page("README.md");
    let first_screen: String = readme.lines().take(40).collect::<Vec<_>>().join("\n");
    for command in ["cargo run --release -- demo", "./test.sh"] {
        assert!(
            first_screen.contains(command),
            "the first screen lacks `{command}`"
        );
    }
    assert!(
        readme.lines().count() <= 200,
        "the README is a front door, not the reference"
    );
    let mut links = 0;
    for (at, _) in readme.match_indices("](") {
        let target: String = readme[at + 2..].chars().take_while(|&c| c != ')').collect();
        if target.starts_with("http") {
            continue;
        }
        links += 1;
        assert!(
            Path::new(env!("CARGO_MANIFEST_DIR")).join(&target).exists(),
            "README links {target}, which does not exist"
        );
    }
    assert!(links >= 5, "the README links its reference pages");
    for linked in ["docs/policies.md", "docs/scenarios.md", "docs/serve.md"] {
        assert!(
            readme.contains(&format!("]({linked})")),
            "README does not link {linked}"
        );
    }
}

#[test]
fn the_live_walkthrough_loads_and_names_its_tenants() {
    let readme = page("README.md");
    let walk = &readme[readme
        .find("## Five minutes live")
        .expect("the walkthrough")..];
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/emulated.toml");
    assert!(walk.contains("ioshare serve examples/emulated.toml"));
    let text = std::fs::read_to_string(&config).unwrap();
    let loaded = ioshare::server::config::ServerConfig::parse(&text, config.parent().unwrap())
        .unwrap_or_else(|e| panic!("examples/emulated.toml: {e}"));
    let names: Vec<&str> = loaded
        .tenants
        .iter()
        .map(|t| t.spec.name.as_str())
        .collect();
    assert_eq!(names, ["t1", "t2", "t3", "t4"]);
    assert!(walk.contains("for t in t1 t2 t3 t4; do"));
    assert!(walk.contains("socket=examples/ioshare-emulated.sock"));
}

#[test]
fn every_subcommand_the_pages_name_exists() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_ioshare"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let known: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        known.contains(&"advise") && known.contains(&"serve"),
        "{known:?}"
    );
    for name in [
        "README.md",
        "docs/policies.md",
        "docs/scenarios.md",
        "docs/serve.md",
    ] {
        let text = page(name);
        for (at, _) in text.match_indices("ioshare ") {
            let word: String = text[at + 8..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '-')
                .collect();
            let before = text[..at].chars().next_back();
            // `ioshare <word>` as a command: after a backtick, a line start or `$ `.
            if word.len() < 3 || !matches!(before, Some('`') | Some('\n') | None) {
                continue;
            }
            assert!(
                known.contains(&word.as_str()),
                "{name} names `ioshare {word}`, which is no subcommand ({known:?})"
            );
        }
    }
}

/// The sample configuration in `contrib/` (for the systemd unit there) is valid, and the
/// unit runs the server as the README's reference says (notify readiness, SIGHUP
/// reload, a pid file).
#[test]
fn the_contrib_service_files_hold_together() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = page("contrib/serve.toml");
    let config = ioshare::server::config::ServerConfig::parse(&text, Path::new("/etc/ioshare"))
        .unwrap_or_else(|e| panic!("contrib/serve.toml: {e}"));
    assert_eq!(config.tenants.len(), 2);
    assert_eq!(config.default_export, Some(0));
    let unit = page("contrib/ioshare.service");
    for line in [
        "Type=notify",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "--pidfile /run/ioshare/ioshare.pid",
    ] {
        assert!(unit.contains(line), "ioshare.service lacks {line}");
    }
    assert!(page("contrib/ioshare.socket").contains("ListenStream=/run/ioshare/ioshare.sock"));
    assert!(root.join("contrib/grafana-dashboard.json").exists());
}
