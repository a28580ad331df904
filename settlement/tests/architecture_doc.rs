//! The map in `docs/ARCHITECTURE.md` and the module list in
//! `settlement/src/lib.rs`'s doc against what the code declares, so a crate
//! or module added, moved or removed without its doc line fails here:
//!
//! - the "Crates" table lists exactly the `members` of the root
//!   `Cargo.toml`, each with the package name its own `Cargo.toml` gives;
//! - the "The settlement crate" table and the bulleted module list of
//!   `lib.rs`'s `//!` doc name exactly the modules `lib.rs` declares
//!   (`mod x;`, `pub mod x;`, test-only modules aside), which in turn are
//!   exactly the `.rs` files and folders in `settlement/src/`.
//!
//! The oracles are the declarations and the files on disk, never the docs.
//! Nothing is hard-coded: the tables are parsed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ARCH: &str = include_str!("../../docs/ARCHITECTURE.md");
const LIB: &str = include_str!("../src/lib.rs");
const WORKSPACE: &str = include_str!("../../Cargo.toml");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("settlement/ has a parent")
        .to_path_buf()
}

/// The text of `doc`'s `## {heading}` section, up to the next `## `.
fn section<'a>(doc: &'a str, heading: &str) -> Result<&'a str, String> {
    let head = format!("\n## {heading}\n");
    let start = doc
        .find(&head)
        .ok_or_else(|| format!("no {head:?} section"))?
        + head.len();
    let rest = &doc[start..];
    Ok(&rest[..rest.find("\n## ").unwrap_or(rest.len())])
}

/// The rows of the tables in `text` whose first cell starts with a code
/// span, as their cells (trimmed). Header and separator rows are skipped.
fn rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// The code spans (text between backticks) of `cell`, in order.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The first code span of a row's first cell, without a trailing `/`.
fn first_name(row: &[String]) -> Result<String, String> {
    let cell = row.first().ok_or("empty row")?;
    let name = code_spans(cell)
        .first()
        .copied()
        .ok_or_else(|| format!("no name in row {row:?}"))?;
    Ok(name.trim_end_matches('/').to_string())
}

/// Names a list of rows, refusing a name given twice.
fn names(rows: &[Vec<String>]) -> Result<BTreeSet<String>, String> {
    let mut out = BTreeSet::new();
    for row in rows {
        let name = first_name(row)?;
        if !out.insert(name.clone()) {
            return Err(format!("{name:?} has two rows"));
        }
    }
    Ok(out)
}

fn compare(what: &str, actual: &BTreeSet<String>, doc: &BTreeSet<String>) -> Result<(), String> {
    let missing: Vec<_> = actual.difference(doc).collect();
    let stale: Vec<_> = doc.difference(actual).collect();
    if missing.is_empty() && stale.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{what}: missing from the second (the doc) {missing:?}; \
             only in the second {stale:?}"
        ))
    }
}

/// The `members` of the root `Cargo.toml`'s `[workspace]`.
fn workspace_members(toml: &str) -> Result<BTreeSet<String>, String> {
    let at = toml
        .find("\nmembers")
        .ok_or("no `members` in the root Cargo.toml")?;
    let list = &toml[at..];
    let list = &list[list.find('[').ok_or("`members` without a list")? + 1..];
    let list = &list[..list.find(']').ok_or("unterminated `members`")?];
    Ok(list
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect())
}

/// The `name` of a `Cargo.toml`'s `[package]`.
fn package_name(toml: &str) -> Option<String> {
    let package = &toml[toml.find("[package]")?..];
    package
        .lines()
        .take_while(|l| !l.starts_with('[') || l.starts_with("[package]"))
        .find_map(|l| {
            let value = l.strip_prefix("name")?.trim_start().strip_prefix('=')?;
            Some(value.trim().trim_matches('"').to_string())
        })
}

fn check_crates(doc: &str, members: &BTreeSet<String>) -> Result<(), String> {
    let table = rows(section(doc, "Crates")?);
    compare("workspace members", members, &names(&table)?)?;
    for row in &table {
        let path = first_name(row)?;
        let toml_path = root().join(&path).join("Cargo.toml");
        let toml = std::fs::read_to_string(&toml_path)
            .map_err(|e| format!("{}: {e}", toml_path.display()))?;
        let actual = package_name(&toml).ok_or_else(|| format!("{path}: no package name"))?;
        let documented = row.get(1).and_then(|c| code_spans(c).first().copied());
        if documented != Some(actual.as_str()) {
            return Err(format!(
                "{path}/: the table says crate {documented:?}, its Cargo.toml {actual:?}"
            ));
        }
    }
    Ok(())
}

