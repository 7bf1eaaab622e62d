//! Verdicts from host-side evidence: strict ones for airlock's own suite (a contained run must
//! also return a sane result), plain ones for grading any sandbox command line.

use crate::plan::{Lifecycle, Outcome, Plan};

/// A verdict of airlock's own suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    Skip,
}

/// Judges an airlock run: `must_escape` runs need the evidence; contained runs need its
/// absence and a sane result (a RunResult, not `sandbox_error`, an attack that tried).
pub fn judge(must_escape: bool, plan: &Plan, outcome: &Outcome) -> (Verdict, String) {
    let evidence = (plan.evidence)(outcome);
    let summary = format!(
        "[{:?} in {} ms]",
        outcome.status.as_deref().unwrap_or("no result"),
        outcome.elapsed.as_millis()
    );
    if must_escape {
        return match evidence {
            Some(evidence) => (Verdict::Pass, format!("escaped as expected: {evidence} {summary}")),
            None => (Verdict::Fail, format!("the attack did not get through, so its check proves nothing {summary}; output: {}", excerpt(outcome))),
        };
    }
    if let Some(evidence) = evidence {
        if let Some(layer) = plan
            .stopped_by
            .filter(|l| !outcome.layers.iter().any(|have| have == l))
        {
            return (Verdict::Pass, format!("not enforced, and reported so (no {layer} in the result): {evidence} {summary}"));
        }
        return (Verdict::Fail, format!("ESCAPED: {evidence} {summary}"));
    }
    match sane(plan, outcome) {
        Ok(()) => (
            Verdict::Pass,
            format!("contained: {} {summary}", blocked_reason(&outcome.text)),
        ),
        Err(why) => (
            Verdict::Fail,
            format!("no evidence, but the result is not sane: {why} {summary}"),
        ),
    }
}

fn sane(plan: &Plan, outcome: &Outcome) -> Result<(), String> {
    if let Lifecycle::KillWhenReady { .. } = plan.lifecycle {
        return Ok(());
    }
    match (&outcome.status, &plan.expect) {
        (None, _) => Err(format!("airlock returned no result; {}", excerpt(outcome))),
        (Some(status), _) if status == "sandbox_error" => {
            Err(format!("sandbox_error; {}", excerpt(outcome)))
        }
        (Some(_), Some(expect)) => expect(outcome),
        // A contained verdict means something only if the attack ran far enough to try.
        (Some(_), None) if !outcome.reported() => Err(format!(
            "the attack program never reported; {}",
            excerpt(outcome)
        )),
        (Some(_), None) => Ok(()),
    }
}

/// How one attack went under a foreign (or any) sandbox command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grade {
    Blocked,
    Escaped,
    /// The attack program did not run (the sandbox refused to start, python missing, ...).
    NotRun,
    /// The harness did not run it (it needs limits only airlock can be given, or root).
    Skipped,
}

impl Grade {
    pub fn name(self) -> &'static str {
        match self {
            Grade::Blocked => "blocked",
            Grade::Escaped => "escaped",
            Grade::NotRun => "not_run",
            Grade::Skipped => "skipped",
        }
    }
}

/// Grades by host-side evidence; what the program printed only decides whether it ran at all
/// (and is the evidence for kernel interfaces whose sole effect is inside the caller).
pub fn grade(plan: &Plan, outcome: &Outcome) -> (Grade, String) {
    if let Some(evidence) = (plan.evidence)(outcome) {
        let source = match evidence.starts_with("ESCAPED") {
            true => "the attack reported",
            false => "host evidence",
        };
        return (Grade::Escaped, format!("{source}: {evidence}"));
    }
    if outcome.reported() {
        let said = outcome
            .text
            .lines()
            .filter(|l| l.starts_with("BLOCKED") || l.starts_with("ESCAPED") || *l == "READY")
            .collect::<Vec<_>>()
            .join("; ");
        return (
            Grade::Blocked,
            format!("no host evidence; the attack said: {said}"),
        );
    }
    let stderr: String = outcome.cli_stderr.trim().chars().take(300).collect();
    let stderr = if stderr.is_empty() {
        "no output"
    } else {
        &stderr
    };
    (Grade::NotRun, format!("the attack did not run: {stderr}"))
}

