//! Looking at the host: processes, mounts, the kernel log, block devices; running host helpers.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The interpreter host-side helpers run with (the host's, whatever the sandbox sees).
pub const HOST_PYTHON: &str = "/usr/bin/python3";

/// Processes whose command line contains `needle` (not this process).
pub fn processes_with(needle: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (pid != me && cmdline.contains(needle)).then_some((pid, cmdline.trim().to_string()))
        })
        .collect()
}

/// SIGKILL to `pid` (negative: a process group), ignoring failure.
pub fn kill(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

pub fn host_mountinfo() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The host kernel log, read like dmesg does (needs root when dmesg_restrict is set).
pub fn kernel_log() -> String {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(mut kmsg) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open("/dev/kmsg")
    else {
        return String::new();
    };
    let mut log = Vec::new();
    let mut record = [0u8; 8192];
    loop {
        match kmsg.read(&mut record) {
            Ok(0) => break,
            Ok(n) => log.extend_from_slice(&record[..n]),
            Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&log).into_owned()
}

/// The first block device root can open, and the sha256 of its first sector as python sees it.
pub fn readable_block_device() -> Option<(String, String)> {
    let mut candidates: Vec<String> = std::fs::read_dir("/sys/block")
        .ok()?
        .flatten()
        .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
        .collect();
    candidates.sort();
    candidates.into_iter().find_map(|device| {
        let script = "import hashlib,sys\nprint(hashlib.sha256(open(sys.argv[1],'rb').read(512)).hexdigest())";
        let digest = run_host(&[HOST_PYTHON, "-c", script, &device]).ok()?;
        Some((device, digest.trim().to_string()))
    })
}

/// Runs a host helper to completion; its stdout on success.
pub fn run_host<S: AsRef<str>>(argv: &[S]) -> Result<String, String> {
    let argv: Vec<&str> = argv.iter().map(AsRef::as_ref).collect();
    let output = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed: {}",
            argv[0],
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// 32 random hex digits (std's per-process random hash keys, a counter and the clock).
pub fn random_hex() -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_usize(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    let mut second = RandomState::new().build_hasher();
    second.write_u64(hasher.finish());
    format!("{:016x}{:016x}", hasher.finish(), second.finish())
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
