//! Issue 37 §3: every link of the documentation goes somewhere.
//!
//! The documents are `README.md`, every `docs/**/*.md`, every
//! `crates/*/README.md` and `python/README.md`. In each, every relative link
//! (`[text](path)`, `[text](path#anchor)`, `[text](#anchor)`, an image
//! `![alt](path)`, a reference definition `[label]: path`, and an HTML
//! `href="…"` or `src="…"`) must name a file or directory of the repository
//! that exists, and an anchor must be a heading of its Markdown file under
//! GitHub's rules ([`slug`]). Links in code (fenced blocks and `` `spans` ``)
//! are text, not links. An external link (`http://`, `https://`, `mailto:`)
//! is not fetched (the tests run without the internet) but must be well-formed.
//! Beside the links: every guide of `docs/guide/` starts with what its reader
//! will have done at its end and is in the README's table of contents, and
//! the README stays at most 300 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The documents whose links are checked, relative to `root`, sorted.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from("README.md")];
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else { return };
        for entry in entries.map(Result::unwrap) {
            let path = dir.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    walk(root, Path::new("docs"), &mut out);
    for entry in std::fs::read_dir(root.join("crates")).unwrap().map(Result::unwrap) {
        let readme = Path::new("crates").join(entry.file_name()).join("README.md");
        if root.join(&readme).is_file() {
            out.push(readme);
        }
    }
    if root.join("python/README.md").is_file() {
        out.push(PathBuf::from("python/README.md"));
    }
    out.sort();
    out
}

