//! Tier 0 without a cgroup: its process cap is RLIMIT_NPROC on the host, which counts every
//! task of the program's uid. A binary of its own: other tests' sandboxes run as the same uid.

mod support;

use support::*;

/// Tier 0 without a cgroup has only RLIMIT_NPROC, set on the host, where it counts every task
/// of the program's uid: other runs' and the caller's own. The run's cap must still be its own
/// `--pids`: tasks the uid already has are headroom, not part of the run's share.
#[test]
fn a_tier0_run_without_a_cgroup_gets_its_own_process_cap_on_a_busy_host() {
    let tier0 = ["--dev", "--backend", "none", "--no-cgroup"];
    let whoami = run_json(&tier0, &["/usr/bin/id", "-u"]);
    let uid: u32 = whoami["stdout"].as_str().unwrap().trim().parse().unwrap();
    if uid != nix::unistd::getuid().as_raw() && !is_root() {
        return skip("starting processes as the program's uid needs root");
    }
    // The uid is busy: 15 tasks that are not this run's.
    let mut busy: Vec<_> = (0..15)
        .map(|_| {
            use std::os::unix::process::CommandExt;
            std::process::Command::new("/bin/sleep")
                .arg("60")
                .uid(uid)
                .spawn()
                .unwrap()
        })
        .collect();
    let forks = "import os\nn=0\ntry:\n for i in range(30):\n  if os.fork()==0:\n   import time; time.sleep(1); os._exit(0)\n  n+=1\nexcept OSError as e: print('refused', e.errno)\nprint('forks', n)";
    let flags = [&tier0[..], &["--pids", "10"]].concat();
    let result = run_json(&flags, &[PYTHON, "-c", forks]);
    for child in &mut busy {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!(result["status"], "exited", "{result}");
    let stdout = result["stdout"].as_str().unwrap();
    let forked: u32 = stdout.rsplit(' ').next().unwrap().trim().parse().unwrap();
    // The run has its own share (several forks succeed although the uid had 15 tasks) and
    // the cap holds (a fork is refused with EAGAIN before 30). The cap is 10 plus the uid's
    // tasks at the start, so tasks of the uid that end meanwhile leave the bomb more room
    // (docs/attacks.md): this test has a binary of its own, so no other test's sandboxes
    // (the same uid) come and go during it.
    assert!(stdout.starts_with("refused 11\n"), "{result}");
    assert!(
        (5..30).contains(&forked),
        "{forked} forks under --pids 10: {result}"
    );
}
