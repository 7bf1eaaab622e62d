//! The interpreter registry: how code given as a string is run (`airlock exec python 'print(1)'`).
//!
//! Each interpreter is a name, an argv template and aliases. In the template `{code}` stands for
//! the code; a template without `{code}` gets the code on stdin instead. Built-in defaults cover
//! python3, node, bash, sh, ruby, perl and php; a TOML file can replace or add interpreters and
//! restrict which of them may run (`allowed_programs`):
//!
//! ```toml
//! allowed_programs = ["python3", "node"]
//!
//! [interpreters.python3]
//! argv = ["/usr/bin/python3", "-I", "-c", "{code}"]
//!
//! [interpreters.deno]
//! argv = ["/usr/local/bin/deno", "eval", "{code}"]
//! aliases = ["ts"]
//! ```
//!
//! This module only decides the command line; running it is the sandbox's job.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::ErrorKind;

/// Stands for the code in an argv template.
pub const CODE_PLACEHOLDER: &str = "{code}";

/// Longest single argument Linux accepts (MAX_ARG_STRLEN, 32 pages), terminating NUL included.
pub const MAX_ARG_BYTES: usize = 32 * 4096 - 1;

/// One interpreter.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Interpreter {
    /// The command line; `{code}` is replaced by the code, else the code goes on stdin.
    pub argv: Vec<String>,
    /// Other names for it, e.g. `python` for `python3`.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// The command line that reads the code on stdin, used when the code cannot be one
    /// argument (over [`MAX_ARG_BYTES`], or with a NUL byte): e.g. `python3 -`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_argv: Option<Vec<String>>,
    /// Run its code on an interpreter zygote (`crate::zygote`; Python only) with these
    /// modules preloaded, instead of starting the interpreter for each run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zygote: Option<ZygoteConfig>,
}

/// An interpreter's zygote: `zygote = { preload = ["json", "re"] }` in a registry file.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct ZygoteConfig {
    /// Modules the template imports before it serves.
    #[serde(default)]
    pub preload: Vec<String>,
}

/// An interpreter entry in a registry file: omitted aliases (and stdin form) keep the built-in
/// ones.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct InterpreterEntry {
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aliases: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin_argv: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zygote: Option<ZygoteConfig>,
}

/// The TOML registry file.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct RegistryFile {
    /// Interpreter names (or aliases) that may run; absent means every registered one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_programs: Option<Vec<String>>,
    /// Interpreters to add or replace.
    #[serde(default)]
    pub interpreters: BTreeMap<String, InterpreterEntry>,
}

/// A resolved command: argv, plus the code as stdin when the template has no `{code}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The canonical interpreter name.
    pub interpreter: String,
    pub argv: Vec<String>,
    pub stdin: Option<Vec<u8>>,
}

impl Invocation {
    /// Refuses an interpreter named by absolute path that is not on this host, before a run
    /// would fail inside the sandbox. (A bare name is looked up on the sandbox's `PATH`.)
    pub fn check_installed(&self) -> Result<(), InterpError> {
        let program = self.argv.first().map(String::as_str).unwrap_or_default();
        if program.starts_with('/') && !Path::new(program).exists() {
            return Err(InterpError::NotInstalled {
                name: self.interpreter.clone(),
                program: program.to_string(),
            });
        }
        Ok(())
    }
}

/// Errors of the interpreter registry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InterpError {
    #[error("unknown interpreter {name:?}; known interpreters: {}", known.join(", "))]
    Unknown { name: String, known: Vec<String> },

    #[error(
        "interpreter {name:?} is not in allowed_programs; allowed: {}",
        list_or_none(allowed)
    )]
    NotAllowed { name: String, allowed: Vec<String> },

    #[error("cannot read interpreter registry {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("interpreter registry {origin}: {message}")]
    Parse { origin: String, message: String },

    #[error("interpreter {name:?}: {problem}")]
    Invalid { name: String, problem: String },

    #[error("code for {name:?} is {bytes} bytes, over the {max}-byte argument limit; give the interpreter a stdin_argv (or an argv without {{code}}) to pass code on stdin")]
    CodeTooLong {
        name: String,
        bytes: usize,
        max: usize,
    },

    #[error("code for {name:?} contains a NUL byte, which cannot be passed as an argument")]
    CodeHasNul { name: String },

    #[error("interpreter {name:?}: {program} is not installed on this host")]
    NotInstalled { name: String, program: String },
}

