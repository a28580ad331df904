//! The operator's guide and the shipped systemd units cannot rot silently.
//!
//! `docs/running-a-validator.md` is read as an operator would copy it: every
//! `tallyd` command in its `sh` code blocks must name subcommands and flags
//! that the built `tallyd` lists in its own `--help` (the oracle is the
//! binary, not the clap definitions); every `app.toml` key it shows (in a
//! `toml` block whose first line names `app.toml`, or set with `sed` on
//! `app.toml`) must be one that `tallyd init` writes, with a value
//! `tallyd`'s config loader accepts; every CometBFT `config.toml` key must
//! be one that `cometbft init` writes, in the same section.
//!
//! The guide's table of every `tallyd` command (its section
//! [`COMMANDS_HEADING`]) must list exactly the commands the built `tallyd`
//! has: every leaf of the subcommand tree its `--help` pages print (the
//! oracle is again the binary), no more and no fewer.
//!
//! The units in `deploy/systemd/` go through `systemd-analyze verify` (a
//! copy whose `/usr/local/bin/` binaries point at stand-ins), any warning
//! about them failing the test; a deliberately broken copy must fail it, so
//! the check is seen to bite on this machine. Without `systemd-analyze`, and
//! for the CometBFT keys without `cometbft`, those tests are reported
//! SKIPPED (counted apart by scripts/test.sh).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, ensure, Context, Result};
use tally_tests::harness::{self, on_path, skip, Test};
use tally_tests::localnet::{repo_root, tallyd_path};

/// The guide's section with the table of every `tallyd` command.
const COMMANDS_HEADING: &str = "## Every `tallyd` command";

const DOC: &str = "docs/running-a-validator.md";
const UNITS: [&str; 2] = ["tallyd.service", "cometbft.service"];

const TESTS: [Test<Fixture>; 10] = [
    Test {
        name: "the_doc_parser_reads_shell_as_written",
        needs: &[],
        run: the_doc_parser_reads_shell_as_written,
    },
    Test {
        name: "tallyd_commands_in_the_doc_exist",
        needs: &[],
        run: tallyd_commands_in_the_doc_exist,
    },
    Test {
        name: "the_command_table_is_tallyds_command_tree",
        needs: &[],
        run: the_command_table_is_tallyds_command_tree,
    },
    Test {
        name: "a_table_row_short_or_extra_is_caught",
        needs: &[],
        run: a_table_row_short_or_extra_is_caught,
    },
    Test {
        name: "app_toml_keys_in_the_doc_exist",
        needs: &[],
        run: app_toml_keys_in_the_doc_exist,
    },
    Test {
        name: "cometbft_config_keys_in_the_doc_exist",
        needs: &[],
        run: cometbft_config_keys_in_the_doc_exist,
    },
    Test {
        name: "units_use_only_what_the_env_file_defines",
        needs: &[],
        run: units_use_only_what_the_env_file_defines,
    },
    Test {
        name: "tallyd_unit_does_not_restart_a_halt",
        needs: &[],
        run: tallyd_unit_does_not_restart_a_halt,
    },
    Test {
        name: "units_pass_systemd_analyze_verify",
        needs: &[],
        run: units_pass_systemd_analyze_verify,
    },
    Test {
        name: "a_broken_unit_fails_systemd_analyze_verify",
        needs: &[],
        run: a_broken_unit_fails_systemd_analyze_verify,
    },
];

fn main() -> ExitCode {
    harness::run_unless(&TESTS, None, Fixture::new)
}

/// The guide, the built `tallyd` and a scratch directory.
struct Fixture {
    root: PathBuf,
    doc: String,
    tallyd: PathBuf,
    tmp: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Result<Self> {
        let root = repo_root();
        let doc =
            std::fs::read_to_string(root.join(DOC)).with_context(|| format!("reading {DOC}"))?;
        Ok(Self {
            root,
            doc,
            tallyd: tallyd_path()?,
            tmp: tempfile::tempdir()?,
        })
    }

    fn unit(&self, name: &str) -> Result<String> {
        let p = self.root.join("deploy/systemd").join(name);
        std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
    }
}

