//! The README's scenario format is the code's: its example parses (every point of its
//! sweep), and every key the parser accepts, in every table and device model, is named
//! in the section. The parser's own "unknown field, expected one of …" message is the
//! list of keys, so a key added to the code without the README fails here.

use ioshare::scenario::Scenario;

fn section() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let start = readme
        .find("## Scenario format")
        .expect("a 'Scenario format' section");
    let rest = &readme[start + 3..];
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
fn every_scenario_key_is_in_the_readme() {
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
        "keys the parser accepts that README.md's 'Scenario format' does not name: {missing:?}"
    );
}

#[test]
fn the_readme_example_scenario_parses() {
    let readme = section();
    let start = readme.find("```toml\n").expect("a toml example") + "```toml\n".len();
    let example = &readme[start..start + readme[start..].find("```").expect("its end")];
    let points = Scenario::points(example, "README example", "example")
        .unwrap_or_else(|e| panic!("the README's example does not parse: {e}"));
    assert!(points.len() > 1, "the example shows a sweep");
    for p in points.iter() {
        p.unwrap_or_else(|e| panic!("a point of the README's example: {e}"));
    }
}