/// A heading's anchor as GitHub makes it: the heading's text as rendered
/// (inline code, emphasis and links reduced to their text), lower-cased,
/// every character that is not a letter, a digit, a space, `-` or `_`
/// removed, and every space made a `-` (runs are not collapsed).
fn slug(heading: &str) -> String {
    rendered_text(heading)
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The text of a line of inline Markdown as GitHub shows it: code spans
/// keep their content, links and images their text, HTML tags go, and
/// emphasis markers (`*`, and `_` at a word's edge) go.
fn rendered_text(s: &str) -> String {
    let c: Vec<char> = s.chars().collect();
    let (mut out, mut i) = (String::new(), 0);
    while i < c.len() {
        match c[i] {
            '`' => {
                let ticks = c[i..].iter().take_while(|&&x| x == '`').count();
                match find_run(&c, i + ticks, '`', ticks) {
                    Some(end) => {
                        out.extend(&c[i + ticks..end]);
                        i = end + ticks;
                    }
                    None => {
                        out.extend(&c[i..i + ticks]);
                        i += ticks;
                    }
                }
            }
            '!' if c.get(i + 1) == Some(&'[') => i += 1,
            '[' => match link_end(&c, i) {
                Some((text_end, after)) => {
                    out.push_str(&rendered_text(&c[i + 1..text_end].iter().collect::<String>()));
                    i = after;
                }
                None => {
                    out.push('[');
                    i += 1;
                }
            },
            '<' if c[i + 1..].iter().position(|&x| x == '>').is_some_and(|n| n > 0)
                && c.get(i + 1).is_some_and(|x| x.is_ascii_alphabetic() || *x == '/') =>
            {
                i += c[i..].iter().position(|&x| x == '>').unwrap() + 1;
            }
            '*' => i += 1,
            '_' if i == 0 || i + 1 == c.len() || !c[i - 1].is_alphanumeric() || !c[i + 1].is_alphanumeric() => i += 1,
            x => {
                out.push(x);
                i += 1;
            }
        }
    }
    out
}

/// The index of the next run of exactly `n` `ch` at or after `from`.
fn find_run(c: &[char], from: usize, ch: char, n: usize) -> Option<usize> {
    let mut i = from;
    while i < c.len() {
        if c[i] == ch {
            let run = c[i..].iter().take_while(|&&x| x == ch).count();
            if run == n {
                return Some(i);
            }
            i += run;
        } else {
            i += 1;
        }
    }
    None
}

/// For a `[` at `open` that starts an inline link `[text](target)`: the
/// index of the text's `]` and the index just past the target's `)`.
fn link_end(c: &[char], open: usize) -> Option<(usize, usize)> {
    let mut depth = 0;
    let mut i = open;
    while i < c.len() {
        match c[i] {
            '[' => depth += 1,
            ']' => {
                depth -= 1;
                if depth == 0 {
                    if c.get(i + 1) != Some(&'(') {
                        return None;
                    }
                    let (_, after) = target_at(c, i + 2)?;
                    return Some((i, after));
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The target of an inline link whose `(` is just before `start`: its text
/// (without a title or angle brackets) and the index just past its `)`.
/// Parentheses inside it must balance.
fn target_at(c: &[char], start: usize) -> Option<(String, usize)> {
    let mut depth = 1;
    let mut i = start;
    while i < c.len() {
        match c[i] {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    let raw: String = c[start..i].iter().collect();
                    let raw = raw.trim();
                    let raw = match raw.strip_prefix('<') {
                        Some(rest) => rest.split('>').next().unwrap_or(""),
                        None => raw.split_whitespace().next().unwrap_or(""),
                    };
                    return Some((raw.to_string(), i + 1));
                }
            }
            '\n' => return None,
            _ => {}
        }
        i += 1;
    }
    None
}

/// The document's lines outside fenced code blocks, with their numbers,
/// and with inline code spans blanked.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker: String = trimmed.chars().take_while(|&c| c == '`' || c == '~').collect();
        let is_fence = marker.len() >= 3 && marker.chars().all(|c| c == marker.chars().next().unwrap());
        match &fence {
            Some(open) => {
                if is_fence && marker.starts_with(open.as_str()) && trimmed[marker.len()..].trim().is_empty() {
                    fence = None;
                }
            }
            None if is_fence => fence = Some(marker),
            None => out.push((n + 1, blank_code_spans(line))),
        }
    }
    out
}

/// The line with the content of each code span replaced by spaces.
fn blank_code_spans(line: &str) -> String {
    let c: Vec<char> = line.chars().collect();
    let (mut out, mut i) = (String::new(), 0);
    while i < c.len() {
        if c[i] == '`' {
            let ticks = c[i..].iter().take_while(|&&x| x == '`').count();
            if let Some(end) = find_run(&c, i + ticks, '`', ticks) {
                out.extend(std::iter::repeat_n(' ', end + ticks - i));
                i = end + ticks;
                continue;
            }
            out.extend(&c[i..i + ticks]);
            i += ticks;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The anchors of a Markdown document: its headings' slugs (a repeated
/// slug gets `-1`, `-2`, … as on GitHub) and the ids and names of its HTML
/// elements (`<a id="x">`).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fence: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let marker: String = trimmed.chars().take_while(|&c| c == '`' || c == '~').collect();
        let is_fence = marker.len() >= 3 && marker.chars().all(|c| c == marker.chars().next().unwrap());
        if let Some(open) = &fence {
            if is_fence && marker.starts_with(open.as_str()) {
                fence = None;
            }
            continue;
        }
        if is_fence {
            fence = Some(marker);
            continue;
        }
        for attr in ["id=\"", "name=\""] {
            for part in line.split(attr).skip(1) {
                if let Some(value) = part.split('"').next() {
                    out.insert(value.to_string());
                }
            }
        }
        let level = trimmed.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&level) && line.len() - trimmed.len() < 4 {
            let rest = &trimmed[level..];
            if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
                continue;
            }
            // A closing run of `#` is not part of the heading.
            let text = rest.trim().trim_end_matches('#').trim_end();
            let base = slug(text);
            let n = seen.entry(base.clone()).or_insert(0);
            out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
            *n += 1;
        }
    }
    out
}

/// The link targets of a document, each with its line number.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        let c: Vec<char> = line.chars().collect();
        for i in 0..c.len().saturating_sub(1) {
            if c[i] == ']' && c[i + 1] == '(' {
                if let Some((target, _)) = target_at(&c, i + 2) {
                    out.push((n, target));
                }
            }
        }
        // A reference definition: `[label]: target`.
        let t = line.trim_start();
        if t.starts_with('[') && !t.starts_with("[^") {
            if let Some(end) = t.find("]:") {
                if let Some(target) = t[end + 2..].split_whitespace().next() {
                    out.push((n, target.trim_matches(['<', '>']).to_string()));
                }
            }
        }
        for attr in ["href=\"", "src=\""] {
            for part in line.split(attr).skip(1) {
                if let Some(value) = part.split('"').next() {
                    out.push((n, value.to_string()));
                }
            }
        }
    }
    out
}

