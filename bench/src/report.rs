//! The result table: plain text for the terminal, markdown for BENCHMARKS.md, and the check of
//! the targets.

use std::fmt::Write;
use std::time::Duration;

use crate::stats::{ms, summarize, Summary};
use crate::tools::{
    BARE, BWRAP, BWRAP_FLOOR, BWRAP_SAME_ARGS, CRUN_SAME_BUNDLE, NATIVE, NATIVE_ALLOWLIST,
    PODMAN_SAME_ARGV, RUNC_SAME_BUNDLE, RUNSC_SAME_BUNDLE, RUNSC_SAME_BUNDLE_PRESIZED, SNIPPET,
};
use crate::warm::{WARM, WARM_PYTHON};

const TARGET_WORKLOAD: &str = "/bin/true";
const PYTHON_WORKLOAD: &str = "python3 -c pass";
/// At most this many milliseconds for a gated run over the same run without network.
const TARGET_GATE_START_MS: f64 = 2.0;

/// What a target holds a row's median (or CPU median) against.
#[derive(Clone, Copy)]
enum Bound {
    /// At most this many milliseconds over bare exec's median.
    OverBareMs(f64),
    /// At most this factor of bare exec's median.
    TimesBare(f64),
    /// At most this factor of another tool's median.
    Times(&'static str, f64),
    /// A median CPU time (user + system of the whole tree) of at most this many ms.
    CpuMs(f64),
    /// A median of at most this many ms.
    Ms(f64),
}

/// The targets of issue 19: the cold path restated, and the warm path.
const TARGETS: &[(&str, &str, Bound)] = &[
    (NATIVE, TARGET_WORKLOAD, Bound::Times(BWRAP, 1.3)),
    (NATIVE, TARGET_WORKLOAD, Bound::Times(BWRAP_FLOOR, 0.8)),
    (NATIVE, TARGET_WORKLOAD, Bound::CpuMs(6.0)),
    (NATIVE, PYTHON_WORKLOAD, Bound::Times(BWRAP, 1.15)),
    (WARM, TARGET_WORKLOAD, Bound::OverBareMs(1.0)),
    (WARM, PYTHON_WORKLOAD, Bound::TimesBare(1.1)),
    (WARM_PYTHON, SNIPPET, Bound::Ms(3.0)),
];
/// A wrapping backend adds less than this factor over its tool started directly with the same
/// configuration.
const TARGET_OVER_PEER: f64 = 1.10;

/// How a wrapping backend's row compares with a peer's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Judged {
    /// Against the target.
    Target,
    /// For reference only (the floor wrapper, the peer without airlock's presized table).
    Reference,
}

/// Each wrapping backend and the peers it is compared with.
const WRAPPER_PAIRS: &[(&str, &str, Judged)] = &[
    // bwrap's peer is the floor: bwrap with airlock's per-run guarantees built in C.
    ("airlock-bwrap", BWRAP_FLOOR, Judged::Target),
    ("airlock-bwrap", BWRAP_SAME_ARGS, Judged::Reference),
    ("airlock-container", RUNC_SAME_BUNDLE, Judged::Target),
    ("airlock-crun", CRUN_SAME_BUNDLE, Judged::Target),
    ("airlock-podman", PODMAN_SAME_ARGV, Judged::Target),
    ("airlock-gvisor", RUNSC_SAME_BUNDLE_PRESIZED, Judged::Target),
    ("airlock-gvisor", RUNSC_SAME_BUNDLE, Judged::Reference),
];

const HEADER: [&str; 9] = [
    "tool", "workload", "median", "p99", "min", "+ bare", "x bare", "x bwrap", "cpu",
];

/// One line of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub tool: String,
    pub workload: &'static str,
    pub summary: Summary,
    /// Median CPU time (user + system) of the launcher and all its descendants.
    pub cpu_median: Duration,
    pub vs_bare: Option<f64>,
    pub vs_bwrap: Option<f64>,
    pub over_bare_ms: Option<f64>,
}

