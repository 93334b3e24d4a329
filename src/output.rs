//! Result files (results.json, timeseries.csv, report.html, characterize.json, ...):
//! writing them, and the one error that names the file that could not be written.

use std::path::{Path, PathBuf};

/// A result file that could not be written, named.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Its folder could not be created.
    #[error("cannot create {}: {source}", path.display())]
    Folder {
        /// The folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file could not be created or written.
    #[error("cannot write {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A CSV row could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Csv {
        /// The file.
        path: PathBuf,
        /// Why.
        source: csv::Error,
    },
    /// The data could not be encoded as JSON.
    #[error("cannot write {}: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// A plot could not be drawn.
    #[error("cannot draw {}: {reason}", path.display())]
    Draw {
        /// The page.
        path: PathBuf,
        /// The plotting library's reason.
        reason: String,
    },
}

/// Creates `dir` (and its parents) unless it exists.
pub fn folder(dir: &Path) -> Result<(), WriteError> {
    std::fs::create_dir_all(dir).map_err(|source| WriteError::Folder {
        path: dir.to_path_buf(),
        source,
    })
}

/// Writes `contents` to `path`, replacing what was there.
pub fn write(path: &Path, contents: impl AsRef<[u8]>) -> Result<(), WriteError> {
    std::fs::write(path, contents).map_err(|source| WriteError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `value` to `path` as pretty-printed JSON with a final newline.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), WriteError> {
    let json = serde_json::to_string_pretty(value).map_err(|source| WriteError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    write(path, json + "\n")
}

/// Writes the rows `rows` hands a CSV writer to `path`; a failed row names the file.
pub fn write_csv(
    path: &Path,
    rows: impl FnOnce(&mut csv::Writer<std::io::BufWriter<std::fs::File>>) -> csv::Result<()>,
) -> Result<(), WriteError> {
    let csv = |source| WriteError::Csv {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(path).map_err(|source| WriteError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut w = csv::Writer::from_writer(std::io::BufWriter::new(file));
    rows(&mut w).map_err(csv)?;
    // Flushes the CSV buffer into the file's.
    let mut inner = w.into_inner().map_err(|e| csv(e.into_error().into()))?;
    std::io::Write::flush(&mut inner).map_err(|e| csv(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_cannot_be_written_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        write(&blocker, "x").unwrap();
        // A folder under a regular file cannot be made; a file in it cannot be written.
        let e = folder(&blocker.join("sub")).unwrap_err().to_string();
        assert!(
            e.starts_with("cannot create ") && e.contains("file/sub"),
            "{e}"
        );
        let e = write(&blocker.join("a.json"), "{}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("file/a.json"), "{e}");
        let e = write_csv(&blocker.join("t.csv"), |w| w.write_record(["a"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("file/t.csv"), "{e}");
        let ok = dir.path().join("t.csv");
        write_csv(&ok, |w| {
            w.write_record(["a", "b"])?;
            w.write_record(["1", "2"])
        })
        .unwrap();
        assert_eq!(std::fs::read_to_string(ok).unwrap(), "a,b\n1,2\n");
    }
}
