//! The host side of the attacks: a [`Stage`] for a whole suite (its directory, who the program
//! runs as) and a [`Scene`] per attack (its bait: planted secrets, victims, listeners; and
//! the cleanup that removes them).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::host::{self, processes_with, random_hex, HOST_PYTHON};
use crate::program::program;

/// What a suite of attacks shares on the host.
pub struct Stage {
    /// Unique per suite: part of every marker, so leftovers are found by it.
    pub id: String,
    /// Where per-attack bait directories are made (removed with [`Stage::remove`]).
    pub dir: PathBuf,
    /// The interpreter the programs run with, as seen inside the sandbox.
    pub python: String,
    /// The uid the program runs as: victims and owned files use it.
    pub sandbox_uid: u32,
    /// Attacks must be shown to work here: one that cannot be (a host that refuses even root
    /// what the attack needs) is skipped with the reason instead of passing vacuously.
    pub proving_escapes: bool,
    /// Text in the command line of the processes the program's code runs in when that is
    /// not the program's own (code handed to an interpreter started ahead carries no marker
    /// in its command line): host-side process counts include those too.
    pub code_processes: Option<&'static str>,
}

impl Stage {
    /// A fresh directory `<parent>/<prefix>-<id>` (`parent` must exist), traversable by the
    /// sandbox's user.
    pub fn create(
        parent: &Path,
        prefix: &str,
        python: &str,
        sandbox_uid: u32,
    ) -> Result<Stage, String> {
        let id = format!("atk{}", &random_hex()[..10]);
        let dir = parent.join(format!("{prefix}-{id}"));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        set_mode(&dir, 0o755)?;
        Ok(Stage {
            id,
            dir,
            python: python.to_string(),
            sandbox_uid,
            proving_escapes: false,
            code_processes: None,
        })
    }

    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One attack's host state.
pub struct Scene<'s> {
    pub stage: &'s Stage,
    pub index: usize,
    pub dir: PathBuf,
    /// Unique per attack and suite: given to the program, searched for in processes.
    pub marker: String,
    cleanups: Vec<Box<dyn FnOnce() + Send>>,
    victims: Vec<i32>,
}

impl<'s> Scene<'s> {
    pub fn new(stage: &'s Stage, name: &str, index: usize) -> Result<Scene<'s>, String> {
        let dir = stage.dir.join(name);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        set_mode(&dir, 0o755)?;
        let marker = format!("{}-{index}-{}", stage.id, &random_hex()[..8]);
        Ok(Scene {
            stage,
            index,
            dir,
            marker,
            cleanups: Vec::new(),
            victims: Vec::new(),
        })
    }

    /// The command line that runs attack program `name` with `args` in the sandbox.
    pub fn python<I: IntoIterator<Item = S>, S: Into<String>>(
        &self,
        name: &str,
        args: I,
    ) -> Vec<String> {
        program(name).argv(&self.stage.python, args)
    }

    /// Runs program or helper `name` on the host (as the harness's user); its stdout.
    pub fn run_on_host(&self, name: &str, args: &[&str]) -> Result<String, String> {
        host::run_host(&program(name).argv(HOST_PYTHON, args.iter().copied()))
    }

    /// A random value the program is never told: finding it anywhere proves a read.
    pub fn secret(&self) -> String {
        format!("secret-{}", random_hex())
    }

    /// Writes a fresh secret to `path` (removed afterwards) and returns it.
    pub fn plant(&mut self, path: &Path, mode: u32) -> Result<String, String> {
        let secret = self.secret();
        std::fs::write(path, format!("{secret}\n"))
            .map_err(|e| format!("cannot plant {}: {e}", path.display()))?;
        set_mode(path, mode)?;
        self.remove_later(path);
        Ok(secret)
    }

    pub fn make_dir(&mut self, dir: &Path, mode: u32) -> Result<(), String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        set_mode(dir, mode)?;
        if !dir.starts_with(&self.stage.dir) {
            let dir = dir.to_path_buf();
            self.on_cleanup(move || {
                let _ = std::fs::remove_dir_all(dir);
            });
        }
        Ok(())
    }

    pub fn chown_to_sandbox_user(&self, path: &Path) -> Result<(), String> {
        let uid = self.stage.sandbox_uid;
        std::os::unix::fs::chown(path, Some(uid), Some(uid))
            .map_err(|e| format!("cannot chown {} to {uid}: {e}", path.display()))
    }

    /// The same for a whole tree (`chown -R`).
    pub fn chown_tree_to_sandbox_user(&self, path: &Path) -> Result<(), String> {
        let uid = self.stage.sandbox_uid;
        let owner = format!("{uid}:{uid}");
        host::run_host(&["chown", "-R", &owner, &path.display().to_string()]).map(drop)
    }

    pub fn remove_later(&mut self, path: &Path) {
        let path = path.to_path_buf();
        self.on_cleanup(move || {
            let _ = std::fs::remove_file(path);
        });
    }

    pub fn on_cleanup(&mut self, action: impl FnOnce() + Send + 'static) {
        self.cleanups.push(Box::new(action));
    }

    /// A host process of the sandbox's own uid (another job of the same user), with `argument`
    /// on its command line and `env_secret` in its environment.
    pub fn victim(&mut self, argument: &str, env_secret: &str) -> Result<Victim, String> {
        let mut command = Command::new(HOST_PYTHON);
        command.args([
            "-c",
            "import time\nwhile True: time.sleep(1)",
            &format!("victim-{}", self.marker),
            argument,
        ]);
        command
            .env_clear()
            .env("AIRLOCK_VICTIM_SECRET", env_secret)
            .current_dir("/");
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if host::is_root() {
            let uid = self.stage.sandbox_uid;
            command.uid(uid).gid(uid);
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start the victim: {e}"))?;
        let victim = Victim {
            pid: child.id(),
            child: Arc::new(Mutex::new(child)),
        };
        self.victims.push(victim.pid as i32);
        let handle = victim.clone();
        self.on_cleanup(move || handle.kill());
        // The victim must be running before the attack looks for it.
        std::thread::sleep(Duration::from_millis(50));
        Ok(victim)
    }

    /// Kills whatever the attack left running (it carries the marker), then undoes the setup.
    pub fn cleanup(&mut self) {
        for (pid, _) in processes_with(&self.marker) {
            if !self.victims.contains(&pid) {
                host::kill(pid);
            }
        }
        while let Some(action) = self.cleanups.pop() {
            action();
        }
    }
}

/// A host process an attack tries to read, signal or trace.
#[derive(Clone)]
pub struct Victim {
    pub pid: u32,
    child: Arc<Mutex<Child>>,
}

impl Victim {
    pub fn alive(&self) -> bool {
        self.child
            .lock()
            .unwrap()
            .try_wait()
            .is_ok_and(|s| s.is_none())
    }

    fn kill(&self) {
        let mut child = self.child.lock().unwrap();
        let _ = child.kill();
        let _ = child.wait();
    }
}

pub fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot chmod {}: {e}", path.display()))
}
