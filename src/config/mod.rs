//! What scenarios and the server's configuration have in common: the one error type
//! ([`ConfigError`]: the file, the field, the problem), a tenant's promise (weight, SLO,
//! reservation, limit) checked the same way in both, and the choice of a policy with its
//! parameters.

use crate::policy::{ParamValue, Params};
use crate::types::{Slo, TenantSpec};
use serde::Deserialize;

/// A configuration (scenario or server) that could not be loaded: which file, which
/// field, and what is wrong with it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    /// The file (or what stands for it: "built-in demo scenario").
    pub source: String,
    /// Where in it, as a user would look for it (`tenant 2 ('b').weight`, `server.tcp`);
    /// empty when the problem is the file as a whole (it cannot be read or parsed).
    pub field: String,
    /// What is wrong, and what would be right.
    pub problem: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.source, self.problem)
        } else {
            write!(f, "{}: {}: {}", self.source, self.field, self.problem)
        }
    }
}

impl std::error::Error for ConfigError {}

/// A problem with one field, before it is known which file it is in.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    /// Dotted path of the field (see [`ConfigError::field`]).
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

impl Invalid {
    /// `field` is wrong: `problem`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Invalid {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// A problem with the file as a whole (a parse error that names its own place).
    pub fn whole(problem: impl Into<String>) -> Self {
        Invalid::new("", problem)
    }

    /// The same problem, one level down: `tenant 2 ('b')` + `weight`.
    pub fn within(self, prefix: &str) -> Self {
        let field = match (prefix.is_empty(), self.field.is_empty()) {
            (true, _) => self.field,
            (false, true) => prefix.to_string(),
            (false, false) => format!("{prefix}.{}", self.field),
        };
        Invalid { field, ..self }
    }

    /// The error as the user sees it, naming the file.
    pub fn in_file(self, source: &str) -> ConfigError {
        ConfigError {
            source: source.to_string(),
            field: self.field,
            problem: self.problem,
        }
    }
}

/// `field: problem` (the problem alone for the file as a whole).
impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.problem)
        } else {
            write!(f, "{}: {}", self.field, self.problem)
        }
    }
}

/// A problem that names its field itself, or concerns the table as a whole.
impl From<String> for Invalid {
    fn from(problem: String) -> Self {
        Invalid::whole(problem)
    }
}

impl From<&str> for Invalid {
    fn from(problem: &str) -> Self {
        Invalid::whole(problem)
    }
}

/// A TOML or serde error, trimmed (it names its own line and column).
pub fn parse_problem(e: impl std::fmt::Display) -> Invalid {
    Invalid::whole(e.to_string().trim_end().to_string())
}

pub mod locate;

/// Deserializes a parsed file, naming in an error the field as errors name fields
/// (`tenant 2 ('b').workload.size`), for [`located`] to find its line.
pub fn from_table<T: serde::de::DeserializeOwned>(doc: toml::Table) -> Result<T, Invalid> {
    let names = tenant_names(&doc);
    serde_path_to_error::deserialize(toml::Value::Table(doc)).map_err(|e| {
        let field = field_of(&e.path().to_string(), &names);
        let problem = e.inner().message().trim_end().to_string();
        Invalid { field, problem }
    })
}

/// The error naming the file (`source`) and, where the field is found in its `text`,
/// the line (`file.toml:12`); an unknown key is looked for by its own name.
pub fn located(e: Invalid, text: &str, source: &str) -> ConfigError {
    let unknown = e
        .problem
        .strip_prefix("unknown field `")
        .and_then(|r| r.split('`').next());
    let path = match unknown {
        Some(key) if e.field.is_empty() => key.to_string(),
        Some(key) => format!("{}.{key}", e.field),
        None => e.field.clone(),
    };
    match locate::line_of(text, &path) {
        Some(line) => e.in_file(&format!("{source}:{line}")),
        None => e.in_file(source),
    }
}

