//! Tool calls: run one Python function (`module:function`) with JSON arguments and get its JSON
//! result back, under a declared policy, with every failure typed.
//!
//! The arguments go in on stdin together with a random nonce. A small shim (`shim.py`, run with
//! `python3 -I -c`) keeps a private, close-on-exec copy of the original stdout and points fd 1
//! at stderr before importing the tool, so whatever the tool or its children print lands on
//! stderr. The shim then writes exactly one framed line, `AIRLOCK-RESULT <nonce> <reply>`, on the
//! private copy. The host accepts stdout only if it is that single line with the right nonce:
//! stray prints can neither corrupt nor forge a result. (The tool runs in the shim's process,
//! so a tool that deliberately digs out the descriptor and nonce can choose its own result —
//! which it can do anyway by returning it.)

use std::io::Read;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cancel::CancelToken;
use crate::error::FailureKind;
use crate::policy::units::ByteSize;
use crate::policy::{load_profile, Overrides, Policy};
use crate::result::{RunResult, RunStatus};
use crate::{Sandbox, SandboxOptions};

/// The shim that runs inside the sandbox.
pub const SHIM: &str = include_str!("shim.py");

/// Prefix of the result line on the private channel.
pub const RESULT_FRAME: &str = "AIRLOCK-RESULT";

/// How much of stderr a `crashed` error carries (the end of it).
pub const STDERR_TAIL_CHARS: usize = 2000;

/// How much of stdout a `bad_output` error quotes (the start of it).
pub const STDOUT_EXCERPT_CHARS: usize = 256;

/// How strongly a tool is isolated.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ToolPolicy {
    /// Tier 0 only (built-in `trusted` profile): for tools the caller trusts but that may
    /// misbehave. Limits, env scrubbing and tree kill apply; the host filesystem is visible.
    Subprocess,
    /// The strongest isolation available (built-in `untrusted` profile).
    Sandboxed,
}

/// Where a tool lives and which function to call.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ToolSpec {
    /// The directory holding the tool's module; exposed read-only and put first on `sys.path`.
    pub module_dir: PathBuf,
    /// `module:function`, e.g. `tools.text:word_count` (the function may be `Class.method`).
    pub target: String,
}

impl ToolSpec {
    pub fn new(module_dir: impl Into<PathBuf>, target: impl Into<String>) -> Self {
        Self {
            module_dir: module_dir.into(),
            target: target.into(),
        }
    }
}

/// How to run calls: interpreter, sandbox set-up, the profile and what the caller changes on
/// top of it (the same [`Overrides`] as `run` and `exec`: limits, paths, network, backend).
#[derive(Debug, Clone)]
pub struct CallOptions {
    /// The Python interpreter (default `/usr/bin/python3`).
    pub python: String,
    /// Sandbox set-up (`init_program`, cgroups, degradation).
    pub sandbox: SandboxOptions,
    /// A profile (built-in name or file) instead of the one the [`ToolPolicy`] implies.
    pub profile: Option<String>,
    /// Changes to the profile. `limits.stderr` is the stderr kept before the call is stopped
    /// with `output_limit`; `limits.stdout` is set from `max_result_bytes`.
    pub overrides: Overrides,
    /// Environment variables for the tool (they win over the profile's).
    pub env: Vec<(String, String)>,
    /// Largest serialised result accepted (default 16 MiB).
    pub max_result_bytes: u64,
    /// Stops the call when cancelled: [`ToolError::Cancelled`] (also when the token fires
    /// before the tool started).
    pub cancel: Option<CancelToken>,
}

impl Default for CallOptions {
    fn default() -> Self {
        Self {
            python: "/usr/bin/python3".into(),
            sandbox: SandboxOptions::default(),
            profile: None,
            overrides: Overrides::default(),
            env: Vec::new(),
            max_result_bytes: 16 << 20,
            cancel: None,
        }
    }
}

