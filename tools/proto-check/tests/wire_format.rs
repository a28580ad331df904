//! The hand-derived protobuf types in `settlement/src/proto.rs` match
//! `proto/tally/v1/*.proto` (compiled with protox, generated with
//! prost-build), and the comparison sees the mistakes it is there to catch.

use std::path::{Path, PathBuf};

use tally_proto_check::{compare, describe, generate, proto_files, report, Mismatch, Schema};

/// The protobuf package and the hand-derived Rust file that implements it.
const PACKAGE: &str = "tally.v1";
const PROTO_DIR: &str = "proto/tally/v1";
const RUST_FILE: &str = "settlement/src/proto.rs";
/// Its submodules (validator messages, user messages), read after it as
/// one source (they hold message items only).
const RUST_PARTS: [&str; 2] = [
    "settlement/src/proto/validators.rs",
    "settlement/src/proto/users.rs",
];

/// The checkout under test: cargo sets `CARGO_MANIFEST_DIR` when it runs
/// the test, so a binary built from another clone that shares the target
/// directory (and was not rebuilt, its sources being the same) still reads
/// this clone's files; the compile-time path is the fallback.
fn repo_root() -> PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf());
    dir.join("../..")
}

/// The schema prost-build generates from the `.proto` files.
fn expected() -> Schema {
    let root = repo_root();
    let files = proto_files(&root.join(PROTO_DIR)).expect("listing the .proto files");
    assert!(!files.is_empty(), "no .proto files in {PROTO_DIR}");
    let generated = generate(&files, &root.join("proto"), PACKAGE).expect("generating Rust");
    describe("generated from the .proto", &generated).expect("reading the generated Rust")
}

