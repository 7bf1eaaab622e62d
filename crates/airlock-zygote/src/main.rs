//! `airlock-zygote`: the template of an interpreter zygote (see `airlock::zygote` and
//! docs/warm.md). Started by the host with its control socket at fd 3; enters its own
//! sandbox before the interpreter exists, imports the preloads, then forks one confined child
//! per run. It never runs user code itself: only its children do, after every confinement
//! step.

mod fork_hooks;

use std::ffi::CString;
use std::process::ExitCode;

use airlock::zygote::{Interpreter, Template, RUNNER};
use pyo3::prelude::*;

/// The system allocator until a run's PID 1 switches its fork to a fresh arena (see
/// `airlock::zygote::ForkArena`).
#[global_allocator]
static ALLOCATOR: airlock::zygote::ForkArena = airlock::zygote::ForkArena;

fn main() -> ExitCode {
    let template = match Template::start() {
        Ok(template) => template,
        Err(error) => {
            eprintln!("airlock-zygote: {error}");
            return ExitCode::from(125);
        }
    };
    let served = Python::with_gil(|py| {
        let mut python = match Embedded::new(py, template.preload(), template.environment()) {
            Ok(python) => python,
            Err(error) => {
                let error = airlock::Error::Command(format!("the interpreter: {error}"));
                Template::report_failure(Some(&template), &error);
                return Err(error);
            }
        };
        template.serve(&mut python)
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("airlock-zygote: {error}");
            ExitCode::from(125)
        }
    }
}

/// The embedded CPython: the runner, looked up once.
struct Embedded<'py> {
    run: Bound<'py, PyAny>,
    warm_up: Bound<'py, PyAny>,
    env: Vec<(String, String)>,
}

impl<'py> Embedded<'py> {
    fn new(
        py: Python<'py>,
        preload: &[String],
        env: &[(String, String)],
    ) -> PyResult<Embedded<'py>> {
        for module in preload {
            py.import(module.as_str())?;
        }
        let name = "_airlock_zygote";
        let code = CString::new(RUNNER)?;
        let module = PyModule::from_code(py, &code, c"<airlock-zygote>", &CString::new(name)?)?;
        // The code finds sys.modules as under `python3 -c`, plus the preloads.
        py.import("sys")?.getattr("modules")?.del_item(name)?;
        // The runner run on empty code once the preloads are in, so that children do not each
        // make (and copy the pages of) what a first run makes lazily; see `warm_up`.
        module.getattr("warm_up")?.call1((env.to_vec(),))?;
        // Everything imported and made so far moves to the collector's permanent generation: a child's
        // collections then never touch (and copy) the template's objects.
        let gc = py.import("gc")?;
        gc.call_method0("collect")?;
        gc.call_method0("freeze")?;
        Ok(Embedded {
            run: module.getattr("run")?,
            warm_up: module.getattr("warm_up")?,
            env: env.to_vec(),
        })
    }
}

impl Interpreter for Embedded<'_> {
    fn before_fork(&mut self) {
        fork_hooks::before_fork(self.run.py());
    }

    fn after_fork_parent(&mut self) {
        fork_hooks::after_fork_parent(self.run.py());
    }

    fn after_fork_child(&mut self) {
        fork_hooks::after_fork_child(self.run.py());
    }

    fn run(&mut self, code: &str, args: &[String], env: &[(String, String)]) -> i32 {
        self.run
            .call1((code, args.to_vec(), env.to_vec()))
            .and_then(|status| status.extract())
            .unwrap_or(1)
    }

    fn library(&self) -> Option<&str> {
        Some("/libpython")
    }

    fn rehearse(&mut self) {
        let _ = self.warm_up.call1((self.env.clone(), 1));
    }
}