/// `%20` and the like, decoded.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether an external URL is well-formed: a scheme this check knows, a
/// host of letters, digits, `.` and `-` (with an optional port), and no
/// whitespace or characters a URL cannot hold unencoded.
fn well_formed_url(url: &str) -> Result<(), String> {
    if url.chars().any(|c| c.is_whitespace() || c.is_control() || matches!(c, '<' | '>' | '"' | '\\' | '`')) {
        return Err("has a character a URL cannot hold".into());
    }
    if let Some(address) = url.strip_prefix("mailto:") {
        let (user, host) = address.split_once('@').ok_or("a mailto: without @")?;
        return if !user.is_empty() && host.contains('.') { Ok(()) } else { Err("a bad mailto: address".into()) };
    }
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://")).ok_or("not http(s)")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap();
    let host = authority.rsplit_once(':').map_or(authority, |(h, port)| {
        if !port.is_empty() && port.chars().all(|c| c.is_ascii_digit()) {
            h
        } else {
            authority
        }
    });
    let labels: Vec<&str> = host.split('.').collect();
    let ok = labels.len() >= 2
        && labels.iter().all(|l| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    if ok || host == "localhost" {
        Ok(())
    } else {
        Err(format!("host {host:?} is not a host name"))
    }
}

/// The problems of the links of `documents` (paths relative to `root`), one
/// line each: `file:line: target: why`.
fn check(root: &Path, documents: &[PathBuf]) -> Vec<String> {
    let mut anchors_of: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for doc in documents {
        let text = std::fs::read_to_string(root.join(doc)).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
        for (line, target) in links(&text) {
            let mut fail = |why: String| problems.push(format!("{}:{line}: {target}: {why}", doc.display()));
            if target.is_empty() {
                fail("an empty link".into());
                continue;
            }
            let scheme = target.split_once(':').map(|(s, _)| s).filter(|s| {
                !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            });
            if scheme.is_some() || target.starts_with("//") {
                if let Err(why) = well_formed_url(&target) {
                    fail(format!("a malformed external link ({why})"));
                }
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                doc.clone()
            } else if path.starts_with('/') {
                fail("an absolute path: links are relative to their document".into());
                continue;
            } else {
                // Resolve `..` by hand: the target must stay in the repository.
                let mut resolved = doc.parent().unwrap().to_path_buf();
                let mut escaped = false;
                for part in Path::new(&percent_decode(path)).components() {
                    match part {
                        Component::ParentDir => escaped |= !resolved.pop(),
                        Component::Normal(p) => resolved.push(p),
                        _ => {}
                    }
                }
                if escaped {
                    fail("goes above the repository".into());
                    continue;
                }
                resolved
            };
            if !root.join(&file).exists() {
                fail(format!("{} does not exist", file.display()));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if file.extension().is_none_or(|e| e != "md") {
                // A line of a source file on GitHub: `#L10`, `#L10-L20`.
                let line_anchor =
                    anchor.strip_prefix('L').is_some_and(|n| n.split("-L").all(|d| d.parse::<u32>().is_ok()));
                if !line_anchor {
                    fail(format!("an anchor into {}, which is not Markdown", file.display()));
                }
                continue;
            }
            let known = anchors_of
                .entry(file.clone())
                .or_insert_with(|| anchors(&std::fs::read_to_string(root.join(&file)).unwrap_or_default()));
            if !known.contains(&percent_decode(anchor)) {
                fail(format!("{} has no heading with the anchor #{anchor}", file.display()));
            }
        }
    }
    problems
}

#[test]
fn every_link_of_the_documentation_resolves() {
    let root = root();
    let docs = documents(&root);
    for must in ["README.md", "docs/design.md", "docs/http-api.md", "docs/guide/getting-started.md"] {
        assert!(docs.contains(&PathBuf::from(must)), "{must} is among the documents checked: {docs:?}");
    }
    let problems = check(&root, &docs);
    assert!(problems.is_empty(), "broken links:\n{}", problems.join("\n"));
    // The check saw links at all: the README alone has dozens.
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(links(&readme).len() > 20, "{:?}", links(&readme));
}

/// GitHub's anchors of headings this repository has.
#[test]
fn slugs_are_githubs() {
    for (heading, anchor) in [
        ("Other lock services: one client API", "other-lock-services-one-client-api"),
        ("The resource side: `fencelock-fence`", "the-resource-side-fencelock-fence"),
        ("fencelock top", "fencelock-top"),
        (
            "Results of 2026-11-26 ([bench/results/2026-11-26](bench/results/2026-11-26/results.md))",
            "results-of-2026-11-26-benchresults2026-11-26",
        ),
        ("Shared and counted locks (W5)", "shared-and-counted-locks-w5"),
        ("Safety under faults: `fencelock-chaos`", "safety-under-faults-fencelock-chaos"),
        ("What `fencelock run` does", "what-fencelock-run-does"),
        (
            "Segment log, the default (K1, K2, K3 on a node; L2, L3 on the group; K1 shared and multi)",
            "segment-log-the-default-k1-k2-k3-on-a-node-l2-l3-on-the-group-k1-shared-and-multi",
        ),
        ("Tokens across groups", "tokens-across-groups"),
        ("A — B", "a--b"),
        ("**Bold** and _emphasis_ with snake_case", "bold-and-emphasis-with-snake_case"),
        ("Café 2× faster", "café-2-faster"),
    ] {
        assert_eq!(slug(heading), anchor, "{heading:?}");
    }
    let doc = "# Intro\n\n## Setup\n\n```sh\n# not a heading\n```\n\n## Setup\n\n### Setup ###\n<a id=\"here\"></a>\n";
    let got: Vec<String> = anchors(doc).into_iter().collect();
    assert_eq!(got, ["here", "intro", "setup", "setup-1", "setup-2"]);
}

/// The check finds what is broken, and passes over links in code.
#[test]
fn a_broken_link_or_anchor_fails_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("docs/guide")).unwrap();
    std::fs::write(root.join("docs/guide/a.md"), "# A guide\n\n## Its part: `one`\n").unwrap();
    std::fs::write(root.join("docs/pic.png"), "").unwrap();
    let readme = "# Title\n\n\
        [ok](docs/guide/a.md), [ok](docs/guide/a.md#its-part-one), ![ok](docs/pic.png), [ok](#title)\n\
        [file](docs/guide/b.md) and [anchor](docs/guide/a.md#its-part-two)\n\
        ![image](docs/missing.png) [self](#no-such-heading)\n\
        [up](../../outside.md) [url](https://example..com/) [url](https://example.com/a#b)\n\
        `[in code](nowhere.md)`\n\n```md\n[in a block](nowhere.md)\n```\n\n[ref]: docs/gone.md\n";
    std::fs::write(root.join("README.md"), readme).unwrap();
    let problems = check(root, &[PathBuf::from("README.md"), PathBuf::from("docs/guide/a.md")]);
    let targets: Vec<String> =
        problems.iter().map(|p| p.splitn(3, ": ").take(2).collect::<Vec<_>>().join(": ")).collect();
    let expected = [
        "README.md:4: docs/guide/b.md",
        "README.md:4: docs/guide/a.md#its-part-two",
        "README.md:5: docs/missing.png",
        "README.md:5: #no-such-heading",
        "README.md:6: ../../outside.md",
        "README.md:6: https://example..com/",
        "README.md:13: docs/gone.md",
    ];
    assert_eq!(targets, expected, "{problems:#?}");
}

