//! The state-layout table in `docs/ARCHITECTURE.md`, the key tables of
//! `docs/proofs.md` (what a third party verifies against) and the `keys`
//! module must name the same key prefixes: a key added, renamed or removed
//! in one place without the others fails here.

use std::collections::BTreeSet;

use tally_settlement::keys::LAYOUT;

/// The literal prefix of each row's key pattern in the "State layout"
/// section: the first column's text up to its first `<` placeholder.
fn documented_prefixes(doc: &str) -> Result<BTreeSet<String>, String> {
    documented_in(doc, "\n## State layout")
}

/// The prefixes of the key tables in `doc`'s section under `heading` (up to
/// the next `## ` heading).
fn documented_in(doc: &str, heading: &str) -> Result<BTreeSet<String>, String> {
    let start = doc
        .find(heading)
        .ok_or_else(|| format!("no {heading:?} section"))?;
    let section = &doc[start + 1..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    let mut out = BTreeSet::new();
    for line in section[..end].lines() {
        let Some(rest) = line.strip_prefix("| `") else {
            continue;
        };
        let pattern = rest
            .split('`')
            .next()
            .ok_or_else(|| format!("unterminated key in row {line:?}"))?;
        let prefix = pattern.split('<').next().unwrap_or_default();
        if prefix.is_empty() {
            return Err(format!("row without a literal prefix: {line:?}"));
        }
        if !out.insert(prefix.to_string()) {
            return Err(format!("prefix {prefix:?} documented twice"));
        }
    }
    Ok(out)
}

fn code_prefixes() -> BTreeSet<String> {
    LAYOUT
        .iter()
        // A control byte (side state's leading 0x01) is written `\x01`.
        .map(|(p, _)| {
            p.iter()
                .map(|&b| {
                    if b < 0x20 {
                        format!("\\x{b:02x}")
                    } else {
                        (b as char).to_string()
                    }
                })
                .collect()
        })
        .collect()
}

fn compare(doc: &str) -> Result<(), String> {
    compare_set(documented_prefixes(doc)?)
}

fn compare_set(documented: BTreeSet<String>) -> Result<(), String> {
    let code = code_prefixes();
    let undocumented: Vec<_> = code.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&code).collect();
    if undocumented.is_empty() && stale.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "keys::LAYOUT and the doc disagree: in code but not documented {undocumented:?}; \
             documented but not in code {stale:?}"
        ))
    }
}

const DOC: &str = include_str!("../../docs/ARCHITECTURE.md");

#[test]
fn architecture_table_names_every_key_prefix() {
    assert_eq!(
        LAYOUT.len(),
        code_prefixes().len(),
        "LAYOUT repeats a prefix"
    );
    if let Err(e) = compare(DOC) {
        panic!("{e}");
    }
}

const PROOFS: &str = include_str!("../../docs/proofs.md");

#[test]
fn proofs_doc_names_every_key_prefix() {
    let documented = documented_in(PROOFS, "\n## Keys and value encodings").unwrap();
    if let Err(e) = compare_set(documented) {
        panic!("docs/proofs.md: {e}");
    }
}

#[test]
fn a_missing_or_extra_row_is_reported() {
    let missing = DOC.replacen("| `bal/<user>`", "| `balance/<user>`", 1);
    let e = compare(&missing).expect_err("renamed row must be caught");
    assert!(e.contains("\"bal/\"") && e.contains("\"balance/\""), "{e}");
}
