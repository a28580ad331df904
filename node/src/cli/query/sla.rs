//! `tallyd query sla route|provider|user|totals`: SLA route records and a
//! party's window totals. `route --window W` and `totals` answer from
//! single state keys and take `--verify` ([`super::verified`]).

use anyhow::{anyhow, bail, Context as _};
use clap::{ArgGroup, Args, Subcommand};
use serde_json::json;
use tally_settlement::query_path::{self, QueryPath};
use tally_settlement::time::rfc3339;
use tally_settlement::{ident, keys, PartyWindow, RouteId};
use tally_store::KvRead;

use super::{show, verified, Shape};
use crate::cli::args::{PageArgs, QueryOpts, VerifyArgs};
use crate::cli::{Command, Context};

/// SLA route records.
#[derive(Subcommand, Debug, PartialEq, Eq)]
pub enum SlaCommand {
    /// One route's records (all windows, or one).
    Route(RouteCommand),
    /// A provider's records.
    Provider(ProviderCommand),
    /// A user's records.
    User(UserCommand),
    /// A provider's or a user's totals in one window.
    Totals(TotalsCommand),
}

impl Command for SlaCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        match self {
            Self::Route(c) => c.execute(ctx),
            Self::Provider(c) => c.execute(ctx),
            Self::User(c) => c.execute(ctx),
            Self::Totals(c) => c.execute(ctx),
        }
    }
}

/// `sla route --user U --provider P --model M --route R [--window W]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct RouteCommand {
    /// Who is charged.
    #[arg(long)]
    pub user: String,
    /// Who served.
    #[arg(long)]
    pub provider: String,
    /// Model.
    #[arg(long)]
    pub model: String,
    /// Route.
    #[arg(long)]
    pub route: String,
    /// One window's record instead of a page over all windows.
    #[arg(long)]
    pub window: Option<u64>,
    /// Paging (over all windows only).
    #[command(flatten)]
    pub page: PageArgs,
    /// Light-client verification (with --window only).
    #[command(flatten)]
    pub verify: VerifyArgs,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl RouteCommand {
    /// The query path and the answer's shape.
    pub fn path(&self) -> (QueryPath, Shape) {
        let (u, p, m, r) = (&self.user, &self.provider, &self.model, &self.route);
        match self.window {
            Some(w) => (query_path::sla_route_window(u, p, m, r, w), Shape::Record),
            None => (
                query_path::sla_route(u, p, m, r)
                    .page(self.page.limit, self.page.cursor.as_deref()),
                Shape::Records,
            ),
        }
    }
}

impl Command for RouteCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let (path, shape) = self.path();
        if !self.verify.verify {
            return show(&self.opts, &path, shape);
        }
        let Some(window) = self.window else {
            bail!(
                "--verify needs --window: one record is provable, a page over all windows is not"
            );
        };
        if self.page != PageArgs::default() {
            bail!("--verify reads one record: --limit and --cursor do not apply");
        }
        let id = RouteId {
            user: self.user.clone(),
            provider: self.provider.clone(),
            model: self.model.clone(),
            route: self.route.clone(),
        };
        // The record, the parameters (its window's start and end) and the
        // first window whose records are kept (a pruned window answers 28
        // from /key itself).
        let keys = [
            keys::route(&id, window),
            keys::PARAMS.to_vec(),
            keys::SLA_KEPT_FROM.to_vec(),
        ];
        let read = verified::read(ctx, &self.opts, &self.verify, &keys)?;
        let v = tally_light::verified::answer(&read, &path.to_string())?;
        verified::print(&self.opts, shape, v, &read)
    }
}

/// `sla provider --provider P [--window W]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct ProviderCommand {
    /// Who served.
    #[arg(long)]
    pub provider: String,
    /// Only this window.
    #[arg(long)]
    pub window: Option<u64>,
    /// Paging.
    #[command(flatten)]
    pub page: PageArgs,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl ProviderCommand {
    /// The query path.
    pub fn path(&self) -> QueryPath {
        query_path::sla_provider(&self.provider, self.window)
            .page(self.page.limit, self.page.cursor.as_deref())
    }
}

impl Command for ProviderCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        show(&self.opts, &self.path(), Shape::Records)?;
        if self.opts.format() == crate::cli::args::Output::Table {
            // The provider's reputation under its objectives (ADR 0021).
            let rpc = crate::rpc::Rpc::new(&self.opts.node.primary());
            let path = query_path::slo_reputation(&self.provider).to_string();
            let r = super::query_json(&rpc, &path)?;
            println!("{}", reputation_line(&r));
        }
        Ok(())
    }
}