/// Each guide starts (after its title and any comment) with what its reader
/// will have done at its end, and the README's table of contents names it.
#[test]
fn every_guide_says_what_its_reader_will_have_done_and_is_in_the_readme() {
    let root = root();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut guides = 0;
    for entry in std::fs::read_dir(root.join("docs/guide")).unwrap().map(Result::unwrap) {
        let name = entry.file_name().into_string().unwrap();
        if !name.ends_with(".md") {
            continue;
        }
        guides += 1;
        let text = std::fs::read_to_string(entry.path()).unwrap();
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        assert!(lines.next().is_some_and(|l| l.starts_with("# ")), "docs/guide/{name} starts with its title");
        // An HTML comment (a guide's conventions for its test) may come first.
        let mut first = lines.next().unwrap_or("");
        if first.starts_with("<!--") {
            let mut rest =
                text.split_once("-->").map(|(_, r)| r).unwrap_or("").lines().filter(|l| !l.trim().is_empty());
            first = rest.next().unwrap_or("");
        }
        assert!(
            first.starts_with("At the end of this guide you will have "),
            "docs/guide/{name} starts with what its reader will have done: {first:?}"
        );
        assert!(
            readme.contains(&format!("](docs/guide/{name})")),
            "the README's table of contents links docs/guide/{name}"
        );
    }
    assert!(guides >= 10, "{guides} guides");
}

/// The README is the front page, not the manual: at most 300 lines, and it
/// still names the test command CI runs.
#[test]
fn the_readme_is_short_and_names_the_test_command() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines; the guides under docs/guide/ take the rest");
    assert!(
        readme.contains("`scripts/test.sh` runs every test"),
        "the README's Development section names scripts/test.sh"
    );
}
