//! Metric names in deploy files and on served `/metrics` pages, for the
//! tests that check the dashboard and alert rules name only metrics a real
//! node serves (`tests/tests/deploy_files.rs`, `tests/tests/e2e_status.rs`).

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::localnet::repo_root;

/// `deploy/grafana/tally.json`.
pub fn dashboard_path() -> PathBuf {
    repo_root()
        .join("deploy")
        .join("grafana")
        .join("tally.json")
}

/// `deploy/prometheus/tally-rules.yml`.
pub fn rules_path() -> PathBuf {
    repo_root()
        .join("deploy")
        .join("prometheus")
        .join("tally-rules.yml")
}

/// Every word of `text` that starts with one of `prefixes` followed by
/// `_` and consists of `[a-z0-9_]`: the metric names a PromQL expression
/// (or a whole rules file) mentions.
pub fn referenced(text: &str, prefixes: &[&str]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let is_word = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    let mut rest = text;
    while let Some(i) = rest.find(|c: char| is_word(c)) {
        // Start of a word only if the previous char is not a word char.
        let before = rest[..i].chars().last();
        let tail = &rest[i..];
        let end = tail.find(|c: char| !is_word(c)).unwrap_or(tail.len());
        let word = &tail[..end];
        let boundary = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if boundary
            && prefixes
                .iter()
                .any(|p| word.len() > p.len() + 1 && word.starts_with(&format!("{p}_")))
        {
            out.insert(word.to_string());
        }
        rest = &tail[end.max(1)..];
    }
    out
}

/// The names a Prometheus text page serves: every series name (with its
/// `_bucket`, `_sum`, `_count` or `_total` suffix as written) and every
/// name in a `# TYPE` line (a family with no series yet).
pub fn served(page: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in page.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            if let Some(name) = t.split_whitespace().next() {
                out.insert(name.to_string());
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            out.insert(line[..end].to_string());
        }
    }
    out
}

/// The PromQL expressions of the dashboard's panels (and its templating
/// queries); fails if the JSON does not parse.
pub fn dashboard_exprs(json: &str) -> anyhow::Result<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(json)?;
    let mut out = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                        ("query", serde_json::Value::String(s)) if s.contains('(') => {
                            out.push(s.clone())
                        }
                        _ => walk(x, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    walk(&v, &mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_with_a_prefix_are_found_and_nothing_else() {
        let got = referenced(
            "rate(tally_a_total{x=\"y\"}[5m]) - on(node) cometbft_b > 1 and xtally_c; tallyd tally-rules tally_d",
            &["tally", "cometbft"],
        );
        let want: BTreeSet<String> = ["tally_a_total", "cometbft_b", "tally_d"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn served_names_come_from_series_and_type_lines() {
        let page = "# HELP tally_x help\n# TYPE tally_x gauge\n# TYPE tally_h histogram\ntally_h_bucket{le=\"1\"} 0\ntally_y 3\n";
        let got = served(page);
        for n in ["tally_x", "tally_h", "tally_h_bucket", "tally_y"] {
            assert!(got.contains(n), "{n} in {got:?}");
        }
        assert!(!got.contains("help"));
    }
}
