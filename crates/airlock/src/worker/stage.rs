//! Laying out a job directory for a worker: `in/` (read-only copies of the declared inputs),
//! `options.json`, and an empty writable `out/`.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use super::{component_problem, WorkerError, MAX_NAME_BYTES};

/// One declared input: copied from `source` (a host path) to `in/<name>` in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFile {
    pub name: String,
    pub source: PathBuf,
}

impl InputFile {
    pub fn new(name: impl Into<String>, source: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            source: source.into(),
        }
    }
}

/// Where [`stage`] put things.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedJob {
    pub job_dir: PathBuf,
    pub in_dir: PathBuf,
    pub options_file: PathBuf,
    pub out_dir: PathBuf,
    /// The staged copies, in the order the inputs were declared.
    pub inputs: Vec<PathBuf>,
}

impl StagedJob {
    /// Deletes the job directory. `in/` is read-only by design, so it is made writable first.
    pub fn remove(&self) -> io::Result<()> {
        set_mode(&self.in_dir, 0o700)?;
        fs::remove_dir_all(&self.job_dir)
    }
}

/// Checks that `name` can be used as a file name in `in/` or `out/`: a single path component,
/// not `.` or `..`, without NUL or control characters, at most 255 bytes.
pub fn validate_input_name(name: &str) -> Result<(), WorkerError> {
    match component_problem(name, MAX_NAME_BYTES) {
        Some(problem) => Err(WorkerError::InvalidName {
            name: name.to_owned(),
            problem,
        }),
        None => Ok(()),
    }
}

/// Creates the job layout under `job_dir` (which must be absent or empty).
///
/// Inputs are copied (following symlinks in their host `source` paths, which the caller chose)
/// and made read-only: files 0444, `in/` 0555. `out/` is 0700 and, with `out_owner` =
/// `Some((uid, gid))`, handed to the user the worker runs as.
pub fn stage(
    job_dir: &Path,
    inputs: &[InputFile],
    options: &serde_json::Value,
    out_owner: Option<(u32, u32)>,
) -> Result<StagedJob, WorkerError> {
    check_inputs(inputs)?;
    prepare_job_dir(job_dir)?;

    let in_dir = job_dir.join("in");
    create_dir(&in_dir)?;
    let staged = inputs
        .iter()
        .map(|input| copy_input(input, &in_dir))
        .collect::<Result<Vec<_>, _>>()?;
    set_mode(&in_dir, 0o555).map_err(|err| WorkerError::io("make read-only", &in_dir, err))?;

    let options_file = job_dir.join("options.json");
    write_options(&options_file, options)?;

    let out_dir = job_dir.join("out");
    create_dir(&out_dir)?;
    set_mode(&out_dir, 0o700).map_err(|err| WorkerError::io("set mode of", &out_dir, err))?;
    if let Some((uid, gid)) = out_owner {
        change_owner(&out_dir, uid, gid)?;
    }

    Ok(StagedJob {
        job_dir: job_dir.to_owned(),
        in_dir,
        options_file,
        out_dir,
        inputs: staged,
    })
}

fn check_inputs(inputs: &[InputFile]) -> Result<(), WorkerError> {
    let mut seen = HashSet::new();
    for input in inputs {
        validate_input_name(&input.name)?;
        if !seen.insert(input.name.as_str()) {
            return Err(WorkerError::DuplicateInput {
                name: input.name.clone(),
            });
        }
        let metadata =
            fs::metadata(&input.source).map_err(|source| WorkerError::MissingSource {
                name: input.name.clone(),
                path: input.source.clone(),
                source,
            })?;
        if !metadata.is_file() {
            return Err(WorkerError::SourceNotRegular {
                name: input.name.clone(),
                path: input.source.clone(),
            });
        }
    }
    Ok(())
}

fn prepare_job_dir(job_dir: &Path) -> Result<(), WorkerError> {
    match fs::create_dir(job_dir) {
        Ok(()) => {
            // The worker may run as another user: it must be able to reach in/ and out/.
            set_mode(job_dir, 0o755).map_err(|err| WorkerError::io("set mode of", job_dir, err))
        }
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
            let mut entries = fs::read_dir(job_dir)
                .map_err(|err| WorkerError::io("read job directory", job_dir, err))?;
            match entries.next() {
                None => Ok(()),
                Some(_) => Err(WorkerError::JobDirNotEmpty {
                    path: job_dir.to_owned(),
                }),
            }
        }
        Err(err) => Err(WorkerError::io("create job directory", job_dir, err)),
    }
}

fn create_dir(path: &Path) -> Result<(), WorkerError> {
    fs::create_dir(path).map_err(|err| WorkerError::io("create directory", path, err))
}

fn copy_input(input: &InputFile, in_dir: &Path) -> Result<PathBuf, WorkerError> {
    let target = in_dir.join(&input.name);
    let mut source = File::open(&input.source).map_err(|source| WorkerError::MissingSource {
        name: input.name.clone(),
        path: input.source.clone(),
        source,
    })?;
    // Re-checked on the opened file: the source may have changed since check_inputs.
    let is_file = source.metadata().map(|m| m.is_file()).unwrap_or(false);
    if !is_file {
        return Err(WorkerError::SourceNotRegular {
            name: input.name.clone(),
            path: input.source.clone(),
        });
    }
    let mut copy = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&target)
        .map_err(|err| WorkerError::io("create staged input", &target, err))?;
    io::copy(&mut source, &mut copy)
        .map_err(|err| WorkerError::io("copy input to", &target, err))?;
    set_mode(&target, 0o444).map_err(|err| WorkerError::io("make read-only", &target, err))?;
    Ok(target)
}

