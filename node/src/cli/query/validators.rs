//! `tallyd query validators|proposals|rotations|dkg`: the validator set,
//! the validator-set proposals, the key rotations and the threshold key
//! with its ceremonies (`/validators`, `/proposals`, `/rotations`, `/dkg`),
//! and their tables.

use std::io::{self, Write};

use clap::Args;
use serde_json::Value;
use tally_settlement::query_path;

use super::{show, Shape};
use crate::cli::args::QueryOpts;
use crate::cli::{Command, Context};

/// `query validators`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct ValidatorsCommand {
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for ValidatorsCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        show(&self.opts, &query_path::validators(), Shape::Validators)
    }
}

/// `query proposals [--from ID]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct ProposalsCommand {
    /// First proposal id (100 are shown at most).
    #[arg(long)]
    pub from: Option<u64>,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for ProposalsCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        show(
            &self.opts,
            &query_path::proposals(self.from),
            Shape::Proposals,
        )
    }
}

/// `query rotations [--from NONCE]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct RotationsCommand {
    /// First rotation nonce (100 are shown at most).
    #[arg(long)]
    pub from: Option<u64>,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for RotationsCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        show(
            &self.opts,
            &query_path::rotations(self.from),
            Shape::Rotations,
        )
    }
}

/// `query dkg`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct DkgCommand {
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl Command for DkgCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        show(&self.opts, &query_path::dkg(), Shape::Dkg)
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// `/validators` as a table.
pub fn validators(out: &mut impl Write, v: &Value) -> io::Result<()> {
    writeln!(
        out,
        "{:<40} {:>8} {:>5} PUBKEY",
        "ADDRESS", "POWER", "SHARE"
    )?;
    let rows = v["validators"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    for r in rows {
        writeln!(
            out,
            "{:<40} {:>8} {:>5} {}",
            s(&r["address"]),
            s(&r["power"]),
            s(&r["share_index"]),
            s(&r["pubkey"]),
        )?;
    }
    if rows.is_empty() {
        writeln!(out, "(no validators)")?;
    }
    writeln!(out, "total power: {}", s(&v["total_power"]))
}

/// `/proposals` as a table.
pub fn proposals(out: &mut impl Write, v: &Value) -> io::Result<()> {
    writeln!(
        out,
        "{:>6} {:<7} {:<9} {:<40} {:>8} {:>8} {:>9} {:>8} REASON",
        "ID", "ACTION", "STATUS", "VALIDATOR", "POWER", "HEIGHT", "APPROVALS", "APPROVED"
    )?;
    let rows = v["proposals"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    for p in rows {
        writeln!(
            out,
            "{:>6} {:<7} {:<9} {:<40} {:>8} {:>8} {:>9} {:>8} {}",
            s(&p["id"]),
            s(&p["action"]),
            s(&p["status"]),
            s(&p["address"]),
            s(&p["power"]),
            s(&p["height"]),
            p["approvals"].as_array().map(Vec::len).unwrap_or(0),
            format!("{}/{}", s(&p["approving_power"]), s(&p["total_power"])),
            p["reason"].as_str().unwrap_or(""),
        )?;
    }
    if rows.is_empty() {
        writeln!(out, "(no proposals)")?;
    }
    if let Some(n) = v["next_from"].as_u64() {
        writeln!(out, "more: --from {n}")?;
    }
    Ok(())
}

/// `/rotations` as a table: nonce, epochs, the new group key, heights.
pub fn rotations(out: &mut impl Write, v: &Value) -> io::Result<()> {
    writeln!(
        out,
        "{:>6} {:>6} {:>6} {:>8} {:>8} {:>8} GROUP KEY",
        "NONCE", "FROM", "EPOCH", "MADE", "SIGNED", "ACTIVE"
    )?;
    let rows = v["rotations"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    for r in rows {
        writeln!(
            out,
            "{:>6} {:>6} {:>6} {:>8} {:>8} {:>8} {}",
            s(&r["nonce"]),
            s(&r["from_epoch"]),
            s(&r["epoch"]),
            s(&r["made_height"]),
            s(&r["signed_height"]),
            s(&r["active_height"]),
            s(&r["group_key"]),
        )?;
    }
    if rows.is_empty() {
        writeln!(out, "(no rotations: the key never changed)")?;
    }
    if let Some(n) = v["next_from"].as_u64() {
        writeln!(out, "more: --from {n}")?;
    }
    Ok(())
}

/// `/dkg` as `key: value` lines, the ceremony on its own lines.
pub fn dkg(out: &mut impl Write, v: &Value) -> io::Result<()> {
    if v["group_key"].is_null() {
        writeln!(out, "key: none yet")?;
    } else {
        writeln!(out, "epoch: {}", s(&v["epoch"]))?;
        writeln!(
            out,
            "threshold: {} of {}",
            s(&v["threshold"]),
            s(&v["validators"])
        )?;
        writeln!(out, "group_key: {}", s(&v["group_key"]))?;
        let signers: Vec<String> = v["signers"]
            .as_array()
            .map(|a| a.iter().map(s).collect())
            .unwrap_or_default();
        writeln!(out, "signers: {}", signers.join(", "))?;
    }
    writeln!(out, "height: {}", s(&v["height"]))?;
    let c = &v["ceremony"];
    if c.is_null() {
        writeln!(out, "ceremony: none running")?;
    } else {
        writeln!(
            out,
            "ceremony: round {} ({}, epoch {}, attempt {}), phase {}: dealings until {}, acks until {}, ends at {}",
            s(&c["round"]),
            s(&c["kind"]),
            s(&c["epoch"]),
            s(&c["attempt"]),
            s(&c["phase"]),
            s(&c["deal_end"]),
            s(&c["ack_end"]),
            s(&c["end"])
        )?;
        writeln!(
            out,
            "  dealers {}, players {}, threshold {}; dealings {}, acks {}, reveals {}",
            s(&c["dealers"]),
            s(&c["players"]),
            s(&c["threshold"]),
            s(&c["dealings"]),
            s(&c["acks"]),
            s(&c["reveals"])
        )?;
    }
    let n = &v["next_key"];
    if !n.is_null() {
        writeln!(
            out,
            "next_key: epoch {} activates at height {} (proposal {})",
            s(&n["epoch"]),
            s(&n["activate_height"]),
            s(&n["proposal"])
        )?;
    }
    let l = &v["last_ceremony"];
    if !l.is_null() {
        writeln!(
            out,
            "last_ceremony: round {} ({}, epoch {}), qualified dealers {}",
            s(&l["round"]),
            s(&l["kind"]),
            s(&l["epoch"]),
            s(&l["qualified"])
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::Output;
    use crate::cli::query::tests::query;
    use crate::cli::query::QueryCommand;
    use serde_json::json;

    fn text(f: impl FnOnce(&mut Vec<u8>) -> io::Result<()>) -> String {
        let mut out = Vec::new();
        f(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn parses() {
        let QueryCommand::Proposals(c) =
            query(&["query", "proposals", "--from", "4", "--json"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(c.from, Some(4));
        assert_eq!(c.opts.format(), Output::Json);
        let QueryCommand::Validators(c) =
            query(&["query", "validators", "--node", "http://n:2"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(c.opts.node.primary(), "http://n:2");
        assert_eq!(c.opts.format(), Output::Table);
        assert!(query(&["query", "proposals", "--from", "x"]).is_err());
        let QueryCommand::Rotations(c) = query(&["query", "rotations", "--from", "2"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(c.from, Some(2));
        assert!(query(&["query", "dkg", "--json", "--output", "table"]).is_ok());
    }

    #[test]
    fn tables_show_what_the_answers_hold() {
        let v = json!({"validators": [
            {"address": "aa", "pubkey": "bb", "power": 10, "share_index": null},
            {"address": "cc", "pubkey": "dd", "power": 20, "share_index": 2}],
            "total_power": 30});
        let t = text(|o| validators(o, &v));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(
            lines[1].starts_with("aa ") && lines[1].contains(" 10     - bb"),
            "{t}"
        );
        assert!(lines[2].contains(" 20     2 dd"), "{t}");
        assert_eq!(lines[3], "total power: 30");
        let v = json!({"proposals": [{"id": 3, "action": "add", "status": "accepted",
            "address": "ab", "power": 5, "height": 9, "approvals": ["x", "y"],
            "approving_power": 21, "total_power": 30, "reason": ""}], "next_from": 4});
        let t = text(|o| proposals(o, &v));
        assert!(t.contains("     3 add     accepted  ab"), "{t}");
        assert!(t.contains("        2    21/30"), "{t}");
        assert!(t.ends_with("more: --from 4\n"), "{t}");
        let v = json!({"epoch": null, "group_key": null, "height": 7, "ceremony": {
            "round": 1, "kind": "fresh", "epoch": 1, "attempt": 0, "phase": "acks",
            "deal_end": 5, "ack_end": 9, "end": 13, "dealers": 4, "players": 4,
            "threshold": 3, "dealings": 4, "acks": 10, "reveals": 0},
            "next_key": null, "last_ceremony": null});
        assert_eq!(
            text(|o| dkg(o, &v)),
            "key: none yet\nheight: 7\n\
             ceremony: round 1 (fresh, epoch 1, attempt 0), phase acks: dealings until 5, acks until 9, ends at 13\n  \
             dealers 4, players 4, threshold 3; dealings 4, acks 10, reveals 0\n"
        );
    }

    #[test]
    fn the_rotations_table_lists_each_rotation() {
        let v = json!({"rotations": [
            {"nonce": 1, "hub": "hub", "epoch": 2, "from_epoch": 1, "group_key": "ab",
             "signature": "cd", "made_height": 40, "signed_height": 43, "active_height": 45},
            {"nonce": 2, "hub": "hub", "epoch": 3, "from_epoch": 2, "group_key": "ef",
             "signature": null, "made_height": 90, "signed_height": 0, "active_height": 0}],
            "next_from": null});
        let t = text(|o| rotations(o, &v));
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[1].ends_with("40       43       45 ab"), "{t}");
        assert!(
            lines[2].contains("     2      3       90        0        0 ef"),
            "{t}"
        );
        let empty = text(|o| rotations(o, &json!({"rotations": [], "next_from": null})));
        assert!(empty.contains("no rotations"), "{empty}");
    }
}
