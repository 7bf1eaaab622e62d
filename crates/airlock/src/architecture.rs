//! The import rules of `docs/architecture.md`, checked on the source: which of the crate's
//! top-level modules each one may name (`crate::x`), that the supervisor reaches the init only
//! through its entry point, that `unsafe` lives in `linux/sys/` alone, and that no source
//! file, of this crate or of the daemon's, grows past the size a reader can hold.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each top-level module and the top-level modules it may import. The crate root's re-exports
/// (`crate::{Sandbox, ...}`) are the API and open to every module.
const MAY_IMPORT: &[(&str, &[&str])] = &[
    // Plumbing, imports nothing.
    ("linux", &[]),
    ("layer", &[]),
    ("cancel", &[]),
    // The scheduler knows nothing of runs; it shares the cancel token with them.
    ("pool", &["cancel"]),
    ("golden", &[]),
    // The API's vocabulary.
    ("error", &["layer"]),
    ("policy", &["error", "layer"]),
    ("plan", &["error", "layer", "policy"]),
    ("result", &["error", "layer"]),
    // Confinement primitives know nothing above them.
    ("confine", &["linux"]),
    // The run directory and the wire between supervisor and init.
    ("rundir", &["confine", "error", "policy"]),
    ("spec", &["confine", "error", "layer", "result", "rundir"]),
    // Backends plan; they never import the supervisor or the init.
    (
        "backend",
        &[
            "confine", "error", "golden", "layer", "policy", "rundir", "spec",
        ],
    ),
    // The egress gate's host side for a run: the policy's gate, the plan's view of it.
    ("net", &["error", "plan", "policy"]),
    // The init executes a spec; it never imports the supervisor or the backends.
    (
        "init",
        &[
            "confine", "error", "layer", "linux", "plan", "result", "rundir", "spec",
        ],
    ),
    // The supervisor drives a run (the init only through its entry point, checked below).
    (
        "supervisor",
        &[
            "backend", "cancel", "confine", "error", "init", "layer", "linux", "net", "plan",
            "policy", "result", "rundir", "spec",
        ],
    ),
    // Features on top of the API.
    (
        "call",
        &["cancel", "error", "layer", "plan", "policy", "result"],
    ),
    (
        "worker",
        &[
            "cancel", "error", "layer", "plan", "policy", "result", "rundir",
        ],
    ),
    ("interp", &["error"]),
    // Warm start keeps prepared sandboxes; the supervisor lends it `Standby` and never
    // imports it back.
    ("warm", &["error", "supervisor"]),
    // Interpreter zygotes: the template's loop and the host's run. A zygote child's
    // confinement is the init's own code (`init::zygote`), never a second copy.
    (
        "zygote",
        &[
            "confine",
            "error",
            "init",
            "layer",
            "linux",
            "result",
            "rundir",
            "spec",
            "supervisor",
            "warm",
        ],
    ),
    (
        "doctor",
        &["backend", "confine", "layer", "policy", "rundir"],
    ),
    ("macos", &["golden", "policy"]),
];

/// What the supervisor may name in the init: how to start it, nothing of its insides.
const INIT_ENTRY: &[&str] = &["INIT_ARG", "init_main_with"];

/// Non-test lines a source file may hold.
const MAX_LINES: usize = 520;

