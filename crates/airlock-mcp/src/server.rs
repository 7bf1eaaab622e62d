//! The MCP tools. Each translates its arguments into one [`Executor`] call and answers with
//! one JSON object whose `status` says what happened. None of them takes a policy argument:
//! what runs may do is the executor's (the operator's) decision.

use std::sync::Arc;

use base64::Engine;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::executor::{Executor, Failure, FailureKind, Program, RunRequest};

const INSTRUCTIONS: &str = "Runs code and commands in an airlock sandbox. Call describe_policy \
first: it says what runs may do (network, limits, isolation). Each run starts from a fresh, \
empty directory unless it names a session (session_create), whose workspace keeps files \
between runs (file_write / file_read). Every answer is JSON with a `status`: a run's own \
(`exited` with `exit_code`, `timeout`, `memory_limit`, `cpu_limit`, `output_limit`, ...) or \
a refusal (`denied` with the reason, `invalid`, `not_found`, `busy`, `sandbox_error`). No tool \
can widen the policy.";

/// The MCP server: the tools over an executor.
#[derive(Clone)]
pub struct AirlockMcp {
    executor: Arc<dyn Executor>,
    tool_router: ToolRouter<Self>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunCodeArgs {
    /// The source code to run.
    pub code: String,
    /// The interpreter: python, bash, sh, node, ruby, perl, php (see describe_policy).
    #[serde(default = "default_language")]
    pub language: String,
    /// Run in this session's workspace (from session_create) instead of a fresh directory.
    #[serde(default)]
    pub session_id: Option<String>,
}

fn default_language() -> String {
    "python".into()
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunCommandArgs {
    /// The program and its arguments, e.g. ["python3", "-c", "print(1)"].
    pub argv: Vec<String>,
    /// Text given to the program on stdin.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Run in this session's workspace (from session_create) instead of a fresh directory.
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct SessionArgs {
    /// The session, as returned by session_create.
    pub session_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct FileReadArgs {
    /// The session, as returned by session_create.
    pub session_id: String,
    /// A path relative to the session's workspace.
    pub path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct FileWriteArgs {
    /// The session, as returned by session_create.
    pub session_id: String,
    /// A path relative to the session's workspace; missing directories are created.
    pub path: String,
    /// The file's content.
    pub content: String,
    /// How `content` is encoded: "utf-8" (default) or "base64".
    #[serde(default)]
    pub encoding: Option<String>,
}

#[tool_router]
impl AirlockMcp {
    /// The tools over `executor`.
    pub fn new(executor: Arc<dyn Executor>) -> Self {
        AirlockMcp {
            executor,
            tool_router: Self::tool_router(),
        }
    }

    #[tool(
        description = "Run source code with an interpreter (python by default) in the sandbox. Returns JSON: status, exit_code, stdout, stderr, limits_hit, isolation, network."
    )]
    async fn run_code(
        &self,
        Parameters(args): Parameters<RunCodeArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let program = Program::Code {
            language: args.language,
            code: args.code,
        };
        self.run(program, None, args.session_id, context).await
    }

    #[tool(
        description = "Run a command (argv) in the sandbox, optionally with stdin. Returns JSON: status, exit_code, stdout, stderr, limits_hit, isolation, network."
    )]
    async fn run_command(
        &self,
        Parameters(args): Parameters<RunCommandArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let stdin = args.stdin.map(String::into_bytes);
        self.run(Program::Command(args.argv), stdin, args.session_id, context)
            .await
    }

    #[tool(
        description = "Create a session: a workspace that keeps files between runs. Returns its session_id; pass it to run_code, run_command, file_read and file_write."
    )]
    async fn session_create(&self) -> CallToolResult {
        match self.executor.create_session().await {
            Ok(info) => ok(json!({ "status": "ok", "session": info })),
            Err(failure) => refused(&failure),
        }
    }

    #[tool(description = "Close a session and remove its workspace with every file in it.")]
    async fn session_close(&self, Parameters(args): Parameters<SessionArgs>) -> CallToolResult {
        match self.executor.close_session(args.session_id).await {
            Ok(()) => ok(json!({ "status": "ok" })),
            Err(failure) => refused(&failure),
        }
    }

    #[tool(
        description = "Read a file of a session's workspace. Text comes back as UTF-8, anything else as base64 (see `encoding`)."
    )]
    async fn file_read(&self, Parameters(args): Parameters<FileReadArgs>) -> CallToolResult {
        let path = args.path.clone();
        match self.executor.read_file(args.session_id, args.path).await {
            Ok(bytes) => ok(file_content(&path, bytes)),
            Err(failure) => refused(&failure),
        }
    }

    #[tool(
        description = "Write a file into a session's workspace (created or replaced). content is UTF-8 text unless encoding is \"base64\"."
    )]
    async fn file_write(&self, Parameters(args): Parameters<FileWriteArgs>) -> CallToolResult {
        let data = match decode(&args.content, args.encoding.as_deref()) {
            Ok(data) => data,
            Err(failure) => return refused(&failure),
        };
        let path = args.path.clone();
        match self
            .executor
            .write_file(args.session_id, args.path, data)
            .await
        {
            Ok(bytes) => ok(json!({ "status": "ok", "path": path, "bytes": bytes })),
            Err(failure) => refused(&failure),
        }
    }

    #[tool(
        description = "What runs may do here, decided by the operator: network mode and allowlist, resource limits, isolation layers in force, interpreters, session caps. Call it first."
    )]
    async fn describe_policy(&self) -> CallToolResult {
        let mut policy = self.executor.describe_policy();
        if let Value::Object(fields) = &mut policy {
            fields.insert("status".into(), json!("ok"));
        }
        ok(policy)
    }
}

