//! Tool calls (`airlock::tool::call` and `airlock call`) against the classic adversarial tools,
//! under both policies: every misbehaviour must come back as a typed error, never a crash or a
//! forged result, and nothing the tool started may outlive the call.
#![cfg(target_os = "linux")]

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use support::api::{call, CallOptions, CancelToken, ToolError, ToolPolicy, ToolSpec};
use support::api::{ByteSize, LimitsSection, Overrides, Seconds};
use support::*;

const TOOLS: &str = r#"
import os, sys

def add(x, y):
    return x + y

def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}

def noisy(x):
    print('AIRLOCK-RESULT 00000000000000000000000000000000 {"ok": true, "result": 666}')
    print("plain text on stdout")
    sys.stdout.flush()
    os.write(1, b"raw bytes on fd 1\n")
    os.system("echo from a child process")
    return x * 2

def forge_private_channel():
    for fd in range(3, 64):
        try:
            os.write(fd, b'AIRLOCK-RESULT 0000 {"ok": true, "result": 666}\n')
        except OSError:
            pass
    return 1

def spin():
    while True:
        pass

def eat_memory():
    hoard = []
    while True:
        hoard.append(bytearray(32 << 20))

def fork_bomb(tag):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(15, tag.encode(), 0, 0, 0) != 0:  # PR_SET_NAME, inherited by every fork
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NAME) failed")
    while True:
        try:
            os.fork()
        except OSError:
            pass

def flood():
    while True:
        print("x" * 10000)

def huge_result():
    return "x" * (2 << 20)

def returns_set():
    return {1, 2}

def print_then_exit_zero():
    print('{"ok": true, "result": 1}')
    sys.exit(0)

def print_then_os_exit_zero():
    print('{"ok": true, "result": 1}')
    sys.stdout.flush()
    os._exit(0)

def raise_error():
    raise ValueError("bad input")

def abort():
    sys.stderr.write("dying words\n")
    sys.stderr.flush()
    os.abort()

def exit_three():
    sys.exit(3)
"#;

struct Tools {
    dir: tempfile::TempDir,
}

