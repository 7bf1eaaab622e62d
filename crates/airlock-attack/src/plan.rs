//! The plan of one attack run (its program, flags, host-side watch and evidence) and what the
//! run left behind ([`Outcome`]); plus the evidence checks the attacks share.

use std::path::PathBuf;
use std::time::Duration;

use crate::host::processes_with;

/// Reads the outcome (and the host) and says what escaped, if anything.
pub type Evidence = Box<dyn Fn(&Outcome) -> Option<String> + Send>;
/// A sanity check of a contained run's result.
pub type Check = Box<dyn Fn(&Outcome) -> Result<(), String> + Send>;
/// Polled on the host while the run lasts.
pub type Watch = Box<dyn FnMut() -> Option<String> + Send>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// Run to the end and collect the output.
    Normal,
    /// Run with a fresh terminal on stdin and read its input queue afterwards.
    Terminal,
    /// Wait for READY on stdout, then SIGKILL the sandbox's supervisor (or its whole process
    /// group, which holds the init too).
    KillWhenReady { whole_group: bool },
}

pub struct Plan {
    pub argv: Vec<String>,
    /// airlock flags that give the program what the attack needs to see (e.g. `--ro DIR`). A
    /// foreign sandbox command line cannot be given them; the attack still means something.
    pub flags: Vec<String>,
    /// airlock limit flags the attack is measured against (e.g. `--pids 32`): without them the
    /// attack means nothing (or is unbounded), so only airlock runs it.
    pub limits: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// A file the caller opens on descriptor 7 without close-on-exec before starting the run.
    pub inherit_fd7: Option<PathBuf>,
    pub lifecycle: Lifecycle,
    /// Polled on the host while the run lasts; the first report is kept in `Outcome::watched`.
    pub watch: Option<Watch>,
    pub evidence: Evidence,
    /// Extra sanity checks of a contained run's result.
    pub expect: Option<Check>,
    /// The layer that stops this attack. A backend whose result does not claim it is allowed
    /// to let the attack through: the report matches reality. One that claims it must stop it.
    pub stopped_by: Option<&'static str>,
}

impl Plan {
    pub fn new(
        argv: Vec<String>,
        evidence: impl Fn(&Outcome) -> Option<String> + Send + 'static,
    ) -> Plan {
        Plan {
            argv,
            flags: Vec::new(),
            limits: Vec::new(),
            env: Vec::new(),
            cwd: None,
            inherit_fd7: None,
            lifecycle: Lifecycle::Normal,
            watch: None,
            evidence: Box::new(evidence),
            expect: None,
            stopped_by: None,
        }
    }

    pub fn argv(mut self, argv: Vec<String>) -> Plan {
        self.argv = argv;
        self
    }

    pub fn flags<I: IntoIterator<Item = S>, S: Into<String>>(mut self, flags: I) -> Plan {
        self.flags.extend(flags.into_iter().map(Into::into));
        self
    }

    pub fn limits<I: IntoIterator<Item = S>, S: Into<String>>(mut self, limits: I) -> Plan {
        self.limits.extend(limits.into_iter().map(Into::into));
        self
    }

    pub fn expect(
        mut self,
        check: impl Fn(&Outcome) -> Result<(), String> + Send + 'static,
    ) -> Plan {
        self.expect = Some(Box::new(check));
        self
    }

    pub fn stopped_by(mut self, layer: &'static str) -> Plan {
        self.stopped_by = Some(layer);
        self
    }

    pub fn watch(mut self, watch: impl FnMut() -> Option<String> + Send + 'static) -> Plan {
        self.watch = Some(Box::new(watch));
        self
    }
}

/// What one run left: its result (for airlock runs), its output, what the host saw.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The RunResult status, for airlock runs that printed one.
    pub status: Option<String>,
    /// Whether the run had a cgroup (a "cgroup" layer in the result).
    pub cgroup: bool,
    /// The layers the result says were in force.
    pub layers: Vec<String>,
    pub warnings: Vec<String>,
    /// The result's details (which path the run took: warm, zygote).
    pub details: Vec<String>,
    /// The program's stdout and stderr.
    pub text: String,
    /// The launcher's own stderr (airlock's warnings), or the sandbox's for foreign ones.
    pub cli_stderr: String,
    pub elapsed: Duration,
    pub watched: Option<String>,
    pub pty_input: Option<String>,
    /// The pid of the launched process (for airlock: the CLI, which names the run's directory
    /// and cgroups).
    pub cli_pid: Option<u32>,
}

impl Outcome {
    /// Whether the program got far enough to report (`BLOCKED`, `ESCAPED` or `READY`).
    pub fn reported(&self) -> bool {
        self.text
            .lines()
            .any(|l| l.starts_with("BLOCKED") || l.starts_with("ESCAPED") || l == "READY")
    }
}

pub fn output_has(secret: String) -> impl Fn(&Outcome) -> Option<String> + Send + 'static {
    move |o: &Outcome| {
        o.text
            .contains(&secret)
            .then(|| format!("the secret {secret} is in the program's output"))
    }
}

pub fn file_exists(path: PathBuf) -> impl Fn(&Outcome) -> Option<String> + Send + 'static {
    move |_: &Outcome| {
        path.exists()
            .then(|| format!("{} exists on the host", path.display()))
    }
}

/// For kernel interfaces whose only effect is inside the caller, the program's own report.
pub fn escaped_line(o: &Outcome) -> Option<String> {
    o.text
        .lines()
        .find(|l| l.starts_with("ESCAPED"))
        .map(str::to_string)
}

/// Processes carrying `marker` still alive on the host a moment after the run.
pub fn survivors(marker: &str) -> impl Fn(&Outcome) -> Option<String> + Send + 'static {
    let marker = marker.to_string();
    move |_: &Outcome| {
        std::thread::sleep(Duration::from_millis(300));
        let alive: Vec<String> = processes_with(&marker)
            .into_iter()
            .map(|(pid, cmdline)| format!("{pid} {}", short(&cmdline)))
            .collect();
        (!alive.is_empty()).then(|| format!("still running on the host after the run: {alive:?}"))
    }
}

/// A command line cut to a readable length (an inlined program's is kilobytes long).
fn short(cmdline: &str) -> String {
    match cmdline.char_indices().nth(100) {
        Some((cut, _)) => format!("{}…", &cmdline[..cut]),
        None => cmdline.to_string(),
    }
}

pub fn status_in(o: &Outcome, allowed: &[&str]) -> Result<(), String> {
    match o.status.as_deref() {
        Some(status) if allowed.contains(&status) => Ok(()),
        other => Err(format!("status {other:?}, expected one of {allowed:?}")),
    }
}
