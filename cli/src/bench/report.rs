//! The benchmark's output: OSU's text layout, nccl-tests' columns, JSON, CSV, the
//! comparison tables of `--compare` and their plots.

use super::{BenchAlgo, BenchRow, Op};
use crate::plot::{self, Series};
use halo::{Error, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What the tables' titles say about the run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    /// The benchmark.
    pub op: Op,
    /// Ranks in the job.
    pub ranks: usize,
    /// The topology's name.
    pub topology: String,
    /// How the ranks ran: `threads, emulated x20`, `processes`, ...
    pub mode: String,
    /// The router behind `alltoallv`'s counts (`None` for the other benchmarks), so
    /// that `halo simulate --measured` can rebuild them.
    pub moe: Option<super::moe::MoeShape>,
    /// Rounds per size ([`BenchOptions::rounds`](super::BenchOptions::rounds)); 1 is
    /// not mentioned in the reports, which then read as before rounds existed.
    pub rounds: usize,
    /// More about how the figures were taken, one line each, printed as `# ` lines
    /// before the tables (and as `notes` in the JSON): that `auto`'s trials ran untimed.
    pub notes: Vec<String>,
}

/// The lines that say how the figures were taken: the rounds when there were several,
/// then the notes.
fn header_lines(info: &RunInfo) -> Vec<String> {
    let rounds =
        (info.rounds > 1).then(|| format!("# rounds: {}, median of per-round means", info.rounds));
    rounds
        .into_iter()
        .chain(info.notes.iter().map(|n| format!("# {n}")))
        .collect()
}

fn algorithms(rows: &[BenchRow]) -> Vec<BenchAlgo> {
    let mut out: Vec<BenchAlgo> = Vec::new();
    for r in rows {
        if !out.contains(&r.algorithm) {
            out.push(r.algorithm);
        }
    }
    out
}

fn sizes(rows: &[BenchRow]) -> Vec<usize> {
    let mut s: Vec<usize> = rows.iter().map(|r| r.size).collect();
    s.sort_unstable();
    s.dedup();
    s
}

fn osu_title(op: Op) -> &'static str {
    match op {
        Op::AllToAll => "All-to-All Personalized Exchange Latency Test",
        Op::AllToAllV => "All-to-Allv Personalized Exchange Latency Test (MoE-shaped counts)",
        Op::Latency => "Latency Test",
        Op::Bandwidth => "Bandwidth Test",
    }
}

/// OSU's layout: per implementation a title line, the column header and one line per
/// size. The collectives print `# Size` and `Avg Latency(us)`, with `full` (OSU's
/// `-f`) also the minimum, maximum and iterations; `latency` prints `Latency (us)`,
/// `bw` `Bandwidth (MB/s)`. With `-c` a last column counts wrong bytes (`Errors`).
///
/// With several rounds a first line says so: `# rounds: R, median of per-round means`;
/// then one `# ` line per note.
pub fn format_osu(info: &RunInfo, rows: &[BenchRow], full: bool, validated: bool) -> String {
    let mut out = String::new();
    for line in header_lines(info) {
        let _ = writeln!(out, "{line}");
    }
    for (i, alg) in algorithms(rows).into_iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "# OSU-style HALO {} ({}: {}, {} ranks, topology {}, {})",
            osu_title(info.op),
            if info.op.is_collective() {
                "algorithm"
            } else {
                "path"
            },
            alg.label(info.op),
            info.ranks,
            info.topology,
            info.mode
        );
        match info.op {
            Op::Latency => {
                let _ = write!(out, "{:<10}{:>20}", "# Size", "Latency (us)");
            }
            Op::Bandwidth => {
                let _ = write!(out, "{:<10}{:>20}", "# Size", "Bandwidth (MB/s)");
            }
            _ => {
                let _ = write!(out, "{:<10}{:>20}", "# Size", "Avg Latency(us)");
                if full {
                    let _ = write!(
                        out,
                        "{:>20}{:>20}{:>12}",
                        "Min Latency(us)", "Max Latency(us)", "Iterations"
                    );
                }
            }
        }
        if validated {
            let _ = write!(out, "{:>10}", "Errors");
        }
        out.push('\n');
        for r in rows.iter().filter(|r| r.algorithm == alg) {
            let value = if info.op == Op::Bandwidth {
                r.mb_per_s()
            } else {
                r.avg_us
            };
            let _ = write!(out, "{:<10}{:>20.2}", r.size, value);
            if full && info.op.is_collective() {
                let _ = write!(
                    out,
                    "{:>20.2}{:>20.2}{:>12}",
                    r.min_us, r.max_us, r.iterations
                );
            }
            if validated {
                let _ = write!(out, "{:>10}", r.wrong);
            }
            out.push('\n');
        }
    }
    out
}

