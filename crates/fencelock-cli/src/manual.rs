//! `fencelock completions SHELL` and `fencelock man DIR`: shell completion
//! scripts and man pages, made from the same clap definitions as the parser,
//! so that they name every subcommand and flag there is, with its help.

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Context;
use clap::{Args, CommandFactory};
use clap_complete::Shell;

use crate::{exit, version};

#[derive(Args, Debug)]
#[command(after_long_help = "\
Install it where the shell looks:
  bash  fencelock completions bash > /etc/bash_completion.d/fencelock
        (or: source <(fencelock completions bash) in ~/.bashrc)
  zsh   fencelock completions zsh > \"${fpath[1]}/_fencelock\"
  fish  fencelock completions fish > ~/.config/fish/completions/fencelock.fish")]
pub struct CompletionsArgs {
    /// The shell to write the script for.
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(Args, Debug)]
#[command(after_long_help = "\
One page per command, named as man names them: fencelock.1, fencelock-run.1,
fencelock-serve.1, …, and fencelock-cluster-add.1 for `fencelock cluster add`.
Read one with `man -l DIR/fencelock-run.1`; a package installs them under
/usr/share/man/man1/. Each written file's path is printed, one a line.")]
pub struct ManArgs {
    /// The directory to write the pages into (made if missing; pages there are replaced).
    dir: PathBuf,
}

/// Print the completion script of `a.shell`.
pub fn completions(a: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut crate::Cli::command(), "fencelock", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script).and_then(|()| out.flush()).context("writing the script")?;
    Ok(ExitCode::from(exit::OK))
}

/// Write the man pages into `a.dir` and print their paths.
pub fn man(a: ManArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&a.dir).with_context(|| format!("making {}", a.dir.display()))?;
    for (name, page) in pages()? {
        let path = a.dir.join(name);
        write_file(&path, &page).with_context(|| format!("writing {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(ExitCode::from(exit::OK))
}

fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// The man pages, as (file name, roff): `fencelock.1` and one per subcommand
/// that is not hidden, nested ones included (`fencelock-cluster-add.1`),
/// subcommands before their parent.
pub fn pages() -> std::io::Result<Vec<(String, Vec<u8>)>> {
    // Built, every subcommand has its display name (`fencelock-cluster-add`),
    // which names its page. The one-line version: the long one is `--version`'s.
    let mut cmd = crate::Cli::command().disable_help_subcommand(true).version(version::short());
    cmd.build();
    let source = format!("fencelock {}", version::short());
    let mut out = Vec::new();
    collect(&cmd, &source, &mut out)?;
    Ok(out)
}

fn collect(cmd: &clap::Command, source: &str, out: &mut Vec<(String, Vec<u8>)>) -> std::io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        collect(sub, source, out)?;
    }
    let man = clap_mangen::Man::new(cmd.clone()).source(source).manual("fencelock manual");
    let mut page = Vec::new();
    man.render(&mut page)?;
    out.push((man.get_filename(), page));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subcommand that is not hidden, as its path of names
    /// (`["cluster", "add"]`), nested ones included.
    fn subcommand_paths() -> Vec<Vec<String>> {
        fn walk(cmd: &clap::Command, path: &[String], out: &mut Vec<Vec<String>>) {
            for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
                let mut p = path.to_vec();
                p.push(sub.get_name().to_string());
                walk(sub, &p, out);
                out.push(p);
            }
        }
        let mut out = Vec::new();
        walk(&crate::Cli::command(), &[], &mut out);
        out
    }

    /// Rule: `fencelock man` writes one page per command of the clap tree,
    /// nested ones named `fencelock-PARENT-CHILD.1`, and none for a hidden one.
    #[test]
    fn every_subcommand_has_a_man_page() {
        let mut written: Vec<String> = pages().unwrap().into_iter().map(|(name, _)| name).collect();
        written.sort();
        let mut expected: Vec<String> =
            subcommand_paths().iter().map(|p| format!("fencelock-{}.1", p.join("-"))).collect();
        expected.push("fencelock.1".into());
        expected.sort();
        assert_eq!(written, expected);
        for name in ["fencelock-run.1", "fencelock-serve.1", "fencelock-cluster-add.1", "fencelock-man.1"] {
            assert!(written.iter().any(|w| w == name), "{name} in {written:?}");
        }
        assert!(!written.iter().any(|w| w.contains("demo-client") || w.contains("help")), "{written:?}");
    }

    /// Rule: a page carries its command's flags with their help: the run page
    /// has `--ttl` and the help clap shows for it.
    #[test]
    fn the_run_page_has_the_ttl_flag_and_its_help() {
        let cli = crate::Cli::command();
        let run = cli.find_subcommand("run").unwrap();
        let ttl = run.get_arguments().find(|a| a.get_long() == Some("ttl")).unwrap();
        let help = ttl.get_help().unwrap().to_string();
        let (_, page) = pages().unwrap().into_iter().find(|(n, _)| n == "fencelock-run.1").unwrap();
        let page = String::from_utf8(page).unwrap();
        assert!(page.contains("\\-\\-ttl"), "{page}");
        assert!(page.contains(&help), "{help:?} in {page}");
    }

    /// Rule: the zsh and fish scripts offer every subcommand, nested ones
    /// included, under its parent.
    #[test]
    fn zsh_and_fish_completions_name_every_subcommand() {
        for shell in [Shell::Zsh, Shell::Fish] {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut crate::Cli::command(), "fencelock", &mut script);
            let script = String::from_utf8(script).unwrap();
            for path in subcommand_paths() {
                let name = path.last().unwrap();
                // zsh: `'NAME:about'` in its parent's list; fish: `-a "NAME"`
                // under a condition that names its parent.
                let offered = match shell {
                    Shell::Zsh => script.contains(&format!("'{name}:")),
                    _ => script.lines().any(|l| {
                        l.contains(&format!("-a \"{name}\""))
                            && path[..path.len() - 1].iter().all(|parent| l.contains(parent.as_str()))
                    }),
                };
                assert!(offered, "{shell}: {path:?} not offered");
            }
        }
    }
}
