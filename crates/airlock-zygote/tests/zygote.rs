//! Interpreter zygotes end to end: each test forks runs from a real template.

use std::time::Duration;

use airlock::zygote::{Zygote, ZygoteOptions, ZygoteRun};
use airlock::{RunResult, RunStatus, Sandbox};

fn zygote(preload: &[&str]) -> Zygote {
    let policy = airlock::policy::load_profile("untrusted").expect("profile");
    let sandbox = Sandbox::new(policy).expect("sandbox");
    let mut options = ZygoteOptions::python(preload);
    options.binary = Some(env!("CARGO_BIN_EXE_airlock-zygote").into());
    sandbox.zygote(options).expect("zygote")
}

fn run(zygote: &Zygote, code: &str) -> RunResult {
    zygote.run(&ZygoteRun::code(code)).expect("run")
}

#[test]
fn smoke() {
    let z = zygote(&["json", "re"]);
    let r = run(&z, "import json; print(json.dumps([1]))");
    eprintln!("{}", serde_json::to_string_pretty(&r).unwrap());
    assert_eq!(r.status, RunStatus::Exited);
    let _ = Duration::from_secs(1);
}