impl Row {
    pub fn new(
        tool: &str,
        workload: &'static str,
        wall: &[Duration],
        cpu: &[Duration],
    ) -> Option<Row> {
        let summary = summarize(wall)?;
        let cpu_median = summarize(cpu).map_or(Duration::ZERO, |s| s.median);
        Some(Row {
            tool: tool.to_string(),
            workload,
            summary,
            cpu_median,
            vs_bare: None,
            vs_bwrap: None,
            over_bare_ms: None,
        })
    }

    fn cells(&self) -> [String; 9] {
        let s = &self.summary;
        [
            self.tool.clone(),
            self.workload.to_string(),
            format!("{:.2}", ms(s.median)),
            format!("{:.2}", ms(s.p99)),
            format!("{:.2}", ms(s.min)),
            self.over_bare_ms
                .map_or("-".to_string(), |v| format!("{v:+.2}")),
            ratio(self.vs_bare),
            ratio(self.vs_bwrap),
            format!("{:.2}", ms(self.cpu_median)),
        ]
    }
}

/// Fills the ratios to the bare and bwrap medians of the same workload.
pub fn with_ratios(mut rows: Vec<Row>) -> Vec<Row> {
    let median_of = |rows: &[Row], tool: &str, workload: &str| {
        rows.iter()
            .find(|r| r.tool == tool && r.workload == workload)
            .map(|r| ms(r.summary.median))
    };
    let references: Vec<(Option<f64>, Option<f64>)> = rows
        .iter()
        .map(|r| {
            (
                median_of(&rows, BARE, r.workload),
                median_of(&rows, BWRAP, r.workload),
            )
        })
        .collect();
    for (row, (bare, bwrap)) in rows.iter_mut().zip(references) {
        let median = ms(row.summary.median);
        row.vs_bare = bare.map(|b| median / b);
        row.vs_bwrap = bwrap.map(|b| median / b);
        row.over_bare_ms = bare.map(|b| median - b);
    }
    rows
}

fn ratio(value: Option<f64>) -> String {
    value.map_or("-".to_string(), |v| format!("{v:.2}x"))
}

fn caption(runs: usize) -> String {
    format!(
        "{runs} runs per pair, times in ms: wall clock from spawn to reaped exit (median, p99, min); \
         cpu = median user+sys time of the launcher's whole process tree"
    )
}

pub fn plain(rows: &[Row], runs: usize, egress: &[String], notes: &[String]) -> String {
    let mut out = caption(runs) + "\n";
    let line = |cells: &[String]| {
        format!(
            "{:<30} {:<16} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8} {:>7}\n",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            cells[6],
            cells[7],
            cells[8]
        )
    };
    out += &line(&HEADER.map(str::to_string));
    for row in rows {
        out += &line(&row.cells());
    }
    for text in target_lines(rows)
        .into_iter()
        .chain(wrapper_lines(rows))
        .chain(egress.iter().cloned())
        .chain(notes.iter().map(|n| format!("note: {n}")))
    {
        let _ = writeln!(out, "{text}");
    }
    out
}

pub fn markdown(rows: &[Row], runs: usize, egress: &[String], notes: &[String]) -> String {
    let mut out = caption(runs) + ".\n\n";
    let _ = writeln!(out, "| {} |", HEADER.join(" | "));
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let mut cells = row.cells();
        cells[1] = format!("`{}`", cells[1]);
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    let _ = writeln!(out);
    for text in target_lines(rows)
        .into_iter()
        .chain(wrapper_lines(rows))
        .chain(egress.iter().cloned())
        .chain(notes.iter().map(|n| format!("note: {n}")))
    {
        let _ = writeln!(out, "- {text}");
    }
    out
}

/// Whether a row is `name`'s configuration (also the `--baseline` build's).
fn is_tool(tool: &str, name: &str) -> bool {
    tool == name
        || tool
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('@'))
}