fn source_files() -> Vec<PathBuf> {
    source_files_under(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// The `.rs` files under `root`, sorted.
fn source_files_under(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// `backend` for `src/backend/bwrap.rs`, `lib` for `src/lib.rs`.
fn top_module(file: &Path) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

/// The source's lines that are code, not comments.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
}

/// Every `crate::name` a line names, with what follows it.
fn crate_paths(line: &str) -> Vec<(&str, &str)> {
    line.match_indices("crate::")
        .filter(|(at, _)| *at == 0 || !line.as_bytes()[at - 1].is_ascii_alphanumeric())
        .filter_map(|(at, _)| {
            let rest = &line[at + "crate::".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (end > 0).then(|| (&rest[..end], &rest[end..]))
        })
        .collect()
}

/// `file:line: text` of a line that breaks a rule.
fn place(file: &Path, number: usize, line: &str) -> String {
    format!("{}:{}: {}", file.display(), number + 1, line.trim())
}

fn assert_none(broken: &[String], what: &str) {
    assert!(broken.is_empty(), "{what}:\n{}", broken.join("\n"));
}

#[test]
fn modules_import_only_what_the_architecture_allows() {
    let rules: BTreeMap<&str, &[&str]> = MAY_IMPORT.iter().copied().collect();
    let mut broken = Vec::new();
    for file in source_files() {
        let module = top_module(&file);
        if module == "lib" || module == "architecture" {
            continue;
        }
        let Some(allowed) = rules.get(module.as_str()) else {
            broken.push(format!(
                "{}: module {module} has no import rule",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for (number, line) in code_lines(&text) {
            for (target, _) in crate_paths(line) {
                let is_module = rules.contains_key(target);
                if is_module && target != module && !allowed.contains(&target) {
                    let what = format!("{module} imports {target}");
                    broken.push(place(&file, number, &what));
                }
            }
        }
    }
    assert_none(&broken, "imports against docs/architecture.md");
}

#[test]
fn the_supervisor_reaches_the_init_only_through_its_entry_point() {
    let mut broken = Vec::new();
    for file in source_files()
        .into_iter()
        .filter(|f| top_module(f) == "supervisor")
    {
        let text = std::fs::read_to_string(&file).unwrap();
        for (number, line) in code_lines(&text) {
            for (target, rest) in crate_paths(line) {
                let item = rest.trim_start_matches("::");
                if target == "init" && !INIT_ENTRY.iter().any(|entry| item.starts_with(entry)) {
                    broken.push(place(&file, number, line));
                }
            }
        }
    }
    assert_none(&broken, "the supervisor reaches into the init");
}

#[test]
fn unsafe_code_lives_in_linux_sys_only() {
    let sys = Path::new("src").join("linux").join("sys");
    let mut broken = Vec::new();
    for file in source_files() {
        let in_sys = file.parent().is_some_and(|dir| dir.ends_with(&sys));
        if in_sys || file.ends_with("architecture.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (number, line) in code_lines(&text) {
            let allowed_here = file.ends_with(Path::new("linux").join("mod.rs"))
                && line.trim() == "#[allow(unsafe_code)]";
            if line.contains("unsafe") && !allowed_here {
                broken.push(place(&file, number, line));
            }
        }
    }
    assert_none(&broken, "unsafe outside linux/sys/");
}

/// Lines that are not in a `#[cfg(test)]` item (a test module, a test-only helper).
fn non_test_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let (mut count, mut index) = (0, 0);
    while index < lines.len() {
        if lines[index].trim_start().starts_with("#[cfg(test)]") {
            index += 1;
            let mut depth = 0i64;
            while index < lines.len() {
                let line = lines[index];
                depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
                index += 1;
                if depth <= 0 && (line.ends_with('}') || line.ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        count += 1;
        index += 1;
    }
    count
}

/// The source trees held to [`MAX_LINES`], from this crate's directory: this crate and the
/// daemon, the two that grow by feature. The rule lives here, once, so the daemon's files are
/// counted the same way (airlockd has no architecture test of its own).
const SIZED_TREES: &[&str] = &["src", "../airlockd/src"];

#[test]
fn no_source_file_holds_more_than_a_reader_can() {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let oversized: Vec<String> = SIZED_TREES
        .iter()
        .flat_map(|tree| source_files_under(&manifest_dir.join(tree)))
        .filter(|f| !f.ends_with("tests.rs") && !f.components().any(|c| c.as_os_str() == "tests"))
        .filter_map(|file| {
            let lines = non_test_lines(&std::fs::read_to_string(&file).unwrap());
            (lines > MAX_LINES).then(|| format!("{}: {lines} lines", file.display()))
        })
        .collect();
    assert!(
        oversized.is_empty(),
        "over {MAX_LINES} lines of non-test code (split by job):\n{}",
        oversized.join("\n")
    );
}

/// Crates the `airlock` binary must not link: a threaded caller executes the init from it for
/// every run, so everything it links is loaded every time. `airlock-attack` (for `airlock
/// conformance`) is allowed: it adds only nix and serde_json, which the CLI links anyway, and
/// static program texts (+280 KB stripped, no measurable change to `run -- /bin/true`).
const NOT_ON_THE_EXEC_PATH: &[&str] = &[
    "tokio",
    "async-std",
    "hyper",
    "axum",
    "tower",
    "reqwest",
    "rustls",
    "openssl",
    "sqlx",
    "rusqlite",
    "utoipa",
    "prometheus-client",
    "wasmtime",
    "airlockd",
    "airlock-mcp",
];

/// The dependency names of a manifest's `[dependencies]` tables (target-specific ones too).
fn dependency_names(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_dependencies = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_dependencies = line.ends_with("dependencies]") && !line.contains("dev-");
            continue;
        }
        // `name = ...`, `name.workspace = true` or `name = { ... }`.
        if let Some((key, _)) = line.split_once('=').filter(|_| in_dependencies) {
            let name = key.split('.').next().unwrap_or(key);
            names.push(name.trim().to_string());
        }
    }
    names
}

#[test]
fn the_binary_the_init_runs_from_stays_lean() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The egress gate is linked too: the library starts it for gated runs.
    for manifest in [
        "airlock/Cargo.toml",
        "airlock-cli/Cargo.toml",
        "airlock-egress/Cargo.toml",
    ] {
        let text = std::fs::read_to_string(crates.join(manifest)).unwrap();
        let heavy: Vec<String> = dependency_names(&text)
            .into_iter()
            .filter(|name| NOT_ON_THE_EXEC_PATH.contains(&name.as_str()))
            .collect();
        assert!(
            heavy.is_empty(),
            "{manifest} depends on {heavy:?}: the init is executed from the airlock binary for \
             every run of a threaded caller (see docs/architecture.md)"
        );
    }
}

/// The egress gate is a leaf: it knows nothing of airlock.
#[test]
fn the_egress_gate_depends_on_nothing_of_airlock() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../airlock-egress/Cargo.toml");
    let text = std::fs::read_to_string(manifest).unwrap();
    let ours: Vec<String> = dependency_names(&text)
        .into_iter()
        .filter(|name| name.starts_with("airlock"))
        .collect();
    assert!(ours.is_empty(), "airlock-egress depends on {ours:?}");
}

/// Where the gate's crate is reached: the gate itself (`Gate`, `RunningGate`, the transfer of
/// its sockets) only from `net/`, the host side of a run; the sandbox's side
/// (`sandbox_side`, `SandboxSockets::send`) only from `init/egress.rs`; elsewhere only its
/// policy, plan and report types.
const EGRESS_ROOMS: &[(&str, &str)] = &[
    ("airlock_egress::gate", "net"),
    ("Gate::start", "net"),
    ("RunningGate", "net"),
    ("SandboxSockets", "net"),
    ("sandbox_side", "init/egress.rs"),
];

#[test]
fn the_egress_gate_is_reached_from_its_rooms_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for file in source_files() {
        if file.ends_with("architecture.rs") {
            continue;
        }
        let relative = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        for (number, line) in code_lines(&text) {
            for (item, room) in EGRESS_ROOMS {
                if line.contains(item) && !relative.starts_with(room) {
                    broken.push(place(&file, number, line));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "the egress gate reached outside net/ and init/egress.rs:\n{}",
        broken.join("\n")
    );
}

#[test]
fn dependency_names_are_read_from_every_dependency_table() {
    let manifest = "[package]\nname = \"x\"\n[dependencies]\nserde.workspace = true\n\
                    tokio = { version = \"1\" }\n[target.'cfg(unix)'.dependencies]\nnix = \"0.29\"\n\
                    [dev-dependencies]\ntempfile = \"3\"\n";
    assert_eq!(dependency_names(manifest), ["serde", "tokio", "nix"]);
}