impl InterpError {
    /// What kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            InterpError::Unknown { .. } => ErrorKind::InterpreterUnknown,
            InterpError::NotAllowed { .. } => ErrorKind::InterpreterNotAllowed,
            InterpError::NotInstalled { .. } => ErrorKind::InterpreterNotInstalled,
            InterpError::Read { .. } | InterpError::Parse { .. } | InterpError::Invalid { .. } => {
                ErrorKind::InterpreterRegistryInvalid
            }
            InterpError::CodeTooLong { .. } | InterpError::CodeHasNul { .. } => {
                ErrorKind::CommandInvalid
            }
        }
    }
}

fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// Interpreters by canonical name, their aliases, and which may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterpreterRegistry {
    interpreters: BTreeMap<String, Interpreter>,
    /// Canonical names allowed to run; `None` allows every registered interpreter.
    allowed: Option<Vec<String>>,
}

impl Default for InterpreterRegistry {
    fn default() -> Self {
        Self::builtin()
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// A built-in interpreter: code as an argument, or on stdin when too large for one.
struct Builtin {
    name: &'static str,
    argv: &'static [&'static str],
    stdin_argv: &'static [&'static str],
    aliases: &'static [&'static str],
}

impl Builtin {
    fn entry(&self) -> Interpreter {
        Interpreter {
            argv: strings(self.argv),
            aliases: strings(self.aliases),
            stdin_argv: Some(strings(self.stdin_argv)),
            zygote: None,
        }
    }
}

/// The shells read their code with `source` so that `$0`, `$1`, ... mean the same in both
/// forms.
const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "python3",
        argv: &["/usr/bin/python3", "-c", "{code}"],
        stdin_argv: &["/usr/bin/python3", "-"],
        aliases: &["python"],
    },
    Builtin {
        name: "node",
        argv: &["/usr/bin/node", "-e", "{code}"],
        stdin_argv: &["/usr/bin/node", "-"],
        aliases: &["nodejs", "js"],
    },
    Builtin {
        name: "bash",
        argv: &["/bin/bash", "-c", "{code}"],
        stdin_argv: &["/bin/bash", "-c", "source /dev/stdin"],
        aliases: &[],
    },
    Builtin {
        name: "sh",
        argv: &["/bin/sh", "-c", "{code}"],
        stdin_argv: &["/bin/sh", "-c", ". /dev/stdin"],
        aliases: &[],
    },
    Builtin {
        name: "ruby",
        argv: &["/usr/bin/ruby", "-e", "{code}"],
        stdin_argv: &["/usr/bin/ruby", "-"],
        aliases: &[],
    },
    Builtin {
        name: "perl",
        argv: &["/usr/bin/perl", "-e", "{code}"],
        stdin_argv: &["/usr/bin/perl", "-"],
        aliases: &[],
    },
    Builtin {
        name: "php",
        argv: &["/usr/bin/php", "-r", "{code}"],
        stdin_argv: &["/usr/bin/php", "--"],
        aliases: &[],
    },
];

impl InterpreterRegistry {
    /// The built-in interpreters, all allowed.
    pub fn builtin() -> Self {
        let interpreters = BUILTINS
            .iter()
            .map(|builtin| (builtin.name.to_string(), builtin.entry()))
            .collect();
        Self {
            interpreters,
            allowed: None,
        }
    }

