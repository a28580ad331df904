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
    for must in ["build.sh", "status.sh", "coverage.sh", "up.sh", "test.sh"] {
        assert!(
            checked.iter().any(|c| c == must),
            "{must} not checked: {checked:?}"
        );
    }
}