/// `reputation: ...` for the answer of `/slo/reputation/{provider}`.
pub fn reputation_line(r: &serde_json::Value) -> String {
    match r["judged"].as_u64() {
        Some(0) | None => "reputation: not judged yet (no objectives, or no window judged)".into(),
        Some(n) => format!(
            "reputation: {} ppm ({n} windows judged, {} breached, last window {})",
            r["score_ppm"], r["breached"], r["last_window"]
        ),
    }
}

/// `sla user --user U [--window W]`.
#[derive(Args, Debug, PartialEq, Eq)]
pub struct UserCommand {
    /// Who is charged.
    #[arg(long)]
    pub user: String,
    /// Only this window.
    #[arg(long)]
    pub window: Option<u64>,
    /// Paging.
    #[command(flatten)]
    pub page: PageArgs,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl UserCommand {
    /// The query path.
    pub fn path(&self) -> QueryPath {
        query_path::sla_user(&self.user, self.window)
            .page(self.page.limit, self.page.cursor.as_deref())
    }
}

impl Command for UserCommand {
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        show(&self.opts, &self.path(), Shape::Records)
    }
}

/// `sla totals (--provider P | --user U) --window W`.
#[derive(Args, Debug, PartialEq, Eq)]
#[command(group(ArgGroup::new("party").required(true).args(["provider", "user"])))]
pub struct TotalsCommand {
    /// The provider whose totals to show.
    #[arg(long)]
    pub provider: Option<String>,
    /// The user whose totals to show.
    #[arg(long)]
    pub user: Option<String>,
    /// The window.
    #[arg(long)]
    pub window: u64,
    /// Light-client verification.
    #[command(flatten)]
    pub verify: VerifyArgs,
    /// Node and output format.
    #[command(flatten)]
    pub opts: QueryOpts,
}

impl TotalsCommand {
    /// `("provider" | "user", name, state key)`.
    pub fn key(&self) -> anyhow::Result<(&'static str, &str, Vec<u8>)> {
        let (kind, party, key) = match (&self.provider, &self.user) {
            (Some(p), None) => ("provider", p, keys::provider_window(p, self.window)),
            (None, Some(u)) => ("user", u, keys::user_window(u, self.window)),
            _ => bail!("give one of --provider and --user"),
        };
        ident::check_party(kind, party).map_err(|e| anyhow!(e.log))?;
        Ok((kind, party, key))
    }
}

