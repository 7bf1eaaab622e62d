//! One suite: the whole catalogue in one mode, with the airlock CLI as one user, on one backend.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use airlock_attack::harness::{execute, run_all, Launch, Supervisor};
use airlock_attack::host::{host_mountinfo, is_root};
use airlock_attack::judge::{blocked_reason, excerpt, judge, Verdict};
use airlock_attack::{catalogue, Attack, Baseline, Lifecycle, Outcome, Plan, Scene, Stage};

use crate::leftovers::{leftovers, remove_run_leftovers};
use crate::support::{PYTHON, SHIM_TEXT, UNPRIVILEGED_UID, ZYGOTE_TEXT};
use crate::variants::{known_gaps, WEAKENINGS};

/// The uid root runs drop to (the untrusted profile's default).
const NOBODY: u32 = 65534;
/// Attacks run this many at a time; resource attacks run alone afterwards.
const PARALLEL: usize = 3;

/// The flags that send each contained run to a Python interpreter started in a prepared
/// sandbox: `airlock exec --warm [flags] python CODE ARGS...` (the path an agent's code takes)
/// instead of `airlock run [flags] -- ARGV`. The first is the subcommand, not a flag.
pub const STARTED_INTERPRETER: &[&str] = &["exec", "--warm"];

/// What a run on a prepared sandbox says in its result's details (a cold fallback does not).
const WARM_DETAIL: &str = "started on a prepared sandbox (warm pool)";

/// Suites share host-wide state (cgroups, /run/airlock, uid 65534's process count): one at a time.
pub static SERIAL: Mutex<()> = Mutex::new(());

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Escape,
    Contained,
    /// The untrusted profile minus one layer ([`WEAKENINGS`]).
    Weakened,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum User {
    /// The airlock CLI runs as root (the program itself runs as uid 65534).
    Root,
    /// The airlock CLI runs as uid 65534 (or as the caller when the tests are not run as root).
    Unprivileged,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Runner {
    Untrusted,
    Tier0,
    Tier0AsRoot,
    Bare,
    BareAsNobody,
}

impl Runner {
    fn is_airlock(self) -> bool {
        matches!(
            self,
            Runner::Untrusted | Runner::Tier0 | Runner::Tier0AsRoot
        )
    }
}

pub struct Suite {
    stage: Stage,
    airlock: PathBuf,
    mode: Mode,
    user: User,
    /// The CLI runs through setpriv as [`UNPRIVILEGED_UID`].
    cli_as_nobody: bool,
    /// The backend of the contained runs (`None`: the profile's `auto`, i.e. native).
    backend: Option<&'static str>,
    /// The contained runs pass `--allow-degraded` (the backend has known gaps).
    accept_degradation: bool,
    /// Extra flags of the contained runs.
    backend_flags: &'static [&'static str],
    cli_pids: Mutex<Vec<u32>>,
}

struct Report {
    name: &'static str,
    threat: airlock_attack::Threat,
    runner: Option<Runner>,
    verdict: Verdict,
    detail: String,
    elapsed: Duration,
}

pub fn run_suite(mode: Mode, user: User) {
    run_suite_on(mode, user, None);
}

/// The whole table with the untrusted profile on one backend (`None`: the profile's choice).
pub fn run_suite_on(mode: Mode, user: User, backend: Option<&'static str>) {
    run_suite_on_with(mode, user, backend, &[]);
}

/// [`run_suite_on`] with extra flags for the contained runs (e.g. `--container-runtime`).
pub fn run_suite_on_with(
    mode: Mode,
    user: User,
    backend: Option<&'static str>,
    backend_flags: &'static [&'static str],
) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(suite) = Suite::set_up(mode, user, backend, backend_flags) else {
        return;
    };
    let mounts_before = host_mountinfo();
    let code_before = suite.stage.code_processes.map(processes_with);
    let started = Instant::now();
    let mut table = catalogue();
    assert!(table.len() >= 35, "the suite must keep at least 35 attacks");
    if mode == Mode::Weakened {
        table.retain(|a| WEAKENINGS.iter().any(|w| w.attack == a.name));
        assert_eq!(
            table.len(),
            WEAKENINGS.len(),
            "every weakening names an attack"
        );
    }
    let reports = run_all(&table, PARALLEL, |index, attack| {
        suite.run_attack(index, attack)
    });
    let mut problems = leftovers(&suite.stage.id, &mounts_before, &suite.cli_pids());
    if let (Some(needle), Some(before)) = (suite.stage.code_processes, &code_before) {
        problems.extend(code_processes_left(needle, before));
    }
    print_reports(&suite, &reports, started.elapsed());
    suite.stage.remove();
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| r.verdict == Verdict::Fail)
        .map(|r| format!("{}: {}", r.name, r.detail))
        .collect();
    assert!(
        failed.is_empty() && problems.is_empty(),
        "attack suite {mode:?} as {user:?} failed:\n{}\n{}",
        failed.join("\n"),
        problems.join("\n")
    );
}

