//! `ioshare ctl SOCKET COMMAND [KEY=VALUE]...`: one request to a running server's
//! control socket (`server.control`), its answer printed. Arguments are a `[[tenant]]`
//! table's fields written as in the configuration file (`weight=4`, `size=10G`,
//! `create=true`, `slo={iops=500, size="4k", rt_us=5000}`); a value that is not TOML is
//! a string, and `none` is JSON null (`set-tenant` clears a field with it).

use crate::*;
use ioshare::server::control::COMMANDS;
use serde_json::{Map, Value, json};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// `ioshare ctl`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// The server's control socket (`server.control`).
    pub socket: PathBuf,
    /// The command: tenants, add-tenant, set-tenant, drain-tenant, remove-tenant,
    /// resume-tenant, metrics, reload.
    pub command: String,
    /// The command's arguments, KEY=VALUE (`name=db weight=4`); a lone word is the
    /// tenant's name.
    pub arguments: Vec<String>,
    /// Print the server's JSON answer as it is.
    #[arg(long)]
    pub json: bool,
    /// How long to wait for the answer, seconds.
    #[arg(long, default_value_t = 30.0)]
    pub timeout_s: f64,
}

/// The list of commands for `--help`.
pub fn commands_help() -> String {
    let mut s = String::from("Commands:\n");
    for (c, what) in COMMANDS {
        s.push_str(&format!("  {c:<14} {what}\n"));
    }
    s.push_str(
        "\nExamples:\n  ioshare ctl /run/ioshare/ctl.sock add-tenant name=db file=/srv/db.img size=10G create=true weight=4\n  ioshare ctl /run/ioshare/ctl.sock set-tenant db limit_iops=2000 slo=none\n  ioshare ctl /run/ioshare/ctl.sock remove-tenant db\n",
    );
    s
}

/// One KEY=VALUE argument's value: TOML when it parses as a TOML value, `none` as
/// null, else the text itself.
fn value_of(text: &str) -> Value {
    if text == "none" || text == "null" {
        return Value::Null;
    }
    match toml::from_str::<toml::Table>(&format!("v = {text}")) {
        Ok(mut t) => serde_json::to_value(t.remove("v").expect("parsed"))
            .unwrap_or_else(|_| Value::String(text.to_string())),
        Err(_) => Value::String(text.to_string()),
    }
}

/// The request's arguments from the command line.
fn arguments(words: &[String]) -> Result<Map<String, Value>> {
    let mut args = Map::new();
    for w in words {
        let (key, value) = match w.split_once('=') {
            Some((k, v)) => (k.to_string(), value_of(v)),
            None if !args.contains_key("name") => ("name".to_string(), Value::String(w.clone())),
            None => bail!(
                "'{w}': arguments are KEY=VALUE (a lone word is the tenant's name, given once)"
            ),
        };
        if args.insert(key.clone(), value).is_some() {
            bail!("{key} is given twice");
        }
    }
    Ok(args)
}

/// Sends one request and prints its answer; an error answer is an error.
pub fn run(a: Args) -> Result<()> {
    if !COMMANDS.iter().any(|(c, _)| *c == a.command) {
        bail!(
            "unknown command '{}' (known: {})",
            a.command,
            COMMANDS.map(|(c, _)| c).join(", ")
        );
    }
    let args = arguments(&a.arguments)?;
    let stream = UnixStream::connect(&a.socket).with_context(|| {
        format!(
            "cannot connect to {} (is the server running with server.control set to it?)",
            a.socket.display()
        )
    })?;
    let wait = Duration::from_secs_f64(a.timeout_s.max(0.001));
    stream.set_read_timeout(Some(wait))?;
    stream.set_write_timeout(Some(wait))?;
    let mut out = stream.try_clone()?;
    let mut input = BufReader::new(stream);
    let mut line = String::new();
    input
        .read_line(&mut line)
        .context("reading the server's greeting")?;
    let greeting: Value = serde_json::from_str(&line)
        .with_context(|| format!("{} is not an ioshare control socket", a.socket.display()))?;
    if greeting.get("ioshare").is_none() {
        bail!("{} is not an ioshare control socket", a.socket.display());
    }
    let request = json!({ "execute": a.command, "arguments": args });
    writeln!(out, "{request}")?;
    line.clear();
    input.read_line(&mut line).context("reading the answer")?;
    let answer: Value = serde_json::from_str(&line).context("the answer is not JSON")?;
    if a.json {
        println!("{answer}");
    }
    if let Some(e) = answer.get("error") {
        bail!(
            "{}: {}",
            e["class"].as_str().unwrap_or("Error"),
            e["desc"].as_str().unwrap_or("(no description)")
        );
    }
    if !a.json {
        print_return(&a.command, &answer["return"]);
    }
    Ok(())
}

fn print_return(command: &str, v: &Value) {
    match (command, v) {
        ("metrics", Value::String(text)) => print!("{text}"),
        ("tenants", Value::Array(list)) => print_tenants(list),
        _ => println!("ok: {v}"),
    }
}

fn print_tenants(list: &[Value]) {
    println!(
        "{:>4}  {:<20} {:<8} {:>7} {:<22} {:>9} {:>9} {:>5} {:>12} {:>7}",
        "id", "name", "state", "weight", "slo", "reserve", "limit", "conns", "completed", "queued"
    );
    let opt = |v: &Value| match v.as_f64() {
        Some(x) => format!("{x}"),
        None => "-".into(),
    };
    for t in list {
        let p = &t["promise"];
        let slo = match &p["slo"] {
            Value::Object(s) => format!(
                "{} IOPS x {} in {} us",
                s.get("iops").map_or(Value::Null, Clone::clone),
                s.get("size").map_or(Value::Null, Clone::clone),
                s.get("rt_us").map_or(Value::Null, Clone::clone)
            ),
            _ => "-".into(),
        };
        println!(
            "{:>4}  {:<20} {:<8} {:>7} {:<22} {:>9} {:>9} {:>5} {:>12} {:>7}",
            opt(&t["id"]),
            t["name"].as_str().unwrap_or("?"),
            t["state"].as_str().unwrap_or("?"),
            opt(&p["weight"]),
            slo,
            opt(&p["reservation_iops"]),
            opt(&p["limit_iops"]),
            opt(&t["connections"]),
            opt(&t["completed"]),
            opt(&t["queued"]),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_toml_values_or_words() {
        let words: Vec<String> = [
            "db",
            "weight=4",
            "size=10G",
            "create=true",
            "slo={iops=500, size=\"4k\", rt_us=5000}",
            "limit_iops=none",
            "file=/srv/db.img",
        ]
        .map(String::from)
        .to_vec();
        let a = arguments(&words).unwrap();
        assert_eq!(
            Value::Object(a),
            json!({
                "name": "db",
                "weight": 4,
                "size": "10G",
                "create": true,
                "slo": {"iops": 500, "size": "4k", "rt_us": 5000},
                "limit_iops": null,
                "file": "/srv/db.img",
            })
        );
        let twice = arguments(&["weight=1".into(), "weight=2".into()]).unwrap_err();
        assert!(
            twice.to_string().contains("weight is given twice"),
            "{twice}"
        );
        let words = arguments(&["a".into(), "b".into()]).unwrap_err();
        assert!(words.to_string().contains("KEY=VALUE"), "{words}");
    }
}
