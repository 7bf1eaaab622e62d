//! The executor of `airlock-mcp`: runs each request through the airlock library in this
//! process, with the operator's policy, re-executing the `airlock` binary as each run's init.
//! Sessions are directories under a private root that is removed when the executor is dropped.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::Semaphore;

use airlock::interp::{InterpError, InterpreterRegistry};
use airlock::{Canceller, Policy, Sandbox, SandboxOptions};

use crate::executor::{
    ExecFuture, Executor, Failure, FailureKind, Program, RunRequest, SessionInfo,
};
use crate::report::run_report;
use crate::workspace::Workspace;

/// What the operator decided: the policy and the server's own caps.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The profile the policy came from (a built-in name or a file), for `describe_policy`.
    pub profile: String,
    pub policy: Policy,
    /// Must name the `airlock` binary in `init_program`: this process has threads.
    pub options: SandboxOptions,
    pub interpreters: InterpreterRegistry,
    /// Sessions open at once.
    pub max_sessions: usize,
    /// Largest file `file_read` and `file_write` move.
    pub max_file_bytes: u64,
    /// Runs at once; more wait for a slot.
    pub max_concurrent_runs: usize,
}

impl LocalConfig {
    /// The defaults for a policy: 16 sessions, 16 MiB files, 4 concurrent runs.
    pub fn new(profile: impl Into<String>, policy: Policy, options: SandboxOptions) -> Self {
        LocalConfig {
            profile: profile.into(),
            policy,
            options,
            interpreters: InterpreterRegistry::builtin(),
            max_sessions: 16,
            max_file_bytes: 16 << 20,
            max_concurrent_runs: 4,
        }
    }
}

struct Session {
    dir: PathBuf,
    workspace: Arc<Workspace>,
}

/// Runs sandboxes in this process.
pub struct LocalExecutor {
    config: LocalConfig,
    sessions: Mutex<HashMap<String, Session>>,
    /// Private directory holding every session's workspace.
    root: PathBuf,
    /// Who owns a workspace: the sandbox user when we are root and drop to it.
    owner: Option<(u32, u32)>,
    runs: Semaphore,
}

/// 2 × `bytes` random hex digits from the kernel's generator.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    if let Ok(mut urandom) = std::fs::File::open("/dev/urandom") {
        let _ = urandom.read_exact(&mut buf);
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

impl LocalExecutor {
    /// Checks the policy and makes the sessions' root directory.
    pub fn new(config: LocalConfig) -> Result<LocalExecutor, Failure> {
        config
            .policy
            .validate()
            .map_err(|e| Failure::new(FailureKind::SandboxError, format!("the profile: {e}")))?;
        let root = std::env::temp_dir().join(format!("airlock-mcp-{}", random_hex(8)));
        make_dir(&root, 0o711).map_err(|e| {
            Failure::new(
                FailureKind::SandboxError,
                format!("cannot create {}: {e}", root.display()),
            )
        })?;
        let root_user = rustix::process::geteuid().is_root();
        let user = &config.policy.user;
        let owner = (root_user && user.drop_root).then_some((user.uid, user.gid));
        Ok(LocalExecutor {
            runs: Semaphore::new(config.max_concurrent_runs.max(1)),
            config,
            sessions: Mutex::new(HashMap::new()),
            root,
            owner,
        })
    }

    /// The argv and stdin of a request, after the registry's and the policy's checks.
    fn command_line(&self, request: &RunRequest) -> Result<(Vec<String>, Vec<u8>), Failure> {
        let stdin = request.stdin.clone().unwrap_or_default();
        match &request.program {
            Program::Command(argv) if argv.is_empty() || argv[0].is_empty() => Err(Failure::new(
                FailureKind::Invalid,
                "argv is empty: give the program and its arguments",
            )),
            Program::Command(argv) => Ok((argv.clone(), stdin)),
            Program::Code { language, code } => {
                let invocation = self
                    .config
                    .interpreters
                    .invocation(language, code, &[])
                    .map_err(interp_failure)?;
                // An interpreter reading its code on stdin cannot also take the caller's.
                Ok((invocation.argv, invocation.stdin.unwrap_or(stdin)))
            }
        }
    }

