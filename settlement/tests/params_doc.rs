//! The README documents every chain parameter: its genesis example's
//! `params` object and its parameter table must hold exactly the fields of
//! `Params`, each with its default. The oracle is `Params::default()` as
//! `Params::to_json` shows it (what genesis, `/params` and `tallyd genesis set-param` use),
//! not the doc. A field added to `Params` without its doc row fails here.

use serde_json::{Map, Value};
use tally_settlement::Params;

const README: &str = include_str!("../../README.md");
const SECTION: &str = "\n### Genesis `app_state`";

fn section(doc: &str) -> Result<&str, String> {
    let start = doc
        .find(SECTION)
        .ok_or_else(|| format!("no {SECTION:?} section"))?;
    let rest = &doc[start + 1..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    Ok(&rest[..end])
}

/// The `params` object of the section's first JSON block.
fn example(section: &str) -> Result<Map<String, Value>, String> {
    let start = section.find("```json\n").ok_or("no json block")? + 8;
    let len = section[start..]
        .find("```")
        .ok_or("unterminated json block")?;
    let v: Value = serde_json::from_str(&section[start..start + len])
        .map_err(|e| format!("the example is not JSON: {e}"))?;
    v.get("params")
        .and_then(Value::as_object)
        .cloned()
        .ok_or_else(|| "the example has no params object".into())
}

/// `(name, default)` of each row of the section's `| param | default |`
/// table; the default cell is read as JSON.
fn table(section: &str) -> Result<Vec<(String, Value)>, String> {
    let mut rows = Vec::new();
    for line in section.lines() {
        let Some(rest) = line.strip_prefix("| `") else {
            continue;
        };
        let cells: Vec<&str> = rest.split(" | ").collect();
        let name = cells[0]
            .strip_suffix('`')
            .ok_or(format!("bad row {line:?}"))?;
        let default = cells.get(1).ok_or(format!("no default in {line:?}"))?;
        let default = default.trim().trim_matches('`');
        let v = serde_json::from_str(default)
            .map_err(|_| format!("default {default:?} of {name} is not a JSON value"))?;
        rows.push((name.to_string(), v));
    }
    Ok(rows)
}

fn defaults() -> Map<String, Value> {
    match Params::default().to_json() {
        Value::Object(m) => m,
        other => panic!("Params does not serialize to an object: {other:?}"),
    }
}

/// Names missing from the doc, documented but not fields, and wrong
/// defaults.
fn compare(doc: &[(String, Value)], what: &str) -> Result<(), String> {
    let code = defaults();
    let mut faults = Vec::new();
    for (name, v) in &code {
        match doc.iter().find(|(n, _)| n == name) {
            None => faults.push(format!("{name} is not documented")),
            Some((_, d)) if d != v => faults.push(format!("{name}: documented {d}, default {v}")),
            Some(_) => {}
        }
    }
    for (name, _) in doc {
        if !code.contains_key(name) {
            faults.push(format!("{name} is not a parameter"));
        }
        if doc.iter().filter(|(n, _)| n == name).count() > 1 {
            faults.push(format!("{name} is documented twice"));
        }
    }
    if faults.is_empty() {
        Ok(())
    } else {
        Err(format!("README {what}: {}", faults.join("; ")))
    }
}

fn check(doc: &str) -> Result<(), String> {
    let s = section(doc)?;
    let example: Vec<(String, Value)> = example(s)?.into_iter().collect();
    compare(&example, "genesis example")?;
    compare(&table(s)?, "parameter table")
}

#[test]
fn the_readme_documents_every_parameter_with_its_default() {
    if let Err(e) = check(README) {
        panic!("{e}");
    }
}

#[test]
fn a_missing_row_or_a_wrong_default_is_reported() {
    let row = README
        .lines()
        .find(|l| l.starts_with("| `max_block_messages` |"))
        .expect("row");
    let without = README.replacen(&format!("{row}\n"), "", 1);
    let e = check(&without).expect_err("a missing row must be caught");
    assert!(e.contains("max_block_messages is not documented"), "{e}");
    let wrong = README.replacen(
        "| `dkg_phase_blocks` | 8 |",
        "| `dkg_phase_blocks` | 9 |",
        1,
    );
    let e = check(&wrong).expect_err("a wrong default must be caught");
    assert!(
        e.contains("dkg_phase_blocks: documented 9, default 8"),
        "{e}"
    );
    let e = check(&README.replacen("\"max_tx_bytes\": 1048576,", "", 1)).unwrap_err();
    assert!(e.contains("genesis example: max_tx_bytes"), "{e}");
}

/// The README's word for a rule.
fn rule_word(r: tally_settlement::gov::params::Rule) -> &'static str {
    use tally_settlement::gov::params::Rule;
    match r {
        Rule::Free => "any",
        Rule::Fixed(_) => "fixed",
        Rule::RaiseOnly => "raise only",
        Rule::NoCeremony => "not during a ceremony",
        Rule::CoversBatch => "not below the batch being settled",
        Rule::FromVersion(7) => "from app version 7",
        Rule::FromVersion(_) => "from a later app version",
    }
}

/// `(name, after genesis)` of each row of the parameter table.
fn rule_column(section: &str) -> Vec<(String, String)> {
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|rest| {
            let cells: Vec<&str> = rest.split(" | ").collect();
            Some((
                cells[0].strip_suffix('`')?.to_string(),
                cells.get(2)?.trim().to_string(),
            ))
        })
        .collect()
}

#[test]
fn the_readme_gives_each_parameter_its_rule_after_genesis() {
    let s = section(README).unwrap();
    let doc = rule_column(s);
    let code = tally_settlement::gov::params::RULES;
    // Every field of Params has exactly one rule in the code.
    let fields: Vec<String> = defaults().keys().cloned().collect();
    let mut ruled: Vec<String> = code.iter().map(|(n, _)| n.to_string()).collect();
    ruled.sort();
    assert_eq!(ruled, fields, "RULES and Params name different parameters");
    for (name, rule) in code {
        let row = doc.iter().find(|(n, _)| n == name);
        assert_eq!(
            row.map(|(_, w)| w.as_str()),
            Some(rule_word(*rule)),
            "README's rule for {name}"
        );
    }
    assert_eq!(doc.len(), code.len());
}