impl Command for TotalsCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        let (kind, party, key) = self.key()?;
        let keys = [key.clone(), keys::PARAMS.to_vec()];
        let read = verified::read(ctx, &self.opts, &self.verify, &keys)?;
        // No record of the party in the window: no totals key, all zero.
        let t = match read.kv.get(&key)? {
            None => PartyWindow::default(),
            Some(b) => PartyWindow::decode(&b)
                .with_context(|| format!("{kind} totals of {} bytes, not 88", b.len()))?,
        };
        let secs = tally_settlement::params(&read.kv)
            .map_err(|e| anyhow!("parameters: {e}"))?
            .settlement_window_secs;
        let start = self.window.saturating_mul(secs);
        let c = &t.totals;
        let v = json!({
            kind: party,
            "window": self.window,
            "window_start": rfc3339(start),
            "window_end": rfc3339(start.saturating_add(secs)),
            "routes": t.routes,
            "requests": c.requests,
            "ok": c.ok,
            "fail_count": c.fail_count(),
            "rate_limit": c.rate_limit,
            "auth": c.auth,
            "transient": c.transient,
            "unknown": c.unknown,
            "client": c.client,
            "cancel": c.cancel,
            "units": c.units,
            "amount": c.amount,
        });
        verified::print(&self.opts, Shape::Flat, v, &read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::Output;
    use crate::cli::query::tests::query;
    use crate::cli::query::QueryCommand;
    use clap::error::ErrorKind;

    fn sla(args: &[&str]) -> Result<SlaCommand, clap::Error> {
        let mut full = vec!["query", "sla"];
        full.extend_from_slice(args);
        match query(&full)? {
            QueryCommand::Sla(c) => Ok(c),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn route_paths_escape_slashes_and_page_only_over_all_windows() {
        let base = [
            "route",
            "--user",
            "alice",
            "--provider",
            "acme-ai",
            "--model",
            "llama/3-70b",
            "--route",
            "/v1/chat",
        ];
        let with = |more: &[&'static str]| [&base[..], more].concat();
        let SlaCommand::Route(c) = sla(&with(&["--limit", "5", "--cursor", "0a"])).unwrap() else {
            panic!()
        };
        assert_eq!(c.page.limit, Some(5));
        let (path, shape) = c.path();
        assert_eq!(
            path.to_string(),
            "/sla/route/alice/acme-ai/llama%2F3-70b/%2Fv1%2Fchat?limit=5&cursor=0a"
        );
        assert_eq!(shape, Shape::Records);
        let SlaCommand::Route(c) = sla(&with(&["--window", "7", "--output", "json"])).unwrap()
        else {
            panic!()
        };
        let (path, shape) = c.path();
        assert_eq!(
            path.to_string(),
            "/sla/route/alice/acme-ai/llama%2F3-70b/%2Fv1%2Fchat/7"
        );
        assert_eq!(shape, Shape::Record);
        assert_eq!(c.opts.format(), Output::Json);
    }

    #[test]
    fn provider_and_user_paths() {
        let SlaCommand::Provider(c) =
            sla(&["provider", "--provider", "acme-ai", "--node", "http://n:1"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(c.path().to_string(), "/sla/provider/acme-ai");
        assert_eq!(c.opts.node.primary(), "http://n:1");
        let SlaCommand::User(c) =
            sla(&["user", "--user", "bob", "--window", "3", "--limit", "2"]).unwrap()
        else {
            panic!()
        };
        assert_eq!(c.path().to_string(), "/sla/user/bob/3?limit=2");
    }

    #[test]
    fn totals_name_one_party_and_its_key() {
        let SlaCommand::Totals(c) =
            sla(&["totals", "--provider", "acme", "--window", "4"]).unwrap()
        else {
            panic!()
        };
        assert!(!c.verify.verify);
        assert_eq!(c.verify.trusting_period.as_secs(), 14 * 86_400);
        assert_eq!(c.verify.header_wait.as_secs(), 15);
        let (kind, party, key) = c.key().unwrap();
        assert_eq!((kind, party), ("provider", "acme"));
        assert_eq!(key, b"pw/acme\0\0\0\0\0\0\0\0\x04".to_vec());
        let SlaCommand::Totals(c) = sla(&[
            "totals",
            "--user",
            "bob",
            "--window",
            "258",
            "--verify",
            "--trust-height",
            "7",
            "--trust-hash",
            "ab",
        ])
        .unwrap() else {
            panic!()
        };
        assert_eq!(c.key().unwrap().2, b"uw/bob\0\0\0\0\0\0\0\x01\x02".to_vec());
        assert!(c.verify.verify);
        assert_eq!(c.verify.trust_height, Some(7));
        assert_eq!(c.verify.trust_hash.as_deref(), Some("ab"));
        let SlaCommand::Totals(c) = sla(&["totals", "--user", "a b", "--window", "1"]).unwrap()
        else {
            panic!()
        };
        assert!(c.key().is_err());
    }

    #[test]
    fn verify_flags_go_together() {
        for (bad, kind) in [
            (
                &["totals", "--provider", "p", "--user", "u", "--window", "1"][..],
                ErrorKind::ArgumentConflict,
            ),
            (
                &["totals", "--window", "1"],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &["totals", "--provider", "p"],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &[
                    "totals",
                    "--provider",
                    "p",
                    "--window",
                    "1",
                    "--trust-height",
                    "3",
                    "--trust-hash",
                    "ab",
                ],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &[
                    "totals",
                    "--provider",
                    "p",
                    "--window",
                    "1",
                    "--verify",
                    "--trust-hash",
                    "ab",
                ],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &[
                    "totals",
                    "--provider",
                    "p",
                    "--window",
                    "1",
                    "--verify",
                    "--trust-height",
                    "3",
                ],
                ErrorKind::MissingRequiredArgument,
            ),
            (
                &[
                    "totals",
                    "--provider",
                    "p",
                    "--window",
                    "1",
                    "--header-wait",
                    "soon",
                ],
                ErrorKind::ValueValidation,
            ),
        ] {
            assert_eq!(sla(bad).unwrap_err().kind(), kind, "{bad:?}");
        }
        let SlaCommand::Route(c) = sla(&[
            "route",
            "--user",
            "a",
            "--provider",
            "p",
            "--model",
            "m",
            "--route",
            "r",
            "--window",
            "3",
            "--verify",
        ])
        .unwrap() else {
            panic!()
        };
        assert!(c.verify.verify && c.verify.trust_height.is_none());
    }

    #[test]
    fn refuses_bad_invocations() {
        for (bad, kind) in [
            (
                &["route", "--user", "a", "--provider", "p", "--model", "m"][..],
                ErrorKind::MissingRequiredArgument,
            ),
            (&["provider"], ErrorKind::MissingRequiredArgument),
            (
                &["user", "--user", "a", "--window", "-1"],
                ErrorKind::UnknownArgument,
            ),
            (
                &["user", "--user", "a", "--window", "x"],
                ErrorKind::ValueValidation,
            ),
            (
                &["provider", "--provider", "p", "--limit", "many"],
                ErrorKind::ValueValidation,
            ),
            (&["model"], ErrorKind::InvalidSubcommand),
        ] {
            assert_eq!(sla(bad).unwrap_err().kind(), kind, "{bad:?}");
        }
    }
}