    fn workspace(&self, session: &str) -> Result<(PathBuf, Arc<Workspace>), Failure> {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions
            .get(session)
            .map(|s| (s.dir.clone(), Arc::clone(&s.workspace)))
            .ok_or_else(|| no_session(session))
    }

    async fn run_request(&self, request: RunRequest) -> Result<Value, Failure> {
        let (argv, stdin) = self.command_line(&request)?;
        let mut policy = self.config.policy.clone();
        if let Some(session) = &request.session {
            policy.filesystem.workdir = Some(self.workspace(session)?.0);
        }
        let _slot = self
            .runs
            .acquire()
            .await
            .map_err(|_| Failure::new(FailureKind::Busy, "the server is shutting down"))?;
        let sandbox = Sandbox::with_options(policy.clone(), self.config.options.clone())
            .map_err(library_failure)?;
        let command = sandbox
            .command(argv[0].clone())
            .args(argv[1..].iter().cloned())
            .stdin(stdin);
        let handle = blocking(move || command.spawn()).await?;
        // A dropped request (the client cancelled) stops the run instead of leaving it to its
        // wall-clock limit.
        let mut cancel_on_drop = CancelOnDrop(Some(handle.canceller()));
        let result = blocking(move || handle.wait()).await;
        cancel_on_drop.0 = None;
        Ok(run_report(&result?, &policy))
    }

    fn new_session(&self) -> Result<SessionInfo, Failure> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if sessions.len() >= self.config.max_sessions {
            return Err(Failure::new(
                FailureKind::Busy,
                format!("{} sessions are open, the most allowed", sessions.len()),
            )
            .with_fix("close a session you no longer need with session_close"));
        }
        let id = random_hex(16);
        let dir = self.root.join(&id);
        let workspace = self.make_workspace(&dir).map_err(|e| {
            Failure::new(
                FailureKind::SandboxError,
                format!("cannot create a workspace: {e}"),
            )
        })?;
        let info = SessionInfo {
            session_id: id.clone(),
            workdir: dir.display().to_string(),
            max_file_bytes: self.config.max_file_bytes,
        };
        sessions.insert(
            id,
            Session {
                dir,
                workspace: Arc::new(workspace),
            },
        );
        Ok(info)
    }

    fn make_workspace(&self, dir: &Path) -> std::io::Result<Workspace> {
        make_dir(dir, 0o700)?;
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
        }
        Workspace::open(dir, self.owner)
    }

    fn remove_session(&self, session: &str) -> Result<(), Failure> {
        let removed = {
            let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            sessions
                .remove(session)
                .ok_or_else(|| no_session(session))?
        };
        // remove_dir_all does not follow symlinks the program may have planted.
        std::fs::remove_dir_all(&removed.dir).map_err(|e| {
            Failure::new(
                FailureKind::SandboxError,
                format!("cannot remove the workspace: {e}"),
            )
        })
    }

    fn policy_description(&self) -> Value {
        let policy = &self.config.policy;
        let (backend, expected) = expected_isolation(policy, &self.config.options);
        json!({
            "profile": self.config.profile,
            "backend": backend,
            "isolation": expected,
            "network": policy.network,
            "limits": policy.limits,
            "filesystem": {
                "read_only": policy.filesystem.read_only,
                "read_write": policy.filesystem.read_write,
                "workdir": "a fresh, empty directory per run; a session's workspace for runs in a session",
            },
            "allowed_programs": policy.allowed_programs,
            "interpreters": self.interpreters(),
            "sessions": {
                "max": self.config.max_sessions,
                "open": self.sessions.lock().map(|s| s.len()).unwrap_or(0),
                "max_file_bytes": self.config.max_file_bytes,
            },
            "widening": "none: the operator's profile decides this policy and no tool can change it",
        })
    }

    fn interpreters(&self) -> Vec<Value> {
        let registry = &self.config.interpreters;
        registry
            .allowed()
            .iter()
            .filter_map(|name| registry.get(name))
            .map(|(name, interp)| {
                let program = interp.argv.first().cloned().unwrap_or_default();
                let installed = !program.starts_with('/') || Path::new(&program).exists();
                json!({ "name": name, "aliases": interp.aliases, "installed": installed })
            })
            .collect()
    }
}

