//! `tallyd query sla route|provider|user`: SLA route records.

use clap::{Args, Subcommand};
use tally_settlement::query_path::{self, QueryPath};

use super::{show, Shape};
use crate::cli::args::{PageArgs, QueryOpts};
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
}

impl Command for SlaCommand {
    fn execute(self, ctx: &Context) -> anyhow::Result<()> {
        match self {
            Self::Route(c) => c.execute(ctx),
            Self::Provider(c) => c.execute(ctx),
            Self::User(c) => c.execute(ctx),
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
    fn execute(self, _ctx: &Context) -> anyhow::Result<()> {
        let (path, shape) = self.path();
        show(&self.opts, &path, shape)
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
        show(&self.opts, &self.path(), Shape::Records)
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
