//! `ioshare trace stats` and `ioshare trace convert`.

use super::*;
use ioshare::trace::{self, Format, OnError, Reader, Select};

/// The arguments of `ioshare trace`.
#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub(crate) command: TraceCommand,
}

/// What to do with a trace.
#[derive(clap::Subcommand)]
pub(crate) enum TraceCommand {
    /// A trace's figures: requests, read/write ratio by count and bytes, sizes, IOPS over
    /// time, gaps between requests, sequentiality, footprint and reuse.
    Stats {
        /// Trace files (plain, .gz or .zst); each is read in one pass.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[command(flatten)]
        input: Input,
        /// Print the figures as JSON (one object per file, in a list).
        #[arg(long)]
        json: bool,
        /// Also write a page with the figures and plots (IOPS over time, sizes, gaps) here.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// Write a trace in another format (`fio3`: `fio --read_iolog=OUT --ioengine=nbd`
    /// replays it against an export).
    Convert {
        /// The trace to read.
        file: PathBuf,
        /// Where to write (`-`: standard output).
        out: PathBuf,
        #[command(flatten)]
        input: Input,
        /// The format written: msr, umass, alibaba, tencent, fio2 or fio3.
        #[arg(long, value_name = "FORMAT")]
        to: String,
    },
}

/// How a trace is read.
#[derive(clap::Args)]
pub(crate) struct Input {
    /// msr, umass, alibaba, tencent, blkparse, fio2, fio3, or auto (from the first line).
    #[arg(long, default_value = "auto", value_name = "FORMAT")]
    format: String,
    /// Only this volume (MSR's disk number, UMass's ASU, Alibaba's device id, Tencent's
    /// volume id, an iolog's file index from 0, blkparse's major << 20 | minor).
    #[arg(long, value_name = "N")]
    volume: Option<u64>,
    /// Stop at the first bad line instead of counting and skipping it.
    #[arg(long)]
    strict: bool,
}

impl Input {
    fn open(&self, path: &Path) -> Result<Reader> {
        let format = Format::parse(&self.format).map_err(|e| anyhow::anyhow!("--format: {e}"))?;
        let select = Select {
            volume: self.volume,
            ..Select::default()
        };
        let on_error = if self.strict {
            OnError::Stop
        } else {
            OnError::Skip
        };
        Ok(Reader::open(path, format, select, on_error)?)
    }
}

pub(crate) fn run(args: Args) -> Result<()> {
    match args.command {
        TraceCommand::Stats {
            files,
            input,
            json,
            html,
        } => stats(&files, &input, json, html.as_deref()),
        TraceCommand::Convert {
            file,
            out,
            input,
            to,
        } => convert(&file, &out, &input, &to),
    }
}

/// Prints what a reader skipped, on standard error.
fn report_skipped(path: &Path, reader: &Reader) {
    if reader.skipped() == 0 {
        return;
    }
    eprintln!(
        "{}: {} bad lines skipped (--strict stops at the first); the first:",
        path.display(),
        reader.skipped()
    );
    for e in reader.errors() {
        eprintln!("  {e}");
    }
}

fn stats(files: &[PathBuf], input: &Input, json: bool, html: Option<&Path>) -> Result<()> {
    let mut all = Vec::new();
    let mut pages = Vec::new();
    for path in files {
        let mut reader = input.open(path)?;
        let mut c = trace::stats::Collector::new();
        for r in reader.by_ref() {
            c.add(&r?);
        }
        report_skipped(path, &reader);
        let s = c.finish();
        if html.is_some() {
            pages.push((path.display().to_string(), s.clone()));
        }
        if json {
            let mut v = serde_json::to_value(&s)?;
            v["file"] = path.display().to_string().into();
            v["format"] = reader.format().name().into();
            v["lines"] = reader.lines().into();
            v["skipped"] = reader.skipped().into();
            all.push(v);
        } else {
            println!(
                "== {} ({}, {} lines)",
                path.display(),
                reader.format().name(),
                reader.lines()
            );
            print!("{}", s.render());
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    if let Some(page) = html {
        report::write_trace_html(&pages, page)?;
        eprintln!("wrote {}", page.display());
    }
    Ok(())
}

fn convert(path: &Path, out: &Path, input: &Input, to: &str) -> Result<()> {
    let format = Format::parse(to)
        .map_err(|e| anyhow::anyhow!("--to: {e}"))?
        .ok_or_else(|| anyhow::anyhow!("--to: name the format to write"))?;
    let mut reader = input.open(path)?;
    let sink: Box<dyn std::io::Write> = if out == Path::new("-") {
        Box::new(std::io::stdout().lock())
    } else {
        let f = std::fs::File::create(out)
            .map_err(|e| anyhow::anyhow!("{}: cannot create it: {e}", out.display()))?;
        Box::new(std::io::BufWriter::with_capacity(1 << 20, f))
    };
    let mut w = trace::convert::Writer::new(sink, format)?;
    for r in reader.by_ref() {
        w.write(&r?)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    let n = w.finish()?;
    report_skipped(path, &reader);
    eprintln!(
        "{n} records written to {} ({})",
        out.display(),
        format.name()
    );
    Ok(())
}
