//! The benchmark's PNG: committed throughput against offered rate, and p99
//! latency against offered rate, one series per application and size.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use super::stats::StepRow;

/// Fonts tried, in order (Debian's fonts-dejavu-core first).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

fn load_font() -> Result<()> {
    let path = std::env::var("TALLY_BENCH_FONT")
        .ok()
        .into_iter()
        .chain(FONTS.iter().map(|s| s.to_string()))
        .find(|p| Path::new(p).exists())
        .context("no TTF font found (install fonts-dejavu-core or set TALLY_BENCH_FONT)")?;
    let bytes: &'static [u8] = Box::leak(std::fs::read(&path)?.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{path} is not a usable font"))
}

/// The series of `rows`: (label, rows of that application and size).
fn series(rows: &[StepRow]) -> Vec<(String, Vec<&StepRow>)> {
    let mut out: Vec<((String, usize), Vec<&StepRow>)> = Vec::new();
    for r in rows {
        let key = (r.app.clone(), r.records);
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(r),
            None => out.push((key, vec![r])),
        }
    }
    out.into_iter()
        .map(|((app, n), v)| {
            let bytes = v.iter().map(|r| r.tx_bytes).sum::<usize>() / v.len();
            (format!("{app} {n}-record size (~{bytes} B)"), v)
        })
        .collect()
}

/// Draws `rows` into a PNG at `path`.
pub fn draw(rows: &[StepRow], path: &Path) -> Result<()> {
    load_font()?;
    let root = BitMapBackend::new(path, (1500, 650)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(750);
    let max_x = rows.iter().map(|r| r.offered).fold(1.0, f64::max) * 1.3;
    let min_x = rows
        .iter()
        .map(|r| r.offered)
        .fold(max_x, f64::min)
        .max(0.1)
        * 0.7;
    let max_y = rows.iter().map(|r| r.committed).fold(1.0, f64::max) * 1.5;
    let max_l = rows.iter().map(|r| r.lat_p99).fold(100.0, f64::max) * 1.5;
    let all = series(rows);
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];

    let mut c = ChartBuilder::on(&left)
        .caption("committed vs offered (tx/s)", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d((min_x..max_x).log_scale(), (0.5..max_y).log_scale())?;
    c.configure_mesh()
        .x_desc("offered tx/s")
        .y_desc("committed tx/s")
        .label_style(("sans-serif", 14))
        .draw()?;
    // The ideal: everything offered is committed.
    let top = max_x.min(max_y);
    c.draw_series(LineSeries::new(
        [(min_x.max(0.5), min_x.max(0.5)), (top, top)],
        BLACK.mix(0.25),
    ))?
    .label("committed = offered")
    .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.25)));
    for (i, (label, s)) in all.iter().enumerate() {
        let col = colors[i % colors.len()];
        let mut pts: Vec<(f64, f64)> = s
            .iter()
            .map(|r| (r.offered, r.committed.max(0.5)))
            .collect();
        // In offered order (an `--at-80` step comes last in the run).
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        c.draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], col.stroke_width(2)));
        c.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, col.filled())))?;
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;

    let mut c = ChartBuilder::on(&right)
        .caption("broadcast to commit p99 latency (ms)", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d((min_x..max_x).log_scale(), (100.0..max_l).log_scale())?;
    c.configure_mesh()
        .x_desc("offered tx/s")
        .y_desc("p99 ms")
        .label_style(("sans-serif", 14))
        .draw()?;
    for (i, (label, s)) in all.iter().enumerate() {
        let col = colors[i % colors.len()];
        let mut pts: Vec<(f64, f64)> = s
            .iter()
            .filter(|r| r.lat_p99 > 0.0)
            .map(|r| (r.offered, r.lat_p99.max(100.0)))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        c.draw_series(LineSeries::new(pts.clone(), col.stroke_width(2)))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], col.stroke_width(2)));
        c.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, col.filled())))?;
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// A labelled series of the soak plot: its value in a row.
type Series<'a> = (&'a str, fn(&StepRow) -> f64);

/// One panel of the soak plot: `series` (label, value of a row) over the
/// rows' elapsed minutes.
fn soak_panel(
    area: &DrawingArea<BitMapBackend, plotters::coord::Shift>,
    title: &str,
    unit: &str,
    rows: &[StepRow],
    series: &[Series<'_>],
) -> Result<()> {
    let max_x = rows.iter().map(|r| r.elapsed_s / 60.0).fold(1.0, f64::max);
    let max_y = rows
        .iter()
        .flat_map(|r| series.iter().map(move |(_, f)| f(r)))
        .fold(1.0, f64::max)
        * 1.25;
    let colors = [RED, BLUE, GREEN, MAGENTA];
    let mut c = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_x, 0.0..max_y)?;
    c.configure_mesh()
        .x_desc("minutes")
        .y_desc(unit)
        .label_style(("sans-serif", 13))
        .draw()?;
    for (i, (label, f)) in series.iter().enumerate() {
        let col = colors[i % colors.len()];
        let pts: Vec<(f64, f64)> = rows.iter().map(|r| (r.elapsed_s / 60.0, f(r))).collect();
        c.draw_series(LineSeries::new(pts, col.stroke_width(2)))?
            .label(*label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], col.stroke_width(2)));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// Draws a soak (`--constant`) into a PNG at `path`: throughput and