// ---------------------------------------------------------------- markdown

/// A fenced code block: its info string (`sh`, `toml`, ...), its text and
/// the line it starts on.
struct Block {
    lang: String,
    text: String,
    line: usize,
}

fn code_blocks(md: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut cur: Option<Block> = None;
    for (i, line) in md.lines().enumerate() {
        let t = line.trim_start();
        if let Some(info) = t.strip_prefix("```") {
            match cur.take() {
                Some(b) => out.push(b),
                None => {
                    cur = Some(Block {
                        lang: info.trim().to_string(),
                        text: String::new(),
                        line: i + 2,
                    })
                }
            }
        } else if let Some(b) = cur.as_mut() {
            b.text.push_str(line);
            b.text.push('\n');
        }
    }
    out
}

fn shell_blocks(md: &str) -> Vec<Block> {
    code_blocks(md)
        .into_iter()
        .filter(|b| matches!(b.lang.as_str(), "sh" | "bash" | "shell" | "console"))
        .collect()
}

// ------------------------------------------------------------------- shell

/// A shell word or an operator (`|`, `&&`, `;`, `$(`, `)`, redirections).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Word(String),
    Op(String),
}

/// Splits a shell snippet into words and operators: quotes are removed
/// (their contents kept, `$VAR` left as written), `\`-newline joins lines,
/// `#` at the start of a word starts a comment.
fn tokenize(src: &str) -> Vec<Tok> {
    let src = src.replace("\\\n", " ");
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = src.chars().peekable();
    let flush = |word: &mut String, in_word: &mut bool, out: &mut Vec<Tok>| {
        if *in_word {
            out.push(Tok::Word(std::mem::take(word)));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for d in chars.by_ref() {
                    if d == '\'' {
                        break;
                    }
                    word.push(d);
                }
            }
            '"' => {
                in_word = true;
                while let Some(d) = chars.next() {
                    match d {
                        '"' => break,
                        '\\' => {
                            if let Some(e) = chars.next() {
                                word.push(e);
                            }
                        }
                        _ => word.push(d),
                    }
                }
            }
            '#' if !in_word => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        break;
                    }
                }
                out.push(Tok::Op("\n".into()));
            }
            '$' if chars.peek() == Some(&'(') => {
                flush(&mut word, &mut in_word, &mut out);
                chars.next();
                out.push(Tok::Op("$(".into()));
            }
            '|' | '&' | ';' | '(' | ')' | '<' | '>' | '\n' | '`' => {
                flush(&mut word, &mut in_word, &mut out);
                let mut op = c.to_string();
                if let Some(&d) = chars.peek() {
                    if (c == '|' || c == '&' || c == '>') && d == c {
                        op.push(d);
                        chars.next();
                    }
                }
                out.push(Tok::Op(op));
            }
            c if c.is_whitespace() => flush(&mut word, &mut in_word, &mut out),
            '\\' => {
                in_word = true;
                if let Some(d) = chars.next() {
                    word.push(d);
                }
            }
            _ => {
                in_word = true;
                word.push(c);
            }
        }
    }
    flush(&mut word, &mut in_word, &mut out);
    out
}

/// The simple commands of a snippet: the words between operators, with a
/// redirection's target dropped.
fn simple_commands(src: &str) -> Vec<Vec<String>> {
    let mut cmds = Vec::new();
    let mut cur: Vec<String> = Vec::new();
    let mut redirect = false;
    for t in tokenize(src) {
        match t {
            Tok::Word(w) => {
                if redirect {
                    redirect = false;
                } else {
                    cur.push(w);
                }
            }
            Tok::Op(op) => {
                if matches!(op.as_str(), ">" | ">>" | "<") {
                    redirect = true;
                    continue;
                }
                if !cur.is_empty() {
                    cmds.push(std::mem::take(&mut cur));
                }
            }
        }
    }
    if !cur.is_empty() {
        cmds.push(cur);
    }
    cmds
}

