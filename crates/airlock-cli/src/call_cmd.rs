//! `airlock call`: call one Python function with JSON arguments and print its JSON result, or a
//! typed JSON error (`{"error": "timeout", "message": ..., ...}`) with exit code 1. It takes the
//! same sandbox flags as `run` (profile, paths, workdir, environment, network, limits).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde_json::Value;

use airlock::call::{call, CallOptions, ToolError, ToolPolicy, ToolSpec};
use airlock::policy::units::ByteSize;

use crate::sandbox_flags::SandboxFlags;

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum PolicyArg {
    /// Tier 0 only: for tools you trust that may misbehave (profile trusted).
    Subprocess,
    /// The strongest isolation available here (profile untrusted).
    Sandboxed,
}

#[derive(Args, Debug)]
pub struct CallArgs {
    /// How the tool is isolated (the profile it implies; --profile names another).
    #[arg(long, value_enum)]
    pub policy: Option<PolicyArg>,
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
    #[command(flatten)]
    pub sandbox: SandboxFlags,
    /// The function to call, as module:function.
    #[arg(value_name = "MODULE:FUNCTION")]
    pub target: String,
}

fn parse_json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|err| format!("not valid JSON: {err}"))
}

pub fn call_tool(args: CallArgs) -> Result<u8> {
    let tool = ToolSpec::new(&args.path, &args.target);
    let (policy, options) = match call_options(&args) {
        Ok(chosen) => chosen,
        Err(error) => {
            eprintln!("airlock: call {}: {error:#}", args.target);
            println!("{}", error_json(&usage_error(&error)));
            return Ok(crate::SETUP_FAILURE);
        }
    };
    match call(&tool, &args.args, policy, &options) {
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

fn call_options(args: &CallArgs) -> Result<(ToolPolicy, CallOptions)> {
    if args.policy.is_some() && args.sandbox.profile.is_some() {
        bail!("give --policy or --profile, not both: --policy subprocess is profile trusted, --policy sandboxed is profile untrusted");
    }
    let policy = match args.policy {
        Some(PolicyArg::Subprocess) => ToolPolicy::Subprocess,
        Some(PolicyArg::Sandboxed) | None => ToolPolicy::Sandboxed,
    };
    let mut options = CallOptions {
        python: args.python.clone(),
        sandbox: args.sandbox.options(),
        profile: args.sandbox.profile.clone(),
        overrides: args.sandbox.overrides(),
        env: args.sandbox.env.clone(),
        ..CallOptions::default()
    };
    if let Some(max) = args.max_result {
        options.max_result_bytes = max.0;
    }
    Ok((policy, options))
}

/// A command line the call cannot use, as the call's own typed error.
fn usage_error(error: &anyhow::Error) -> ToolError {
    ToolError::SandboxError {
        message: format!("{error:#}"),
        error_kind: Some(crate::outcome::failure_kind(error)),
    }
}

/// The error's fields plus a human-readable `message`.
pub fn error_json(error: &ToolError) -> Value {
    let mut value = serde_json::to_value(error).unwrap_or_default();
    if let Value::Object(fields) = &mut value {
        fields.insert("message".into(), Value::from(error.to_string()));
    }
    value
}
