//! `airlock conformance --prefix "<sandbox command>"`: grades any sandbox command line (bwrap,
//! firejail, unshare, airlock itself) with the attacks of airlock's own suite (the catalogue of
//! `airlock-attack`). Each attack program runs as `<prefix> python3 -B -c <program> <args>`;
//! wherever an attack has an effect outside the sandbox (a file, a connection, a dead or traced
//! process, a leaked secret) the verdict comes from that host-side evidence, never from what
//! the program claims. Attacks measured against limits only airlock can be given (`--pids 32`,
//! `--mem 128MiB` ...) are listed as skipped.

use std::path::PathBuf;
use std::time::Duration;

use airlock_attack::harness::{execute, run_all, Launch, Supervisor};
use airlock_attack::host::is_root;
use airlock_attack::judge::{grade, Grade};
use airlock_attack::{catalogue, Attack, Group, Scene, Stage};
use anyhow::{anyhow, Result};
use clap::Args;
use serde_json::{json, Value};

/// Arguments of `airlock conformance`.
#[derive(Args, Debug)]
pub struct ConformanceArgs {
    /// A sandbox command line the attack program is appended to, as a shell fragment, e.g.
    /// "bwrap --unshare-all --ro-bind / /" or "airlock run --" (repeatable: one row each).
    #[arg(long, required = true, value_name = "COMMAND")]
    pub prefix: Vec<String>,
    /// Row labels, in the order of --prefix (default: the prefix itself).
    #[arg(long, value_name = "NAME")]
    pub name: Vec<String>,
    /// The Python interpreter the attacks run with, as seen inside the sandbox.
    #[arg(long, default_value = "/usr/bin/python3")]
    pub python: String,
    /// Seconds before one attack is stopped.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Where the attacks' secret files, drop directories and sockets are made: somewhere
    /// sandboxes do not usually replace with a private tmpfs (as they do /tmp and /var/tmp).
    #[arg(long, default_value = "/var/lib", value_name = "DIR")]
    pub bait_dir: PathBuf,
    /// Print JSON instead of Markdown tables.
    #[arg(long)]
    pub json: bool,
}

/// Attacks run this many at a time; exclusive (resource-hungry) ones run alone afterwards.
const PARALLEL: usize = 3;

/// One attack's verdict under one sandbox.
#[derive(Debug, Clone)]
pub struct Graded {
    pub attack: &'static str,
    pub group: Group,
    pub threat: airlock_attack::Threat,
    pub grade: Grade,
    pub evidence: String,
    /// What stops it in airlock (from the catalogue).
    pub layers: &'static str,
}

/// One sandbox command line and its verdicts, in catalogue order.
pub struct Row {
    pub name: String,
    pub prefix: String,
    pub results: Vec<Graded>,
}

pub fn run(args: ConformanceArgs) -> Result<u8> {
    let mut rows = Vec::new();
    for (index, prefix) in args.prefix.iter().enumerate() {
        let name = args.name.get(index).unwrap_or(prefix).clone();
        let results = grade_sandbox(prefix, &args)?;
        rows.push(Row {
            name,
            prefix: prefix.clone(),
            results,
        });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&rows))?);
    } else {
        print!("{}", markdown(&rows));
    }
    let escaped = rows
        .iter()
        .flat_map(|row| &row.results)
        .any(|r| r.grade == Grade::Escaped);
    Ok(u8::from(escaped))
}

/// Runs the whole catalogue under `prefix`.
fn grade_sandbox(prefix: &str, args: &ConformanceArgs) -> Result<Vec<Graded>> {
    let sandbox_uid = match is_root() {
        true => 65534,
        false => nix::unistd::getuid().as_raw(),
    };
    let stage = Stage::create(
        &args.bait_dir,
        "airlock-conformance",
        &args.python,
        sandbox_uid,
    )
    .map_err(|e| anyhow!("{e} (choose another --bait-dir)"))?;
    let results = run_all(&catalogue(), PARALLEL, |index, attack| {
        grade_attack(&stage, index, attack, prefix, args)
    });
    stage.remove();
    Ok(results)
}

fn grade_attack(
    stage: &Stage,
    index: usize,
    attack: &Attack,
    prefix: &str,
    args: &ConformanceArgs,
) -> Graded {
    let (grade, evidence) = match attack.root_only.filter(|_| !is_root()) {
        Some(reason) => (Grade::Skipped, format!("needs root: {reason}")),
        None => match Scene::new(stage, attack.name, index) {
            Err(e) => (Grade::NotRun, format!("cannot set up: {e}")),
            Ok(mut scene) => {
                let verdict = run_in_scene(&mut scene, attack, prefix, args);
                scene.cleanup();
                verdict
            }
        },
    };
    Graded {
        attack: attack.name,
        group: attack.group,
        threat: attack.threat,
        grade,
        evidence,
        layers: attack.layers,
    }
}