/// What the program saw: its first refusal, else its first line (an attack may "succeed"
/// inside the sandbox's own view, e.g. write to the sandbox's private /tmp).
pub fn blocked_reason(text: &str) -> String {
    match text.lines().find(|l| l.starts_with("BLOCKED")) {
        Some(line) => line.trim_start_matches("BLOCKED ").to_string(),
        None => format!(
            "program said {:?}",
            text.lines().find(|l| !l.trim().is_empty()).unwrap_or("")
        ),
    }
}

/// The program's output and the launcher's stderr, cut to a readable length.
pub fn excerpt(outcome: &Outcome) -> String {
    let mut all = format!(
        "{} | cli: {}",
        outcome.text.trim(),
        outcome.cli_stderr.trim()
    );
    if all.len() > 400 {
        let mut cut = 400;
        while !all.is_char_boundary(cut) {
            cut -= 1;
        }
        all.truncate(cut);
        all.push('…');
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::escaped_line;

    fn outcome(text: &str) -> Outcome {
        Outcome {
            text: text.into(),
            cli_stderr: "bwrap: boom".into(),
            ..Outcome::default()
        }
    }

    /// A plan judged by a host-side check that finds (or does not find) its evidence.
    fn host_checked(found: bool) -> Plan {
        Plan::new(Vec::new(), move |_: &Outcome| {
            found.then(|| "a file appeared".to_string())
        })
    }

    #[test]
    fn host_evidence_overrides_the_attacks_claim() {
        let graded = |found, text| grade(&host_checked(found), &outcome(text)).0;
        assert_eq!(graded(true, "BLOCKED no\n"), Grade::Escaped);
        assert_eq!(graded(false, "ESCAPED wrote\n"), Grade::Blocked);
        let (not_run, evidence) = grade(&host_checked(false), &outcome(""));
        assert_eq!(not_run, Grade::NotRun);
        assert!(evidence.contains("bwrap: boom"));
    }

    #[test]
    fn any_escape_line_fails_a_self_reported_attack() {
        let plan = Plan::new(Vec::new(), escaped_line);
        let graded = |text| grade(&plan, &outcome(text)).0;
        assert_eq!(graded("ESCAPED keyctl\nBLOCKED x\n"), Grade::Escaped);
        assert_eq!(graded("BLOCKED all\n"), Grade::Blocked);
        assert_eq!(graded("Traceback\n"), Grade::NotRun);
    }

    #[test]
    fn a_contained_run_must_have_a_sane_result() {
        let plan = host_checked(false);
        let mut run = outcome("BLOCKED refused\n");
        assert_eq!(judge(false, &plan, &run).0, Verdict::Fail, "no result");
        run.status = Some("sandbox_error".into());
        assert_eq!(judge(false, &plan, &run).0, Verdict::Fail);
        run.status = Some("exited".into());
        assert_eq!(judge(false, &plan, &run).0, Verdict::Pass);
        assert_eq!(judge(true, &plan, &run).0, Verdict::Fail, "must escape");
        run.text = "Traceback\n".into();
        assert_eq!(judge(false, &plan, &run).0, Verdict::Fail, "never tried");
    }

    #[test]
    fn an_escape_past_a_layer_the_result_does_not_claim_is_reported_not_failed() {
        let plan = host_checked(true).stopped_by("inode_quota");
        let mut run = outcome("ESCAPED created 3000 files\n");
        run.status = Some("exited".into());
        let (verdict, detail) = judge(false, &plan, &run);
        assert_eq!(verdict, Verdict::Pass);
        assert!(detail.contains("not enforced, and reported so"), "{detail}");
        run.layers = vec!["inode_quota".into()];
        assert_eq!(judge(false, &plan, &run).0, Verdict::Fail);
    }
}