/// Why a tool call produced no result. Serialises as `{"error": "<kind>", ...fields}`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, thiserror::Error)]
#[serde(tag = "error", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolError {
    #[error("the tool timed out after {wall_ms} ms")]
    Timeout { wall_ms: u64 },

    #[error("the tool used up its CPU time ({cpu_ms} ms)")]
    CpuLimit { cpu_ms: u64 },

    #[error("the tool hit its memory limit{}", detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    MemoryLimit {
        peak_memory_bytes: Option<u64>,
        detail: Option<String>,
    },

    #[error("the tool wrote more output than allowed (stdout {stdout_bytes} bytes, stderr {stderr_bytes} bytes)")]
    OutputLimit {
        stdout_bytes: u64,
        stderr_bytes: u64,
    },

    #[error("the tool wrote a file over the file-size limit")]
    FileSizeLimit,

    #[error("the tool call was cancelled")]
    Cancelled,

    #[error("the tool crashed ({}); stderr ends with: {stderr_tail}", exit_description(*exit_code, *signal))]
    Crashed {
        exit_code: Option<i32>,
        signal: Option<i32>,
        stderr_tail: String,
    },

    #[error("the tool raised {exception}: {exception_message}")]
    Raised {
        exception: String,
        exception_message: String,
        traceback: String,
    },

    #[error("the tool's output is not a valid result: {reason}")]
    BadOutput {
        reason: String,
        stdout_excerpt: String,
    },

    #[error("the tool cannot be called: {reason}")]
    BadTool { reason: String },

    #[error("the sandbox failed: {message}")]
    SandboxError {
        message: String,
        /// The kind of failure (a refusal or a set-up failure), where known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_kind: Option<FailureKind>,
    },
}

fn exit_description(exit_code: Option<i32>, signal: Option<i32>) -> String {
    match (exit_code, signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "no exit status".into(),
    }
}

