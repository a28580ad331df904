//! The house rules of the source tree, checked on the tree itself
//! (`docs/adr/0009-module-shape-and-errors.md`):
//!
//! - no non-test source file over [`MAX_FILE_LINES`] lines (a file's own
//!   `#[cfg(test)] mod tests { .. }` block does not count);
//! - no function over [`MAX_FN_LINES`] lines in `settlement`, `abci` and
//!   `relay`, unless it is mostly a `match` of one-line arms;
//! - no file-level import cycle in any crate: when file A names an item of
//!   file B (`crate::b::..`, `super::b::..`), B names nothing of A. A child
//!   naming its ancestors (`super::`, the crate root's re-exports) is not a
//!   cycle: that is how a module's parts share its types.
//!
//! Test code is exempt: the `tests` crate, `tests/` folders, `tests.rs`
//! files, `#[cfg(test)]` modules and `src/bin/`.
//!
//! The checker is a small lexer (comments, strings and chars removed, then
//! braces matched), not a Rust parser. Its own unit tests below feed it
//! hand-written sources with a known answer, so a checker that stops
//! seeing cycles or long functions fails here first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest non-test source file, in lines.
const MAX_FILE_LINES: usize = 500;
/// Longest function in the crates on the consensus path, in lines.
const MAX_FN_LINES: usize = 80;
/// Crates whose functions must stay short.
const SHORT_FN_CRATES: [&str; 3] = ["settlement", "abci", "relay"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The workspace's library crates: (name, `src` folder), from the root
/// manifest's members, minus the test crate.
fn crates() -> Vec<(String, PathBuf)> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("root Cargo.toml");
    let value: toml::Value = manifest.parse().expect("root Cargo.toml parses");
    let members = value["workspace"]["members"]
        .as_array()
        .expect("workspace members")
        .iter()
        .filter_map(|m| m.as_str())
        .filter(|m| *m != "tests")
        .map(|m| (m.to_string(), root().join(m).join("src")))
        .collect::<Vec<_>>();
    assert!(members.len() >= 8, "found only {members:?}");
    members
}

/// Whether `path` (relative to a crate's `src`) is test code.
fn is_test_file(rel: &Path) -> bool {
    rel.components().any(|c| {
        let s = c.as_os_str().to_string_lossy();
        s == "tests" || s == "bin"
    }) || rel.file_name().is_some_and(|f| f == "tests.rs")
}

