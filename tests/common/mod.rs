//! What the conformance tests share: the documented table and the comparison with it.

use std::path::Path;

/// The text of `docs/conformance.md` between the line `start` and the marker `end`.
pub fn documented(start: &str, end: &str) -> String {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/conformance.md"))
            .expect("docs/conformance.md");
    let from = doc.find(start).expect("start marker") + start.len();
    let to = doc.find(end).expect("end marker");
    doc[from..to].to_string()
}

/// Fails, naming the first differing line, unless `now` is the `documented` table;
/// `command` regenerates it.
pub fn assert_documented(now: &str, documented: &str, what: &str, command: &str) {
    if now != documented {
        let first = now
            .lines()
            .zip(documented.lines())
            .find(|(a, b)| a != b)
            .map(|(a, b)| format!("now:        {a}\ndocumented: {b}"))
            .unwrap_or_else(|| "the tables differ in length".into());
        panic!(
            "{what} changed; regenerate docs/conformance.md's table with `{command}` and \
             explain the change there.\n{first}"
        );
    }
}
