//! A code run on an interpreter's zygote: the child forked from the template runs the code,
//! its events relayed into the run's log as a cold run's are. Apart from the pools and the
//! matching of runs to them: a zygote run is not the library's launch (nothing to hand over
//! to another thread), so it runs to its end here, on the run's thread.

use std::sync::Arc;

use airlock::zygote::{Zygote, ZygoteRun};

use crate::engine::execute::{CommandWork, Streamed};
use crate::engine::LiveRun;

/// Code through the interpreter registry, as a zygote takes it.
#[derive(Debug, Clone)]
pub struct CodeWork {
    /// The registry name the request gave (or an alias).
    pub language: String,
    pub code: String,
    pub args: Vec<String>,
}

/// A zygote that may run a code run's code ([`super::WarmStarts::zygote_for`]).
pub(in crate::engine) struct ZygoteFor(pub(super) Arc<Zygote>);

impl ZygoteFor {
    /// Runs `work`'s code on the zygote, if it takes the run (see [`run_on_zygote`]).
    pub(in crate::engine) fn run(&self, live: &LiveRun, work: &CommandWork) -> Option<Streamed> {
        let code = work.code.as_ref()?;
        run_on_zygote(live, &self.0, code, &work.env, work.stdin.as_deref())
    }
}

/// Runs `code` on `zygote` as the run's sandbox, relaying its events into the run's log as
/// they come (`started`, then each chunk of output within the caps, as for a cold run).
/// `None` when the zygote could not take it (no child, a template gone): nothing of the code
/// ran, and the run goes cold.
fn run_on_zygote(
    live: &LiveRun,
    zygote: &Zygote,
    code: &CodeWork,
    env: &[(String, String)],
    stdin: Option<&[u8]>,
) -> Option<Streamed> {
    let (events, received) = std::sync::mpsc::channel();
    let run = ZygoteRun {
        code: code.code.clone(),
        args: code.args.clone(),
        env: env.to_vec(),
        stdin: stdin.map(<[u8]>::to_vec).unwrap_or_default(),
        cancel: Some(live.cancel.clone()),
        events: Some(events),
    };
    let outcome = std::thread::scope(|scope| {
        scope.spawn(|| crate::engine::execute::relay(live, received));
        let outcome = zygote.run(&run);
        // The last sender goes with the run: the relay has everything and stops.
        drop(run);
        outcome
    });
    let result = match outcome {
        Ok(result) => result,
        Err(e) => {
            tracing::warn!(run = %live.id, "warm: the zygote could not take the run, it runs cold: {e}");
            return None;
        }
    };
    Some(Streamed {
        stdout: result.stdout_raw().unwrap_or_default(),
        stderr: result.stderr_raw().unwrap_or_default(),
        result,
    })
}
