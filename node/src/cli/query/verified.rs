//! Queries answered from single state keys read with `/key`, verified by
//! the light client with `--verify`: where the trust root comes from, when
//! it advances, and how a [`Read`] is printed. The reading and answering
//! are [`tally_light::verified`]'s: a verified answer looks like the
//! unverified one, plus `"height"` and `"verified": true`.

use std::io::Write;

use anyhow::Context as _;
use serde_json::Value;
use tally_light::client::now;
use tally_light::verified::stamped;
use tally_light::verified::Read;
use tally_light::{trust, LightClient, Options, RpcSource, TrustRoot};

use super::{render, Shape};
use crate::cli::args::{Output, QueryOpts, VerifyArgs};
use crate::cli::Context;
use crate::rpc::Rpc;

/// The trust root `--verify` uses: the flags, else the trust file in the
/// home directory. The second value is the file, when that is where it came
/// from.
fn trust_root(
    ctx: &Context,
    v: &VerifyArgs,
) -> anyhow::Result<(TrustRoot, Option<std::path::PathBuf>)> {
    match (v.trust_height, &v.trust_hash) {
        (Some(h), Some(hash)) => Ok((
            TrustRoot::new(None, h, hash).map_err(anyhow::Error::msg)?,
            None,
        )),
        _ => {
            let path = trust::path_in(ctx.home());
            Ok((TrustRoot::load(&path)?, Some(path)))
        }
    }
}

/// Reads `keys` from the first node of `opts` at one height; with
/// `--verify`, verified (or an error: nothing unverified comes back).
pub fn read(
    ctx: &Context,
    opts: &QueryOpts,
    v: &VerifyArgs,
    keys: &[Vec<u8>],
) -> anyhow::Result<Read> {
    let rpc = Rpc::new(&opts.node.primary()).client().clone();
    if !v.verify {
        return Ok(Read::unverified(&rpc, keys)?);
    }
    let (root, file) = trust_root(ctx, v)?;
    let options = Options {
        trusting_period: v.trusting_period,
        ..Options::default()
    };
    let client = LightClient::new(RpcSource::new(rpc), root.clone(), options, now()?);
    let (read, header) = Read::verified(&client, keys, v.header_wait).context("--verify")?;
    // The verified header becomes the stored trust root: as trustworthy as
    // the old one, and newer (it keeps the root inside the trusting period
    // and makes the next verification shorter).
    if let Some(path) = file {
        if header.height > root.height {
            if let Err(e) = header.as_root().save(&path) {
                eprintln!("warning: could not advance the trust root: {e}");
            }
        }
    }
    Ok(read)
}

/// Prints `v` as `shape` (JSON: stamped with height and verified; table:
/// followed by a line saying what was verified).
pub fn print(opts: &QueryOpts, shape: Shape, v: Value, read: &Read) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match opts.format() {
        Output::Json => writeln!(out, "{}", stamped(v, read))?,
        Output::Table => {
            render(&mut out, shape, v)?;
            if read.verified {
                writeln!(
                    out,
                    "verified: state at height {} (proof checked against the app hash of header {}, verified from the trust root)",
                    read.height,
                    read.height + 1
                )?;
            } else {
                writeln!(
                    out,
                    "not verified: state at height {} as the node says (use --verify)",
                    read.height
                )?;
            }
        }
    }
    Ok(())
}