fn write_options(path: &Path, options: &serde_json::Value) -> Result<(), WorkerError> {
    let text = serde_json::to_vec_pretty(options).map_err(|source| WorkerError::Options {
        path: path.to_owned(),
        source,
    })?;
    fs::write(path, text).map_err(|err| WorkerError::io("write options to", path, err))?;
    set_mode(path, 0o444).map_err(|err| WorkerError::io("make read-only", path, err))
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    let mut permissions = fs::metadata(path)?.permissions();
    permissions.set_readonly(mode & 0o222 == 0);
    fs::set_permissions(path, permissions)
}

#[cfg(unix)]
fn change_owner(path: &Path, uid: u32, gid: u32) -> Result<(), WorkerError> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .map_err(|err| WorkerError::io("change owner of", path, err))
}

#[cfg(not(unix))]
fn change_owner(path: &Path, _uid: u32, _gid: u32) -> Result<(), WorkerError> {
    Err(WorkerError::io(
        "change owner of",
        path,
        io::Error::new(io::ErrorKind::Unsupported, "ownership needs a unix host"),
    ))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn host_file(dir: &Path, name: &str, content: &str) -> PathBuf {
        let path = dir.join(name);
        fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn stages_the_layout_with_read_only_inputs() {
        let host = tempfile::tempdir().unwrap();
        let data = host_file(host.path(), "data-source", "1,2,3\n");
        let job = host.path().join("job");
        let options = serde_json::json!({"threshold": 3});

        let staged = stage(&job, &[InputFile::new("data.csv", &data)], &options, None).unwrap();

        assert_eq!(staged.inputs, vec![job.join("in/data.csv")]);
        assert_eq!(fs::read_to_string(&staged.inputs[0]).unwrap(), "1,2,3\n");
        assert_eq!(mode(&staged.inputs[0]), 0o444);
        assert_eq!(mode(&staged.in_dir), 0o555);
        assert_eq!(mode(&staged.out_dir), 0o700);
        assert_eq!(mode(&staged.options_file), 0o444);
        let read_back: serde_json::Value =
            serde_json::from_slice(&fs::read(&staged.options_file).unwrap()).unwrap();
        assert_eq!(read_back, options);
        assert_eq!(fs::read_dir(&staged.out_dir).unwrap().count(), 0);

        staged.remove().unwrap();
        assert!(!job.exists());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn out_dir_is_handed_to_the_given_owner() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipping: chown to another uid needs root");
            return;
        }
        let host = tempfile::tempdir().unwrap();
        let job = host.path().join("job");
        let staged = stage(&job, &[], &serde_json::Value::Null, Some((12345, 23456))).unwrap();
        let meta = fs::metadata(&staged.out_dir).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (12345, 23456));
        assert_eq!(fs::metadata(&staged.in_dir).unwrap().uid(), 0);
    }

    #[test]
    fn rejects_bad_names_duplicates_and_bad_sources_naming_the_input() {
        let host = tempfile::tempdir().unwrap();
        let data = host_file(host.path(), "data", "x");
        let job = host.path().join("job");
        let none = serde_json::Value::Null;

        let err = stage(&job, &[InputFile::new("../escape", &data)], &none, None).unwrap_err();
        assert!(matches!(err, WorkerError::InvalidName { .. }), "{err}");
        assert!(err.to_string().contains("../escape"));

        let twice = [InputFile::new("a", &data), InputFile::new("a", &data)];
        let err = stage(&job, &twice, &none, None).unwrap_err();
        assert!(err.to_string().contains("declared twice"), "{err}");

        let missing = host.path().join("nope");
        let err = stage(&job, &[InputFile::new("m", &missing)], &none, None).unwrap_err();
        assert!(matches!(err, WorkerError::MissingSource { .. }), "{err}");
        assert!(err.to_string().contains("\"m\"") && err.to_string().contains("nope"));

        let err = stage(&job, &[InputFile::new("d", host.path())], &none, None).unwrap_err();
        assert!(matches!(err, WorkerError::SourceNotRegular { .. }), "{err}");

        assert!(
            !job.exists(),
            "validation failures must not leave a half-staged job"
        );
    }

    #[test]
    fn refuses_a_non_empty_job_dir() {
        let host = tempfile::tempdir().unwrap();
        host_file(host.path(), "leftover", "x");
        let err = stage(host.path(), &[], &serde_json::Value::Null, None).unwrap_err();
        assert!(matches!(err, WorkerError::JobDirNotEmpty { .. }), "{err}");
    }

    #[test]
    fn accepts_an_existing_empty_job_dir() {
        let host = tempfile::tempdir().unwrap();
        let staged = stage(host.path(), &[], &serde_json::json!({}), None).unwrap();
        assert!(staged.out_dir.is_dir());
        staged.remove().unwrap();
    }

    #[test]
    fn validate_input_name_examples() {
        assert!(validate_input_name("report.pdf").is_ok());
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a\0b",
            "line\nbreak",
            &"n".repeat(256),
        ] {
            assert!(validate_input_name(bad).is_err(), "{bad:?}");
        }
    }
}