fn hand_source() -> String {
    let read = |f: &str| {
        let p = repo_root().join(f);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let mut all = read(RUST_FILE);
    for part in RUST_PARTS {
        all.push('\n');
        all.push_str(&read(part));
    }
    all
}

fn found(source: &str) -> Schema {
    describe(RUST_FILE, source).expect("reading the hand-derived Rust")
}

#[test]
fn hand_derived_types_match_the_proto() {
    let expected = expected();
    let mismatches = compare(&expected, &found(&hand_source()));
    assert!(
        mismatches.is_empty(),
        "{}",
        report(&format!("{PROTO_DIR}/*.proto"), RUST_FILE, &mismatches)
    );
}

#[test]
fn the_proto_side_is_not_empty() {
    // Guards the test above against passing because nothing was read.
    let e = expected();
    for m in [
        "Tx",
        "SignedReport",
        "ReportUsage",
        "UsageRecord",
        "RouteCalls",
        "PartialSig",
        "SignedAllowance",
        "AllowanceChange",
        "SignedValidatorMsg",
        "ValidatorMsg",
        "Dealing",
        "DkgAck",
        "Ceremony",
        "Proposal",
    ] {
        assert!(e.messages.contains_key(m), "{m} not generated: {e:?}");
    }
    assert_eq!(e.oneofs["tx::Sum"].len(), 6, "{e:?}");
    assert_eq!(e.oneofs["user_msg::Sum"].len(), 2, "{e:?}");
    assert_eq!(e.oneofs["validator_msg::Sum"].len(), 6, "{e:?}");
    assert_eq!(e.enums["Outcome"]["Unknown"], 7, "{e:?}");
    assert_eq!(
        e.messages["ReportUsage"]["records"],
        "message, repeated, tag = \"4\" -> UsageRecord"
    );
    assert_eq!(
        e.messages["ReportUsage"]["route_calls"],
        "message, repeated, tag = \"5\" -> RouteCalls"
    );
}

/// `source` with `from` replaced by `to` in the nearest `#[prost(...)]`
/// attribute above the first line containing `anchor`, or (when `in_line`)
/// in that line itself.
fn mutate(source: &str, anchor: &str, from: &str, to: &str, in_line: bool) -> String {
    let mut lines: Vec<String> = source.lines().map(str::to_string).collect();
    let at = lines
        .iter()
        .position(|l| l.contains(anchor))
        .unwrap_or_else(|| panic!("{anchor:?} not in {RUST_FILE}"));
    let target = if in_line {
        at
    } else {
        (0..at)
            .rev()
            .find(|&i| lines[i].contains("#[prost("))
            .unwrap_or_else(|| panic!("no #[prost(...)] above {anchor:?}"))
    };
    assert!(
        lines[target].contains(from),
        "{from:?} not in {:?}",
        lines[target]
    );
    lines[target] = lines[target].replacen(from, to, 1);
    lines.join("\n")
}

fn mismatches_after(anchor: &str, from: &str, to: &str, in_line: bool) -> Vec<Mismatch> {
    let src = mutate(&hand_source(), anchor, from, to, in_line);
    compare(&expected(), &found(&src))
}

#[test]
fn a_changed_field_tag_is_reported() {
    let m = mismatches_after(
        "pub report_id: Vec<u8>",
        "tag = \"2\"",
        "tag = \"13\"",
        false,
    );
    assert_eq!(
        m,
        vec![Mismatch {
            item: "message ReportUsage".into(),
            member: Some("report_id".into()),
            expected: Some("bytes = \"vec\", tag = \"2\"".into()),
            found: Some("bytes = \"vec\", tag = \"13\"".into()),
        }],
        "{}",
        report("proto", "mutated", &m)
    );
    // The report names the message, the field and both sides.
    let text = report("proto", "mutated", &m);
    assert!(
        text.contains(
            "message ReportUsage / report_id: expected `bytes = \"vec\", tag = \"2\"`, found `bytes = \"vec\", tag = \"13\"`"
        ),
        "{text}"
    );
}

#[test]
fn a_changed_field_type_is_reported() {
    let m = mismatches_after("pub units: u64", "uint64", "uint32", false);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(m[0].member.as_deref(), Some("units"));
}

#[test]
fn a_field_holding_another_message_is_reported() {
    let m = mismatches_after(
        "pub hub_result: Option<HubResult>,",
        "Option<HubResult>",
        "Option<HubBlock>",
        true,
    );
    // The first such line is PendingMessage's.
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(m[0].item, "message PendingMessage");
    assert_eq!(
        m[0].found.as_deref(),
        Some("message, optional, tag = \"3\" -> HubBlock")
    );
}

#[test]
fn a_changed_oneof_tag_is_reported() {
    let m = mismatches_after(
        "Partials(super::SubmitPartials)",
        "tag = \"3\"",
        "tag = \"4\"",
        false,
    );
    assert_eq!(
        m,
        vec![Mismatch {
            item: "oneof tx::Sum".into(),
            member: Some("Partials".into()),
            expected: Some("message, tag = \"3\" -> SubmitPartials".into()),
            found: Some("message, tag = \"4\" -> SubmitPartials".into()),
        }]
    );
}

#[test]
fn a_changed_enum_value_is_reported() {
    let m = mismatches_after("Unknown = 7,", "7", "8", true);
    assert_eq!(
        m,
        vec![Mismatch {
            item: "enum Outcome".into(),
            member: Some("Unknown".into()),
            expected: Some("7".into()),
            found: Some("8".into()),
        }]
    );
}

#[test]
fn a_message_on_one_side_only_is_reported() {
    let mut f = found(&hand_source());
    f.messages.remove("HubDeposit");
    f.messages.insert("RustOnly".into(), Default::default());
    let m = compare(&expected(), &f);
    assert_eq!(
        m,
        vec![
            Mismatch {
                item: "message HubDeposit".into(),
                member: None,
                expected: Some("defined".into()),
                found: None,
            },
            Mismatch {
                item: "message RustOnly".into(),
                member: None,
                expected: None,
                found: Some("defined".into()),
            },
        ]
    );
    assert!(report("proto", "rust", &m)
        .contains("message HubDeposit: expected `defined`, found (missing)"));
}

#[test]
fn a_missing_field_is_reported() {
    let mut f = found(&hand_source());
    f.messages
        .get_mut("HubBlock")
        .expect("HubBlock")
        .remove("more");
    let m = compare(&expected(), &f);
    assert_eq!(m.len(), 1, "{m:?}");
    assert_eq!(m[0].member.as_deref(), Some("more"));
    assert_eq!(m[0].found, None);
}