fn print_reports(suite: &Suite, reports: &[Report], took: Duration) {
    println!(
        "\nattack suite: mode {:?}, CLI as {:?}, {} attacks in {:.1}s",
        suite.mode,
        suite.user,
        reports.len(),
        took.as_secs_f64()
    );
    for r in reports {
        let runner = r
            .runner
            .map(|r| format!("{r:?}"))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<30} {:?} {:<9} {:<12} {:<4} {:>5}ms  {}",
            r.name,
            r.threat,
            format!("{:?}", suite.mode),
            runner,
            format!("{:?}", r.verdict).to_uppercase(),
            r.elapsed.as_millis(),
            r.detail
        );
    }
    let count = |v| reports.iter().filter(|r| r.verdict == v).count();
    println!(
        "passed {}, failed {}, skipped {}",
        count(Verdict::Pass),
        count(Verdict::Fail),
        count(Verdict::Skip)
    );
}

/// The processes on the host whose command line holds `needle`: a started interpreter's
/// (interpreter and address-space holder: the shim's text, [`SHIM_TEXT`]) or a zygote's
/// (template and its runs' processes: [`ZYGOTE_TEXT`]), which carry no suite marker.
fn processes_with(needle: &'static str) -> Vec<(i32, String)> {
    airlock_attack::host::processes_with(needle)
}

/// Such processes that appeared during the suite and are still alive: a started interpreter,
/// its holder, or a zygote's process outlived its run (each CLI call stops its zygote).
/// (Another user's warm pool or zygote started meanwhile would show here too: the suites run
/// alone.)
fn code_processes_left(needle: &'static str, before: &[(i32, String)]) -> Vec<String> {
    let is_new = |pid: &i32| !before.iter().any(|(old, _)| old == pid);
    // The last run's sandbox is torn down after its result: give it a moment.
    std::thread::sleep(Duration::from_millis(300));
    processes_with(needle)
        .into_iter()
        .filter(|(pid, _)| is_new(pid))
        .map(|(pid, cmdline)| {
            airlock_attack::host::kill(pid);
            format!("{pid} ({cmdline:.60}) outlived its run")
        })
        .collect()
}

/// `PYTHON [-B] -c CODE ARGS...`: the code and its arguments.
fn python_code(argv: &[String]) -> Option<(&String, &[String])> {
    let rest = match argv.split_first()? {
        (program, rest) if program == PYTHON => rest,
        _ => return None,
    };
    let rest = match rest.first().map(String::as_str) {
        Some("-B") => &rest[1..],
        _ => rest,
    };
    match rest {
        [flag, code, args @ ..] if flag == "-c" => Some((code, args)),
        _ => None,
    }
}

impl Suite {
    /// The contained runs go to a started interpreter ([`STARTED_INTERPRETER`], then any flags).
    fn on_started_interpreter(&self) -> bool {
        self.backend_flags.first() == STARTED_INTERPRETER.first()
    }

    /// The contained runs take Python code, not a program (a zygote, a started interpreter).
    fn runs_python_code_only(&self) -> bool {
        self.backend_flags.contains(&"--zygote") || self.on_started_interpreter()
    }