/// The program a simple command runs and its arguments, past variable
/// assignments and `sudo [-u USER] [-E]`, `env`, `exec`, `nohup`, `time`.
fn program(cmd: &[String]) -> Option<(&str, &[String])> {
    let mut i = 0;
    while i < cmd.len() {
        let w = cmd[i].as_str();
        let assignment = w.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        if assignment || matches!(w, "env" | "exec" | "nohup" | "time" | "-E" | "-H") {
            i += 1;
        } else if w == "sudo" {
            i += 1;
            while i < cmd.len() && cmd[i].starts_with('-') {
                i += if matches!(cmd[i].as_str(), "-u" | "-g") {
                    2
                } else {
                    1
                };
            }
        } else {
            return Some((w, &cmd[i + 1..]));
        }
    }
    None
}

/// The `tallyd` invocations of the guide, each with the line of its block.
fn tallyd_invocations(md: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    for b in shell_blocks(md) {
        for cmd in simple_commands(&b.text) {
            if let Some((prog, args)) = program(&cmd) {
                if prog == "tallyd" || prog.ends_with("/tallyd") {
                    out.push((b.line, args.to_vec()));
                }
            }
        }
    }
    out
}

// ------------------------------------------------------------- tallyd help

/// What `tallyd <path> -h` lists: subcommands and long/short flags.
#[derive(Debug, Default)]
struct Help {
    commands: BTreeSet<String>,
    flags: BTreeSet<String>,
}

