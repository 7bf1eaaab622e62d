//! The attack programs: small Python scripts in `programs/`, compiled into the crate as static
//! strings, so the test suite and `airlock conformance` run exactly the same text and nothing
//! has to be copied into (or be visible from) the sandbox.
//!
//! A program is started as `python3 -B -c <text> ARGS...`. Its text is the script wrapped in a
//! few lines that first load `_common.py` as the module `_common`, which every script imports,
//! and name the code after its file so that tracebacks point at the right script and line.

/// One attack program (or host-side helper) and its source.
#[derive(Debug)]
pub struct Program {
    /// The file name in `programs/`, e.g. `read_path.py`.
    pub name: &'static str,
    pub source: &'static str,
}

macro_rules! programs {
    ($($name:literal),* $(,)?) => {
        /// Every attack program, by file name.
        pub static PROGRAMS: &[Program] = &[
            $(Program { name: $name, source: include_str!(concat!("../programs/", $name)) },)*
        ];
    };
}

programs!(
    "block_device.py",
    "bpf.py",
    "capabilities.py",
    "cgroup_raise.py",
    "clone3_userns.py",
    "cpu_loop.py",
    "dev_kvm.py",
    "disk_fill.py",
    "dns_exfil.py",
    "fork_bomb.py",
    "git_plant.py",
    "hardlink.py",
    "inherited_fds.py",
    "inode_bomb.py",
    "io_uring.py",
    "keyctl.py",
    "kmsg_write.py",
    "many_processes.py",
    "memory_bomb.py",
    "mknod_device.py",
    "mount_tmpfs.py",
    "netlink_route.py",
    "open_by_handle.py",
    "parent_env.py",
    "perf_event.py",
    "ptrace_pid.py",
    "raw_socket.py",
    "read_path.py",
    "setuid_plant.py",
    "signal_pid.py",
    "survivor.py",
    "symlink_own.py",
    "sysv_shm.py",
    "tcp_connect.py",
    "tiocsti.py",
    "udp_send.py",
    "unix_connect.py",
    "userns_mount.py",
    "write_file.py",
);

/// The helpers every program imports (`from _common import ...`).
pub static COMMON: Program = Program {
    name: "_common.py",
    source: include_str!("../programs/_common.py"),
};

/// Host-side helpers: run by the harness on the host to set a scene up, never in a sandbox.
pub static HOST_HELPERS: &[Program] = &[Program {
    name: "host/shm_segment.py",
    source: include_str!("../programs/host/shm_segment.py"),
}];

/// The program or host helper called `name`. Panics on an unknown name: the catalogue names
/// its programs literally, so that is a bug in the catalogue (caught by its tests).
pub fn program(name: &str) -> &'static Program {
    PROGRAMS
        .iter()
        .chain(HOST_HELPERS)
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no attack program named {name}"))
}

impl Program {
    /// The text to pass to `python3 -c`: loads `_common`, then runs this program under its own
    /// file name. Sources are raw triple-quoted literals: a test checks none contains `'''`.
    pub fn inline(&self) -> String {
        format!(
            "import sys, types\n\
             common = types.ModuleType('_common')\n\
             exec(compile(r'''{common}''', '{common_name}', 'exec'), common.__dict__)\n\
             sys.modules['_common'] = common\n\
             sys.argv[0] = '{name}'\n\
             exec(compile(r'''{source}''', '{name}', 'exec'), {{'__name__': '__main__'}})\n",
            common = COMMON.source,
            common_name = COMMON.name,
            name = self.name,
            source = self.source,
        )
    }

    /// `PYTHON -B -c <inline text> ARGS...` (-B: never write bytecode anywhere).
    pub fn argv<I, S>(&self, python: &str, args: I) -> Vec<String>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut argv = vec![python.to_string(), "-B".into(), "-c".into(), self.inline()];
        argv.extend(args.into_iter().map(Into::into));
        argv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PYTHON: &str = "/usr/bin/python3";

    #[test]
    fn every_file_in_programs_is_listed_and_every_listed_program_exists() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("programs");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".py") && name != COMMON.name)
            .collect();
        files.sort();
        let listed: Vec<&str> = PROGRAMS.iter().map(|p| p.name).collect();
        assert_eq!(files, listed, "programs/ and PROGRAMS differ");
    }

    #[test]
    fn sources_fit_in_a_raw_triple_quoted_literal() {
        for program in PROGRAMS.iter().chain(HOST_HELPERS).chain([&COMMON]) {
            assert!(
                !program.source.contains("'''") && !program.source.trim_end().ends_with('\\'),
                "{} cannot be inlined as r'''...'''",
                program.name
            );
        }
    }

    #[test]
    fn an_inlined_program_imports_common_and_sees_its_arguments() {
        if !std::path::Path::new(PYTHON).exists() {
            eprintln!("skipped: {PYTHON} is missing");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, "s3cret").unwrap();
        let argv = program("read_path.py").argv(PYTHON, [file.display().to_string()]);
        let output = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.starts_with("ESCAPED read") && stdout.contains("s3cret"),
            "{stdout} {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    #[test]
    fn a_failing_program_names_its_own_file_in_the_traceback() {
        if !std::path::Path::new(PYTHON).exists() {
            eprintln!("skipped: {PYTHON} is missing");
            return;
        }
        // No argument: the script's sys.argv[1] raises IndexError.
        let argv = program("tcp_connect.py").argv(PYTHON, Vec::<String>::new());
        let output = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("File \"tcp_connect.py\""), "{stderr}");
    }
}
