//! An interpreter started in each prepared sandbox ahead of its run, with its modules
//! imported: the run then only hands it code. Python for now (`shim.py`); each interpreter
//! serves one run, so nothing of one run's interpreter (modules, hash seed, random state)
//! is another's.

use std::path::PathBuf;

use crate::error::Error;
use crate::supervisor::Prestart;

/// The program the shim runs in: Python, whose `-c` takes the shim.
const SHIM: &str = concat!(include_str!("run_code.py"), include_str!("shim.py"));
/// What the shim writes on stdout once its modules are imported (must match `shim.py`).
const READY_MARKER: &[u8] = b"\0airlock-warm-ready\0\n";

/// A Python interpreter to start in each prepared sandbox, and the modules it imports first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmInterpreter {
    /// The interpreter inside the sandbox, e.g. `/usr/bin/python3`.
    pub program: PathBuf,
    /// Modules imported before the sandbox counts as ready (e.g. `json`, `re`, `numpy`).
    pub preload: Vec<String>,
}

impl WarmInterpreter {
    /// Python at `program`, importing `preload` first.
    pub fn python(program: impl Into<PathBuf>, preload: &[&str]) -> WarmInterpreter {
        WarmInterpreter {
            program: program.into(),
            preload: preload.iter().map(|m| m.to_string()).collect(),
        }
    }

    pub(super) fn prestart(&self) -> Result<Prestart, Error> {
        if let Some(bad) = self.preload.iter().find(|m| !is_module_name(m)) {
            return Err(Error::Command(format!(
                "{bad:?} is not a module name (letters, digits, `_` and `.`)"
            )));
        }
        if !self.program.is_absolute() {
            return Err(Error::Command(format!(
                "the warm interpreter {} must be an absolute path",
                self.program.display()
            )));
        }
        Ok(Prestart {
            argv: vec![
                self.program.display().to_string(),
                "-c".into(),
                SHIM.into(),
                self.preload.join(","),
            ],
            ready_marker: READY_MARKER,
        })
    }
}

/// A Python module name: dotted parts of letters, digits and `_`.
pub fn is_module_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|part| {
            !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_is_the_shims() {
        let shim_marker = "MARKER = b\"\\0airlock-warm-ready\\0\\n\"";
        assert!(
            SHIM.contains(shim_marker),
            "shim.py and READY_MARKER differ"
        );
        assert_eq!(READY_MARKER, b"\0airlock-warm-ready\0\n");
    }

    #[test]
    fn preload_names_are_module_names() {
        let ok = WarmInterpreter::python("/usr/bin/python3", &["json", "os.path", "_ssl"]);
        assert!(ok.prestart().is_ok());
        for bad in ["", "a b", "x;import os", "..", "a."] {
            let interpreter = WarmInterpreter::python("/usr/bin/python3", &[bad]);
            assert!(interpreter.prestart().is_err(), "{bad:?}");
        }
        assert!(WarmInterpreter::python("python3", &[]).prestart().is_err());
    }
}