/// The targets, one met / NOT met line each for every row they apply to.
fn target_lines(rows: &[Row]) -> Vec<String> {
    let median = |tool: &str, workload: &str| {
        rows.iter()
            .find(|r| r.tool == tool && r.workload == workload)
            .map(|r| ms(r.summary.median))
    };
    let mut lines = gate_start_lines(rows);
    for (name, workload, bound) in TARGETS {
        for r in rows
            .iter()
            .filter(|r| is_tool(&r.tool, name) && r.workload == *workload)
        {
            let ours = ms(r.summary.median);
            let (met, said) = match *bound {
                Bound::OverBareMs(limit) => match median(BARE, workload) {
                    Some(bare) => (
                        ours - bare <= limit,
                        format!("<= bare + {limit} ms ({:+.2} ms)", ours - bare),
                    ),
                    None => continue,
                },
                Bound::TimesBare(limit) => match median(BARE, workload) {
                    Some(bare) => (
                        ours / bare <= limit,
                        format!("<= {limit}x bare ({:.2}x)", ours / bare),
                    ),
                    None => continue,
                },
                Bound::Times(peer, limit) => match median(peer, workload) {
                    Some(theirs) => (
                        ours / theirs <= limit,
                        format!("<= {limit}x {peer} ({:.2}x)", ours / theirs),
                    ),
                    None => continue,
                },
                Bound::Ms(limit) => (ours <= limit, format!("<= {limit} ms ({ours:.2} ms)")),
                Bound::CpuMs(limit) => {
                    let cpu = ms(r.cpu_median);
                    (cpu <= limit, format!("cpu <= {limit} ms ({cpu:.2} ms)"))
                }
            };
            let verdict = if met { "met" } else { "NOT met" };
            lines.push(format!("target {} {said} on {workload}: {verdict}", r.tool));
        }
    }
    lines
}

/// The start-up cost of the egress gate: a gated run (`--allow-net`) over the same run without
/// network, on `/bin/true`.
fn gate_start_lines(rows: &[Row]) -> Vec<String> {
    let median = |tool: &str| {
        rows.iter()
            .find(|r| r.tool == tool && r.workload == TARGET_WORKLOAD)
            .map(|r| ms(r.summary.median))
    };
    let (Some(gated), Some(plain)) = (median(NATIVE_ALLOWLIST), median(NATIVE)) else {
        return Vec::new();
    };
    let over = gated - plain;
    let verdict = if over <= TARGET_GATE_START_MS {
        "met"
    } else {
        "NOT met"
    };
    vec![format!(
        "target {NATIVE_ALLOWLIST} <= {NATIVE} + {TARGET_GATE_START_MS} ms on {TARGET_WORKLOAD}: {verdict} ({over:+.2} ms)"
    )]
}

