//! The command line of a harness tool (`fencelock-bench`, `fencelock-chaos`)
//! as a user would type it, for the reports those tools write into the
//! repository (`bench/results/*/results.{md,json}`, `docs/safety.md`).
//!
//! A report records how it was made, but not where: the program is named by its
//! file name, not the path of the build that ran it
//! (`/work/target-rel/release/fencelock-chaos`), and a path argument inside the
//! working directory (the checkout, as the tools are run) is written relative
//! to it (`docs/safety.md`), one next to it as `../name`. Any other argument is
//! kept as typed; one with white space or quotes is single-quoted.

use std::path::{Component, Path};

/// This process's command line as a user would type it (see the module docs).
pub fn this_command() -> String {
    let args: Vec<String> = std::env::args().collect();
    let cwd = std::env::current_dir().unwrap_or_default();
    typed_command(&args, &cwd)
}

/// `args` (the program first) as a user in `cwd` would type them.
pub fn typed_command(args: &[String], cwd: &Path) -> String {
    let mut words = Vec::with_capacity(args.len());
    if let Some(program) = args.first() {
        let name = Path::new(program).file_name().map_or_else(|| program.clone(), |n| n.to_string_lossy().into_owned());
        words.push(quoted(&name));
    }
    for arg in args.iter().skip(1) {
        words.push(quoted(&typed_arg(arg, cwd)));
    }
    words.join(" ")
}

/// One argument: an absolute path (alone or as `--flag=PATH`) made relative
/// to `cwd` where it is inside `cwd` or its parent.
fn typed_arg(arg: &str, cwd: &Path) -> String {
    if let Some((flag, value)) = arg.split_once('=') {
        if flag.starts_with('-') {
            return format!("{flag}={}", typed_path(value, cwd));
        }
    }
    typed_path(arg, cwd)
}

fn typed_path(arg: &str, cwd: &Path) -> String {
    let path = Path::new(arg);
    if !path.is_absolute() || !cwd.is_absolute() {
        return arg.to_string();
    }
    if let Ok(rel) = path.strip_prefix(cwd) {
        return if rel.as_os_str().is_empty() { ".".into() } else { rel.display().to_string() };
    }
    // A sibling of the working directory, but never "../" up to the root.
    let parent = cwd.parent().filter(|p| p.components().any(|c| matches!(c, Component::Normal(_))));
    match parent.and_then(|p| path.strip_prefix(p).ok()) {
        Some(rel) if !rel.as_os_str().is_empty() => format!("../{}", rel.display()),
        _ => arg.to_string(),
    }
}

/// `word` as a shell takes it: single-quoted if it holds white space or quotes.
fn quoted(word: &str) -> String {
    if word.is_empty() || word.chars().any(|c| c.is_whitespace() || "'\"\\$`".contains(c)) {
        format!("'{}'", word.replace('\'', r"'\''"))
    } else {
        word.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(args: &[&str], cwd: &str) -> String {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        typed_command(&args, Path::new(cwd))
    }

    /// Issue 16: `docs/safety.md` recorded `/work/target-rel/release/fencelock-chaos
    /// … --out /work/chaos-long --report /work/main/docs/safety.md`.
    #[test]
    fn the_program_by_name_and_paths_relative_to_the_checkout() {
        let got = typed(
            &[
                "/work/target-rel/release/fencelock-chaos",
                "profile",
                "long",
                "--resume",
                "--out",
                "/work/chaos-long",
                "--report",
                "/work/main/docs/safety.md",
            ],
            "/work/main",
        );
        assert_eq!(got, "fencelock-chaos profile long --resume --out ../chaos-long --report docs/safety.md");
    }

    #[test]
    fn other_arguments_are_kept_as_typed() {
        let got = typed(
            &[
                "./fencelock-bench",
                "--engines",
                "fencelock,redis",
                "--out=/repo/bench/x",
                "--data",
                "/tmp/d",
                "bench/y",
            ],
            "/repo",
        );
        assert_eq!(got, "fencelock-bench --engines fencelock,redis --out=bench/x --data /tmp/d bench/y");
        assert_eq!(typed(&["fencelock-bench"], "/repo"), "fencelock-bench");
        assert_eq!(typed(&["b", "/repo"], "/repo"), "b .");
    }

    /// Directly under the root, a sibling is not written as `../`: that would
    /// only move the machine's layout into a relative path.
    #[test]
    fn no_relative_path_up_to_the_root() {
        assert_eq!(typed(&["b", "/etc/x"], "/repo"), "b /etc/x");
    }

    #[test]
    fn words_with_spaces_or_quotes_are_quoted() {
        assert_eq!(typed(&["b", "--note", "two words", "it's"], "/r"), r"b --note 'two words' 'it'\''s'");
    }
}