/// nccl-tests' columns (`alltoall_perf`): per implementation a header, then per size
/// `size` (bytes per rank in all), `count` (elements, `uint8`), `type`, `time` (us),
/// `algbw` and `busbw` (GB/s) and `#wrong`. With several rounds a first line says so,
/// as in [`format_osu`].
pub fn format_nccl_tests(info: &RunInfo, rows: &[BenchRow]) -> String {
    let mut out = String::new();
    for line in header_lines(info) {
        let _ = writeln!(out, "{line}");
    }
    let n = if info.op.is_collective() {
        info.ranks
    } else {
        1
    };
    for (i, alg) in algorithms(rows).into_iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "# halo {} ({}), {} ranks, topology {}, {}",
            info.op,
            alg.label(info.op),
            info.ranks,
            info.topology,
            info.mode
        );
        let _ = writeln!(
            out,
            "#{:>11}{:>13}{:>9}{:>11}{:>9}{:>9}{:>8}",
            "size", "count", "type", "time", "algbw", "busbw", "#wrong"
        );
        let _ = writeln!(
            out,
            "#{:>11}{:>13}{:>9}{:>11}{:>9}{:>9}{:>8}",
            "(B)", "(elements)", "", "(us)", "(GB/s)", "(GB/s)", ""
        );
        for r in rows.iter().filter(|r| r.algorithm == alg) {
            let total = r.size * n;
            let _ = writeln!(
                out,
                "{:>12}{:>13}{:>9}{:>11.2}{:>9.2}{:>9.2}{:>8}",
                total, total, "uint8", r.avg_us, r.alg_bw_gbs, r.bus_bw_gbs, r.wrong
            );
        }
    }
    out
}

fn row_json(r: &BenchRow) -> serde_json::Value {
    serde_json::json!({
        "op": r.op.name(),
        "algorithm": r.algorithm.label(r.op),
        "size": r.size,
        "avg_us": r.avg_us,
        "min_us": r.min_us,
        "max_us": r.max_us,
        "iterations": r.iterations,
        "algbw_gbs": r.alg_bw_gbs,
        "busbw_gbs": r.bus_bw_gbs,
        "mb_per_s": r.mb_per_s(),
        "wrong": r.wrong,
    })
}

/// One JSON document: the run's description and every row. With several rounds the
/// document has a `rounds` field (absent: one round) and `rounds_statistic`, the
/// figure each rank gives per (implementation, size): `"median of per-round means"`.
pub fn format_json(info: &RunInfo, rows: &[BenchRow]) -> String {
    let mut doc = serde_json::json!({
        "benchmark": info.op.name(),
        "ranks": info.ranks,
        "topology": info.topology,
        "mode": info.mode,
        "moe": info.moe,
        "rows": rows.iter().map(row_json).collect::<Vec<_>>(),
    });
    if !info.notes.is_empty() {
        doc["notes"] = info.notes.clone().into();
    }
    if info.rounds > 1 {
        doc["rounds"] = info.rounds.into();
        doc["rounds_statistic"] = "median of per-round means".into();
    }
    let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
    s.push('\n');
    s
}

/// CSV with a header line; one line per row. With several rounds a last column
/// `rounds` gives their number (each figure the median of per-round means).
pub fn format_csv(info: &RunInfo, rows: &[BenchRow]) -> String {
    let rounds = info.rounds > 1;
    let mut out = String::from(
        "benchmark,ranks,algorithm,size,avg_us,min_us,max_us,iterations,algbw_gbs,busbw_gbs,mb_per_s,wrong",
    );
    out.push_str(if rounds { ",rounds\n" } else { "\n" });
    for r in rows {
        let _ = write!(
            out,
            "{},{},{},{},{:.3},{:.3},{:.3},{},{:.6},{:.6},{:.3},{}",
            info.op,
            info.ranks,
            r.algorithm.label(info.op),
            r.size,
            r.avg_us,
            r.min_us,
            r.max_us,
            r.iterations,
            r.alg_bw_gbs,
            r.bus_bw_gbs,
            r.mb_per_s(),
            r.wrong
        );
        if rounds {
            let _ = write!(out, ",{}", info.rounds);
        }
        out.push('\n');
    }
    out
}

