//! The JSON a run tool answers with: the library's [`RunResult`] (status, exit code, output,
//! the isolation layers in force, warnings) plus `limits_hit`, named as the policy's limits,
//! and `network`: the run's own network record once the library has one, else the mode in
//! force.

use serde_json::{json, Value};

use airlock::{Policy, RunResult, RunStatus};

/// The limits a result shows were reached, named as in `[limits]` of a profile.
pub fn limits_hit(result: &RunResult) -> Vec<&'static str> {
    let mut hit = match result.status {
        RunStatus::Timeout => vec!["wall_time"],
        RunStatus::MemoryLimit => vec!["memory"],
        RunStatus::CpuLimit => vec!["cpu_time"],
        RunStatus::FileSizeLimit => vec!["file_size"],
        _ => vec![],
    };
    if result.stdout_truncated {
        hit.push("stdout");
    }
    if result.stderr_truncated {
        hit.push("stderr");
    }
    if result.status == RunStatus::OutputLimit && hit.is_empty() {
        hit.push("output");
    }
    hit
}

/// The run's report for the model.
pub fn run_report(result: &RunResult, policy: &Policy) -> Value {
    let mut report = serde_json::to_value(result).unwrap_or_else(|_| json!({}));
    if let Value::Object(fields) = &mut report {
        fields.insert("limits_hit".into(), json!(limits_hit(result)));
        fields
            .entry("network")
            .or_insert_with(|| json!({ "mode": policy.network.mode }));
        // The host path of a kept workdir means nothing to the model.
        fields.remove("workdir");
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(status: RunStatus) -> RunResult {
        // Built on a refusal's result so that fields the library adds need no change here.
        RunResult {
            status,
            wall_ms: 1,
            stdout: Some(String::new()),
            stderr: Some(String::new()),
            backend: "native".into(),
            error: None,
            error_kind: None,
            ..RunResult::not_started(airlock::ErrorKind::Io, "")
        }
    }

    #[test]
    fn each_limit_status_names_its_limit() {
        assert_eq!(limits_hit(&result(RunStatus::Timeout)), ["wall_time"]);
        assert_eq!(limits_hit(&result(RunStatus::MemoryLimit)), ["memory"]);
        assert_eq!(limits_hit(&result(RunStatus::CpuLimit)), ["cpu_time"]);
        assert!(limits_hit(&result(RunStatus::Exited)).is_empty());
    }

    #[test]
    fn an_output_flood_names_the_stream_that_overflowed() {
        let mut flood = result(RunStatus::OutputLimit);
        flood.stdout_bytes = 5 << 20;
        flood.stdout_truncated = true;
        assert_eq!(limits_hit(&flood), ["stdout"]);
        let mut err_flood = result(RunStatus::OutputLimit);
        err_flood.stderr_bytes = 5 << 20;
        err_flood.stderr_truncated = true;
        assert_eq!(limits_hit(&err_flood), ["stderr"]);
    }

    #[test]
    fn the_report_carries_status_limits_and_network() {
        let policy = airlock::policy::load_profile("untrusted").unwrap();
        let report = run_report(&result(RunStatus::Timeout), &policy);
        assert_eq!(report["status"], "timeout");
        assert_eq!(report["limits_hit"], json!(["wall_time"]));
        assert_eq!(report["network"]["mode"], "none");
    }
}