fn run_in_scene(
    scene: &mut Scene,
    attack: &Attack,
    prefix: &str,
    args: &ConformanceArgs,
) -> (Grade, String) {
    let mut plan = match (attack.prepare)(scene) {
        Ok(plan) => plan,
        Err(reason) => return (Grade::NotRun, format!("cannot set up: {reason}")),
    };
    if !plan.limits.is_empty() {
        let limits = plan.limits.join(" ");
        return (
            Grade::Skipped,
            format!("measured against limits only airlock is given here ({limits})"),
        );
    }
    // `sh -c '<prefix> "$@"' NAME PROGRAM...`: the prefix is a shell fragment, the program is
    // appended; the sandbox's supervisor is then the shell's child.
    let mut line = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        format!("{} \"$@\"", absolute_command(prefix)),
        "airlock-conformance".into(),
    ];
    line.extend(plan.argv.iter().cloned());
    let launch = Launch {
        line,
        cwd: scene.dir.clone(),
        airlock_result: false,
        clear_env: false,
        deadline: Duration::from_secs(args.timeout),
        supervisor: Supervisor::ChildrenOfLaunched,
        pids: None,
    };
    match execute(&mut plan, launch) {
        Ok(outcome) => grade(&plan, &outcome),
        Err(e) => (Grade::NotRun, format!("the attack did not run: {e}")),
    }
}

/// `prefix` with a relative command path (`target/debug/airlock run --`) made absolute: each
/// attack runs in its own scene directory, not in the caller's.
fn absolute_command(prefix: &str) -> String {
    let trimmed = prefix.trim_start();
    let word = trimmed.split_whitespace().next().unwrap_or_default();
    let relative_path = word.contains('/') && !word.starts_with('/') && !word.contains('=');
    match std::fs::canonicalize(word) {
        Ok(path) if relative_path => {
            format!("{}{}", path.display(), &trimmed[word.len()..])
        }
        _ => prefix.to_string(),
    }
}

/// A group's verdict: escaped if any attack escaped, blocked if any was blocked, else not run;
/// `None` when every attack of the group was skipped (no column for it).
fn group_grade(results: &[Graded], group: Group) -> Option<(Grade, String)> {
    let of_group: Vec<&Graded> = results.iter().filter(|r| r.group == group).collect();
    let named = |grade: Grade| -> Vec<&str> {
        of_group
            .iter()
            .filter(|r| r.grade == grade)
            .map(|r| r.attack)
            .collect()
    };
    let (escaped, blocked, not_run) = (
        named(Grade::Escaped),
        named(Grade::Blocked),
        named(Grade::NotRun),
    );
    let ran = escaped.len() + blocked.len();
    let mut evidence = match (escaped.is_empty(), blocked.is_empty(), not_run.is_empty()) {
        (false, _, _) => format!("{} of {ran} escaped: {}", escaped.len(), escaped.join(", ")),
        (true, false, _) => format!("all {ran} blocked"),
        (true, true, false) => "no attack ran".to_string(),
        (true, true, true) => return None,
    };
    if !not_run.is_empty() && ran > 0 {
        evidence.push_str(&format!("; not run: {}", not_run.join(", ")));
    }
    let skipped = named(Grade::Skipped);
    if !skipped.is_empty() {
        evidence.push_str(&format!("; skipped: {}", skipped.join(", ")));
    }
    let grade = match (escaped.is_empty(), blocked.is_empty()) {
        (false, _) => Grade::Escaped,
        (true, false) => Grade::Blocked,
        (true, true) => Grade::NotRun,
    };
    Some((grade, evidence))
}

/// The groups with at least one attack run in some row, in table order.
fn columns(rows: &[Row]) -> Vec<Group> {
    Group::ALL
        .into_iter()
        .filter(|group| {
            rows.iter()
                .any(|row| group_grade(&row.results, *group).is_some())
        })
        .collect()
}

fn cell(grade: Grade) -> &'static str {
    match grade {
        Grade::Blocked => "blocked",
        Grade::Escaped => "**ESCAPED**",
        Grade::NotRun => "n/a",
        Grade::Skipped => "skip",
    }
}

fn markdown(rows: &[Row]) -> String {
    let columns = columns(rows);
    let names: Vec<&str> = columns.iter().map(|g| g.name()).collect();
    let mut out = format!(
        "| sandbox | {} |\n|---|{}\n",
        names.join(" | "),
        "---|".repeat(names.len())
    );
    for row in rows {
        let cells: Vec<&str> = columns
            .iter()
            .map(|g| group_grade(&row.results, *g).map_or("skip", |(grade, _)| cell(grade)))
            .collect();
        out.push_str(&format!("| {} | {} |\n", row.name, cells.join(" | ")));
    }
    out.push_str(&per_attack_table(rows));
    out.push_str("\nevidence:\n");
    for row in rows {
        for group in &columns {
            if let Some((_, evidence)) = group_grade(&row.results, *group) {
                out.push_str(&format!("- {} / {}: {evidence}\n", row.name, group.name()));
            }
        }
    }
    for row in rows {
        for r in &row.results {
            out.push_str(&format!("- {} / {}: {}\n", row.name, r.attack, r.evidence));
        }
    }
    out
}