fn value(rows: &[BenchRow], alg: BenchAlgo, size: usize) -> Option<f64> {
    rows.iter()
        .find(|r| r.algorithm == alg && r.size == size)
        .map(|r| r.avg_us)
        .filter(|t| *t > 0.0)
}

/// The ratio tables of `--compare`: per size each implementation's time, then its
/// speed-up over the flat fan-out and over MPI (baseline time / its time; > 1 is
/// faster), where those were measured.
pub fn compare_table(info: &RunInfo, rows: &[BenchRow]) -> String {
    let algs = algorithms(rows);
    let mut out = String::new();
    let unit = if info.op == Op::Bandwidth {
        "us per message"
    } else {
        "us"
    };
    let rounds = if info.rounds > 1 {
        format!(", median of {} rounds", info.rounds)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "\n# Comparison: {} ({} ranks, {}), time in {unit}{rounds}",
        info.op, info.ranks, info.mode
    );
    let _ = write!(out, "{:<10}", "# Size");
    for a in &algs {
        let _ = write!(out, "{:>12}", a.label(info.op));
    }
    out.push('\n');
    for s in sizes(rows) {
        let _ = write!(out, "{s:<10}");
        for &a in &algs {
            match value(rows, a, s) {
                Some(t) => {
                    let _ = write!(out, "{t:>12.2}");
                }
                None => {
                    let _ = write!(out, "{:>12}", "-");
                }
            }
        }
        out.push('\n');
    }
    let baselines = [
        (
            BenchAlgo::Halo(Some(halo_collectives::Algorithm::Flat)),
            "the flat fan-out",
        ),
        (BenchAlgo::Mpi, "MPI"),
    ];
    for (base, what) in baselines {
        if !algs.contains(&base) || algs.len() < 2 {
            continue;
        }
        let others: Vec<BenchAlgo> = algs
            .iter()
            .copied()
            .filter(|a| *a != base && *a != BenchAlgo::Memcpy)
            .collect();
        let _ = writeln!(
            out,
            "\n# Speed-up over {what} ({} time / time; > 1 is faster)",
            base.label(info.op)
        );
        ratio_block(&mut out, info, rows, &others, |s, a| {
            Some(value(rows, base, s)? / value(rows, a, s)?)
        });
    }
    if algs.contains(&BenchAlgo::Memcpy) && algs.len() > 1 {
        // busbw / memcpy bandwidth = (size n / t x (n - 1) / n) / (size n / t_memcpy).
        let n = info.ranks.max(1) as f64;
        let others: Vec<BenchAlgo> = algs
            .iter()
            .copied()
            .filter(|a| *a != BenchAlgo::Memcpy)
            .collect();
        let _ = writeln!(
            out,
            "\n# Bus bandwidth / memcpy bandwidth (memcpy time / time x (n - 1) / n; memcpy: every rank copies its send buffer, all at once)"
        );
        ratio_block(&mut out, info, rows, &others, |s, a| {
            Some(value(rows, BenchAlgo::Memcpy, s)? / value(rows, a, s)? * (n - 1.0) / n)
        });
    }
    out
}

/// One table of ratios: a line per size, a column per implementation.
fn ratio_block(
    out: &mut String,
    info: &RunInfo,
    rows: &[BenchRow],
    columns: &[BenchAlgo],
    ratio: impl Fn(usize, BenchAlgo) -> Option<f64>,
) {
    let _ = write!(out, "{:<10}", "# Size");
    for a in columns {
        let _ = write!(out, "{:>12}", a.label(info.op));
    }
    out.push('\n');
    for s in sizes(rows) {
        if columns.iter().all(|&a| ratio(s, a).is_none()) {
            continue;
        }
        let _ = write!(out, "{s:<10}");
        for &a in columns {
            match ratio(s, a) {
                Some(r) => {
                    let _ = write!(out, "{r:>11.2}x");
                }
                None => {
                    let _ = write!(out, "{:>12}", "-");
                }
            }
        }
        out.push('\n');
    }
}