/// latency, memory, open files and disk over time, one point per step.
pub fn draw_soak(rows: &[StepRow], path: &Path) -> Result<()> {
    load_font()?;
    if rows.is_empty() {
        anyhow::bail!("no steps to draw");
    }
    let root = BitMapBackend::new(path, (1500, 1350)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((3, 2));
    soak_panel(
        &panels[0],
        "throughput (per step)",
        "tx/s; transactions",
        rows,
        &[
            ("offered tx/s", |r| r.offered),
            ("committed tx/s", |r| r.committed),
            ("lost per second", |r| r.lost as f64 / r.step_secs.max(1.0)),
        ],
    )?;
    soak_panel(
        &panels[1],
        "broadcast to commit latency",
        "s",
        rows,
        &[
            ("p50", |r| r.lat_p50 / 1000.0),
            ("p99", |r| r.lat_p99 / 1000.0),
        ],
    )?;
    soak_panel(
        &panels[2],
        "resident memory (sum over validators)",
        "MiB",
        rows,
        &[
            ("app RSS", |r| r.app_rss),
            ("CometBFT RSS", |r| r.comet_rss),
        ],
    )?;
    soak_panel(
        &panels[3],
        "CPU (sum over validators; 200 = both cores)",
        "%",
        rows,
        &[("app", |r| r.app_cpu), ("CometBFT", |r| r.comet_cpu)],
    )?;
    soak_panel(
        &panels[4],
        "open files (sum over processes)",
        "files",
        rows,
        &[("open files", |r| r.fds as f64)],
    )?;
    soak_panel(
        &panels[5],
        "disk (sum of validator homes)",
        "MiB",
        rows,
        &[("disk", |r| r.disk_mib)],
    )?;
    root.present()?;
    Ok(())
}

/// Rows read back from a `network.csv` (the columns the plots use), to
/// redraw a finished run: `tally-bench network --plot CSV` (or
/// `--plot-soak CSV`).
pub fn read_csv(text: &str) -> anyhow::Result<Vec<StepRow>> {
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().context("empty CSV")?.split(',').collect();
    let col = |name: &str| {
        head.iter()
            .position(|h| *h == name)
            .with_context(|| format!("no column {name}"))
    };
    let (app, rec, bytes, off, com, p99) = (
        col("app")?,
        col("records_per_report")?,
        col("tx_bytes")?,
        col("offered_tx_s")?,
        col("committed_tx_s")?,
        col("latency_p99_ms")?,
    );
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let get = |i: usize| f.get(i).copied().context("short CSV line");
            // Columns of a soak, read when the CSV has them (0 if not).
            let opt = |name: &str| -> f64 {
                head.iter()
                    .position(|h| *h == name)
                    .and_then(|i| f.get(i))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0)
            };
            Ok(StepRow {
                app: get(app)?.to_string(),
                records: get(rec)?.parse()?,
                tx_bytes: get(bytes)?.parse()?,
                offered: get(off)?.parse()?,
                committed: get(com)?.parse()?,
                lat_p99: get(p99)?.parse()?,
                lat_p50: opt("latency_p50_ms"),
                lost: opt("lost") as u64,
                app_cpu: opt("app_cpu_pct"),
                comet_cpu: opt("cometbft_cpu_pct"),
                app_rss: opt("app_rss_mib"),
                comet_rss: opt("cometbft_rss_mib"),
                elapsed_s: opt("elapsed_s"),
                step_secs: opt("step_secs"),
                fds: opt("open_files") as u64,
                disk_mib: opt("disk_mib"),
                ..StepRow::default()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_png() {
        if !FONTS.iter().any(|p| Path::new(p).exists()) {
            eprintln!("SKIPPED draws_a_png: no DejaVu font");
            return;
        }
        let row = |app: &str, offered: f64, committed: f64| StepRow {
            app: app.into(),
            records: 1,
            tx_bytes: 250,
            offered,
            committed,
            lat_p99: 1500.0,
            ..StepRow::default()
        };
        let mut rows = [
            row("tally", 100.0, 99.0),
            row("tally", 150.0, 120.0),
            row("kvstore", 100.0, 100.0),
        ];
        // Tally's mean size varies a little from step to step: one series.
        rows[1].tx_bytes = 252;
        let s = series(&rows);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].0, "tally 1-record size (~251 B)");
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.png");
        draw(&rows, &p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        // The CSV the benchmark writes reads back to the same series.
        let p = d.path().join("soak.png");
        draw_soak(&rows, &p).unwrap();
        assert_eq!(&std::fs::read(&p).unwrap()[1..4], b"PNG");
        let back = read_csv(&super::super::stats::csv(&rows)).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(
            (back[1].offered, back[1].committed, back[1].tx_bytes),
            (150.0, 120.0, 252)
        );
    }
}
