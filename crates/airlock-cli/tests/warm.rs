//! Warm start: prepared sandboxes through the library.

mod support;

use std::time::Duration;

use support::api::{load_profile, Sandbox, SandboxOptions, WarmOptions};

fn sandbox(profile: &str) -> Sandbox {
    let options = SandboxOptions {
        init_program: Some(env!("CARGO_BIN_EXE_airlock").into()),
        ..SandboxOptions::default()
    };
    Sandbox::with_options(load_profile(profile).unwrap(), options).unwrap()
}

#[test]
fn a_warm_run_runs() {
    if !support::sandbox_available() {
        eprintln!("skipping: the native backend cannot run here");
        return;
    }
    let sb = sandbox("untrusted");
    let pool = sb.warm(WarmOptions::new(2)).unwrap();
    assert!(pool.wait_ready(1, Duration::from_secs(20)), "{:?}", pool.stats());
    let result = pool
        .command(support::PYTHON)
        .args(["-c", "import sys; print(open('in.txt').read(), sys.stdin.read())"])
        .file("in.txt", "hello")
        .stdin("world")
        .run()
        .unwrap();
    eprintln!("{result:?}");
    let cold = sb.command("/bin/true").run().unwrap();
    assert_eq!(result.isolation, cold.isolation);
    assert!(result.success(), "{result:?}");
    assert_eq!(result.stdout.as_deref(), Some("hello world\n"));
    eprintln!("{:?}", pool.stats());
}
