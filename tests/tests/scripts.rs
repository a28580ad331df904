//! Every shell script a user runs (`localnet/*.sh`, `scripts/*.sh`) parses
//! with `bash -n`. Some of them no test runs whole (`localnet/build.sh`
//! runs inside `up.sh`, which the e2e tests call with `--no-build`;
//! `localnet/status.sh`; `scripts/coverage.sh`): this at least catches a
//! script broken by an edit. It fails on a script with a syntax error (a
//! missing `fi` was tried).

use std::path::Path;
use std::process::Command;

#[test]
fn every_shell_script_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = Vec::new();
    for dir in ["localnet", "scripts"] {
        for e in std::fs::read_dir(root.join(dir)).expect("script folder") {
            let p = e.expect("entry").path();
            if p.extension().is_some_and(|x| x == "sh") {
                let out = Command::new("bash")
                    .arg("-n")
                    .arg(&p)
                    .output()
                    .expect("bash");
                assert!(
                    out.status.success(),
                    "{} does not parse: {}",
                    p.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
                checked.push(
                    p.file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .to_string(),
                );
            }
        }
    }
    for must in [
        "build.sh",
        "status.sh",
        "coverage.sh",
        "up.sh",
        "test.sh",
        "user-scripts.sh",
        "coverage-rustc.sh",
    ] {
        assert!(
            checked.iter().any(|c| c == must),
            "{must} not checked: {checked:?}"
        );
    }
}

/// `crate -> floor` rows of a table: lines of `text` between the line
/// holding `start` and the first line not matched by `row`.
fn floors(
    text: &str,
    start: &str,
    row: impl Fn(&str) -> Option<(String, u32)>,
) -> Vec<(String, u32)> {
    text.lines()
        .skip_while(|l| !l.contains(start))
        .skip(1)
        .map_while(row)
        .collect()
}

/// The coverage floors `scripts/coverage.sh --fail-under` enforces (the
/// table in its header, which the script itself reads) are the ones the
/// README's test section states, crate for crate, and they are the issue's
/// floors: settlement, abci and relay 85 %, node and client 70 %.
#[test]
fn coverage_floors_match_the_readme() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = std::fs::read_to_string(root.join("scripts/coverage.sh")).expect("coverage.sh");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let in_script = floors(&script, "#   crate        floor", |l| {
        let mut w = l.strip_prefix("#   ")?.split_whitespace();
        Some((w.next()?.to_string(), w.next()?.parse().ok()?))
    });
    // | crate | floor | measured |
    let in_readme = floors(&readme, "| crate | floor |", |l| {
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        if cells.len() < 3 || cells[1].starts_with("---") {
            return if l.trim_start().starts_with('|') {
                Some((String::new(), 0))
            } else {
                None
            };
        }
        Some((
            cells[1].trim_matches('`').to_string(),
            cells[2].trim_end_matches(" %").parse().ok()?,
        ))
    })
    .into_iter()
    .filter(|(c, _)| !c.is_empty())
    .collect::<Vec<_>>();
    let want: Vec<(String, u32)> = [
        ("settlement", 85),
        ("abci", 85),
        ("relay", 85),
        ("node", 70),
        ("client", 70),
    ]
    .iter()
    .map(|(c, f)| (c.to_string(), *f))
    .collect();
    assert_eq!(in_script, want, "scripts/coverage.sh's floor table");
    assert_eq!(in_readme, want, "README's coverage table");
}
