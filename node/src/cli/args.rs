//! Argument groups shared by several subcommands, flattened into each with
//! `#[command(flatten)]`: node endpoints, output format, paging, logging.

use std::time::Duration;

use clap::{Args, ValueEnum};

/// The CometBFT node endpoint(s) a command talks to.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct NodeArgs {
    /// CometBFT RPC endpoint (repeat the flag or separate with commas for
    /// several).
    #[arg(
        long = "node",
        value_name = "NODE",
        env = "TALLY_NODE",
        default_value = "http://127.0.0.1:26657",
        value_delimiter = ','
    )]
    pub nodes: Vec<String>,
}

impl NodeArgs {
    /// The endpoints as given, trimmed, without empty entries.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    }

    /// The endpoint single-node commands use: the first one given.
    pub fn primary(&self) -> String {
        self.endpoints().into_iter().next().unwrap_or_default()
    }

    /// The endpoints for messages, as they would be written on the command
    /// line (`a,b`), with any credentials in them shown as `***`.
    pub fn display(&self) -> String {
        self.nodes
            .iter()
            .map(|n| tally_client::redact_url(n))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// How a command prints its answer.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    // (Plain comments: doc comments here would change `--help`.)
    // Aligned columns or `key: value` lines, for people.
    #[default]
    Table,
    // One JSON value per answer, for scripts.
    Json,
}

/// `--output table|json`, or `--json` for short.
#[derive(Args, Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Same as --output json.
    #[arg(long)]
    pub json: bool,
}

impl OutputArgs {
    /// The chosen format (`--json` wins).
    pub fn format(&self) -> Output {
        if self.json {
            Output::Json
        } else {
            self.output
        }
    }
}

/// A query command's node and output format.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct QueryOpts {
    /// Where to ask.
    #[command(flatten)]
    pub node: NodeArgs,
    /// How to print.
    #[command(flatten)]
    pub output: OutputArgs,
}

impl QueryOpts {
    /// The chosen output format.
    pub fn format(&self) -> Output {
        self.output.format()
    }
}

/// `--verify` and its trust settings, for queries whose answer is one
/// provable state key (or a few).
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct VerifyArgs {
    /// Verify the answer with the light client: the node's proof against
    /// the app hash of a header verified from the trust root (the trust file
    /// of `tallyd light init`, or --trust-height/--trust-hash).
    #[arg(long)]
    pub verify: bool,
    /// Trust root height, instead of the trust file (with --trust-hash).
    #[arg(long, requires_all = ["trust_hash", "verify"])]
    pub trust_height: Option<u64>,
    /// Hash (hex) of the header at --trust-height.
    #[arg(long, requires = "trust_height")]
    pub trust_hash: Option<String>,
    /// How long a verified header's validators stay trusted (s, m, h, d).
    #[arg(long, default_value = "14d", value_parser = parse_duration)]
    pub trusting_period: Duration,
    /// How long to wait for the header that carries the answer's app hash.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub header_wait: Duration,
}

/// A duration: a number with an optional unit s, m, h or d (default s).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 15s, 90m, 36h, 14d)"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: the unit must be s, m, h or d")),
    };
    n.checked_mul(mult)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// `--limit` and `--cursor` of a paged query.
#[derive(Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct PageArgs {
    /// Page size (1-1000).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Cursor from a previous page's next_cursor.
    #[arg(long)]
    pub cursor: Option<String>,
}

/// Log line format.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    // Human-readable lines.
    #[default]
    Text,
    // One JSON object per line.
    Json,
}

impl LogFormat {
    /// Reads app.toml's `log_format` (`text` or `json`).
    pub fn parse(s: &str) -> Result<Self, String> {
        <Self as ValueEnum>::from_str(s, false)
            .map_err(|_| format!("log format must be text or json, got {s:?}"))
    }
}