    /// The suite, or `None` (having said why) when it cannot run here.
    fn set_up(
        mode: Mode,
        user: User,
        backend: Option<&'static str>,
        backend_flags: &'static [&'static str],
    ) -> Option<Suite> {
        let root = is_root();
        if user == User::Root && !root {
            eprintln!("skipped: the {mode:?} suite as root needs root");
            return None;
        }
        if !std::path::Path::new(PYTHON).exists() {
            eprintln!("skipped: {PYTHON} is missing, the attack programs need it");
            return None;
        }
        let cli_as_nobody = user == User::Unprivileged && root;
        if cli_as_nobody && !std::path::Path::new("/usr/bin/setpriv").exists() {
            eprintln!(
                "skipped: setpriv (util-linux) is needed to run airlock as uid {UNPRIVILEGED_UID}"
            );
            return None;
        }
        let mut suite = Suite::new(mode, user, cli_as_nobody);
        suite.backend = backend;
        suite.backend_flags = backend_flags;
        // Host-side process counts (fork_bomb, many_processes) and the leftover check see
        // the code's processes by their command line, which is the shim's or the zygote's.
        if suite.on_started_interpreter() {
            suite.stage.code_processes = Some(SHIM_TEXT);
        } else if backend_flags.contains(&"--zygote") {
            suite.stage.code_processes = Some(ZYGOTE_TEXT);
        }
        if mode != Mode::Escape {
            let gaps = known_gaps(backend, backend_flags, user);
            suite.accept_degradation = !gaps.is_empty();
            if let Err(why) = suite.native_backend_works() {
                let on = backend.unwrap_or("its default backend");
                eprintln!("skipped: the untrusted profile cannot run on {on} on this host: {why}");
                suite.stage.remove();
                return None;
            }
            suite.check_refused_by_default(gaps);
            suite.check_started_interpreter();
        }
        Some(suite)
    }

    fn new(mode: Mode, user: User, cli_as_nobody: bool) -> Suite {
        let sandbox_uid = match (is_root(), user) {
            (true, User::Root) => NOBODY,
            (true, User::Unprivileged) => UNPRIVILEGED_UID,
            (false, _) => nix::unistd::getuid().as_raw(),
        };
        let mut stage = Stage::create(
            &std::env::temp_dir(),
            "airlock-attacks",
            PYTHON,
            sandbox_uid,
        )
        .expect("create the suite directory");
        stage.proving_escapes = mode == Mode::Escape;
        let suite = Suite {
            stage,
            airlock: PathBuf::from(env!("CARGO_BIN_EXE_airlock")),
            mode,
            user,
            cli_as_nobody,
            backend: None,
            accept_degradation: false,
            backend_flags: &[],
            cli_pids: Mutex::new(Vec::new()),
        };
        std::fs::write(
            suite.tier0_as_root_profile(),
            "extends = \"untrusted\"\nbackend = \"none\"\n\n[user]\ndrop_root = false\n",
        )
        .expect("write the Tier 0 as root profile");
        suite
    }

    fn tier0_as_root_profile(&self) -> PathBuf {
        self.stage.dir.join("tier0-as-root.toml")
    }

    fn cli_pids(&self) -> Vec<u32> {
        self.cli_pids.lock().unwrap().clone()
    }

    fn run_attack(&self, index: usize, attack: &Attack) -> Report {
        let started = Instant::now();
        let report = |runner, verdict, detail: String| Report {
            name: attack.name,
            threat: attack.threat,
            runner,
            verdict,
            detail,
            elapsed: started.elapsed(),
        };
        if self.user == User::Unprivileged {
            if let Some(reason) = attack.root_only {
                return report(None, Verdict::Skip, reason.to_string());
            }
        }
        let mut scene = match Scene::new(&self.stage, attack.name, index) {
            Ok(scene) => scene,
            Err(e) => return report(None, Verdict::Fail, format!("setup failed: {e}")),
        };
        let weakening = WEAKENINGS
            .iter()
            .find(|w| self.mode == Mode::Weakened && w.attack == attack.name);
        let runner = match (self.mode, attack.baseline) {
            (Mode::Contained | Mode::Weakened, _) => Runner::Untrusted,
            (Mode::Escape, Baseline::Tier0 | Baseline::ContainedToo) => Runner::Tier0,
            (Mode::Escape, Baseline::Tier0AsRoot) => Runner::Tier0AsRoot,
            (Mode::Escape, Baseline::Bare) => Runner::Bare,
            (Mode::Escape, Baseline::BareAsNobody) => Runner::BareAsNobody,
        };
        let result = (attack.prepare)(&mut scene).and_then(|mut plan| {
            if self.runs_python_code_only() && python_code(&plan.argv).is_none() {
                return Err(format!(
                    "not a Python program ({}): this path runs Python code only",
                    plan.argv.first().map(String::as_str).unwrap_or("nothing")
                ));
            }
            if let Some(weakening) = weakening {
                let dir = scene.dir.display().to_string();
                plan.flags
                    .extend(weakening.flags.iter().map(|f| f.replace("{dir}", &dir)));
            }
            let outcome = self.execute(&scene, runner, &mut plan)?;
            Ok((plan, outcome))
        });
        let (verdict, mut detail, killed_init) = match result {
            Err(reason) => (Verdict::Skip, format!("cannot set up: {reason}"), None),
            Ok((plan, outcome)) => {
                let must_escape = match weakening {
                    Some(weakening) => weakening.escapes,
                    None => self.mode == Mode::Escape && attack.baseline != Baseline::ContainedToo,
                };
                let (mut verdict, mut detail) = judge(must_escape, &plan, &outcome);
                if let Some(cold) = self.ran_cold(runner, &outcome) {
                    (verdict, detail) = (Verdict::Fail, format!("{cold}; {detail}"));
                }
                if let Some(weakening) = weakening {
                    detail = format!(
                        "{} -> {detail} ({})",
                        weakening.flags.join(" "),
                        weakening.why
                    );
                }
                let killed_init = (plan.lifecycle
                    == Lifecycle::KillWhenReady { whole_group: true }
                    && runner.is_airlock())
                .then_some(outcome.cli_pid)
                .flatten();
                (verdict, detail, killed_init)
            }
        };
        scene.cleanup();
        if let Some(pid) = killed_init {
            // With the init dead nobody removes the run's directory and cgroups: that is expected
            // here, so remove them before the suite-wide leftover check.
            let removed = remove_run_leftovers(pid);
            if !removed.is_empty() {
                detail.push_str(&format!(
                    " (the killed init left {} behind; the harness removed them)",
                    removed.join(", ")
                ));
            }
        }
        if self.mode == Mode::Escape
            && matches!(
                attack.baseline,
                Baseline::Bare | Baseline::BareAsNobody | Baseline::Tier0AsRoot
            )
        {
            detail.push_str(&format!(
                " | under Tier 0: {}",
                self.tier0_verdict(index, attack)
            ));
        }
        report(Some(runner), verdict, detail)
    }

    /// For attacks shown with a weaker baseline: what plain Tier 0 does with them (informational,
    /// for the table in docs/attacks.md; Tier 0 is not a security boundary).
    fn tier0_verdict(&self, index: usize, attack: &Attack) -> String {
        let Ok(mut scene) = Scene::new(&self.stage, &format!("{}-tier0", attack.name), index)
        else {
            return "not run".into();
        };
        let verdict = match (attack.prepare)(&mut scene) {
            Err(reason) => format!("not run ({reason})"),
            Ok(mut plan) => match self.execute(&scene, Runner::Tier0, &mut plan) {
                Err(e) => format!("not run ({e})"),
                Ok(outcome) => match (plan.evidence)(&outcome) {
                    Some(evidence) => format!("ESCAPED ({evidence})"),
                    None => format!("contained ({})", blocked_reason(&outcome.text)),
                },
            },
        };
        scene.cleanup();
        verdict
    }

    /// On the started-interpreter path, a run that printed a result without the warm detail
    /// ran cold (no sandbox was ready): it proves nothing about that path.
    fn ran_cold(&self, runner: Runner, outcome: &Outcome) -> Option<String> {
        let judged = self.on_started_interpreter() && runner == Runner::Untrusted;
        (judged && outcome.status.is_some() && !outcome.details.iter().any(|d| d == WARM_DETAIL))
            .then(|| {
                format!(
                    "ran cold, not on a started interpreter: {:?}",
                    outcome.details
                )
            })
    }

    /// The code of a started-interpreter run runs in the interpreter started ahead: its
    /// collector's frozen generation (the shim's preparation) is what a cold `python3 -c`
    /// never has.
    fn check_started_interpreter(&self) {
        if !self.on_started_interpreter() {
            return;
        }
        let mut scene = Scene::new(&self.stage, "started", 997).expect("set up the probe");
        let code = "import gc\nprint('frozen' if gc.get_freeze_count() else 'cold')";
        let argv = vec![PYTHON.into(), "-c".into(), code.into()];
        let mut plan = Plan::new(argv, |_: &Outcome| None);
        let outcome = self.execute(&scene, Runner::Untrusted, &mut plan);
        scene.cleanup();
        let outcome = outcome.expect("run the started-interpreter probe");
        assert!(
            outcome.text.starts_with("frozen")
                && self.ran_cold(Runner::Untrusted, &outcome).is_none(),
            "the probe did not run on a started interpreter: {} {:?}",
            outcome.text,
            outcome.details
        );
    }

    /// A backend's gaps refuse a run that does not accept them, naming each gap and the opt-in.
    fn check_refused_by_default(&mut self, gaps: &[&str]) {
        if gaps.is_empty() {
            return;
        }
        self.accept_degradation = false;
        let outcome = self.run_true("gaps", 998).expect("run the refusal check");
        self.accept_degradation = true;
        assert_eq!(
            outcome.status, None,
            "a run with unenforceable limits must be refused by default: {}",
            outcome.text
        );
        for gap in gaps {
            assert!(
                outcome.cli_stderr.contains(gap) && outcome.cli_stderr.contains("--allow-degraded"),
                "the refusal must name {gap} and the opt-in: {}",
                outcome.cli_stderr
            );
        }
    }

    fn native_backend_works(&self) -> Result<(), String> {
        let outcome = self.run_true("probe", 999)?;
        match outcome.status.as_deref() {
            Some("exited") => Ok(()),
            _ => Err(excerpt(&outcome)),
        }
    }

    /// `/bin/true` under the untrusted profile, as the suite's contained runs start it.
    fn run_true(&self, name: &str, index: usize) -> Result<Outcome, String> {
        let mut scene = Scene::new(&self.stage, name, index)?;
        // A zygote and a started interpreter run Python code only.
        let argv = match self.runs_python_code_only() {
            true => vec![PYTHON.into(), "-c".into(), "pass".into()],
            false => vec!["/bin/true".into()],
        };
        let mut plan = Plan::new(argv, |_: &Outcome| None);
        let outcome = self.execute(&scene, Runner::Untrusted, &mut plan);
        scene.cleanup();
        outcome
    }

    fn execute(&self, scene: &Scene, runner: Runner, plan: &mut Plan) -> Result<Outcome, String> {
        let launch = Launch {
            line: self.command_line(runner, plan),
            cwd: scene.dir.clone(),
            airlock_result: runner.is_airlock(),
            clear_env: true,
            deadline: Duration::from_secs(90),
            supervisor: Supervisor::Launched,
            pids: runner.is_airlock().then_some(&self.cli_pids),
        };
        execute(plan, launch)
    }

    /// The command line of one run.
    fn command_line(&self, runner: Runner, plan: &Plan) -> Vec<String> {
        let as_uid = |uid: u32| {
            vec![
                "/usr/bin/setpriv".to_string(),
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".into(),
            ]
        };
        let mut line = Vec::new();
        match runner {
            Runner::Bare => {}
            Runner::BareAsNobody => line.extend(as_uid(NOBODY)),
            _ => {
                if self.cli_as_nobody {
                    line.extend(as_uid(UNPRIVILEGED_UID));
                }
                line.extend(self.airlock_run(runner, plan));
            }
        }
        match self.code_for_exec(runner, plan) {
            // `exec`'s builtin `python` is PYTHON, run as `PYTHON -c CODE ARGS...`.
            Some((code, args)) => {
                line.extend(["python".to_string(), code.clone()]);
                line.extend(args.iter().cloned());
            }
            None => line.extend(plan.argv.iter().cloned()),
        }
        line
    }

    /// The code and arguments of a run through `airlock exec` (the started interpreter).
    fn code_for_exec<'p>(
        &self,
        runner: Runner,
        plan: &'p Plan,
    ) -> Option<(&'p String, &'p [String])> {
        (runner == Runner::Untrusted && self.on_started_interpreter())
            .then(|| python_code(&plan.argv))
            .flatten()
    }

    /// `airlock run [flags] --` for one of the airlock runners.
    fn airlock_run(&self, runner: Runner, plan: &Plan) -> Vec<String> {
        let exec = self.code_for_exec(runner, plan).is_some();
        let subcommand = if exec { "exec" } else { "run" };
        let mut line = vec![self.airlock.display().to_string(), subcommand.into()];
        // A run the harness kills must stream its output, so READY arrives in time.
        if !matches!(plan.lifecycle, Lifecycle::KillWhenReady { .. }) {
            line.push("--json".into());
        }
        match runner {
            // The baselines are the weakest airlock: Tier 0 with its run directory on disk,
            // without the capped tmpfs mounts of an in-memory one.
            Runner::Tier0 => {
                line.extend(["--dev", "--backend", "none", "--disk-run-dir"].map(String::from))
            }
            Runner::Tier0AsRoot => line.extend([
                "--disk-run-dir".to_string(),
                "--dev".to_string(),
                "--profile".into(),
                self.tier0_as_root_profile().display().to_string(),
            ]),
            Runner::Untrusted => {
                if let Some(backend) = self.backend {
                    line.extend(["--backend".to_string(), backend.to_string()]);
                }
                if self.accept_degradation {
                    line.push("--allow-degraded".into());
                }
                let flags = self.backend_flags.iter().filter(|f| **f != "exec");
                line.extend(flags.map(|f| f.to_string()));
            }
            Runner::Bare | Runner::BareAsNobody => unreachable!("not an airlock runner"),
        }
        let flags = plan.limits.iter().chain(&plan.flags);
        if !flags.clone().any(|f| f == "--wall") {
            line.extend(["--wall", "20s"].map(String::from));
        }
        line.extend(flags.cloned());
        // `exec` takes the interpreter's name and the code as its own arguments.
        if !exec {
            line.push("--".into());
        }
        line
    }
}
