//! How a run ended: the init's stop reason, the limit evidence and the program's own exit,
//! decided in one place.

use std::time::Duration;

use nix::sys::signal::Signal;

use super::watch::StopCause;
use super::ExitReport;
use crate::result::RunStatus;
use crate::spec::StopReason;

/// Sandbox tools (bwrap, runc, runsc) report a program killed by signal N as exit code 128+N,
/// so for wrapped runs such a code is the signal. (A program that exits 128+N by itself looks
/// the same through these tools; limit kills are what must not be misread.)
pub(super) fn decode_tool_signal(report: ExitReport) -> ExitReport {
    match report.exit_code {
        Some(code) if (129..=128 + 64).contains(&code) => ExitReport {
            exit_code: None,
            signal: Some(code - 128),
            ..report
        },
        _ => report,
    }
}

/// What the init knows when it decides how a run ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Evidence {
    pub stop: Option<StopCause>,
    pub exit: ExitReport,
    pub oom_kills: u64,
    pub cpu_used: Duration,
    pub cpu_limit: Duration,
}

/// The status of a run: the init's own stop reason first, then the limit evidence, then how
/// the program ended.
pub(crate) fn decide_status(e: &Evidence) -> RunStatus {
    const SIGKILL: i32 = Signal::SIGKILL as i32;
    match e.stop {
        Some(StopCause::Timeout) => return RunStatus::Timeout,
        Some(StopCause::CpuLimit) => return RunStatus::CpuLimit,
        Some(StopCause::Requested(StopReason::OutputLimit)) => return RunStatus::OutputLimit,
        Some(StopCause::Requested(StopReason::Cancelled)) | Some(StopCause::SupervisorGone) => {
            return RunStatus::Cancelled
        }
        None => {}
    }
    let signal = e.exit.signal;
    if e.oom_kills > 0 {
        RunStatus::MemoryLimit
    } else if signal == Some(Signal::SIGXCPU as i32)
        || (signal == Some(SIGKILL) && e.cpu_used >= e.cpu_limit)
    {
        RunStatus::CpuLimit
    } else if signal == Some(Signal::SIGXFSZ as i32) || e.exit.file_size_hit {
        RunStatus::FileSizeLimit
    } else if signal.is_some() {
        RunStatus::Signaled
    } else {
        RunStatus::Exited
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(exit: ExitReport) -> Evidence {
        Evidence {
            stop: None,
            exit,
            oom_kills: 0,
            cpu_used: Duration::ZERO,
            cpu_limit: Duration::from_secs(10),
        }
    }

    #[test]
    fn stop_reasons_win_over_exit_details() {
        let mut e = evidence(ExitReport {
            signal: Some(15),
            ..Default::default()
        });
        e.stop = Some(StopCause::Timeout);
        assert_eq!(decide_status(&e), RunStatus::Timeout);
        e.stop = Some(StopCause::Requested(StopReason::OutputLimit));
        assert_eq!(decide_status(&e), RunStatus::OutputLimit);
    }

    #[test]
    fn limit_evidence_maps_to_limit_statuses() {
        let mut e = evidence(ExitReport {
            signal: Some(9),
            ..Default::default()
        });
        e.oom_kills = 1;
        assert_eq!(decide_status(&e), RunStatus::MemoryLimit);
        let e = evidence(ExitReport {
            signal: Some(Signal::SIGXCPU as i32),
            ..Default::default()
        });
        assert_eq!(decide_status(&e), RunStatus::CpuLimit);
        let e = evidence(ExitReport {
            exit_code: Some(1),
            file_size_hit: true,
            ..Default::default()
        });
        assert_eq!(decide_status(&e), RunStatus::FileSizeLimit);
    }

    #[test]
    fn plain_endings_stay_plain() {
        assert_eq!(
            decide_status(&evidence(ExitReport {
                exit_code: Some(3),
                ..Default::default()
            })),
            RunStatus::Exited
        );
        assert_eq!(
            decide_status(&evidence(ExitReport {
                signal: Some(11),
                ..Default::default()
            })),
            RunStatus::Signaled
        );
    }
}
