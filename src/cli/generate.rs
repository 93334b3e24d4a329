//! `ioshare completions SHELL` and `ioshare man --out DIR`: shell completions and man
//! pages generated from the command line's own definition, so they cannot drift from it.

use super::*;
use clap::CommandFactory as _;

/// Prints the completion script for `shell` (bash, zsh, fish, elvish, powershell).
pub(crate) fn completions(shell: clap_complete::Shell) -> Result<()> {
    let mut cmd = crate::Cli::command();
    clap_complete::generate(shell, &mut cmd, "ioshare", &mut std::io::stdout());
    Ok(())
}

/// Writes `ioshare.1` and one page per subcommand (`ioshare-serve.1`, ...) into `out`.
pub(crate) fn man(out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let cmd = crate::Cli::command();
    let mut written = Vec::new();
    let mut page = |cmd: clap::Command, name: String| -> Result<()> {
        let path = out.join(format!("{name}.1"));
        let mut text = Vec::new();
        // The page's NAME is `ioshare-serve`, not `serve`: clap takes a static name, and
        // this command ends as soon as the pages are written.
        let named: &'static str = Box::leak(name.clone().into_boxed_str());
        clap_mangen::Man::new(cmd.name(named)).render(&mut text)?;
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
        Ok(())
    };
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("ioshare-{}", sub.get_name());
        page(sub.clone(), name)?;
    }
    page(cmd, "ioshare".into())?;
    println!(
        "wrote {} man pages into {} (man -l {}/ioshare.1)",
        written.len(),
        out.display(),
        out.display()
    );
    Ok(())
}