/// Each wrapping backend over the peers it drives, per workload, with the target's verdict.
/// Each wrapping backend over the peers it drives, per workload, with the target's verdict.
fn wrapper_lines(rows: &[Row]) -> Vec<String> {
    let median = |tool: &str, workload: &str| {
        rows.iter()
            .find(|r| r.tool == tool && r.workload == workload)
            .map(|r| ms(r.summary.median))
    };
    let mut lines = Vec::new();
    for (airlock, peer, judged) in WRAPPER_PAIRS {
        for workload in rows
            .iter()
            .filter(|r| r.tool == *airlock)
            .map(|r| r.workload)
        {
            let (Some(ours), Some(theirs)) = (median(airlock, workload), median(peer, workload))
            else {
                continue;
            };
            let factor = ours / theirs;
            let verdict = match (judged, factor < TARGET_OVER_PEER) {
                (Judged::Reference, _) => "reference".to_string(),
                (Judged::Target, true) => format!("target < {TARGET_OVER_PEER:.2}x: met"),
                (Judged::Target, false) => format!("target < {TARGET_OVER_PEER:.2}x: NOT met"),
            };
            lines.push(format!(
                "wrapper {airlock} over {peer} on {workload}: {factor:.2}x ({verdict})"
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tool: &'static str, workload: &'static str, median_ms: u64) -> Row {
        Row::new(tool, workload, &[Duration::from_millis(median_ms)], &[]).unwrap()
    }

    #[test]
    fn ratios_use_the_same_workload() {
        let rows = with_ratios(vec![
            row(BARE, "a", 1),
            row(BWRAP, "a", 2),
            row(NATIVE, "a", 3),
            row(BARE, "b", 10),
            row(NATIVE, "b", 20),
        ]);
        assert_eq!(rows[2].vs_bare, Some(3.0));
        assert_eq!(rows[2].vs_bwrap, Some(1.5));
        assert_eq!(rows[4].vs_bare, Some(2.0));
        assert_eq!(rows[4].vs_bwrap, None);
    }

    #[test]
    fn targets_say_not_met_when_missed() {
        let rows = with_ratios(vec![
            row(BARE, TARGET_WORKLOAD, 1),
            row(BWRAP, TARGET_WORKLOAD, 2),
            row(NATIVE, TARGET_WORKLOAD, 5),
            row(WARM, TARGET_WORKLOAD, 3),
        ]);
        let lines = target_lines(&rows);
        // vs bwrap, cpu (no floor row: that target is not judged), warm over bare.
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines
                .iter()
                .filter(|l| !l.contains("cpu"))
                .all(|l| l.contains("NOT met")),
            "{lines:?}"
        );
        let rows = with_ratios(vec![
            row(BARE, TARGET_WORKLOAD, 2),
            row(BWRAP, TARGET_WORKLOAD, 3),
            row(BWRAP_FLOOR, TARGET_WORKLOAD, 5),
            row(NATIVE, TARGET_WORKLOAD, 3),
            row(WARM, TARGET_WORKLOAD, 3),
        ]);
        let lines = target_lines(&rows);
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(lines.iter().all(|l| l.contains(": met")), "{lines:?}");
    }

    #[test]
    fn wrappers_are_judged_against_their_same_config_peer_only() {
        let rows = vec![
            row("airlock-bwrap", TARGET_WORKLOAD, 12),
            row(BWRAP_SAME_ARGS, TARGET_WORKLOAD, 8),
            row(BWRAP_FLOOR, TARGET_WORKLOAD, 11),
            row("airlock-container", TARGET_WORKLOAD, 32),
            row(RUNC_SAME_BUNDLE, TARGET_WORKLOAD, 30),
            row("airlock-crun", TARGET_WORKLOAD, 20),
        ];
        let lines = wrapper_lines(&rows);
        assert_eq!(
            lines,
            [
                "wrapper airlock-bwrap over bwrap-airlock-argv-floor on /bin/true: 1.09x (target < 1.10x: met)",
                "wrapper airlock-bwrap over bwrap-airlock-argv on /bin/true: 1.50x (reference)",
                "wrapper airlock-container over runc-airlock-bundle on /bin/true: 1.07x (target < 1.10x: met)",
            ]
        );
    }

    #[test]
    fn targets_apply_to_their_configuration_and_its_baseline_only() {
        assert!(is_tool("airlock-native", NATIVE) && is_tool("airlock-native@baseline", NATIVE));
        assert!(!is_tool("airlock-native-nocg", NATIVE) && !is_tool("airlock-none", NATIVE));
    }

    #[test]
    fn the_gates_start_up_is_judged_against_the_same_run_without_network() {
        let rows = vec![
            row(NATIVE, TARGET_WORKLOAD, 10),
            row(NATIVE_ALLOWLIST, TARGET_WORKLOAD, 11),
        ];
        assert_eq!(
            gate_start_lines(&rows),
            ["target airlock-native-allowlist <= airlock-native + 2 ms on /bin/true: met (+1.00 ms)"]
        );
        let slow = vec![
            row(NATIVE, TARGET_WORKLOAD, 10),
            row(NATIVE_ALLOWLIST, TARGET_WORKLOAD, 13),
        ];
        assert!(gate_start_lines(&slow)[0].contains("NOT met"));
    }
}