impl Tools {
    fn new() -> Self {
        let dir = shared_tempdir();
        write_file(dir.path(), "adversary.py", TOOLS);
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn call(&self, function: &str, args: Value, policy: ToolPolicy) -> Result<Value, ToolError> {
        self.call_with(function, args, policy, &options())
    }

    fn call_with(
        &self,
        function: &str,
        args: Value,
        policy: ToolPolicy,
        options: &CallOptions,
    ) -> Result<Value, ToolError> {
        let spec = ToolSpec::new(self.path(), format!("adversary:{function}"));
        call(&spec, &args, policy, options)
    }
}

fn options() -> CallOptions {
    CallOptions {
        sandbox: sandbox_options(),
        overrides: limits(20),
        ..CallOptions::default()
    }
}

/// A wall-clock limit in seconds and 256MiB of memory.
fn limits(wall_secs: u64) -> Overrides {
    Overrides {
        limits: LimitsSection {
            wall_time: Some(Seconds(Duration::from_secs(wall_secs))),
            memory: Some(ByteSize(256 << 20)),
            ..LimitsSection::default()
        },
        ..Overrides::default()
    }
}

/// The policies this host can run; `Sandboxed` needs the full native sandbox.
fn policies() -> Vec<ToolPolicy> {
    let mut policies = vec![ToolPolicy::Subprocess];
    if sandbox_available() {
        policies.push(ToolPolicy::Sandboxed);
    } else {
        skip("sandboxed policy: the untrusted profile cannot run on this host");
    }
    policies
}

#[test]
fn returns_the_json_result_and_maps_arguments() {
    let tools = Tools::new();
    for policy in policies() {
        let sum = tools.call("add", json!({"x": 2, "y": 3}), policy);
        assert_eq!(sum.unwrap(), json!(5), "{policy:?}");
        let positional = tools.call("echo", json!([1, "two"]), policy).unwrap();
        assert_eq!(positional, json!({"args": [1, "two"], "kwargs": {}}));
        let single = tools.call("echo", json!("solo"), policy).unwrap();
        assert_eq!(single, json!({"args": ["solo"], "kwargs": {}}));
    }
}

#[test]
fn stdout_prints_cannot_corrupt_or_forge_the_result() {
    let tools = Tools::new();
    for policy in policies() {
        let result = tools.call("noisy", json!({"x": 21}), policy);
        assert_eq!(result.unwrap(), json!(42), "{policy:?}");
    }
}

#[test]
fn a_forged_frame_on_the_private_channel_is_bad_output() {
    let tools = Tools::new();
    for policy in policies() {
        let result = tools.call("forge_private_channel", json!({}), policy);
        assert!(
            matches!(result, Err(ToolError::BadOutput { .. })),
            "{policy:?}: {result:?}"
        );
    }
}

#[test]
fn infinite_loop_times_out() {
    let tools = Tools::new();
    let options = CallOptions {
        overrides: limits(2),
        ..options()
    };
    for policy in policies() {
        let start = Instant::now();
        let result = tools.call_with("spin", json!({}), policy, &options);
        assert!(
            matches!(result, Err(ToolError::Timeout { .. })),
            "{policy:?}: {result:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(10), "{policy:?}");
    }
}

/// A running call stops when its token is cancelled, and one whose token fired before it
/// started never runs the tool: both are `Cancelled`.
#[test]
fn a_cancel_token_stops_a_call() {
    let tools = Tools::new();
    for policy in policies() {
        let token = CancelToken::new();
        let options = CallOptions {
            cancel: Some(token.clone()),
            ..options()
        };
        let start = Instant::now();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            token.cancel();
        });
        let result = tools.call_with("spin", json!({}), policy, &options);
        assert!(
            matches!(result, Err(ToolError::Cancelled)),
            "{policy:?}: {result:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(10), "{policy:?}");
        let result = tools.call_with("add", json!({"x": 1, "y": 2}), policy, &options);
        assert!(
            matches!(result, Err(ToolError::Cancelled)),
            "{policy:?}: {result:?}"
        );
    }
}

#[test]
fn memory_eater_hits_the_memory_limit_with_a_cgroup() {
    if !is_root() || !Path::new("/sys/fs/cgroup/memory").is_dir() {
        return skip("needs root and the cgroup v1 memory controller for per-run cgroups");
    }
    let tools = Tools::new();
    for policy in policies() {
        let result = tools.call("eat_memory", json!({}), policy);
        let Err(ToolError::MemoryLimit {
            peak_memory_bytes,
            detail,
        }) = result
        else {
            panic!("{policy:?}: expected memory_limit, got {result:?}");
        };
        assert!(detail.is_none(), "the cgroup, not Python, should stop it");
        assert!(peak_memory_bytes.is_some_and(|peak| peak >= 200 << 20));
    }
}

#[test]
fn memory_eater_hits_the_memory_limit_without_a_cgroup() {
    let tools = Tools::new();
    let mut options = options();
    options.sandbox.no_cgroup = true;
    for policy in policies() {
        let result = tools.call_with("eat_memory", json!({}), policy, &options);
        assert!(
            matches!(result, Err(ToolError::MemoryLimit { .. })),
            "{policy:?}: {result:?}"
        );
    }
}

fn processes_named(comm: &str) -> usize {
    let entries = std::fs::read_dir("/proc").unwrap();
    entries
        .filter_map(Result::ok)
        .filter(|entry| {
            let path = entry.path().join("comm");
            std::fs::read_to_string(path).is_ok_and(|name| name.trim_end() == comm)
        })
        .count()
}

#[test]
fn fork_bomb_is_contained_and_leaves_nothing_behind() {
    let tools = std::sync::Arc::new(Tools::new());
    let options = CallOptions {
        overrides: limits(3),
        ..options()
    };
    for policy in policies() {
        let tag = format!("airlockbomb{}", policy as u8);
        let bomb = {
            let (tools, options, tag) = (tools.clone(), options.clone(), tag.clone());
            std::thread::spawn(move || {
                tools.call_with("fork_bomb", json!({"tag": tag}), policy, &options)
            })
        };
        let mut most_seen = 0;
        while !bomb.is_finished() {
            most_seen = most_seen.max(processes_named(&tag));
            std::thread::sleep(Duration::from_millis(100));
        }
        let result = bomb.join().unwrap();
        assert!(
            matches!(
                result,
                Err(ToolError::Timeout { .. }
                    | ToolError::CpuLimit { .. }
                    | ToolError::MemoryLimit { .. })
            ),
            "{policy:?}: {result:?}"
        );
        assert!(
            most_seen > 1,
            "{policy:?}: the bomb never forked, the test proves nothing"
        );
        assert_eq!(
            processes_named(&tag),
            0,
            "{policy:?}: bomb processes survived"
        );
        let after = tools.call("add", json!({"x": 1, "y": 1}), policy);
        assert_eq!(
            after.unwrap(),
            json!(2),
            "{policy:?}: host unusable after the bomb"
        );
    }
}

#[test]
fn output_flood_hits_the_output_cap() {
    let tools = Tools::new();
    for policy in policies() {
        let result = tools.call("flood", json!({}), policy);
        let Err(ToolError::OutputLimit { stderr_bytes, .. }) = result else {
            panic!("{policy:?}: expected output_limit, got {result:?}");
        };
        assert!(stderr_bytes > 1 << 20);
    }
}

#[test]
fn an_oversized_result_is_bad_output() {
    let tools = Tools::new();
    let options = CallOptions {
        max_result_bytes: 1 << 20,
        ..options()
    };
    for policy in policies() {
        let result = tools.call_with("huge_result", json!({}), policy, &options);
        let Err(ToolError::BadOutput { reason, .. }) = &result else {
            panic!("{policy:?}: expected bad_output, got {result:?}");
        };
        assert!(reason.contains("larger than"), "{reason}");
    }
}

#[test]
fn non_json_results_and_stdout_only_tools_are_bad_output() {
    let tools = Tools::new();
    for policy in policies() {
        for function in [
            "returns_set",
            "print_then_exit_zero",
            "print_then_os_exit_zero",
        ] {
            let result = tools.call(function, json!({}), policy);
            assert!(
                matches!(result, Err(ToolError::BadOutput { .. })),
                "{policy:?} {function}: {result:?}"
            );
        }
    }
}

#[test]
fn exceptions_and_crashes_are_typed() {
    let tools = Tools::new();
    for policy in policies() {
        let raised = tools.call("raise_error", json!({}), policy);
        let Err(ToolError::Raised {
            exception,
            exception_message,
            traceback,
        }) = raised
        else {
            panic!("{policy:?}: expected raised, got {raised:?}");
        };
        assert_eq!(
            (exception.as_str(), exception_message.as_str()),
            ("ValueError", "bad input")
        );
        assert!(traceback.contains("raise_error"));

        let aborted = tools.call("abort", json!({}), policy);
        let Err(ToolError::Crashed {
            signal,
            stderr_tail,
            ..
        }) = aborted
        else {
            panic!("{policy:?}: expected crashed, got {aborted:?}");
        };
        assert_eq!(signal, Some(6));
        assert!(stderr_tail.contains("dying words"), "{stderr_tail:?}");

        let exited = tools.call("exit_three", json!({}), policy);
        assert!(
            matches!(
                exited,
                Err(ToolError::Crashed {
                    exit_code: Some(3),
                    ..
                })
            ),
            "{policy:?}: {exited:?}"
        );
    }
}

#[test]
fn unknown_modules_functions_and_targets_are_bad_tool() {
    let tools = Tools::new();
    for policy in policies() {
        for target in [
            "missing_module:f",
            "adversary:missing",
            "adversary",
            "a b:c",
        ] {
            let spec = ToolSpec::new(tools.path(), target);
            let result = call(&spec, &json!({}), policy, &options());
            assert!(
                matches!(result, Err(ToolError::BadTool { .. })),
                "{policy:?} {target}: {result:?}"
            );
        }
    }
    let nowhere = ToolSpec::new("/nonexistent/airlock-tools", "m:f");
    let result = call(&nowhere, &json!({}), ToolPolicy::Subprocess, &options());
    assert!(
        matches!(result, Err(ToolError::BadTool { .. })),
        "{result:?}"
    );
}

#[test]
fn cli_prints_the_result_or_a_typed_error() {
    let tools = Tools::new();
    let path = tools.path().to_str().unwrap();
    for policy in ["subprocess", "sandboxed"] {
        if policy == "sandboxed" && !sandbox_available() {
            return skip("sandboxed policy: the untrusted profile cannot run on this host");
        }
        let ok = airlock(&[
            "call",
            "--policy",
            policy,
            "--path",
            path,
            "adversary:add",
            "--args",
            r#"{"x": 40, "y": 2}"#,
        ]);
        assert_eq!(ok.status.code(), Some(0), "{}", stderr_text(&ok));
        assert_eq!(stdout_text(&ok).trim(), "42");

        let late = airlock(&[
            "call",
            "--policy",
            policy,
            "--path",
            path,
            "--wall",
            "1s",
            "adversary:spin",
        ]);
        assert_eq!(late.status.code(), Some(1));
        let error: Value = serde_json::from_str(stdout_text(&late).trim()).unwrap();
        assert_eq!(error["error"], "timeout");
        assert!(error["message"].as_str().unwrap().contains("timed out"));
    }
}

#[test]
fn cli_rejects_invalid_json_arguments() {
    let out = airlock(&["call", "--path", "/tmp", "m:f", "--args", "{not json"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr_text(&out).contains("not valid JSON"),
        "{}",
        stderr_text(&out)
    );
}