fn help(tallyd: &Path, path: &[String]) -> Result<Help> {
    let out = Command::new(tallyd)
        .args(path)
        .arg("-h")
        .output()
        .context("running tallyd -h")?;
    ensure!(
        out.status.success(),
        "`tallyd {} -h` failed: {}",
        path.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut h = Help::default();
    let mut section = "";
    for line in text.lines() {
        if !line.starts_with(' ') {
            section = line.trim_end_matches(':');
            continue;
        }
        let t = line.trim_start();
        match section {
            "Commands" => {
                if let Some(name) = t.split_whitespace().next() {
                    h.commands.insert(name.to_string());
                }
            }
            "Options" | "Arguments" => {
                for word in t
                    .split([' ', ','])
                    .take_while(|w| w.starts_with('-') || w.is_empty())
                {
                    if !word.is_empty() {
                        h.flags.insert(word.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    Ok(h)
}

/// Checks one invocation against the binary's help.
fn check_invocation(tallyd: &Path, args: &[String]) -> Result<()> {
    // --home is global: drop it (and its value) wherever it is.
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--home" {
            it.next();
        } else if !a.starts_with("--home=") {
            rest.push(a.clone());
        }
    }
    let mut path: Vec<String> = Vec::new();
    let mut h = help(tallyd, &path)?;
    ensure!(h.flags.contains("--home"), "tallyd has no global --home");
    let mut i = 0;
    while !h.commands.is_empty() {
        let Some(word) = rest.get(i) else {
            bail!("`tallyd {}` needs a subcommand", path.join(" "))
        };
        if word.starts_with('-') {
            break; // e.g. `tallyd --version`
        }
        if !h.commands.contains(word) {
            bail!(
                "`tallyd {}`: no subcommand {word:?} (tallyd has: {})",
                path.join(" "),
                h.commands.iter().cloned().collect::<Vec<_>>().join(", ")
            );
        }
        path.push(word.clone());
        h = help(tallyd, &path)?;
        i += 1;
    }
    for a in &rest[i..] {
        let flag = a.split('=').next().unwrap_or(a);
        let is_flag = flag.starts_with("--") || (flag.len() == 2 && flag.starts_with('-'));
        if is_flag && !h.flags.contains(flag) {
            bail!(
                "`tallyd {}` has no flag {flag} (it has: {})",
                path.join(" "),
                h.flags.iter().cloned().collect::<Vec<_>>().join(" ")
            );
        }
    }
    Ok(())
}

fn tallyd_commands_in_the_doc_exist(f: &mut Fixture) -> Result<()> {
    let calls = tallyd_invocations(&f.doc);
    ensure!(
        calls.len() >= 5,
        "found only {} tallyd commands in {DOC}: is the parser still reading sh blocks?",
        calls.len()
    );
    let mut errors = Vec::new();
    for (line, args) in &calls {
        println!("{DOC} line {line}: tallyd {}", args.join(" "));
        if let Err(e) = check_invocation(&f.tallyd, args) {
            errors.push(format!("{DOC} block at line {line}: {e:#}"));
        }
    }
    println!("checked {} tallyd commands of {DOC}", calls.len());
    ensure!(errors.is_empty(), "{}", errors.join("\n"));
    Ok(())
}

// ------------------------------------------------------- the command table

/// Every leaf of `tallyd`'s subcommand tree, as `--help` prints it (clap's
/// own `help` pseudo-command aside), each as the words after `tallyd`.
fn command_tree(tallyd: &Path) -> Result<BTreeSet<Vec<String>>> {
    let mut leaves = BTreeSet::new();
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        let h = help(tallyd, &path)?;
        let subs: Vec<&String> = h.commands.iter().filter(|c| *c != "help").collect();
        if subs.is_empty() {
            leaves.insert(path);
            continue;
        }
        for c in subs {
            let mut p = path.clone();
            p.push(c.clone());
            todo.push(p);
        }
    }
    Ok(leaves)
}

/// The commands of the table under [`COMMANDS_HEADING`] in `md`: the first
/// cell of each row, `` `tallyd a b` ``, as `(line, ["a", "b"])`.
fn command_table(md: &str) -> Result<Vec<(usize, Vec<String>)>> {
    let mut lines = md.lines().enumerate();
    lines
        .find(|(_, l)| l.trim_end() == COMMANDS_HEADING)
        .with_context(|| format!("{DOC} has no section {COMMANDS_HEADING:?}"))?;
    let mut rows = Vec::new();
    for (i, l) in lines {
        if l.starts_with("## ") {
            break;
        }
        let Some(cell) = l.strip_prefix('|').and_then(|r| r.split('|').next()) else {
            continue;
        };
        let cell = cell.trim();
        let Some(cmd) = cell
            .strip_prefix("`tallyd ")
            .and_then(|c| c.strip_suffix('`'))
        else {
            continue; // the header and its rule
        };
        rows.push((i + 1, cmd.split_whitespace().map(String::from).collect()));
    }
    Ok(rows)
}

/// Both ways: every row is a command of `tree`, every command of `tree` is
/// a row (once).
fn compare_table(rows: &[(usize, Vec<String>)], tree: &BTreeSet<Vec<String>>) -> Vec<String> {
    let mut errors = Vec::new();
    let mut seen = BTreeSet::new();
    for (line, cmd) in rows {
        if !tree.contains(cmd) {
            errors.push(format!(
                "{DOC} line {line}: the table lists `tallyd {}`, which tallyd does not have",
                cmd.join(" ")
            ));
        }
        if !seen.insert(cmd.clone()) {
            errors.push(format!(
                "{DOC} line {line}: `tallyd {}` is listed twice",
                cmd.join(" ")
            ));
        }
    }
    for cmd in tree.difference(&seen) {
        errors.push(format!(
            "{DOC}: `tallyd {}` is missing from the table under {COMMANDS_HEADING:?}",
            cmd.join(" ")
        ));
    }
    errors
}

fn the_command_table_is_tallyds_command_tree(f: &mut Fixture) -> Result<()> {
    let tree = command_tree(&f.tallyd)?;
    ensure!(
        tree.len() >= 20,
        "tallyd --help shows only {} commands: is the help parser still reading it?",
        tree.len()
    );
    let rows = command_table(&f.doc)?;
    let errors = compare_table(&rows, &tree);
    println!(
        "{} commands in tallyd, {} rows in the table",
        tree.len(),
        rows.len()
    );
    ensure!(errors.is_empty(), "{}", errors.join("\n"));
    Ok(())
}

/// The comparison bites: the guide's table without one row, or with a
/// command tallyd lacks, fails against the real binary's tree.
fn a_table_row_short_or_extra_is_caught(f: &mut Fixture) -> Result<()> {
    let tree = command_tree(&f.tallyd)?;
    let rows = command_table(&f.doc)?;
    ensure!(rows.len() > 1, "the table has {} rows", rows.len());
    let short = &rows[1..];
    let errors = compare_table(short, &tree);
    ensure!(
        errors
            .iter()
            .any(|e| e.contains("is missing from the table")),
        "a missing row was not caught: {errors:?}"
    );
    let mut extra = rows.clone();
    extra.push((0, vec!["query".into(), "frobnicate".into()]));
    let errors = compare_table(&extra, &tree);
    ensure!(
        errors.iter().any(|e| e.contains("tallyd query frobnicate")),
        "an extra row was not caught: {errors:?}"
    );
    Ok(())
}

// -------------------------------------------------------------- toml keys

/// `(section, key)` pairs of a TOML text, `section` empty at the top.
fn toml_keys(text: &str) -> Result<BTreeMap<(String, String), toml::Value>> {
    let table: toml::Table = text.parse().context("not TOML")?;
    let mut out = BTreeMap::new();
    for (k, v) in table {
        match v {
            toml::Value::Table(t) => {
                for (k2, v2) in t {
                    out.insert((k.clone(), k2), v2);
                }
            }
            v => {
                out.insert((String::new(), k), v);
            }
        }
    }
    Ok(out)
}

/// A key the guide sets: the line of its block, section, key, value (when
/// it could be read as TOML).
type DocKey = (usize, String, String, Option<toml::Value>);

/// Where the guide sets keys of a file (`app.toml` or `config.toml`):
/// `toml` blocks whose first line names the file, and `sed` edits of it
/// (`s|^key = .*|key = value|`, in `/^\[section\]/,/^\[/` ranges).
fn doc_keys(md: &str, file: &str) -> Result<Vec<DocKey>> {
    let mut out = Vec::new();
    for b in code_blocks(md) {
        let first = b.text.lines().next().unwrap_or_default();
        if b.lang == "toml" && first.starts_with('#') && first.contains(file) {
            let keys = toml_keys(&b.text)
                .with_context(|| format!("{DOC}: the toml block at line {}", b.line))?;
            for ((s, k), v) in keys {
                out.push((b.line, s, k, Some(v)));
            }
        }
    }
    for b in shell_blocks(md) {
        for cmd in simple_commands(&b.text) {
            let Some(("sed", args)) = program(&cmd) else {
                continue;
            };
            if !args.iter().any(|a| a.ends_with(file)) {
                continue;
            }
            for a in args {
                for expr in a.split(';').filter(|e| e.contains("s|^")) {
                    let section = expr
                        .split_once("/^\\[")
                        .and_then(|(_, r)| r.split_once("\\]"))
                        .map(|(s, _)| s.to_string())
                        .unwrap_or_default();
                    let Some((_, r)) = expr.split_once("s|^") else {
                        continue;
                    };
                    let key = r.split([' ', '=']).next().unwrap_or_default().to_string();
                    // The replacement `key = value`, as TOML when it parses.
                    let value = r
                        .split('|')
                        .nth(1)
                        .and_then(|rep| toml_keys(rep).ok())
                        .and_then(|m| m.into_values().next());
                    out.push((b.line, section, key, value));
                }
            }
        }
    }
    Ok(out)
}

fn app_toml_keys_in_the_doc_exist(f: &mut Fixture) -> Result<()> {
    let home = f.tmp.path().join("init");
    let out = Command::new(&f.tallyd)
        .args(["init", "--home"])
        .arg(&home)
        .output()?;
    ensure!(
        out.status.success(),
        "tallyd init: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = std::fs::read_to_string(home.join("config/app.toml"))?;
    let known = toml_keys(&generated)?;
    let used = doc_keys(&f.doc, "app.toml")?;
    ensure!(
        !used.is_empty(),
        "{DOC} shows no app.toml key: is the parser still reading it?"
    );
    let mut errors = Vec::new();
    for (line, section, key, value) in &used {
        let name = if section.is_empty() {
            key.clone()
        } else {
            format!("{section}.{key}")
        };
        let id = (section.clone(), key.clone());
        if !known.contains_key(&id) {
            errors.push(format!(
                "{DOC} line {line}: `tallyd init` writes no app.toml key {name}"
            ));
            continue;
        }
        // The value must be one tallyd's config loader accepts: a file with
        // only this key (every other key has a default).
        if let Some(v) = value {
            let mut table = toml::Table::new();
            if section.is_empty() {
                table.insert(key.clone(), v.clone());
            } else {
                let mut inner = toml::Table::new();
                inner.insert(key.clone(), v.clone());
                table.insert(section.clone(), toml::Value::Table(inner));
            }
            let h = f.tmp.path().join(format!("value-{line}-{name}"));
            std::fs::create_dir_all(h.join("config"))?;
            std::fs::write(h.join("config/app.toml"), toml::to_string(&table)?)?;
            match tally_node::config::AppConfig::load(&h) {
                Ok(_) => {}
                // The binary (perhaps built from a newer tree in a shared
                // target dir) knows the key, this test's loader does not.
                Err(e) if e.to_string().contains("unknown field") => println!(
                    "NOTE: {DOC} line {line}: {name}: the tallyd binary knows it, the loader this test was built with does not: value not checked"
                ),
                Err(e) => errors.push(format!("{DOC} line {line}: {name} = {v}: tallyd refuses it: {e}")),
            }
        }
    }
    println!("checked {} app.toml keys of {DOC}", used.len());
    ensure!(errors.is_empty(), "{}", errors.join("\n"));
    Ok(())
}

fn cometbft_config_keys_in_the_doc_exist(f: &mut Fixture) -> Result<()> {
    if !on_path("cometbft") {
        return Err(skip(
            "cometbft not on PATH (localnet/install-cometbft.sh installs it)",
        ));
    }
    let home = f.tmp.path().join("cometbft");
    let out = Command::new("cometbft")
        .args(["init", "--home"])
        .arg(&home)
        .output()?;
    ensure!(
        out.status.success(),
        "cometbft init: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let known = toml_keys(&std::fs::read_to_string(home.join("config/config.toml"))?)?;
    let used = doc_keys(&f.doc, "config.toml")?;
    ensure!(
        !used.is_empty(),
        "{DOC} shows no config.toml key: is the parser still reading it?"
    );
    let mut errors = Vec::new();
    for (line, section, key, _) in &used {
        if !known.contains_key(&(section.clone(), key.clone())) {
            let wanted = if section.is_empty() {
                "at the top".into()
            } else {
                format!("in [{section}]")
            };
            let found: Vec<_> = known
                .keys()
                .filter(|(_, k)| k == key)
                .map(|(s, _)| {
                    if s.is_empty() {
                        "the top".to_string()
                    } else {
                        format!("[{s}]")
                    }
                })
                .collect();
            errors.push(format!(
                "{DOC} line {line}: CometBFT's config.toml has no {key} {wanted} (found in: {})",
                if found.is_empty() {
                    "nowhere".into()
                } else {
                    found.join(", ")
                }
            ));
        }
    }
    println!("checked {} config.toml keys of {DOC}", used.len());
    ensure!(errors.is_empty(), "{}", errors.join("\n"));
    Ok(())
}

// ------------------------------------------------------------------ units

/// `Key=value` lines of a unit or env file, in order.
fn directives(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with('#') && !l.starts_with(';') && !l.starts_with('[')
        })
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// `${NAME}` references in a text (`$${NAME}` is systemd's escape for the
/// shell, which then expands it from the same environment).
fn references(text: &str) -> BTreeSet<String> {
    text.split("${")
        .skip(1)
        .filter_map(|s| s.split_once('}'))
        .map(|(name, _)| name.to_string())
        .collect()
}

fn units_use_only_what_the_env_file_defines(f: &mut Fixture) -> Result<()> {
    let env: BTreeMap<String, String> = directives(&f.unit("tally.env")?).into_iter().collect();
    for name in UNITS {
        let unit = f.unit(name)?;
        let d = directives(&unit);
        let env_files: Vec<_> = d
            .iter()
            .filter(|(k, _)| k == "EnvironmentFile")
            .map(|(_, v)| v)
            .collect();
        ensure!(
            env_files == ["/etc/tally/tally.env"],
            "{name}: EnvironmentFile {env_files:?}"
        );
        ensure!(
            f.doc.contains("/etc/tally/tally.env"),
            "{DOC} never says where tally.env goes"
        );
        for var in references(&unit) {
            ensure!(
                env.contains_key(&var),
                "{name} uses ${{{var}}}, which tally.env does not define"
            );
        }
        // The hardening leaves the home writable: RocksDB, CometBFT's data
        // and address book, the light client's trust file live there.
        let home = env
            .get("TALLY_HOME")
            .context("tally.env has no TALLY_HOME")?;
        let writable: Vec<_> = d
            .iter()
            .filter(|(k, _)| k == "ReadWritePaths")
            .map(|(_, v)| v.as_str())
            .collect();
        ensure!(
            writable.iter().any(|w| w.split_whitespace().any(|p| home.starts_with(p.trim_start_matches('-')))),
            "{name}: ProtectSystem=strict but TALLY_HOME={home} is not in ReadWritePaths {writable:?}"
        );
        ensure!(
            d.iter().any(|(k, _)| k == "LimitNOFILE"),
            "{name}: no LimitNOFILE"
        );
    }
    // CometBFT starts after tallyd and stops before it.
    let c = directives(&f.unit("cometbft.service")?);
    let has = |key: &str, val: &str| {
        c.iter()
            .any(|(k, v)| k == key && v.split_whitespace().any(|w| w == val))
    };
    ensure!(
        has("After", "tallyd.service"),
        "cometbft.service is not ordered after tallyd.service"
    );
    ensure!(
        has("Requires", "tallyd.service") || has("BindsTo", "tallyd.service"),
        "cometbft.service does not require tallyd.service"
    );
    Ok(())
}

fn tallyd_unit_does_not_restart_a_halt(f: &mut Fixture) -> Result<()> {
    use tally_store::halt::HaltReason;
    let d = directives(&f.unit("tallyd.service")?);
    let codes: BTreeSet<i32> = d
        .iter()
        .filter(|(k, _)| k == "RestartPreventExitStatus")
        .flat_map(|(_, v)| {
            v.split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect::<Vec<_>>()
        })
        .collect();
    let halts: BTreeSet<i32> = HaltReason::ALL
        .into_iter()
        .map(HaltReason::exit_code)
        .collect();
    ensure!(
        codes == halts,
        "tallyd.service RestartPreventExitStatus {codes:?}, but tallyd halts with {halts:?}"
    );
    Ok(())
}

/// Copies the units into `dir`, their `/usr/local/bin/` programs pointed
/// at executable stand-ins in `dir/bin`, and applies `edit` to the text.
fn staged_units(
    dir: &Path,
    f: &Fixture,
    edit: impl Fn(&str, String) -> String,
) -> Result<Vec<PathBuf>> {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    for prog in ["tallyd", "cometbft"] {
        let p = bin.join(prog);
        std::fs::write(&p, "#!/bin/sh\nexit 0\n")?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
    }
    let prefix = format!("{}/", bin.display());
    let mut out = Vec::new();
    for name in UNITS {
        let text = f.unit(name)?.replace("/usr/local/bin/", &prefix);
        let p = dir.join(name);
        std::fs::write(&p, edit(name, text))?;
        out.push(p);
    }
    Ok(out)
}

/// `systemd-analyze verify` of `units`: its complaints about them (empty:
/// clean). Warnings count: systemd ignores a bad line and exits 0.
fn verify(units: &[PathBuf]) -> Result<Vec<String>> {
    if !on_path("systemd-analyze") {
        return Err(skip(
            "systemd-analyze not on PATH (Debian: apt-get install systemd)",
        ));
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(units)
        .output()
        .context("running systemd-analyze verify")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut complaints: Vec<String> = text
        .lines()
        .filter(|l| UNITS.iter().any(|u| l.contains(u)) || l.contains("ignoring"))
        .map(str::to_string)
        .collect();
    if !out.status.success() && complaints.is_empty() {
        complaints.push(format!("exit status {}: {text}", out.status));
    }
    Ok(complaints)
}

fn units_pass_systemd_analyze_verify(f: &mut Fixture) -> Result<()> {
    let dir = f.tmp.path().join("units-ok");
    let units = staged_units(&dir, f, |_, t| t)?;
    let complaints = verify(&units)?;
    ensure!(
        complaints.is_empty(),
        "systemd-analyze verify:\n{}",
        complaints.join("\n")
    );
    Ok(())
}

fn a_broken_unit_fails_systemd_analyze_verify(f: &mut Fixture) -> Result<()> {
    // Each a mistake systemd only warns about (exit 0) or refuses.
    let breakages: [(&str, &str, &str); 4] = [
        ("tallyd.service", "Restart=on-failure", "Restart=on-failur"),
        ("cometbft.service", "RestartSec=3", "RestartSec=3q"),
        ("cometbft.service", "ExecStart=", "ExecStrat="),
        ("tallyd.service", "[Service]", "[Servce]"),
    ];
    for (i, (unit, from, to)) in breakages.iter().enumerate() {
        let dir = f.tmp.path().join(format!("units-broken-{i}"));
        let units = staged_units(&dir, f, |name, t| {
            if name == *unit {
                t.replacen(from, to, 1)
            } else {
                t
            }
        })?;
        let text = std::fs::read_to_string(dir.join(unit))?;
        ensure!(text.contains(to), "{unit} has no {from:?} to break");
        let complaints = verify(&units)?;
        ensure!(
            !complaints.is_empty(),
            "{unit} with {from:?} changed to {to:?} passed systemd-analyze verify"
        );
    }
    Ok(())
}

/// The doc parser on snippets with known answers: commands in command
/// position only (not `systemctl status tallyd`), past `sudo -u` and
/// assignments, comments and quotes handled, `sed` edits found.
fn the_doc_parser_reads_shell_as_written(_: &mut Fixture) -> Result<()> {
    let src =
        "sudo -u tally TALLY_HOME=/h tallyd --home \"/a b\" init --force && echo ok # tallyd x\n\
               systemctl status tallyd | grep -q 'tallyd y'\n\
               H=$(tallyd query node --node http://n:1) > /dev/null\n";
    let t: Vec<(String, Vec<String>)> = simple_commands(src)
        .iter()
        .filter_map(|c| program(c))
        .map(|(p, a)| (p.to_string(), a.to_vec()))
        .collect();
    let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let want = vec![
        (
            "tallyd".to_string(),
            w(&["--home", "/a b", "init", "--force"]),
        ),
        ("echo".into(), w(&["ok"])),
        ("systemctl".into(), w(&["status", "tallyd"])),
        ("grep".into(), w(&["-q", "tallyd y"])),
        ("H=".into(), vec![]),
        (
            "tallyd".into(),
            w(&["query", "node", "--node", "http://n:1"]),
        ),
    ];
    // `H=$(` leaves the assignment as its own (empty) command word.
    let got: Vec<_> = t.iter().filter(|(p, _)| p != "H=").cloned().collect();
    let want: Vec<_> = want.into_iter().filter(|(p, _)| p != "H=").collect();
    ensure!(got == want, "{got:#?}");
    let md = "```sh\nsed -i -e '/^\\[statesync\\]/,/^\\[/ s|^enable = .*|enable = true|' \"$H/config/config.toml\"\n```\n\
              ```toml\n# <home>/config/app.toml\nmetrics_listen = \"127.0.0.1:1\"\n[relay]\npoll_interval_ms = 500\n```\n";
    let c = doc_keys(md, "config.toml")?;
    ensure!(
        c.len() == 1
            && c[0].1 == "statesync"
            && c[0].2 == "enable"
            && c[0].3 == Some(toml::Value::Boolean(true)),
        "{:?}",
        c.iter().map(|k| (&k.1, &k.2, &k.3)).collect::<Vec<_>>()
    );
    let a: Vec<_> = doc_keys(md, "app.toml")?
        .into_iter()
        .map(|k| (k.1, k.2))
        .collect();
    ensure!(
        a == [
            (String::new(), "metrics_listen".to_string()),
            ("relay".into(), "poll_interval_ms".into())
        ],
        "{a:?}"
    );
    Ok(())
}