/// The tenants' names in a parsed file, in order (`?` where one has none).
fn tenant_names(doc: &toml::Table) -> Vec<String> {
    match doc.get("tenant") {
        Some(toml::Value::Array(ts)) => ts
            .iter()
            .map(|t| {
                t.get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or("?")
                    .to_string()
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// A deserializer's path as errors name fields: `tenant[1].weight` → `tenant 2
/// ('b').weight`; `.` (the whole file) → empty.
fn field_of(path: &str, names: &[String]) -> String {
    if path == "." {
        return String::new();
    }
    if let Some(rest) = path.strip_prefix("tenant[")
        && let Some((index, tail)) = rest.split_once(']')
        && let Ok(i) = index.parse::<usize>()
    {
        let name = names.get(i).map_or("?", String::as_str);
        return format!("{}{tail}", tenant_field(i + 1, name));
    }
    path.to_string()
}

/// How the `n`-th tenant (1-based) named `name` is called in errors.
pub fn tenant_field(n: usize, name: &str) -> String {
    format!("tenant {n} ('{name}')")
}

/// A number as a person reads it in an error: `1e308`, not 309 digits.
pub fn shown(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-4..1e7).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// The largest weight: a million to one is beyond any share a device can measure.
pub const MAX_WEIGHT: f64 = 1.0e6;

/// A tenant's weight, SLO, reservation and limit as a file gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QosFields {
    /// `weight` (default 1).
    pub weight: Option<f64>,
    /// `slo = { iops, size, rt_us, burst }`.
    pub slo: Option<Slo>,
    /// `reservation_iops`.
    pub reservation_iops: Option<f64>,
    /// `limit_iops`.
    pub limit_iops: Option<f64>,
}

impl QosFields {
    /// The tenant's promise, checked: a positive finite weight, an SLO with positive
    /// parts, positive reservation and limit with the reservation not above the limit.
    pub fn spec(self, name: &str) -> Result<TenantSpec, Invalid> {
        let weight = self.weight.unwrap_or(1.0);
        // Bounded above too: 1e308 beside 1 made share errors of `inf`.
        if !(weight.is_finite() && weight > 0.0 && weight <= MAX_WEIGHT) {
            return Err(Invalid::new(
                "weight",
                format!("must be in (0, {MAX_WEIGHT}], got {}", shown(weight)),
            ));
        }
        if let Some(slo) = &self.slo
            && !(slo.iops.is_finite() && slo.iops > 0.0 && slo.size > 0 && slo.rt_us > 0)
        {
            return Err(Invalid::new(
                "slo",
                "needs iops > 0, size > 0 and rt_us > 0",
            ));
        }
        if let Some(burst) = self.slo.and_then(|s| s.burst)
            && !(burst.is_finite() && (1.0..=1e9).contains(&burst))
        {
            return Err(Invalid::new(
                "slo.burst",
                format!(
                    "must be in [1, 1000000000] requests (how many may come at once above iops), got {}",
                    shown(burst)
                ),
            ));
        }
        for (field, v) in [
            ("reservation_iops", self.reservation_iops),
            ("limit_iops", self.limit_iops),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && v > 0.0)
            {
                return Err(Invalid::new(field, format!("must be > 0, got {v}")));
            }
        }
        if let (Some(r), Some(l)) = (self.reservation_iops, self.limit_iops)
            && r > l
        {
            return Err(Invalid::new(
                "reservation_iops",
                format!("{r} is above limit_iops {l}"),
            ));
        }
        Ok(TenantSpec {
            name: name.to_string(),
            weight,
            slo: self.slo,
            reservation_iops: self.reservation_iops,
            limit_iops: self.limit_iops,
        })
    }
}

/// A policy as a file names it: `"sfq"` or `{ name = "sfq", label = "sfq-d8", depth = 8 }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PolicyEntry {
    /// Just the registry name.
    Name(String),
    /// `name`, optional `label`, and the policy's parameters.
    Table(toml::Table),
}

/// A policy to run: registry name, parameters, and the label reports use.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyChoice {
    /// What reports call it (the name unless given).
    pub label: String,
    /// Registry name.
    pub name: String,
    /// Parameters for its constructor.
    pub params: Params,
}

impl PolicyChoice {
    /// A registered policy with default parameters.
    pub fn named(name: &str) -> Self {
        PolicyChoice {
            label: name.to_string(),
            name: name.to_string(),
            params: Params::new(),
        }
    }
}