impl ToolError {
    /// The kind as serialised in the `error` field, e.g. `timeout`.
    pub fn kind(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|value| value["error"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    fn sandbox(error: impl std::fmt::Display) -> Self {
        Self::SandboxError {
            message: error.to_string(),
            error_kind: None,
        }
    }

    fn refused(error: crate::Error) -> Self {
        Self::SandboxError {
            message: error.to_string(),
            error_kind: Some(error.kind().into()),
        }
    }

    fn bad_output(reason: impl Into<String>, stdout: &str) -> Self {
        Self::BadOutput {
            reason: reason.into(),
            stdout_excerpt: stdout.chars().take(STDOUT_EXCERPT_CHARS).collect(),
        }
    }
}

/// Calls `tool` with `args` under `policy`. Never panics on anything the tool does: every
/// failure is a [`ToolError`].
///
/// `args` is passed as keyword arguments when it is an object, as positional arguments when
/// it is an array, and as the single argument otherwise.
pub fn call(
    tool: &ToolSpec,
    args: &Value,
    policy: ToolPolicy,
    options: &CallOptions,
) -> Result<Value, ToolError> {
    call_with_run(tool, args, policy, options).value
}

/// A call's outcome with the run behind it, for callers that record what the sandbox did
/// (isolation layers, the egress gate's decisions).
#[derive(Debug)]
pub struct CallRun {
    pub value: Result<Value, ToolError>,
    /// The sandbox's result; `None` when the call was refused before a sandbox ran.
    pub run: Option<RunResult>,
}

/// [`call`], also returning the sandbox's [`RunResult`].
pub fn call_with_run(
    tool: &ToolSpec,
    args: &Value,
    policy: ToolPolicy,
    options: &CallOptions,
) -> CallRun {
    let refused = |value: ToolError| CallRun {
        value: Err(value),
        run: None,
    };
    let request = match Request::new(tool, args) {
        Ok(request) => request,
        Err(e) => return refused(e),
    };
    let sandbox = match tool_sandbox(request.module_dir.as_ref(), policy, options) {
        Ok(sandbox) => sandbox,
        Err(e) => return refused(e),
    };
    let mut command = sandbox
        .command(options.python.clone())
        .args(["-I", "-c", SHIM])
        .stdin(request.to_bytes());
    if let Some(token) = &options.cancel {
        command = command.cancel_on(token);
    }
    for (key, value) in &options.env {
        command = command.env(key.clone(), value.clone());
    }
    match command.run() {
        Ok(result) => CallRun {
            value: interpret(&result, &request.nonce, options.max_result_bytes),
            run: Some(result),
        },
        Err(e) => refused(ToolError::refused(e)),
    }
}

/// The policy a call runs under: the profile (`options.profile`, else the one for `policy`),
/// the overrides from `options`, the module directory read-only and stdout sized for the
/// largest result.
pub fn tool_policy(
    module_dir: &std::path::Path,
    policy: ToolPolicy,
    options: &CallOptions,
) -> Result<Policy, ToolError> {
    let profile = options.profile.as_deref().unwrap_or(profile_name(policy));
    let refused = |e: crate::Error| ToolError::refused(e);
    let mut resolved = load_profile(profile).map_err(|e| refused(e.into()))?;
    options
        .overrides
        .apply(&mut resolved)
        .map_err(|e| refused(e.into()))?;
    resolved.filesystem.read_only.push(module_dir.to_owned());
    resolved.limits.stdout = ByteSize(stdout_cap(options.max_result_bytes));
    Ok(resolved)
}

fn profile_name(policy: ToolPolicy) -> &'static str {
    match policy {
        ToolPolicy::Subprocess => "trusted",
        ToolPolicy::Sandboxed => "untrusted",
    }
}

/// Room for the frame around the largest accepted result.
fn stdout_cap(max_result_bytes: u64) -> u64 {
    max_result_bytes.saturating_add(4096)
}

fn tool_sandbox(
    module_dir: &std::path::Path,
    policy: ToolPolicy,
    options: &CallOptions,
) -> Result<Sandbox, ToolError> {
    let resolved = tool_policy(module_dir, policy, options)?;
    // The `trusted` profile behind `Subprocess` may use backend none by its origin.
    Sandbox::with_options(resolved, options.sandbox.clone()).map_err(ToolError::refused)
}

/// What the shim reads on stdin.
#[derive(Serialize, Debug)]
struct Request<'a> {
    nonce: String,
    module_dir: String,
    target: &'a str,
    args: &'a Value,
}

impl<'a> Request<'a> {
    fn new(tool: &'a ToolSpec, args: &'a Value) -> Result<Self, ToolError> {
        check_target(&tool.target)?;
        let module_dir = std::path::absolute(&tool.module_dir).map_err(|err| bad_dir(tool, err))?;
        if !module_dir.is_dir() {
            return Err(bad_dir(tool, "it is not an existing directory"));
        }
        let module_dir = module_dir
            .to_str()
            .ok_or_else(|| bad_dir(tool, "it is not valid UTF-8"))?
            .to_owned();
        Ok(Self {
            nonce: new_nonce()?,
            module_dir,
            target: &tool.target,
            args,
        })
    }

    fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

fn bad_dir(tool: &ToolSpec, problem: impl std::fmt::Display) -> ToolError {
    ToolError::BadTool {
        reason: format!(
            "module directory {} is unusable: {problem}",
            tool.module_dir.display()
        ),
    }
}

/// Accepts `module.sub:function.attr` made of Python identifiers.
fn check_target(target: &str) -> Result<(), ToolError> {
    let dotted = |text: &str| !text.is_empty() && text.split('.').all(is_identifier);
    match target.split_once(':') {
        Some((module, function)) if dotted(module) && dotted(function) => Ok(()),
        _ => Err(ToolError::BadTool {
            reason: format!(
                "target {target:?} is not module:function (e.g. \"mytools:word_count\")"
            ),
        }),
    }
}

fn is_identifier(part: &str) -> bool {
    let mut chars = part.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic());
    first_ok && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

fn new_nonce() -> Result<String, ToolError> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .map_err(|err| ToolError::sandbox(format!("failed to read /dev/urandom: {err}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Turns a finished run into the tool's result or a typed error.
fn interpret(result: &RunResult, nonce: &str, max_result_bytes: u64) -> Result<Value, ToolError> {
    let stdout = result.stdout.as_deref().unwrap_or_default();
    match result.status {
        RunStatus::Exited if result.exit_code == Some(0) => {
            if result.stdout_truncated || result.stdout_bytes > stdout_cap(max_result_bytes) {
                return Err(result_too_large(stdout, max_result_bytes));
            }
            parse_reply(stdout, nonce)
        }
        RunStatus::Exited | RunStatus::Signaled => Err(crashed(result)),
        RunStatus::OutputLimit if result.stdout_bytes > stdout_cap(max_result_bytes) => {
            Err(result_too_large(stdout, max_result_bytes))
        }
        RunStatus::OutputLimit => Err(ToolError::OutputLimit {
            stdout_bytes: result.stdout_bytes,
            stderr_bytes: result.stderr_bytes,
        }),
        RunStatus::Timeout => Err(ToolError::Timeout {
            wall_ms: result.wall_ms,
        }),
        RunStatus::CpuLimit => Err(ToolError::CpuLimit {
            cpu_ms: result.cpu_user_ms + result.cpu_sys_ms,
        }),
        RunStatus::MemoryLimit => Err(ToolError::MemoryLimit {
            peak_memory_bytes: result.peak_memory_bytes,
            detail: None,
        }),
        RunStatus::FileSizeLimit => Err(ToolError::FileSizeLimit),
        RunStatus::Cancelled => Err(ToolError::Cancelled),
        RunStatus::SandboxError => Err(ToolError::SandboxError {
            message: result
                .error
                .clone()
                .unwrap_or_else(|| "unknown sandbox error".into()),
            error_kind: result.error_kind,
        }),
    }
}

fn result_too_large(stdout: &str, max_result_bytes: u64) -> ToolError {
    ToolError::bad_output(
        format!("the result is larger than {max_result_bytes} bytes"),
        stdout,
    )
}

fn crashed(result: &RunResult) -> ToolError {
    let stderr = result.stderr.as_deref().unwrap_or_default();
    let skip = stderr.chars().count().saturating_sub(STDERR_TAIL_CHARS);
    ToolError::Crashed {
        exit_code: result.exit_code,
        signal: result.signal,
        stderr_tail: stderr.chars().skip(skip).collect(),
    }
}

/// The shim's reply, inside the frame.
#[derive(Deserialize, Debug)]
struct Reply {
    ok: bool,
    #[serde(default)]
    result: Value,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    exception: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    traceback: String,
}

fn parse_reply(stdout: &str, nonce: &str) -> Result<Value, ToolError> {
    let bad = |reason: &str| ToolError::bad_output(reason, stdout);
    if stdout.is_empty() {
        return Err(bad(
            "the tool exited without a result (did it call sys.exit or os._exit?)",
        ));
    }
    let line = stdout
        .strip_suffix('\n')
        .filter(|line| !line.contains('\n'))
        .ok_or_else(|| bad("the result channel must carry exactly one line"))?;
    let (frame_nonce, body) = line
        .strip_prefix(RESULT_FRAME)
        .and_then(|rest| rest.strip_prefix(' '))
        .and_then(|rest| rest.split_once(' '))
        .ok_or_else(|| bad("the result line is not framed"))?;
    if frame_nonce != nonce {
        return Err(bad("the result frame carries the wrong nonce"));
    }
    let reply: Reply = serde_json::from_str(body)
        .map_err(|err| bad(&format!("the result is not valid JSON: {err}")))?;
    reply_to_result(reply, stdout)
}

fn reply_to_result(reply: Reply, stdout: &str) -> Result<Value, ToolError> {
    if reply.ok {
        return Ok(reply.result);
    }
    match reply.kind.as_str() {
        "bad_tool" => Err(ToolError::BadTool {
            reason: reply.message,
        }),
        // Without a cgroup the memory limit is an address-space rlimit, which Python reports
        // as MemoryError: the same failure, seen from inside.
        "raised" if reply.exception == "MemoryError" => Err(ToolError::MemoryLimit {
            peak_memory_bytes: None,
            detail: Some("the tool raised MemoryError".into()),
        }),
        "raised" => Err(ToolError::Raised {
            exception: reply.exception,
            exception_message: reply.message,
            traceback: reply.traceback,
        }),
        "unserializable" => Err(ToolError::bad_output(
            format!("the tool's return value is not JSON: {}", reply.message),
            stdout,
        )),
        other => Err(ToolError::bad_output(
            format!("unknown reply kind {other:?}"),
            stdout,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: &str = "00ff";

    fn frame(body: &str) -> String {
        format!("{RESULT_FRAME} {NONCE} {body}\n")
    }

    #[test]
    fn targets_must_be_module_colon_function() {
        for good in ["m:f", "pkg.mod:f", "m:Class.method", "_m:_f1"] {
            assert!(check_target(good).is_ok(), "{good}");
        }
        for bad in [
            "m",
            ":f",
            "m:",
            "m:f:g",
            "1m:f",
            "m:f-g",
            "m;import os:f",
            "../m:f",
            "m.:f",
        ] {
            assert!(check_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_framed_reply_gives_the_result() {
        let value = parse_reply(&frame(r#"{"ok":true,"result":{"n":3}}"#), NONCE).unwrap();
        assert_eq!(value, serde_json::json!({"n": 3}));
        let null = parse_reply(&frame(r#"{"ok":true,"result":null}"#), NONCE).unwrap();
        assert_eq!(null, Value::Null);
    }

    #[test]
    fn anything_but_one_framed_line_is_bad_output() {
        let good = frame(r#"{"ok":true,"result":1}"#);
        let cases = [
            String::new(),
            "42\n".to_string(),
            good.trim_end().to_string(),
            format!("noise\n{good}"),
            format!("{good}{good}"),
            good.replace(NONCE, "beef"),
            frame("not json"),
            frame(r#"{"ok":false,"kind":"unserializable","message":"set"}"#),
        ];
        for stdout in cases {
            let err = parse_reply(&stdout, NONCE).unwrap_err();
            assert!(
                matches!(err, ToolError::BadOutput { .. }),
                "{stdout:?}: {err:?}"
            );
        }
    }

    #[test]
    fn failure_replies_are_typed() {
        let raised = frame(
            r#"{"ok":false,"kind":"raised","exception":"ValueError","message":"m","traceback":"t"}"#,
        );
        assert!(
            matches!(parse_reply(&raised, NONCE), Err(ToolError::Raised { exception, .. }) if exception == "ValueError")
        );
        let memory = raised.replace("ValueError", "MemoryError");
        assert!(matches!(
            parse_reply(&memory, NONCE),
            Err(ToolError::MemoryLimit { .. })
        ));
        let bad_tool =
            frame(r#"{"ok":false,"kind":"bad_tool","message":"ModuleNotFoundError: x"}"#);
        assert!(matches!(
            parse_reply(&bad_tool, NONCE),
            Err(ToolError::BadTool { .. })
        ));
    }

    #[test]
    fn errors_serialise_with_their_kind() {
        let err = ToolError::Timeout { wall_ms: 5 };
        assert_eq!(err.kind(), "timeout");
        assert_eq!(
            serde_json::to_value(&err).unwrap(),
            serde_json::json!({"error": "timeout", "wall_ms": 5})
        );
        assert_eq!(ToolError::sandbox("x").kind(), "sandbox_error");
    }

    #[test]
    fn nonces_are_fresh() {
        let (a, b) = (new_nonce().unwrap(), new_nonce().unwrap());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
    }
}
