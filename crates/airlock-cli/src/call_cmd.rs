//! `airlock call`: call one Python function with JSON arguments and print its JSON result, or a
//! typed JSON error (`{"error": "timeout", "message": ..., ...}`) with exit code 1.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};
use serde_json::Value;

use airlock::call::{call, CallOptions, ToolError, ToolPolicy, ToolSpec};
use airlock::policy::units::ByteSize;

use crate::sandbox_flags::{LimitFlags, SetupFlags};

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum PolicyArg {
    /// Tier 0 only: for tools you trust that may misbehave.
    Subprocess,
    /// The strongest isolation available here.
    Sandboxed,
}

#[derive(Args, Debug)]
pub struct CallArgs {
    /// How the tool is isolated.
    #[arg(long, value_enum, default_value = "sandboxed")]
    pub policy: PolicyArg,
    /// Directory holding the tool's module (exposed read-only).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub path: PathBuf,
    /// The arguments as JSON: an object is passed as keyword arguments, an array as positional.
    #[arg(long, value_name = "JSON", default_value = "{}", value_parser = parse_json)]
    pub args: Value,
    /// The Python interpreter.
    #[arg(long, value_name = "PATH", default_value = "/usr/bin/python3")]
    pub python: String,
    /// Largest result accepted.
    #[arg(long, value_name = "SIZE")]
    pub max_result: Option<ByteSize>,
    /// Bytes of stderr allowed before the call is stopped.
    #[arg(long, value_name = "SIZE")]
    pub stderr_cap: Option<ByteSize>,
    #[command(flatten)]
    pub limits: LimitFlags,
    #[command(flatten)]
    pub setup: SetupFlags,
    /// The function to call, as module:function.
    #[arg(value_name = "MODULE:FUNCTION")]
    pub target: String,
}

fn parse_json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|err| format!("not valid JSON: {err}"))
}

pub fn call_tool(args: CallArgs) -> Result<u8> {
    let tool = ToolSpec::new(&args.path, &args.target);
    let policy = match args.policy {
        PolicyArg::Subprocess => ToolPolicy::Subprocess,
        PolicyArg::Sandboxed => ToolPolicy::Sandboxed,
    };
    match call(&tool, &args.args, policy, &call_options(&args)) {
        Ok(value) => {
            println!("{value}");
            Ok(0)
        }
        Err(error) => {
            eprintln!("airlock: call {}: {error}", args.target);
            println!("{}", error_json(&error));
            Ok(1)
        }
    }
}

fn call_options(args: &CallArgs) -> CallOptions {
    let mut options = CallOptions {
        python: args.python.clone(),
        sandbox: args.setup.options(),
        wall_time: args.limits.wall.map(|s| s.0),
        cpu_time: args.limits.cpu.map(|s| s.0),
        memory_bytes: args.limits.mem.map(|s| s.0),
        processes: args.limits.pids,
        stderr_bytes: args.stderr_cap.map(|s| s.0),
        ..CallOptions::default()
    };
    if let Some(max) = args.max_result {
        options.max_result_bytes = max.0;
    }
    options
}

/// The error's fields plus a human-readable `message`.
fn error_json(error: &ToolError) -> Value {
    let mut value = serde_json::to_value(error).unwrap_or_default();
    if let Value::Object(fields) = &mut value {
        fields.insert("message".into(), Value::from(error.to_string()));
    }
    value
}
