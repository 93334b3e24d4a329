//! A `workload = { trace = ... }` table resolved: the trace's path (environment
//! variables expanded), format, selection, timing and placement checked, the file opened
//! once so that a missing file or an unknown format is an error when the scenario is
//! loaded, not in the middle of a run. The replay itself is [`crate::trace::replay`].

use super::{Arrivals, MAX_IODEPTH, Pattern, Phase, SizeDist, Workload, WorkloadTable};
use crate::config::Invalid;
use crate::trace::replay::{Remap, Timing, TraceSpec};
use crate::trace::{Format, OnError, Reader, Select};
use crate::types::secs_to_nanos;
use std::path::PathBuf;

/// The keys a trace workload does not take (its requests come from the trace).
fn drawn_keys(t: &WorkloadTable) -> Option<&'static str> {
    [
        (t.standin.is_some(), "standin"),
        (t.pattern.is_some(), "pattern"),
        (t.read_mix.is_some(), "read_mix"),
        (t.size.is_some(), "size"),
        (t.size_mean.is_some(), "size_mean"),
        (t.align.is_some(), "align"),
        (t.rate_iops.is_some(), "rate_iops"),
        (t.rate_process.is_some(), "rate_process"),
        (t.on_ms.is_some(), "on_ms"),
        (t.off_ms.is_some(), "off_ms"),
        (t.duration_s.is_some(), "duration_s"),
        (t.idle.is_some(), "idle"),
        (t.phases.is_some(), "phases"),
    ]
    .into_iter()
    .find(|(given, _)| *given)
    .map(|(_, key)| key)
}

/// The trace-only keys given in a table without `trace`.
pub(super) fn trace_keys(t: &WorkloadTable) -> Option<&'static str> {
    [
        (t.format.is_some(), "format"),
        (t.select.is_some(), "select"),
        (t.timing.is_some(), "timing"),
        (t.speed.is_some(), "speed"),
        (t.looped.is_some(), "loop"),
        (t.remap.is_some(), "remap"),
        (t.on_error.is_some(), "on_error"),
    ]
    .into_iter()
    .find(|(given, _)| *given)
    .map(|(_, key)| key)
}

/// `${VAR}` and `$VAR` replaced by the environment's values; an unset one is an error.
pub fn expand(path: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = path;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, tail) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced
                .find('}')
                .ok_or_else(|| format!("'{path}': '${{' without its '}}'"))?;
            (&braced[..end], &braced[end + 1..])
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        if name.is_empty() {
            return Err(format!("'{path}': a '$' names no variable"));
        }
        let value = std::env::var(name).map_err(|_| {
            format!("'{path}': the environment variable {name} is not set (it says where the trace is; docs/scenarios.md, \"Traces\")")
        })?;
        out.push_str(&value);
        rest = tail;
    }
    out.push_str(rest);
    Ok(out)
}

fn select(t: &WorkloadTable) -> Result<Select, Invalid> {
    let Some(s) = &t.select else {
        return Ok(Select::default());
    };
    let bad = |key: &str, problem: String| Invalid::new(format!("select.{key}"), problem);
    if s.disk.is_some() && s.volume.is_some() {
        return Err(bad(
            "disk",
            "`disk` and `volume` name the same thing: give one".into(),
        ));
    }
    let secs = |key: &str, v: Option<f64>| match v {
        Some(x) if !(x.is_finite() && x >= 0.0) => Err(bad(key, format!("must be ≥ 0, got {x}"))),
        Some(x) => Ok(Some(secs_to_nanos(x))),
        None => Ok(None),
    };
    let (from, to) = (secs("from_s", s.from_s)?, secs("to_s", s.to_s)?);
    if let (Some(f), Some(t)) = (from, to)
        && t <= f
    {
        return Err(bad("to_s", "must be after from_s".into()));
    }
    let event = match s.event.as_deref() {
        None => None,
        Some(e @ ("Q" | "D" | "C")) => e.chars().next(),
        Some(other) => return Err(bad("event", format!("expected Q, D or C, got '{other}'"))),
    };
    Ok(Select {
        volume: s.disk.or(s.volume),
        from,
        to,
        event,
    })
}