impl PolicyEntry {
    /// The choice this entry makes (the policy itself is checked when it is built).
    pub fn choice(self) -> Result<PolicyChoice, Invalid> {
        match self {
            PolicyEntry::Name(n) => Ok(PolicyChoice::named(&n)),
            PolicyEntry::Table(mut t) => {
                let name = match t.remove("name") {
                    Some(toml::Value::String(s)) => s,
                    Some(other) => {
                        return Err(Invalid::new(
                            "name",
                            format!("must be a string, got {other}"),
                        ));
                    }
                    None => return Err(Invalid::whole("a policy table needs `name`")),
                };
                let label = match t.remove("label") {
                    Some(toml::Value::String(s)) => s,
                    Some(other) => {
                        return Err(Invalid::new(
                            "label",
                            format!("must be a string, got {other}"),
                        ));
                    }
                    None => name.clone(),
                };
                Ok(PolicyChoice {
                    label,
                    name,
                    params: params(t)?,
                })
            }
        }
    }
}

/// A policy's parameters from a TOML table: numbers, booleans and strings.
pub fn params(table: toml::Table) -> Result<Params, Invalid> {
    table
        .into_iter()
        .map(|(k, v)| {
            let value = match v {
                toml::Value::Integer(i) => ParamValue::Int(i),
                toml::Value::Float(f) => ParamValue::Float(f),
                toml::Value::Boolean(b) => ParamValue::Bool(b),
                toml::Value::String(s) => ParamValue::Text(s),
                other => {
                    return Err(Invalid::new(
                        k,
                        format!("must be a number, true/false or a string, got {other}"),
                    ));
                }
            };
            Ok((k, value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_file_field_problem() {
        let e = Invalid::new("weight", "must be > 0, got 0")
            .within("tenant 1 ('a')")
            .in_file("x.toml");
        assert_eq!(
            e.to_string(),
            "x.toml: tenant 1 ('a').weight: must be > 0, got 0"
        );
        assert_eq!(e.field, "tenant 1 ('a').weight");
        let whole = Invalid::whole("cannot read: gone")
            .within("")
            .in_file("y.toml");
        assert_eq!(whole.to_string(), "y.toml: cannot read: gone");
        let at = Invalid::whole("a policy table needs `name`").within("policies[2]");
        assert_eq!(at.field, "policies[2]");
    }

    #[test]
    fn qos_fields_are_checked() {
        let ok = QosFields {
            weight: Some(2.0),
            reservation_iops: Some(10.0),
            limit_iops: Some(10.0),
            ..QosFields::default()
        };
        assert_eq!(ok.spec("a").unwrap().weight, 2.0);
        assert_eq!(QosFields::default().spec("a").unwrap().weight, 1.0);
        let cases = [
            (
                QosFields {
                    weight: Some(f64::NAN),
                    ..QosFields::default()
                },
                "weight",
            ),
            (
                QosFields {
                    limit_iops: Some(0.0),
                    ..QosFields::default()
                },
                "limit_iops",
            ),
            (
                QosFields {
                    reservation_iops: Some(20.0),
                    limit_iops: Some(10.0),
                    ..QosFields::default()
                },
                "reservation_iops",
            ),
            (
                QosFields {
                    slo: Some(Slo::new(f64::INFINITY, 4096, 1)),
                    ..QosFields::default()
                },
                "slo",
            ),
            (
                QosFields {
                    slo: Some(Slo {
                        burst: Some(0.5),
                        ..Slo::new(100.0, 4096, 1000)
                    }),
                    ..QosFields::default()
                },
                "slo.burst",
            ),
        ];
        for (q, field) in cases {
            assert_eq!(q.spec("a").unwrap_err().field, field, "{q:?}");
        }
    }

    #[test]
    fn policy_entries_take_labels_and_scalar_parameters() {
        let t: toml::Table = toml::from_str("name = 'sfq'\nlabel = 'd8'\ndepth = 8").unwrap();
        let c = PolicyEntry::Table(t).choice().unwrap();
        assert_eq!((c.name.as_str(), c.label.as_str()), ("sfq", "d8"));
        assert_eq!(c.params.get("depth"), Some(&ParamValue::Int(8)));
        let t: toml::Table = toml::from_str("name = 'sfq'\ndepth = [1]").unwrap();
        assert_eq!(PolicyEntry::Table(t).choice().unwrap_err().field, "depth");
    }
}