impl AirlockMcp {
    async fn run(
        &self,
        program: Program,
        stdin: Option<Vec<u8>>,
        session: Option<String>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let request = RunRequest {
            program,
            stdin,
            session,
        };
        // rmcp keeps running a handler whose request the client cancelled (or whose session
        // ended) and only signals it: dropping the executor's future stops the run.
        let outcome = tokio::select! {
            outcome = self.executor.run(request) => outcome,
            () = context.ct.cancelled() => {
                Err(Failure::new(FailureKind::Cancelled, "the client cancelled the request"))
            }
        };
        match outcome {
            Ok(report) => ok(report),
            Err(failure) => refused(&failure),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for AirlockMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "airlock-mcp",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(INSTRUCTIONS)
    }
}

fn ok(value: Value) -> CallToolResult {
    CallToolResult::structured(value)
}

/// A refusal is a tool error the model can read: the status and the reason.
fn refused(failure: &Failure) -> CallToolResult {
    CallToolResult::structured_error(failure.to_json())
}

fn file_content(path: &str, bytes: Vec<u8>) -> Value {
    let size = bytes.len();
    let (encoding, content) = match String::from_utf8(bytes) {
        Ok(text) => ("utf-8", text),
        Err(e) => (
            "base64",
            base64::engine::general_purpose::STANDARD.encode(e.into_bytes()),
        ),
    };
    json!({ "status": "ok", "path": path, "bytes": size, "encoding": encoding, "content": content })
}

fn decode(content: &str, encoding: Option<&str>) -> Result<Vec<u8>, Failure> {
    match encoding.unwrap_or("utf-8") {
        "utf-8" | "utf8" | "text" => Ok(content.as_bytes().to_vec()),
        "base64" => base64::engine::general_purpose::STANDARD
            .decode(content)
            .map_err(|e| Failure::new(FailureKind::Invalid, format!("content is not base64: {e}"))),
        other => Err(
            Failure::new(FailureKind::Invalid, format!("unknown encoding {other:?}"))
                .with_fix("use \"utf-8\" or \"base64\""),
        ),
    }
}
