//! `airlock-mcp`: serves airlock's sandbox as MCP tools over stdio. The operator's profile
//! decides what every run may do; each run's init is the `airlock` binary (next to this one,
//! else on PATH), so the per-run exec stays the lean CLI.

#[cfg(target_os = "linux")]
mod serve;

#[cfg(target_os = "linux")]
fn main() -> std::process::ExitCode {
    serve::main()
}

#[cfg(not(target_os = "linux"))]
fn main() -> std::process::ExitCode {
    eprintln!("airlock-mcp: error: only Linux is supported");
    std::process::ExitCode::from(125)
}
