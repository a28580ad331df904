//! Committed blocks, for following the chain: `/block` (a block's
//! transactions and time) and `/block_results` (their FinalizeBlock
//! results, in the same order).

use serde_json::{json, Value};

use super::{bytes_field, str_field, u32_field, u64_field, RpcClient, RpcError};

/// A committed block's transactions (`/block`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockTxs {
    /// The block's height.
    pub height: u64,
    /// The header's time, whole seconds since the Unix epoch (rounded
    /// down).
    pub time: u64,
    /// The transactions, base64-decoded, in block order.
    pub txs: Vec<Vec<u8>>,
}

/// One transaction's FinalizeBlock result (`/block_results`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecResult {
    /// Result code (0 = accepted).
    pub code: u32,
    /// Log.
    pub log: String,
    /// `data`, base64-decoded.
    pub data: Vec<u8>,
}

/// Seconds since the Unix epoch of an RFC 3339 UTC time as CometBFT
/// writes it (`2024-05-01T12:34:56.123456789Z`); fractions are dropped.
pub fn parse_utc_secs(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 20 || !s.ends_with('Z') || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<u64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    if hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from 1970-01-01 of a proleptic Gregorian date (Howard
    // Hinnant's days_from_civil, for years from 1970 on).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

impl RpcClient {
    /// `/block` at `height`: its time and transactions.
    pub fn block(&self, height: u64) -> Result<BlockTxs, RpcError> {
        let m = "block";
        let r = self.call(m, json!({ "height": height.to_string() }))?;
        let header = &r["block"]["header"];
        let time = parse_utc_secs(header["time"].as_str().unwrap_or("")).ok_or_else(|| {
            RpcError::Decode {
                method: m.into(),
                msg: format!("block {height}: bad time {}", header["time"]),
            }
        })?;
        let txs = match &r["block"]["data"]["txs"] {
            Value::Array(a) => a
                .iter()
                .map(|t| bytes_field(m, "block.data.txs", t))
                .collect::<Result<Vec<_>, _>>()?,
            _ => Vec::new(),
        };
        Ok(BlockTxs {
            height: u64_field(&header["height"]),
            time,
            txs,
        })
    }

    /// `/block_results` at `height`: each transaction's FinalizeBlock
    /// result, in block order.
    pub fn block_results(&self, height: u64) -> Result<Vec<ExecResult>, RpcError> {
        let m = "block_results";
        let r = self.call(m, json!({ "height": height.to_string() }))?;
        match &r["txs_results"] {
            Value::Array(a) => a
                .iter()
                .map(|t| {
                    Ok(ExecResult {
                        code: u32_field(&t["code"]),
                        log: str_field(&t["log"]),
                        data: bytes_field(m, "txs_results.data", &t["data"])?,
                    })
                })
                .collect(),
            _ => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_utc_secs;

    #[test]
    fn cometbft_times_parse_to_unix_seconds() {
        // Oracles: `date -u -d ... +%s`.
        assert_eq!(parse_utc_secs("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_utc_secs("2024-02-29T23:59:59.999999999Z"),
            Some(1_709_251_199)
        );
        assert_eq!(
            parse_utc_secs("2025-12-01T15:21:07.123Z"),
            Some(1_764_602_467)
        );
        assert_eq!(parse_utc_secs("2025-12-01T15:21:07+01:00"), None);
        assert_eq!(parse_utc_secs("garbage"), None);
    }
}