/// The modules `lib.rs` declares: `mod x;`, `pub mod x;`, `pub(crate) mod
/// x;` or an inline `mod x {`, except those under `#[cfg(test)]`.
fn declared_modules(lib: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut test_only = false;
    for line in lib.lines().map(str::trim) {
        if line.starts_with("//") || line.is_empty() {
            continue;
        }
        if line.starts_with("#[") {
            test_only |= line == "#[cfg(test)]";
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let visibility = words.first().is_some_and(|w| w.starts_with("pub"));
        let at = usize::from(visibility);
        if words.get(at) == Some(&"mod") && !test_only {
            if let Some(name) = words.get(at + 1) {
                out.insert(name.trim_end_matches([';', '{']).to_string());
            }
        }
        test_only = false;
    }
    out
}

/// The modules `settlement/src/` holds on disk: every `.rs` file but the
/// crate root, and every folder (of a `mod.rs` module or a file module's
/// children).
fn modules_on_disk() -> Result<BTreeSet<String>, String> {
    let dir = root().join("settlement/src");
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.is_dir() || (path.extension().is_some_and(|e| e == "rs") && stem != "lib") {
            out.insert(stem.to_string());
        }
    }
    Ok(out)
}

/// The names `lib.rs`'s `//!` doc gives in its module list: every code
/// span that is a plain identifier in the bullets after the line that
/// introduces the modules (`Modules, ...`).
fn lib_doc_modules(lib: &str) -> Result<BTreeSet<String>, String> {
    let doc: Vec<&str> = lib
        .lines()
        .map_while(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    let start = doc
        .iter()
        .position(|l| l.starts_with("Modules"))
        .ok_or("lib.rs's doc has no `Modules` list")?;
    let mut out = BTreeSet::new();
    for line in doc[start + 1..]
        .iter()
        .skip_while(|l| !l.starts_with("- "))
        .take_while(|l| l.starts_with("- ") || l.starts_with("  "))
    {
        for span in code_spans(line) {
            let ident = !span.is_empty()
                && span
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if ident {
                out.insert(span.to_string());
            }
        }
    }
    Ok(out)
}

fn check_settlement_table(doc: &str, declared: &BTreeSet<String>) -> Result<(), String> {
    let table = rows(section(doc, "The settlement crate")?);
    compare(
        "settlement modules in ARCHITECTURE.md",
        declared,
        &names(&table)?,
    )
}

#[test]
fn crates_table_lists_the_workspace_members() {
    let members = workspace_members(WORKSPACE).unwrap();
    assert!(members.contains("settlement"), "parsed members {members:?}");
    if let Err(e) = check_crates(ARCH, &members) {
        panic!("docs/ARCHITECTURE.md: {e}");
    }
}

#[test]
fn declared_modules_are_the_files_on_disk() {
    let declared = declared_modules(LIB);
    assert!(declared.contains("keys"), "parsed {declared:?}");
    if let Err(e) = compare(
        "settlement/src files vs lib.rs declarations",
        &modules_on_disk().unwrap(),
        &declared,
    ) {
        panic!("{e}");
    }
}

#[test]
fn architecture_names_every_settlement_module() {
    if let Err(e) = check_settlement_table(ARCH, &declared_modules(LIB)) {
        panic!("{e}");
    }
}

#[test]
fn lib_doc_lists_every_module() {
    let documented = lib_doc_modules(LIB).unwrap();
    if let Err(e) = compare(
        "settlement/src/lib.rs's module list",
        &declared_modules(LIB),
        &documented,
    ) {
        panic!("{e}");
    }
}

/// The checks bite: a module missing from a doc, a module that no longer
/// exists, a crate row renamed or with the wrong package name.
#[test]
fn a_missing_or_stale_name_is_reported() {
    let declared = declared_modules(LIB);
    let without = ARCH.replacen("| `calls` |", "| `callz` |", 1);
    let e = check_settlement_table(&without, &declared).expect_err("renamed module row");
    assert!(e.contains("\"calls\"") && e.contains("\"callz\""), "{e}");

    let mut more = declared.clone();
    more.insert("pipeline_x".into());
    let e = check_settlement_table(ARCH, &more).expect_err("undocumented module");
    assert!(e.contains("pipeline_x"), "{e}");

    let lib = LIB.replacen("pub mod calls;", "pub mod calls;\npub mod ghost;", 1);
    let e = compare(
        "lib",
        &declared_modules(&lib),
        &lib_doc_modules(&lib).unwrap(),
    )
    .expect_err("module missing from lib.rs's list");
    assert!(e.contains("ghost"), "{e}");

    let members = workspace_members(WORKSPACE).unwrap();
    let renamed = ARCH.replacen("| `store/` | `tally-store`", "| `store/` | `tally-stor`", 1);
    let e = check_crates(&renamed, &members).expect_err("wrong package name");
    assert!(e.contains("tally-stor\""), "{e}");
    let mut extra = members.clone();
    extra.insert("ghost-crate".into());
    let e = check_crates(ARCH, &extra).expect_err("crate missing from the table");
    assert!(e.contains("ghost-crate"), "{e}");
}

#[test]
fn test_only_and_inline_modules_are_parsed() {
    let src = "//! doc\n#[cfg(test)]\nmod tests;\npub(crate) mod a;\nmod b {\n}\npub use a::X;\n";
    let got: Vec<_> = declared_modules(src).into_iter().collect();
    assert_eq!(got, ["a", "b"]);
}