/// One line per attack, one column per sandbox.
fn per_attack_table(rows: &[Row]) -> String {
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    let mut out = format!(
        "\n| attack | class | threat | {} |\n|---|---|---|{}\n",
        names.join(" | "),
        "---|".repeat(names.len())
    );
    let Some(first) = rows.first() else {
        return out;
    };
    for (index, attack) in first.results.iter().enumerate() {
        let cells: Vec<&str> = rows
            .iter()
            .map(|row| row.results.get(index).map_or("", |r| cell(r.grade)))
            .collect();
        out.push_str(&format!(
            "| {} | {} | {:?} | {} |\n",
            attack.attack,
            attack.group.name(),
            attack.threat,
            cells.join(" | ")
        ));
    }
    out
}

/// One object per row: `attacks` has a verdict per group (the table's columns), `results` one
/// per attack.
fn to_json(rows: &[Row]) -> Value {
    let columns = columns(rows);
    let rows: Vec<Value> = rows
        .iter()
        .map(|row| {
            let groups: Vec<Value> = columns
                .iter()
                .filter_map(|g| group_grade(&row.results, *g).map(|graded| (g, graded)))
                .map(|(g, (grade, evidence))| json!({"class": g.name(), "verdict": grade.name(), "evidence": evidence}))
                .collect();
            let results: Vec<Value> = row
                .results
                .iter()
                .map(|r| json!({"attack": r.attack, "class": r.group.name(), "threat": format!("{:?}", r.threat), "verdict": r.grade.name(), "evidence": r.evidence, "stopped_in_airlock_by": r.layers}))
                .collect();
            json!({"name": row.name, "prefix": row.prefix, "attacks": groups, "results": results})
        })
        .collect();
    Value::Array(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_attack::Threat;

    fn graded(attack: &'static str, group: Group, grade: Grade) -> Graded {
        Graded {
            attack,
            group,
            threat: Threat::C,
            grade,
            evidence: format!("{attack} evidence"),
            layers: "",
        }
    }

    #[test]
    fn a_relative_command_path_is_made_absolute() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            absolute_command("src/main.rs --flag x"),
            format!("{}/src/main.rs --flag x", cwd.display())
        );
        for unchanged in ["env", "/usr/bin/env -i", "FOO=a/b env", "no/such/tool --x"] {
            assert_eq!(absolute_command(unchanged), unchanged);
        }
    }

    #[test]
    fn the_table_has_a_column_per_class() {
        let results = Group::ALL
            .iter()
            .map(|g| graded(g.name(), *g, Grade::Blocked))
            .collect();
        let rows = [Row {
            name: "bare".into(),
            prefix: "env".into(),
            results,
        }];
        let table = markdown(&rows);
        let header = table.lines().next().unwrap();
        assert_eq!(header.matches('|').count(), Group::ALL.len() + 2);
        assert!(table
            .lines()
            .nth(2)
            .unwrap()
            .starts_with("| bare | blocked |"));
    }

    #[test]
    fn a_group_escapes_if_any_attack_escaped_and_is_hidden_if_all_were_skipped() {
        let results = vec![
            graded("read_a", Group::FsRead, Grade::Blocked),
            graded("read_b", Group::FsRead, Grade::Escaped),
            graded("read_c", Group::FsRead, Grade::NotRun),
            graded("write_a", Group::FsWrite, Grade::Blocked),
            graded("write_b", Group::FsWrite, Grade::NotRun),
            graded("bomb", Group::Resources, Grade::Skipped),
        ];
        let (grade, evidence) = group_grade(&results, Group::FsRead).unwrap();
        assert_eq!(grade, Grade::Escaped);
        assert_eq!(evidence, "1 of 2 escaped: read_b; not run: read_c");
        assert_eq!(
            group_grade(&results, Group::FsWrite).unwrap(),
            (
                Grade::Blocked,
                "all 1 blocked; not run: write_b".to_string()
            )
        );
        assert_eq!(group_grade(&results, Group::Resources), None);
        let rows = [Row {
            name: "x".into(),
            prefix: "env".into(),
            results,
        }];
        assert_eq!(columns(&rows), [Group::FsRead, Group::FsWrite]);
        let json = to_json(&rows);
        assert_eq!(json[0]["attacks"].as_array().unwrap().len(), 2);
        assert_eq!(json[0]["results"][5]["verdict"], "skipped");
        assert!(markdown(&rows).contains("| bomb | resources | C | skip |"));
    }
}