/// Writes the plots of `--compare` into `dir`: `halo-bench-<op>-latency.{svg,png}`
/// (time against size, one line per implementation) and
/// `halo-bench-<op>-busbw.{svg,png}` (bus bandwidth; MB/s for `bw`). Returns the
/// files written.
///
/// # Errors
/// [`Error::SystemError`] when a file cannot be written; [`Error::InvalidArgument`]
/// when there is nothing to plot.
pub fn write_plots(dir: &Path, info: &RunInfo, rows: &[BenchRow]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::SystemError {
        message: format!("cannot create {}: {e}", dir.display()),
    })?;
    let algs = algorithms(rows);
    let series = |f: &dyn Fn(&BenchRow) -> f64| -> Vec<Series> {
        algs.iter()
            .map(|&a| Series {
                name: a.label(info.op).to_string(),
                points: rows
                    .iter()
                    .filter(|r| r.algorithm == a)
                    .map(|r| (r.size as f64, f(r)))
                    .collect(),
            })
            .collect()
    };
    let what = format!("{} ranks, {}", info.ranks, info.mode);
    let mut written = Vec::new();
    let bandwidth = info.op == Op::Bandwidth;
    let (bw_name, bw_label) = if bandwidth {
        ("bw", "MB/s")
    } else {
        ("busbw", "bus bandwidth (GB/s)")
    };
    let bw = |r: &BenchRow| {
        if bandwidth {
            r.mb_per_s()
        } else {
            r.bus_bw_gbs
        }
    };
    let plots: [(&str, String, &str, Vec<Series>); 2] = [
        (
            "latency",
            format!("halo bench {}: time ({what})", info.op),
            "time (us)",
            series(&|r| r.avg_us),
        ),
        (
            bw_name,
            format!("halo bench {}: {bw_label} ({what})", info.op),
            bw_label,
            series(&bw),
        ),
    ];
    for (name, title, y, s) in plots {
        for ext in ["svg", "png"] {
            let path = dir.join(format!("halo-bench-{}-{name}.{ext}", info.op));
            plot::line_plot(&path, &title, y, &s)?;
            written.push(path);
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use halo_collectives::Algorithm;

    fn info(op: Op) -> RunInfo {
        RunInfo {
            op,
            ranks: 4,
            topology: "nodes:2x2".into(),
            mode: "processes".into(),
            moe: None,
            rounds: 1,
            notes: Vec::new(),
        }
    }

    fn row(alg: BenchAlgo, size: usize, us: f64) -> BenchRow {
        BenchRow {
            op: Op::AllToAll,
            algorithm: alg,
            size,
            avg_us: us,
            min_us: us - 1.0,
            max_us: us + 1.0,
            iterations: 1000,
            alg_bw_gbs: size as f64 * 4.0 / us / 1e3,
            bus_bw_gbs: super::super::bus_bandwidth(size, 4, us * 1e-6),
            wrong: 0,
        }
    }

    #[test]
    fn osu_layout_is_exact() {
        let rows = [row(BenchAlgo::Halo(Some(Algorithm::Flat)), 1024, 12.345)];
        let text = format_osu(&info(Op::AllToAll), &rows, false, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "# OSU-style HALO All-to-All Personalized Exchange Latency Test (algorithm: flat, 4 ranks, topology nodes:2x2, processes)"
        );
        assert_eq!(lines[1], "# Size         Avg Latency(us)");
        assert_eq!(lines[2], "1024                     12.35");
        let full = format_osu(&info(Op::AllToAll), &rows, true, true);
        assert_eq!(
            full.lines().nth(2).unwrap(),
            "1024                     12.35               11.35               13.35        1000         0"
        );
    }

    #[test]
    fn nccl_tests_columns_and_busbw() {
        let rows = [row(BenchAlgo::Halo(Some(Algorithm::Halo)), 1024, 1.0)];
        let text = format_nccl_tests(&info(Op::AllToAll), &rows);
        let last = text.lines().last().unwrap();
        let cols: Vec<&str> = last.split_whitespace().collect();
        // 4 KiB per rank in all; algbw 4096 B / 1 us = 4.10 GB/s; busbw x 3/4 = 3.07.
        assert_eq!(cols, ["4096", "4096", "uint8", "1.00", "4.10", "3.07", "0"]);
    }

    #[test]
    fn compare_gives_ratios_against_flat_and_mpi() {
        let flat = BenchAlgo::Halo(Some(Algorithm::Flat));
        let halo = BenchAlgo::Halo(Some(Algorithm::Halo));
        let rows = [
            row(flat, 1, 100.0),
            row(halo, 1, 25.0),
            row(BenchAlgo::Mpi, 1, 50.0),
        ];
        let t = compare_table(&info(Op::AllToAll), &rows);
        assert!(t.contains("# Speed-up over the flat fan-out"), "{t}");
        let flat_line = t
            .lines()
            .skip_while(|l| !l.contains("flat fan-out"))
            .nth(2)
            .unwrap();
        assert_eq!(
            flat_line.split_whitespace().collect::<Vec<_>>(),
            ["1", "4.00x", "2.00x"]
        );
        let mpi_line = t
            .lines()
            .skip_while(|l| !l.contains("over MPI"))
            .nth(2)
            .unwrap();
        assert_eq!(
            mpi_line.split_whitespace().collect::<Vec<_>>(),
            ["1", "0.50x", "2.00x"]
        );
    }

    #[test]
    fn json_and_csv_carry_every_row() {
        let rows = [
            row(BenchAlgo::Mpi, 8, 3.0),
            row(BenchAlgo::Halo(None), 8, 2.0),
        ];
        let j: serde_json::Value =
            serde_json::from_str(&format_json(&info(Op::AllToAll), &rows)).unwrap();
        assert_eq!(j["rows"][1]["algorithm"], "auto");
        assert_eq!(j["rows"][0]["avg_us"], 3.0);
        let csv = format_csv(&info(Op::AllToAll), &rows);
        assert_eq!(csv.lines().count(), 3);
        assert!(
            csv.lines()
                .nth(1)
                .unwrap()
                .starts_with("alltoall,4,mpi,8,3.000,")
        );
        assert!(j.get("rounds").is_none());
    }

    #[test]
    fn several_rounds_are_named_in_every_format() {
        let rows = [
            row(BenchAlgo::Halo(Some(Algorithm::Flat)), 8, 3.0),
            row(BenchAlgo::Halo(None), 8, 2.0),
        ];
        let one = info(Op::AllToAll);
        let three = RunInfo {
            rounds: 3,
            ..one.clone()
        };
        let line = "# rounds: 3, median of per-round means";
        // One round: the reports as they were, no word of rounds.
        for text in [
            format_osu(&one, &rows, true, true),
            format_nccl_tests(&one, &rows),
            format_csv(&one, &rows),
            compare_table(&one, &rows),
        ] {
            assert!(!text.contains("round"), "{text}");
        }
        let osu = format_osu(&three, &rows, false, false);
        assert_eq!(osu.lines().next(), Some(line));
        // The rest is the one-round layout, line for line.
        assert_eq!(
            osu.lines().skip(1).collect::<Vec<_>>(),
            format_osu(&one, &rows, false, false)
                .lines()
                .collect::<Vec<_>>()
        );
        assert_eq!(format_nccl_tests(&three, &rows).lines().next(), Some(line));
        let j: serde_json::Value = serde_json::from_str(&format_json(&three, &rows)).unwrap();
        assert_eq!(j["rounds"], 3);
        assert_eq!(j["rounds_statistic"], "median of per-round means");
        assert_eq!(j["rows"][0]["avg_us"], 3.0);
        let csv = format_csv(&three, &rows);
        let lines: Vec<&str> = csv.lines().collect();
        assert!(lines[0].ends_with(",wrong,rounds"), "{csv}");
        assert!(lines[1].starts_with("alltoall,4,flat,8,3.000,") && lines[1].ends_with(",0,3"));
        assert_eq!(lines.len(), 3);
        let cmp = compare_table(&three, &rows);
        assert!(cmp.contains("time in us, median of 3 rounds"), "{cmp}");
    }
}