fn timing(t: &WorkloadTable) -> Result<Timing, Invalid> {
    match t.timing.as_deref().unwrap_or("original") {
        "original" => {
            if t.iodepth.is_some() {
                return Err(Invalid::new(
                    "iodepth",
                    "applies to timing = \"closed\"; the original timing issues at the trace's times",
                ));
            }
            let speed = t.speed.unwrap_or(1.0);
            if !(speed.is_finite() && speed > 0.0 && speed <= 1e6) {
                return Err(Invalid::new(
                    "speed",
                    format!("must be in (0, 1000000], got {speed}"),
                ));
            }
            Ok(Timing::Original { speed })
        }
        "closed" => {
            if t.speed.is_some() {
                return Err(Invalid::new("speed", "applies to timing = \"original\""));
            }
            match t.iodepth.unwrap_or(32) {
                d @ 1..=MAX_IODEPTH => Ok(Timing::Closed { iodepth: d }),
                d => Err(Invalid::new(
                    "iodepth",
                    format!("must be 1 ..= {MAX_IODEPTH}, got {d}"),
                )),
            }
        }
        other => Err(Invalid::new(
            "timing",
            format!("expected \"original\" or \"closed\", got \"{other}\""),
        )),
    }
}

/// Resolves a table with `trace` (see the module). A relative path is taken from the
/// current directory here; the scenario loader has made it relative to the scenario
/// file before.
pub(super) fn trace_workload(t: &WorkloadTable) -> Result<Workload, Invalid> {
    if let Some(key) = drawn_keys(t) {
        return Err(Invalid::new(
            key,
            "does not apply to a trace workload: its requests come from the trace",
        ));
    }
    let raw = t.trace.as_deref().expect("a trace workload");
    let path = PathBuf::from(expand(raw).map_err(|e| Invalid::new("trace", e))?);
    let format = Format::parse(t.format.as_deref().unwrap_or("auto"))
        .map_err(|e| Invalid::new("format", e))?;
    let on_error = OnError::parse(t.on_error.as_deref().unwrap_or("skip"))
        .map_err(|e| Invalid::new("on_error", e))?;
    let select = select(t)?;
    let timing = timing(t)?;
    let reader = Reader::open(&path, format, select, on_error)
        .map_err(|e| Invalid::new("trace", e.to_string()))?;
    let detected = reader.format();
    drop(reader);
    let remap = match t.remap.as_deref().unwrap_or("wrap") {
        "wrap" => Remap::Wrap,
        "scale" => {
            let span = crate::trace::replay::span(&path, Some(detected), select, on_error)
                .map_err(|e| Invalid::new("trace", e.to_string()))?;
            Remap::Scale { span }
        }
        other => {
            return Err(Invalid::new(
                "remap",
                format!("expected \"wrap\" or \"scale\", got \"{other}\""),
            ));
        }
    };
    let (arrivals, how) = match timing {
        Timing::Original { speed: 1.0 } => (Arrivals::Trace, "original timing".into()),
        Timing::Original { speed } => (Arrivals::Trace, format!("original timing x{speed}")),
        Timing::Closed { iodepth } => (Arrivals::Closed { iodepth }, format!("closed qd{iodepth}")),
    };
    let name = path
        .file_name()
        .map_or_else(|| raw.to_string(), |n| n.to_string_lossy().into_owned());
    Ok(Workload {
        label: format!("trace {name} ({}, {how})", detected.name()),
        phases: vec![Phase {
            start: 0,
            end: None,
            pattern: Pattern::RandRw,
            read_mix: 0.5,
            size: SizeDist::Fixed(512),
            align: 512,
            arrivals,
        }],
        trace: Some(TraceSpec {
            path,
            format: Some(detected),
            select,
            timing,
            remap,
            looped: t.looped.unwrap_or(false),
            on_error,
        }),
    })
}