    /// The built-ins with a registry file's contents layered on top.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, InterpError> {
        let file: RegistryFile = toml::from_str(text).map_err(|err| InterpError::Parse {
            origin: origin.to_owned(),
            message: err.to_string(),
        })?;
        let mut registry = Self::builtin();
        registry.apply(file)?;
        Ok(registry)
    }

    /// Reads a registry file (see [`from_toml`](Self::from_toml)).
    pub fn load(path: &Path) -> Result<Self, InterpError> {
        let text = std::fs::read_to_string(path).map_err(|source| InterpError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text, &path.display().to_string())
    }

    /// Adds or replaces interpreters and sets the allowlist from `file`.
    pub fn apply(&mut self, file: RegistryFile) -> Result<(), InterpError> {
        for (name, entry) in file.interpreters {
            let previous = self.interpreters.get(&name);
            let aliases = entry
                .aliases
                .or_else(|| previous.map(|p| p.aliases.clone()))
                .unwrap_or_default();
            // A replaced argv makes the old stdin form a guess: keep it only when unset here
            // and the interpreter's program is the same.
            let same_program = previous.is_some_and(|p| p.argv.first() == entry.argv.first());
            let stdin_argv = entry.stdin_argv.or_else(|| {
                previous
                    .filter(|_| same_program)
                    .and_then(|p| p.stdin_argv.clone())
            });
            let interpreter = Interpreter {
                argv: entry.argv,
                aliases,
                stdin_argv,
                zygote: entry.zygote,
            };
            self.interpreters.insert(name, interpreter);
        }
        self.check()?;
        if let Some(allowed) = file.allowed_programs {
            self.set_allowed(&allowed)?;
        }
        Ok(())
    }

    /// Every name and alias must be unique and every argv non-empty.
    fn check(&self) -> Result<(), InterpError> {
        let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, interp) in &self.interpreters {
            let invalid = |problem: String| InterpError::Invalid {
                name: name.clone(),
                problem,
            };
            if interp.argv.first().is_none_or(|program| program.is_empty()) {
                return Err(invalid("argv is empty; give the program path first".into()));
            }
            if interp.zygote.is_some() && !runs_python(&interp.argv[0]) {
                return Err(invalid(
                    "a zygote embeds Python: remove `zygote` or give a python program".into(),
                ));
            }
            for key in std::iter::once(name).chain(&interp.aliases) {
                if key.is_empty() {
                    return Err(invalid("a name or alias is empty".into()));
                }
                if let Some(other) = owner.insert(key, name) {
                    return Err(invalid(format!("{key:?} is also a name of {other:?}")));
                }
            }
        }
        Ok(())
    }

    /// Restricts which interpreters may run (names or aliases).
    pub fn set_allowed<S: AsRef<str>>(&mut self, names: &[S]) -> Result<(), InterpError> {
        let mut allowed = names
            .iter()
            .map(|name| self.canonical(name.as_ref()).map(str::to_owned))
            .collect::<Result<Vec<_>, _>>()?;
        allowed.sort();
        allowed.dedup();
        self.allowed = Some(allowed);
        Ok(())
    }

    /// Canonical names of the interpreters that may run.
    pub fn allowed(&self) -> Vec<String> {
        match &self.allowed {
            Some(allowed) => allowed.clone(),
            None => self.names(),
        }
    }

    /// Canonical names of all registered interpreters.
    pub fn names(&self) -> Vec<String> {
        self.interpreters.keys().cloned().collect()
    }

    /// The interpreter registered under `name`, by canonical name or alias.
    pub fn get(&self, name: &str) -> Option<(&str, &Interpreter)> {
        self.interpreters
            .iter()
            .find(|(canonical, interp)| {
                *canonical == name || interp.aliases.iter().any(|a| a == name)
            })
            .map(|(canonical, interp)| (canonical.as_str(), interp))
    }

    fn canonical(&self, name: &str) -> Result<&str, InterpError> {
        self.get(name)
            .map(|(canonical, _)| canonical)
            .ok_or_else(|| InterpError::Unknown {
                name: name.to_owned(),
                known: self.names(),
            })
    }

    /// The command that runs `code` with interpreter `name`, followed by `args`; refused when
    /// the interpreter is unknown or not allowed.
    pub fn invocation(
        &self,
        name: &str,
        code: &str,
        args: &[String],
    ) -> Result<Invocation, InterpError> {
        let canonical = self.canonical(name)?;
        if !self.allowed().iter().any(|allowed| allowed == canonical) {
            return Err(InterpError::NotAllowed {
                name: name.to_owned(),
                allowed: self.allowed(),
            });
        }
        let interp = &self.interpreters[canonical];
        let mut invocation = match (&interp.stdin_argv, fits_argv(code)) {
            (Some(stdin_argv), false) => expand(canonical, stdin_argv, code)?,
            _ => expand(canonical, &interp.argv, code)?,
        };
        invocation.argv.extend(args.iter().cloned());
        Ok(invocation)
    }
}