/// Every non-test `.rs` file under `src`, relative to it.
fn sources(src: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, base, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(base).expect("under base").to_path_buf();
                if !is_test_file(&rel) {
                    out.push(rel);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(src, src, &mut out);
    out.sort();
    out
}

/// `src` with comments, string and char literals blanked to spaces (line
/// breaks kept, so line numbers stay), and every `#[cfg(test)]` item
/// (a `mod tests { .. }` or a `mod tests;`) blanked too.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |c: u8| if c == b'\n' { b'\n' } else { b' ' };
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if b[i] == b'r' && matches!(b.get(i + 1), Some(b'"' | b'#')) && raw_start(b, i) {
            // r"..." or r#"..."#
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            out.extend(std::iter::repeat_n(b' ', j + 1 - i));
            i = j + 1;
            while i < b.len() && !b[i..].starts_with(&close) {
                out.push(blank(b[i]));
                i += 1;
            }
            out.extend(std::iter::repeat_n(b' ', close.len().min(b.len() - i)));
            i += close.len();
        } else if b[i] == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    out.push(b' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if b[i] == b'\'' && is_char_literal(b, i) {
            let end = char_literal_end(b, i);
            out.extend(std::iter::repeat_n(b' ', end - i));
            i = end;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out.truncate(b.len());
    let s = String::from_utf8_lossy(&out).into_owned();
    blank_cfg_test(&s)
}

/// Whether the `r` at `i` starts a raw string (not the end of an ident).
fn raw_start(b: &[u8], i: usize) -> bool {
    i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// Whether the `'` at `i` opens a char literal (not a lifetime).
fn is_char_literal(b: &[u8], i: usize) -> bool {
    match b.get(i + 1) {
        Some(b'\\') => true,
        Some(_) => {
            // 'x' (one char, possibly multi-byte UTF-8)
            let mut j = i + 1;
            j += 1;
            while j < b.len() && (b[j] & 0xC0) == 0x80 {
                j += 1;
            }
            b.get(j) == Some(&b'\'')
        }
        None => false,
    }
}

fn char_literal_end(b: &[u8], i: usize) -> usize {
    let mut j = i + 1;
    if b.get(j) == Some(&b'\\') {
        j += 2;
    } else {
        j += 1;
    }
    while j < b.len() && b[j] != b'\'' {
        j += 1;
    }
    (j + 1).min(b.len())
}

/// Blanks every item under `#[cfg(test)]`: from the attribute to the end of
/// the item (its matching `}` or its `;`).
fn blank_cfg_test(s: &str) -> String {
    let mut b = s.as_bytes().to_vec();
    let pat = b"#[cfg(test)]";
    let mut from = 0;
    while let Some(pos) = find(&b[from..], pat).map(|p| p + from) {
        let mut j = pos + pat.len();
        let mut depth = 0i32;
        while j < b.len() {
            match b[j] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        j += 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    j += 1;
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        for c in &mut b[pos..j.min(s.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        from = j.min(s.len());
    }
    String::from_utf8_lossy(&b).into_owned()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Lines of a stripped file that hold code (a `#[cfg(test)]` block is blank).
fn code_lines(stripped: &str) -> usize {
    let lines: Vec<&str> = stripped.lines().collect();
    let last = lines.iter().rposition(|l| !l.trim().is_empty());
    last.map_or(0, |l| l + 1)
}

/// Functions of a stripped file: (name, first line (1-based), lines, lines
/// that are one-line match arms).
fn functions(stripped: &str) -> Vec<(String, usize, usize, usize)> {
    let b = stripped.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = find(&b[i..], b"fn ").map(|p| p + i) {
        i = p + 3;
        if p > 0 && (b[p - 1].is_ascii_alphanumeric() || b[p - 1] == b'_') {
            continue;
        }
        let name: String = stripped[p + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body: the first `{` at bracket depth 0 before any `;`.
        let mut j = p;
        let mut paren = 0i32;
        let mut open = None;
        while j < b.len() {
            match b[j] {
                b'(' | b'[' | b'<' => paren += 1,
                b')' | b']' => paren -= 1,
                b'>' if j > 0 && b[j - 1] != b'-' && b[j - 1] != b'=' => paren -= 1,
                b';' if paren <= 0 => break,
                b'{' if paren <= 0 => {
                    open = Some(j);
                    break;
                }
                _ => {}
            }
            j += 1;
        }
        let Some(open) = open else { continue };
        let mut depth = 0i32;
        let mut k = open;
        while k < b.len() {
            match b[k] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            k += 1;
        }
        let first = stripped[..p].matches('\n').count() + 1;
        let last = stripped[..k.min(b.len())].matches('\n').count() + 1;
        let body = &stripped[open..k.min(b.len())];
        let arms = body
            .lines()
            .filter(|l| {
                let t = l.trim();
                t.contains("=>") && (t.ends_with(',') || t.ends_with('}')) && !t.ends_with("=> {")
            })
            .count();
        out.push((name, first, last + 1 - first, arms));
        // Nested fns are found on their own; go on inside the body.
        i = open + 1;
    }
    out
}

/// A file's module path inside its crate (`a/b.rs` and `a/b/mod.rs` are
/// `[a, b]`; `lib.rs` is `[]`).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Every module path a stripped file names, absolute from its crate root:
/// `crate::a::b::{c, d::e}` gives `[a,b,c]` and `[a,b,d,e]`;
/// `super::x` is resolved against `me`.
fn referenced_paths(stripped: &str, me: &[String]) -> Vec<Vec<String>> {
    let toks = tokens(stripped);
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].as_str();
        let prev_is_sep = i > 0 && toks[i - 1] == "::";
        if (t == "crate" || t == "super" || t == "self") && !prev_is_sep {
            let mut base: Vec<String> = match t {
                "crate" => Vec::new(),
                "self" => me.to_vec(),
                _ => me[..me.len().saturating_sub(1)].to_vec(),
            };
            let mut j = i + 1;
            // super::super::..
            while toks.get(j).map(String::as_str) == Some("::")
                && toks.get(j + 1).map(String::as_str) == Some("super")
            {
                base.pop();
                j += 2;
            }
            if t == "self" && toks.get(j).map(String::as_str) != Some("::") {
                i += 1;
                continue;
            }
            let end = use_tree(&toks, j, base, &mut out);
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Parses `:: seg :: seg ... [:: { tree, tree }]` from `toks[at]`, pushing
/// every full path; returns the index after it.
fn use_tree(
    toks: &[String],
    mut at: usize,
    mut path: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        if toks.get(at).map(String::as_str) != Some("::") {
            out.push(path);
            return at;
        }
        match toks.get(at + 1).map(String::as_str) {
            Some("{") => {
                let mut j = at + 2;
                loop {
                    match toks.get(j).map(String::as_str) {
                        None => return j,
                        Some("}") => return j + 1,
                        Some(",") => j += 1,
                        Some("self") => {
                            out.push(path.clone());
                            j += 1;
                        }
                        Some(s) if is_ident(s) => {
                            let mut p = path.clone();
                            p.push(s.to_string());
                            j = use_tree(toks, j + 1, p, out);
                        }
                        Some(_) => j += 1,
                    }
                }
            }
            Some(s) if is_ident(s) => {
                path.push(s.to_string());
                at += 2;
            }
            _ => {
                out.push(path);
                return at + 1;
            }
        }
    }
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Identifiers, `::` and single punctuation characters.
fn tokens(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let cs: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        if c.is_alphanumeric() || c == '_' {
            let st = i;
            while i < cs.len() && (cs[i].is_alphanumeric() || cs[i] == '_') {
                i += 1;
            }
            out.push(cs[st..i].iter().collect());
        } else if c == ':' && cs.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
        } else if c.is_whitespace() {
            i += 1;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// The file (of `files`, by module path) that a path names: its longest
/// prefix that is a module.
fn resolve<'a>(
    path: &[String],
    files: &'a BTreeMap<Vec<String>, PathBuf>,
) -> Option<&'a Vec<String>> {
    (0..=path.len())
        .rev()
        .find_map(|n| files.get_key_value(&path[..n]).map(|(k, _)| k))
}

/// The file-level edges of one crate: file -> files it names, leaving out
/// names of itself and of its ancestors.
fn edges(files: &BTreeMap<Vec<String>, String>) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let index: BTreeMap<Vec<String>, PathBuf> =
        files.keys().map(|k| (k.clone(), PathBuf::new())).collect();
    let mut out = BTreeMap::new();
    for (me, stripped) in files {
        let mut to = BTreeSet::new();
        for p in referenced_paths(stripped, me) {
            if let Some(target) = resolve(&p, &index) {
                let ancestor = target.len() <= me.len() && me[..target.len()] == target[..];
                if !ancestor {
                    to.insert(target.clone());
                }
            }
        }
        out.insert(me.clone(), to);
    }
    out
}

/// Strongly connected components with more than one file (Tarjan).
fn cycles(g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct T<'a> {
        g: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, usize>,
        low: BTreeMap<&'a Vec<String>, usize>,
        on: BTreeSet<&'a Vec<String>>,
        stack: Vec<&'a Vec<String>>,
        next: usize,
        out: Vec<Vec<Vec<String>>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a Vec<String>) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        let g = t.g;
        for w in g.get(v).into_iter().flatten() {
            let Some((w, _)) = g.get_key_value(w) else {
                continue;
            };
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().expect("on stack");
                t.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        on: BTreeSet::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// Each crate's non-test files, stripped, by module path.
/// A crate's non-test files: module path -> (file, stripped text).
type Files = BTreeMap<Vec<String>, (PathBuf, String)>;

fn stripped_crates() -> Vec<(String, PathBuf, Files)> {
    crates()
        .into_iter()
        .map(|(name, src)| {
            let files = sources(&src)
                .into_iter()
                .map(|rel| {
                    let text = std::fs::read_to_string(src.join(&rel)).expect("readable source");
                    (module_of(&rel), (rel, strip(&text)))
                })
                .collect();
            (name, src, files)
        })
        .collect()
}

#[test]
fn no_source_file_is_over_the_line_limit() {
    let mut long = Vec::new();
    for (name, _, files) in stripped_crates() {
        for (rel, stripped) in files.values() {
            let n = code_lines(stripped);
            if n > MAX_FILE_LINES {
                long.push(format!("{name}/src/{}: {n} lines", rel.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines (split them by concern):\n{}",
        long.join("\n")
    );
}

#[test]
fn no_function_on_the_consensus_path_is_over_the_line_limit() {
    let mut long = Vec::new();
    for (name, _, files) in stripped_crates() {
        if !SHORT_FN_CRATES.contains(&name.as_str()) {
            continue;
        }
        for (rel, stripped) in files.values() {
            for (f, line, n, arms) in functions(stripped) {
                if n > MAX_FN_LINES && arms * 10 < n * 7 {
                    long.push(format!(
                        "{name}/src/{}:{line} fn {f}: {n} lines",
                        rel.display()
                    ));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines in {SHORT_FN_CRATES:?}:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_crate_has_a_file_import_cycle() {
    let mut found = Vec::new();
    for (name, _, files) in stripped_crates() {
        let text: BTreeMap<Vec<String>, String> = files
            .iter()
            .map(|(k, (_, s))| (k.clone(), s.clone()))
            .collect();
        for c in cycles(&edges(&text)) {
            let names: Vec<String> = c
                .iter()
                .map(|m| {
                    format!(
                        "{name}::{}",
                        if m.is_empty() {
                            "(root)".into()
                        } else {
                            m.join("::")
                        }
                    )
                })
                .collect();
            found.push(names.join(" <-> "));
        }
    }
    assert!(
        found.is_empty(),
        "file import cycles:\n{}",
        found.join("\n")
    );
}

// The checker's own oracle: hand-written sources with known answers.

fn modmap(files: &[(&str, &str)]) -> BTreeMap<Vec<String>, String> {
    files
        .iter()
        .map(|(p, src)| (module_of(Path::new(p)), strip(src)))
        .collect()
}

#[test]
fn checker_sees_a_sibling_cycle_through_a_grouped_use() {
    let files = modmap(&[
        ("lib.rs", "pub mod a; pub mod b; pub mod c;"),
        ("a.rs", "use crate::{b::{self, X}, c::Y};"),
        ("b.rs", "fn f() { crate::a::g(); }"),
        ("c.rs", "use crate::Z;"),
    ]);
    assert_eq!(cycles(&edges(&files)).len(), 1);
    let c = &cycles(&edges(&files))[0];
    assert_eq!(c, &vec![vec!["a".to_string()], vec!["b".to_string()]]);
}

#[test]
fn checker_allows_children_naming_their_parent_and_ignores_comments_and_tests() {
    let files = modmap(&[
        ("lib.rs", "pub mod p;"),
        ("p/mod.rs", "mod q; use q::Q; use self::q::R; pub struct P;"),
        (
            "p/q.rs",
            "use super::P; // crate::p::r\n/* crate::p */ fn s() { let _ = \"crate::p\"; }",
        ),
        (
            "p/r.rs",
            "#[cfg(test)]\nmod tests { use crate::p::q::Q; }\nuse crate::p::q;",
        ),
        ("p/q/x.rs", "use crate::p::r;"),
    ]);
    // r -> q is the only edge between siblings (plus x -> r, and q's own child x).
    assert!(cycles(&edges(&files)).is_empty());
    // r naming its sibling q and q naming r would be a cycle:
    let files = modmap(&[
        ("lib.rs", "pub mod p;"),
        ("p/mod.rs", "mod q; mod r;"),
        ("p/q.rs", "use super::r::R;"),
        ("p/r.rs", "use super::q::Q;"),
    ]);
    assert_eq!(cycles(&edges(&files)).len(), 1);
}

#[test]
fn checker_measures_functions_and_files() {
    let mut src = String::from("//! doc\nfn short() -> u8 {\n    1\n}\n\npub(crate) fn long<T: Into<u8>>(x: T) -> Result<(), ()> {\n");
    for i in 0..90 {
        src.push_str(&format!("    let _v{i} = \"}}\"; // }}\n"));
    }
    src.push_str("    Ok(())\n}\n\nfn arms(x: u8) -> u8 {\n    match x {\n");
    for i in 0..100 {
        src.push_str(&format!("        {i} => {i},\n"));
    }
    src.push_str("        _ => 0,\n    }\n}\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\n");
    let s = strip(&src);
    let f = functions(&s);
    let by_name: BTreeMap<_, _> = f
        .iter()
        .map(|(n, l, len, arms)| (n.as_str(), (*l, *len, *arms)))
        .collect();
    assert_eq!(by_name["short"], (2, 3, 0));
    assert_eq!(by_name["long"].1, 93);
    assert!(by_name["arms"].2 >= 100);
    assert!(!by_name.contains_key("t"), "cfg(test) code is not measured");
    assert_eq!(code_lines(&s), src.lines().count() - 4);
}