impl Drop for LocalExecutor {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl Executor for LocalExecutor {
    fn describe_policy(&self) -> Value {
        self.policy_description()
    }

    fn run(&self, request: RunRequest) -> ExecFuture<'_, Value> {
        Box::pin(self.run_request(request))
    }

    fn create_session(&self) -> ExecFuture<'_, SessionInfo> {
        Box::pin(async move { self.new_session() })
    }

    fn close_session(&self, session: String) -> ExecFuture<'_, ()> {
        Box::pin(async move { self.remove_session(&session) })
    }

    fn read_file(&self, session: String, path: String) -> ExecFuture<'_, Vec<u8>> {
        Box::pin(async move {
            let (_, workspace) = self.workspace(&session)?;
            let max = self.config.max_file_bytes;
            blocking(move || Ok(workspace.read(&path, max))).await?
        })
    }

    fn write_file(&self, session: String, path: String, data: Vec<u8>) -> ExecFuture<'_, u64> {
        Box::pin(async move {
            let (_, workspace) = self.workspace(&session)?;
            let max = self.config.max_file_bytes;
            blocking(move || Ok(workspace.write(&path, &data, max))).await?
        })
    }
}

/// The backend the policy selects here and the layers it puts in force, from the library's dry
/// run of a run under this policy (each run's result lists those actually in force).
pub fn expected_isolation(policy: &Policy, options: &SandboxOptions) -> (Value, Value) {
    let program = policy
        .allowed_programs
        .as_ref()
        .and_then(|programs| programs.first().cloned())
        .unwrap_or_else(|| "/bin/true".to_string());
    let plan = Sandbox::with_options(policy.clone(), options.clone())
        .and_then(|sandbox| sandbox.command(program).plan());
    match plan {
        Ok(plan) => (json!(plan.backend), json!(plan.layers)),
        Err(e) => (json!(null), json!({ "unavailable": e.to_string() })),
    }
}

/// Runs blocking library code off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, airlock::Error> + Send + 'static,
) -> Result<T, Failure> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(library_failure),
        Err(e) => Err(Failure::new(
            FailureKind::SandboxError,
            format!("run task failed: {e}"),
        )),
    }
}

struct CancelOnDrop(Option<Canceller>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(canceller) = self.0.take() {
            canceller.cancel();
        }
    }
}

fn make_dir(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(mode).create(path)
}

fn no_session(session: &str) -> Failure {
    Failure::new(FailureKind::NotFound, format!("no session {session:?}"))
        .with_fix("create one with session_create (sessions end with session_close)")
}

fn interp_failure(error: InterpError) -> Failure {
    let kind = match error {
        InterpError::NotAllowed { .. } => FailureKind::Denied,
        InterpError::Unknown { .. }
        | InterpError::CodeTooLong { .. }
        | InterpError::CodeHasNul { .. } => FailureKind::Invalid,
        _ => FailureKind::SandboxError,
    };
    let failure = Failure::new(kind, error.to_string());
    match kind {
        FailureKind::Denied => failure
            .with_reason("interpreter_not_allowed")
            .with_fix("use one of the allowed interpreters (see describe_policy)"),
        _ => failure.with_fix("see describe_policy for the interpreters and their names"),
    }
}

fn library_failure(error: airlock::Error) -> Failure {
    let message = error.to_string();
    match error {
        airlock::Error::ProgramNotAllowed { .. } => Failure::new(FailureKind::Denied, message)
            .with_reason("program_not_allowed")
            .with_fix("run a program the profile allows (see describe_policy)"),
        airlock::Error::Command(_) => Failure::new(FailureKind::Invalid, message),
        _ => Failure::new(FailureKind::SandboxError, message),
    }
}