fn runs_python(program: &str) -> bool {
    Path::new(program)
        .file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("python"))
}

fn expand(name: &str, template: &[String], code: &str) -> Result<Invocation, InterpError> {
    let in_argv = template.iter().any(|arg| arg.contains(CODE_PLACEHOLDER));
    if in_argv {
        check_code_fits_argv(name, code)?;
    }
    let argv = template
        .iter()
        .map(|arg| arg.replace(CODE_PLACEHOLDER, code))
        .collect();
    Ok(Invocation {
        interpreter: name.to_owned(),
        argv,
        stdin: (!in_argv).then(|| code.as_bytes().to_vec()),
    })
}

/// Whether `code` can be passed as one argument.
fn fits_argv(code: &str) -> bool {
    !code.contains('\0') && code.len() <= MAX_ARG_BYTES
}

fn check_code_fits_argv(name: &str, code: &str) -> Result<(), InterpError> {
    if code.contains('\0') {
        return Err(InterpError::CodeHasNul {
            name: name.to_owned(),
        });
    }
    if code.len() > MAX_ARG_BYTES {
        return Err(InterpError::CodeTooLong {
            name: name.to_owned(),
            bytes: code.len(),
            max: MAX_ARG_BYTES,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_resolves_names_and_aliases() {
        let registry = InterpreterRegistry::builtin();
        let inv = registry.invocation("python", "print(1)", &[]).unwrap();
        assert_eq!(inv.interpreter, "python3");
        assert_eq!(inv.argv, ["/usr/bin/python3", "-c", "print(1)"]);
        assert_eq!(inv.stdin, None);
        assert_eq!(
            registry.invocation("nodejs", "1", &[]).unwrap().interpreter,
            "node"
        );
        for name in ["python3", "node", "bash", "sh", "ruby", "perl", "php"] {
            assert!(registry.get(name).is_some(), "{name}");
        }
    }

    #[test]
    fn extra_args_follow_the_code() {
        let registry = InterpreterRegistry::builtin();
        let inv = registry
            .invocation("bash", "echo $1", &["x".into(), "y".into()])
            .unwrap();
        assert_eq!(inv.argv, ["/bin/bash", "-c", "echo $1", "x", "y"]);
    }

    #[test]
    fn unknown_interpreter_is_refused_with_the_known_list() {
        let err = InterpreterRegistry::builtin()
            .invocation("cobol", "x", &[])
            .unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, InterpError::Unknown { .. }));
        assert!(
            message.contains("\"cobol\"") && message.contains("python3"),
            "{message}"
        );
    }

    #[test]
    fn allowlist_refuses_others_and_accepts_aliases() {
        let mut registry = InterpreterRegistry::builtin();
        registry.set_allowed(&["python", "sh"]).unwrap();
        assert_eq!(registry.allowed(), ["python3", "sh"]);
        assert!(registry.invocation("python3", "1", &[]).is_ok());
        let err = registry.invocation("node", "1", &[]).unwrap_err();
        assert!(matches!(err, InterpError::NotAllowed { .. }));
        let message = err.to_string();
        assert!(
            message.contains("\"node\"") && message.contains("python3, sh"),
            "{message}"
        );
        assert!(registry.set_allowed(&["nope"]).is_err());
    }

    #[test]
    fn toml_overrides_adds_and_restricts() {
        let text = r#"
            allowed_programs = ["python", "deno"]
            [interpreters.python3]
            argv = ["/opt/py/bin/python3", "-I", "-c", "{code}"]
            [interpreters.deno]
            argv = ["/usr/local/bin/deno", "run", "-"]
            aliases = ["ts"]
        "#;
        let registry = InterpreterRegistry::from_toml(text, "test").unwrap();
        let inv = registry.invocation("python", "1", &[]).unwrap();
        assert_eq!(
            inv.argv[0], "/opt/py/bin/python3",
            "aliases kept when omitted"
        );
        let inv = registry.invocation("ts", "console.log(1)", &[]).unwrap();
        assert_eq!(inv.argv, ["/usr/local/bin/deno", "run", "-"]);
        assert_eq!(inv.stdin.as_deref(), Some(&b"console.log(1)"[..]));
        assert!(matches!(
            registry.invocation("bash", "true", &[]),
            Err(InterpError::NotAllowed { .. })
        ));
    }

    #[test]
    fn bad_registry_files_are_rejected() {
        let cases = [
            "[interpreters.x]\nargv = []\n",
            "[interpreters.x]\nargv = [\"/bin/x\"]\naliases = [\"python\"]\n",
            "[interpreters.x]\nargv = [\"/bin/x\"]\nextra = 1\n",
            "allowed_programs = [\"nope\"]\n",
            "unknown_key = 1\n",
        ];
        for text in cases {
            assert!(InterpreterRegistry::from_toml(text, "t").is_err(), "{text}");
        }
    }

    /// Code too large for one argument (or with a NUL byte) goes on stdin where the
    /// interpreter has a stdin form, and is refused where it has none.
    #[test]
    fn code_that_cannot_be_an_argument_goes_on_stdin_or_is_refused() {
        let huge = "#".repeat(MAX_ARG_BYTES + 1);
        let builtin = InterpreterRegistry::builtin();
        let inv = builtin.invocation("python3", &huge, &["x".into()]).unwrap();
        assert_eq!(inv.argv, ["/usr/bin/python3", "-", "x"]);
        assert_eq!(inv.stdin.as_deref(), Some(huge.as_bytes()));
        let text = "[interpreters.x]\nargv = [\"/bin/x\", \"-c\", \"{code}\"]\n";
        let custom = InterpreterRegistry::from_toml(text, "t").unwrap();
        assert!(matches!(
            custom.invocation("x", &huge, &[]),
            Err(InterpError::CodeTooLong { .. })
        ));
        assert!(matches!(
            custom.invocation("x", "a\0b", &[]),
            Err(InterpError::CodeHasNul { .. })
        ));
    }

    #[test]
    fn a_replaced_program_drops_the_builtin_stdin_form() {
        let text = "[interpreters.python3]\nargv = [\"/opt/py/bin/python3\", \"-c\", \"{code}\"]\n";
        let registry = InterpreterRegistry::from_toml(text, "t").unwrap();
        assert_eq!(registry.get("python3").unwrap().1.stdin_argv, None);
        let same =
            "[interpreters.python3]\nargv = [\"/usr/bin/python3\", \"-I\", \"-c\", \"{code}\"]\n";
        let registry = InterpreterRegistry::from_toml(same, "t").unwrap();
        assert!(registry.get("python3").unwrap().1.stdin_argv.is_some());
    }

    #[test]
    fn a_zygote_is_configured_for_python_only() {
        let text = "[interpreters.python3]\nargv = [\"/usr/bin/python3\", \"-c\", \"{code}\"]\nzygote = { preload = [\"json\", \"re\"] }\n";
        let registry = InterpreterRegistry::from_toml(text, "t").unwrap();
        let zygote = registry.get("python").unwrap().1.zygote.clone().unwrap();
        assert_eq!(zygote.preload, ["json", "re"]);
        assert_eq!(
            InterpreterRegistry::builtin()
                .get("python")
                .unwrap()
                .1
                .zygote,
            None
        );
        let bash = "[interpreters.bash]\nargv = [\"/bin/bash\", \"-c\", \"{code}\"]\nzygote = {}\n";
        let error = InterpreterRegistry::from_toml(bash, "t").unwrap_err();
        assert!(
            error.to_string().contains("zygote embeds Python"),
            "{error}"
        );
    }
}