/// `--log-format` and `--log-level`, each overriding app.toml.
#[derive(Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct LogArgs {
    /// Override app.toml's log_format (text|json).
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Override app.toml's log_level.
    #[arg(long)]
    pub log_level: Option<String>,
}

impl LogArgs {
    /// Installs the global tracing subscriber; the flags win over the
    /// app.toml values given.
    pub fn init(&self, cfg_format: &str, cfg_level: &str) -> anyhow::Result<()> {
        use anyhow::Context;
        use tracing_subscriber::EnvFilter;
        let format = match self.log_format {
            Some(f) => f,
            None => LogFormat::parse(cfg_format).map_err(anyhow::Error::msg)?,
        };
        let level = self.log_level.as_deref().unwrap_or(cfg_level);
        // tendermint-abci logs every request at debug: keep it at info unless asked.
        let filter = EnvFilter::try_new(format!("tendermint_abci=info,{level}"))
            .with_context(|| format!("bad log level {level:?}"))?;
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr);
        match format {
            LogFormat::Json => builder.json().init(),
            LogFormat::Text => builder.init(),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct T {
        #[command(flatten)]
        q: QueryOpts,
        #[command(flatten)]
        page: PageArgs,
        #[command(flatten)]
        log: LogArgs,
    }

    #[test]
    fn defaults() {
        let t = T::try_parse_from(["t"]).unwrap();
        assert_eq!(t.q.node.endpoints(), ["http://127.0.0.1:26657"]);
        assert_eq!(t.q.format(), Output::Table);
        assert_eq!(t.page, PageArgs::default());
        assert_eq!(t.log, LogArgs::default());
    }

    #[test]
    fn nodes_repeat_or_split_on_commas() {
        let t = T::try_parse_from([
            "t",
            "--node",
            "http://a:1, http://b:2",
            "--node",
            "http://c:3",
        ])
        .unwrap();
        assert_eq!(
            t.q.node.endpoints(),
            ["http://a:1", "http://b:2", "http://c:3"]
        );
        assert_eq!(t.q.node.primary(), "http://a:1");
        assert_eq!(t.q.node.display(), "http://a:1, http://b:2,http://c:3");
        // Messages never show an endpoint's credentials.
        let t = T::try_parse_from(["t", "--node", "https://u:s3cret@rpc.example:443/?key=K3Y"])
            .unwrap();
        assert_eq!(t.q.node.display(), "https://***@rpc.example:443/?key=***");
    }

    #[test]
    fn values_are_checked_by_clap() {
        let t = T::try_parse_from([
            "t",
            "--output",
            "json",
            "--limit",
            "5",
            "--cursor",
            "ab",
            "--log-format",
            "json",
            "--log-level",
            "debug",
        ])
        .unwrap();
        assert_eq!(t.q.format(), Output::Json);
        assert_eq!(t.page.limit, Some(5));
        assert_eq!(t.page.cursor.as_deref(), Some("ab"));
        assert_eq!(t.log.log_format, Some(LogFormat::Json));
        assert_eq!(t.log.log_level.as_deref(), Some("debug"));
        for bad in [
            &["t", "--log-format", "xml"][..],
            &["t", "--output", "yaml"],
        ] {
            let e = T::try_parse_from(bad).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::InvalidValue, "{bad:?}");
        }
        let e = T::try_parse_from(["t", "--limit", "ten"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
        // A negative number reads as an unknown flag.
        let e = T::try_parse_from(["t", "--limit", "-1"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("90m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("36h"), Ok(Duration::from_secs(129_600)));
        assert_eq!(parse_duration("14d"), Ok(Duration::from_secs(1_209_600)));
        for bad in ["", "d", "1w", "1.5h", "-3s", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn app_toml_log_format_is_read_the_same_way() {
        assert_eq!(LogFormat::parse("text"), Ok(LogFormat::Text));
        assert_eq!(LogFormat::parse("json"), Ok(LogFormat::Json));
        assert!(LogFormat::parse("xml")
            .unwrap_err()
            .contains("text or json"));
    }
}
