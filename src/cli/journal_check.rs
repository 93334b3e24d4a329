//! `ioshare journal-check`: the PDC journal detector scored on a captured stream.

use super::*;

/// The arguments of `ioshare journal-check`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The capture (fio iolog v3, as `serve --capture` writes it).
    pub(crate) capture: PathBuf,
    /// A file holding `debugfs -R "stat <8>"` output for the export's file system
    /// (the journal inode's extents).
    #[arg(long, value_name = "FILE")]
    pub(crate) extents: PathBuf,
    /// The file system's block size, bytes.
    #[arg(long, default_value_t = 4096)]
    pub(crate) block_size: u64,
    /// The export to score (default: the capture's only one).
    #[arg(long)]
    pub(crate) export: Option<String>,
    /// The export's size (default: the end of its furthest request).
    #[arg(long)]
    pub(crate) size: Option<ioshare::units::ByteSize>,
    /// Detector group size (as backend.pdc.group).
    #[arg(long)]
    pub(crate) group: Option<ioshare::units::ByteSize>,
    /// Minimum run before a wrap (as backend.pdc.min_run).
    #[arg(long)]
    pub(crate) min_run: Option<ioshare::units::ByteSize>,
    /// How far a second pass runs before it confirms the log (as
    /// backend.pdc.confirm).
    #[arg(long)]
    pub(crate) confirm: Option<ioshare::units::ByteSize>,
    /// How far past a run's end a write still extends it (as backend.pdc.gap).
    #[arg(long)]
    pub(crate) gap: Option<ioshare::units::ByteSize>,
    /// Print the scores as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `ioshare journal-check`.
pub(crate) fn run(a: Args) -> Result<()> {
    let Args {
        capture,
        extents,
        block_size,
        export,
        size,
        group,
        min_run,
        confirm,
        gap,
        json,
    } = a;
    journal_check(JournalCheck {
        capture: &capture,
        extents: &extents,
        block_size,
        export: export.as_deref(),
        size: size.map(|s| s.0),
        group: group.map(|s| s.0),
        min_run: min_run.map(|s| s.0),
        confirm: confirm.map(|s| s.0),
        gap: gap.map(|s| s.0),
        json,
    })
}

/// `journal-check`'s arguments.
struct JournalCheck<'a> {
    capture: &'a Path,
    extents: &'a Path,
    block_size: u64,
    export: Option<&'a str>,
    size: Option<u64>,
    group: Option<u64>,
    min_run: Option<u64>,
    confirm: Option<u64>,
    gap: Option<u64>,
    json: bool,
}

fn journal_check(a: JournalCheck) -> Result<()> {
    use ioshare::journal::{JournalParams, accuracy};
    let text = std::fs::read_to_string(a.capture)
        .with_context(|| format!("cannot read {}", a.capture.display()))?;
    let entries = ioshare::iolog::parse(&text).with_context(|| a.capture.display().to_string())?;
    let extents_text = std::fs::read_to_string(a.extents)
        .with_context(|| format!("cannot read {}", a.extents.display()))?;
    if a.block_size == 0 || !a.block_size.is_power_of_two() {
        bail!("--block-size {}: not a power of two", a.block_size);
    }
    let journal = accuracy::debugfs_extents(&extents_text, a.block_size)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.extents.display()))?;
    let mut files: Vec<&str> = entries.iter().map(|e| e.file.as_str()).collect();
    files.sort_unstable();
    files.dedup();
    let file = match (a.export, files.as_slice()) {
        (Some(e), _) if files.contains(&e) => e.to_string(),
        (Some(e), _) => bail!(
            "--export {e}: not in the capture (it has: {})",
            files.join(", ")
        ),
        (None, [one]) => one.to_string(),
        (None, []) => bail!("{}: no requests", a.capture.display()),
        (None, many) => bail!(
            "the capture has several exports ({}); name one with --export",
            many.join(", ")
        ),
    };
    let d = JournalParams::default();
    let params = JournalParams {
        group_bytes: a.group.unwrap_or(d.group_bytes),
        min_run_bytes: a.min_run.unwrap_or(d.min_run_bytes),
        confirm_bytes: a.confirm.unwrap_or(d.confirm_bytes),
        gap_bytes: a.gap.unwrap_or(d.gap_bytes),
        ..d
    };
    if let Err(e) = params.check() {
        bail!("detector thresholds: {}: {}", e.field, e.problem);
    }
    let end = entries
        .iter()
        .filter(|e| e.file == file)
        .map(|e| e.offset + e.len)
        .chain(journal.iter().map(|r| r.end))
        .max()
        .unwrap_or(0);
    let size = a.size.unwrap_or(end).max(end);
    if size.div_ceil(params.group_bytes) > ioshare::journal::MAX_GROUPS {
        bail!(
            "the export ({size} bytes, up to its furthest request) has more than {} groups of {} bytes; give a larger --group",
            ioshare::journal::MAX_GROUPS,
            params.group_bytes
        );
    }
    let s = accuracy::score(&entries, &file, size, params, &journal);
    if a.json {
        let mut v = serde_json::to_value(&s)?;
        v["byte_precision"] = s.byte_precision().into();
        v["byte_recall_after_wrap"] = s.byte_recall_after_wrap().into();
        v["group_precision"] = s.group_precision().into();
        v["group_recall"] = s.group_recall().into();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_score(&file, &s, &journal);
    Ok(())
}

/// The score as lines for a person.
fn print_score(
    file: &str,
    s: &ioshare::journal::accuracy::Accuracy,
    journal: &[std::ops::Range<u64>],
) {
    let mib = |b: u64| b as f64 / 1048576.0;
    let secs =
        |us: Option<u64>| us.map_or("never".to_string(), |u| format!("{:.2} s", u as f64 / 1e6));
    println!(
        "export {file}: {} writes, {:.1} MiB",
        s.writes,
        mib(s.written_bytes)
    );
    println!(
        "journal: {:.1} MiB at {} ({:.1} MiB written, {:.1} % of all bytes); groups {:?}",
        mib(journal.iter().map(|r| r.end - r.start).sum()),
        journal
            .iter()
            .map(|r| format!("{}..{}", r.start, r.end))
            .collect::<Vec<_>>()
            .join(", "),
        mib(s.journal_bytes),
        100.0 * s.journal_bytes as f64 / s.written_bytes.max(1) as f64,
        s.journal_groups
    );
    println!(
        "first wrap at {}, detected at {}; first pass {:.1} MiB ({:.1} MiB of it missed)",
        secs(s.first_wrap_us),
        secs(s.detected_us),
        mib(s.first_pass_bytes),
        mib(s.missed_first_pass_bytes)
    );
    println!(
        "per byte: precision {:.4}, recall after the first wrap {:.4} ({:.2} MiB missed after it, {:.2} MiB of data routed as journal)",
        s.byte_precision(),
        s.byte_recall_after_wrap(),
        mib(s.missed_after_wrap_bytes),
        mib(s.false_positive_bytes)
    );
    println!(
        "per group: precision {:.3}, recall {:.3} (marked {:?})",
        s.group_precision(),
        s.group_recall(),
        s.marked_groups
    );
}
