//! Bringing a worker's `out/` back to the host, treating every byte and inode in it as hostile.
//!
//! The sandbox had write access to `out/` and may still be running (or have left a helper
//! running), so it can plant symlinks, hardlinks, FIFOs, devices and absurd names, and swap
//! entries while we walk. The walk therefore never resolves a path it did not just check:
//!
//! - every directory is held open as a file descriptor and each child is opened relative to
//!   it by a single, validated name with `O_NOFOLLOW`;
//! - each child is first *pinned* with `O_PATH|O_NOFOLLOW` (which opens nothing: no FIFO can
//!   block, no device driver runs, a symlink is pinned as itself) and classified by `fstat` on
//!   that pin. `lstat(name)` followed by `open(name)` would be a TOCTOU race: the sandbox could
//!   swap the name for a symlink to a host file between the two calls;
//! - a regular file is then opened for reading by name again (`O_NOFOLLOW|O_NONBLOCK`) and
//!   must be the very inode that was pinned, unchanged; after the copy it is checked again;
//! - destination entries are created with `O_CREAT|O_EXCL|O_NOFOLLOW` relative to directory
//!   descriptors under a destination directory that starts out empty, so nothing outside it
//!   can be written.
//!
//! Only regular files with a single link are copied, with fresh modes (0644 files, 0755
//! directories): no set-id or exec bits travel back. Everything else is reported in
//! [`IngestReport::skipped`] with a [`SkipReason`].

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{
    fstat, mkdirat, openat, unlinkat, AtFlags, Dir, FileType, Mode, OFlags, Stat, CWD,
};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use super::{component_problem, WorkerError};
use file::{copy_at_most, display_name, display_or_root, join, open_pinned_file, same_version};

mod file;

/// Caps on what one ingestion may bring back.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct IngestLimits {
    /// Sum of the sizes of all copied files.
    pub max_total_bytes: u64,
    /// Directory entries examined (files, directories and skipped entries alike): the bound on
    /// the work an inode bomb can cause.
    pub max_files: u64,
    /// Size of any single file.
    pub max_file_bytes: u64,
    /// Path components of a copied file, e.g. `a/b/c.txt` has depth 3. Values above
    /// [`DEPTH_CEILING`] act as the ceiling: the walk recurses and holds two descriptors per level.
    pub max_depth: u32,
    /// Bytes in one file or directory name.
    pub max_name_bytes: usize,
}

/// The deepest walk any configuration allows, bounding host stack and descriptor use.
pub const DEPTH_CEILING: u32 = 128;

impl IngestLimits {
    fn effective_depth(&self) -> u32 {
        self.max_depth.min(DEPTH_CEILING)
    }
}

impl Default for IngestLimits {
    fn default() -> Self {
        Self {
            max_total_bytes: 100 * 1024 * 1024,
            max_files: 1000,
            max_file_bytes: 50 * 1024 * 1024,
            max_depth: 8,
            max_name_bytes: 255,
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct IngestedFile {
    /// Path relative to `out/` (and to the destination), `/`-separated.
    pub rel_path: String,
    pub bytes: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Path relative to `out/`; lossy UTF-8 with control characters shown as `\u{..}`.
    pub rel_path: String,
    pub reason: SkipReason,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SkipReason {
    Symlink,
    /// A regular file with more than one link: it may be a host file linked into `out/`.
    Hardlink,
    Fifo,
    Socket,
    Device,
    /// Larger than `max_file_bytes`.
    TooLarge,
    /// Deeper than `max_depth`.
    TooDeep,
    /// Not valid UTF-8, `.`/`..`, contains `/`, NUL or control characters, or too long.
    BadName,
    /// Replaced, grown, shrunk or modified between being examined and being copied.
    ChangedDuringCopy,
    /// `max_files` or `max_total_bytes` was reached.
    LimitReached,
    /// The host could not open or read it, or its type is unknown.
    Unreadable,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct IngestReport {
    pub files: Vec<IngestedFile>,
    pub skipped: Vec<Skipped>,
    pub total_bytes: u64,
    /// Set when `max_files` or `max_total_bytes` cut the ingestion short: which one, first.
    pub truncated_by_limit: Option<String>,
}

/// Copies the regular files under `sandbox_out` into `dest` within `limits`.
///
/// `dest` must not exist (its parent must) or be an empty directory; it is never followed if
/// it is a symlink. Problems with individual entries are reported in the result, not
/// returned as errors; an `Err` means `sandbox_out` or `dest` itself is unusable or writing
/// to `dest` failed, in which case `dest` may hold a partial copy.
pub fn ingest(
    sandbox_out: &Path,
    dest: &Path,
    limits: &IngestLimits,
) -> Result<IngestReport, WorkerError> {
    ingest_with_hook(sandbox_out, dest, limits, &mut |_, _| {})
}

/// Moments in a file's copy at which tests can play the sandbox and change things.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HookPoint {
    /// The entry is pinned and classified as a regular file, not yet opened for reading.
    BeforeOpen,
    /// Opened and checked, not yet copied.
    BeforeCopy,
}

type Hook<'a> = &'a mut dyn FnMut(HookPoint, &str);

fn ingest_with_hook(
    sandbox_out: &Path,
    dest: &Path,
    limits: &IngestLimits,
    hook: Hook<'_>,
) -> Result<IngestReport, WorkerError> {
    let source_root = open_directory(CWD, sandbox_out)
        .map_err(|err| WorkerError::io("open sandbox output directory", sandbox_out, err))?;
    let dest_root = create_fresh_dest(dest)?;
    let mut walk = Walk {
        limits,
        hook,
        dest,
        entries_seen: 0,
        report: IngestReport::default(),
    };
    walk.directory(&source_root, &dest_root, "", 1)?;
    Ok(walk.report)
}

fn open_directory(
    parent: impl std::os::fd::AsFd,
    name: impl rustix::path::Arg,
) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(openat(parent, name, flags, Mode::empty())?)
}

fn create_fresh_dest(dest: &Path) -> Result<OwnedFd, WorkerError> {
    match mkdirat(CWD, dest, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(err) => return Err(WorkerError::io("create destination", dest, err)),
    }
    let not_usable = || WorkerError::DestNotEmpty {
        path: dest.to_owned(),
    };
    let root = open_directory(CWD, dest).map_err(|err| match err.raw_os_error() {
        Some(code)
            if code == Errno::LOOP.raw_os_error() || code == Errno::NOTDIR.raw_os_error() =>
        {
            not_usable()
        }
        _ => WorkerError::io("open destination", dest, err),
    })?;
    let mut listing =
        Dir::read_from(&root).map_err(|err| WorkerError::io("list destination", dest, err))?;
    while let Some(entry) = listing.read() {
        let entry = entry.map_err(|err| WorkerError::io("list destination", dest, err))?;
        if !is_dot_entry(entry.file_name()) {
            return Err(not_usable());
        }
    }
    Ok(root)
}

fn is_dot_entry(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

struct Walk<'a> {
    limits: &'a IngestLimits,
    hook: Hook<'a>,
    dest: &'a Path,
    entries_seen: u64,
    report: IngestReport,
}

impl Walk<'_> {
    fn directory(
        &mut self,
        source: &OwnedFd,
        dest: &OwnedFd,
        prefix: &str,
        depth: u32,
    ) -> Result<Flow, WorkerError> {
        let names = match self.list(source) {
            Ok(names) => names,
            Err(err) => {
                self.skip(display_or_root(prefix), SkipReason::Unreadable, Some(err));
                return Ok(Flow::Continue);
            }
        };
        for name in names {
            let rel_path = join(prefix, &display_name(&name));
            if self.entries_seen >= self.limits.max_files {
                let limit = format!("file count limit of {} reached", self.limits.max_files);
                self.limit_reached(rel_path, limit);
                return Ok(Flow::Stop);
            }
            self.entries_seen += 1;
            if self.entry(source, dest, &name, rel_path, depth)? == Flow::Stop {
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    }

    /// Entry names, sorted for a deterministic report; reads no more than the file budget
    /// (plus one, to notice the overflow) so a huge directory costs bounded memory.
    fn list(&self, source: &OwnedFd) -> io::Result<Vec<CString>> {
        let budget = self.limits.max_files.saturating_sub(self.entries_seen);
        let wanted = usize::try_from(budget)
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        let mut listing = Dir::read_from(source)?;
        let mut names = Vec::new();
        while names.len() < wanted {
            let Some(entry) = listing.read() else { break };
            let entry = entry?;
            if !is_dot_entry(entry.file_name()) {
                names.push(entry.file_name().to_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    fn entry(
        &mut self,
        source: &OwnedFd,
        dest: &OwnedFd,
        name: &CStr,
        rel_path: String,
        depth: u32,
    ) -> Result<Flow, WorkerError> {
        if let Err(problem) = self.check_name(name) {
            self.skip(rel_path, SkipReason::BadName, Some(problem));
            return Ok(Flow::Continue);
        }
        if depth > self.limits.effective_depth() {
            self.skip(rel_path, SkipReason::TooDeep, None);
            return Ok(Flow::Continue);
        }
        let pin_flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let pinned = openat(source, name, pin_flags, Mode::empty()).and_then(|pin| {
            let stat = fstat(&pin)?;
            Ok((pin, stat))
        });
        let (pin, stat) = match pinned {
            Ok(pinned) => pinned,
            Err(err) => {
                self.skip(rel_path, SkipReason::Unreadable, Some(err.into()));
                return Ok(Flow::Continue);
            }
        };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => self.subdirectory(&pin, dest, name, rel_path, depth),
            FileType::RegularFile => self.regular_file(source, dest, name, &stat, rel_path),
            other => {
                let (reason, detail) = match other {
                    FileType::Symlink => (SkipReason::Symlink, None),
                    FileType::Fifo => (SkipReason::Fifo, None),
                    FileType::Socket => (SkipReason::Socket, None),
                    FileType::CharacterDevice | FileType::BlockDevice => (SkipReason::Device, None),
                    _ => (SkipReason::Unreadable, Some("unknown file type".to_owned())),
                };
                self.report.skipped.push(Skipped {
                    rel_path,
                    reason,
                    detail,
                });
                Ok(Flow::Continue)
            }
        }
    }

    fn check_name(&self, name: &CStr) -> Result<(), io::Error> {
        let text = name
            .to_str()
            .map_err(|_| io::Error::other("name is not valid UTF-8"))?;
        match component_problem(text, self.limits.max_name_bytes) {
            Some(problem) => Err(io::Error::other(problem)),
            None => Ok(()),
        }
    }

    fn subdirectory(
        &mut self,
        pin: &OwnedFd,
        dest: &OwnedFd,
        name: &CStr,
        rel_path: String,
        depth: u32,
    ) -> Result<Flow, WorkerError> {
        // Its children would be deeper than allowed: don't walk an arbitrarily deep tree.
        if depth >= self.limits.effective_depth() {
            self.skip(rel_path, SkipReason::TooDeep, None);
            return Ok(Flow::Continue);
        }
        // "." relative to the pin is the pinned directory itself, whatever the name means now.
        let source_child = match open_directory(pin, c".") {
            Ok(fd) => fd,
            Err(err) => {
                self.skip(rel_path, SkipReason::Unreadable, Some(err));
                return Ok(Flow::Continue);
            }
        };
        let dest_path = self.dest.join(&rel_path);
        mkdirat(dest, name, Mode::from_raw_mode(0o755))
            .map_err(|err| WorkerError::io("create directory", &dest_path, err))?;
        let dest_child = open_directory(dest, name)
            .map_err(|err| WorkerError::io("open directory", &dest_path, err))?;
        self.directory(&source_child, &dest_child, &rel_path, depth + 1)
    }

    fn regular_file(
        &mut self,
        source: &OwnedFd,
        dest: &OwnedFd,
        name: &CStr,
        pinned: &Stat,
        rel_path: String,
    ) -> Result<Flow, WorkerError> {
        if pinned.st_nlink > 1 {
            self.skip(rel_path, SkipReason::Hardlink, None);
            return Ok(Flow::Continue);
        }
        let size = u64::try_from(pinned.st_size).unwrap_or(u64::MAX);
        if size > self.limits.max_file_bytes {
            let detail = format!("{size} bytes, limit {}", self.limits.max_file_bytes);
            self.skip(
                rel_path,
                SkipReason::TooLarge,
                Some(io::Error::other(detail)),
            );
            return Ok(Flow::Continue);
        }
        if self.report.total_bytes.saturating_add(size) > self.limits.max_total_bytes {
            let limit = format!(
                "total size limit of {} bytes reached",
                self.limits.max_total_bytes
            );
            self.limit_reached(rel_path, limit);
            return Ok(Flow::Continue);
        }
        (self.hook)(HookPoint::BeforeOpen, &rel_path);
        let file = match open_pinned_file(source, name, pinned) {
            Ok(file) => file,
            Err((reason, err)) => {
                self.skip(rel_path, reason, Some(err));
                return Ok(Flow::Continue);
            }
        };
        (self.hook)(HookPoint::BeforeCopy, &rel_path);
        self.copy_file(file, dest, name, pinned, size, rel_path)
    }

    fn copy_file(
        &mut self,
        mut file: File,
        dest: &OwnedFd,
        name: &CStr,
        pinned: &Stat,
        size: u64,
        rel_path: String,
    ) -> Result<Flow, WorkerError> {
        let dest_path = self.dest.join(&rel_path);
        let create =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut copy = openat(dest, name, create, Mode::from_raw_mode(0o644))
            .map(File::from)
            .map_err(|err| WorkerError::io("create file", &dest_path, err))?;
        // One byte more than fstat promised, so growth shows up as a longer copy.
        let outcome = copy_at_most(&mut file, &mut copy, size + 1)
            .map_err(|err| WorkerError::io("write file", &dest_path, err))?;
        let unchanged = fstat(&file).is_ok_and(|after| same_version(pinned, &after));
        let problem = match outcome {
            Err(read_error) => Some((SkipReason::Unreadable, read_error)),
            Ok(copied) if copied != size || !unchanged => Some((
                SkipReason::ChangedDuringCopy,
                io::Error::other(format!("expected {size} bytes, read {copied}")),
            )),
            Ok(_) => None,
        };
        if let Some((reason, detail)) = problem {
            drop(copy);
            unlinkat(dest, name, AtFlags::empty())
                .map_err(|err| WorkerError::io("remove partial copy", &dest_path, err))?;
            self.skip(rel_path, reason, Some(detail));
            return Ok(Flow::Continue);
        }
        self.report.total_bytes += size;
        self.report.files.push(IngestedFile {
            rel_path,
            bytes: size,
        });
        Ok(Flow::Continue)
    }

    fn skip(&mut self, rel_path: String, reason: SkipReason, detail: Option<io::Error>) {
        self.report.skipped.push(Skipped {
            rel_path,
            reason,
            detail: detail.map(|err| err.to_string()),
        });
    }

    fn limit_reached(&mut self, rel_path: String, limit: String) {
        self.skip(
            rel_path,
            SkipReason::LimitReached,
            Some(io::Error::other(limit.clone())),
        );
        self.report.truncated_by_limit.get_or_insert(limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::Write;
    use std::os::unix::fs::symlink;

    struct Setup {
        _host: tempfile::TempDir,
        out: std::path::PathBuf,
        dest: std::path::PathBuf,
        canary: std::path::PathBuf,
    }

    fn setup() -> Setup {
        let host = tempfile::tempdir().unwrap();
        let out = host.path().join("out");
        fs::create_dir(&out).unwrap();
        let canary = host.path().join("canary");
        fs::write(&canary, "host secret").unwrap();
        Setup {
            dest: host.path().join("dest"),
            out,
            canary,
            _host: host,
        }
    }

    fn reasons(report: &IngestReport) -> Vec<(&str, SkipReason)> {
        report
            .skipped
            .iter()
            .map(|s| (s.rel_path.as_str(), s.reason))
            .collect()
    }

    #[test]
    fn file_appended_to_before_open_is_skipped() {
        let s = setup();
        fs::write(s.out.join("grows"), "abc").unwrap();
        let target = s.out.join("grows");
        let mut hook = |point: HookPoint, _: &str| {
            if point == HookPoint::BeforeOpen {
                let mut f = fs::OpenOptions::new().append(true).open(&target).unwrap();
                f.write_all(b"more").unwrap();
            }
        };
        let report =
            ingest_with_hook(&s.out, &s.dest, &IngestLimits::default(), &mut hook).unwrap();
        assert_eq!(reasons(&report), [("grows", SkipReason::ChangedDuringCopy)]);
        assert!(report.files.is_empty());
        assert!(
            !s.dest.join("grows").exists(),
            "no partial copy is left behind"
        );
    }

    #[test]
    fn file_appended_to_during_copy_is_skipped() {
        let s = setup();
        let target = s.out.join("grows");
        fs::write(&target, vec![b'x'; 200_000]).unwrap();
        let mut hook = |point: HookPoint, _: &str| {
            if point == HookPoint::BeforeCopy {
                let mut f = fs::OpenOptions::new().append(true).open(&target).unwrap();
                f.write_all(b"more").unwrap();
            }
        };
        let report =
            ingest_with_hook(&s.out, &s.dest, &IngestLimits::default(), &mut hook).unwrap();
        assert_eq!(reasons(&report), [("grows", SkipReason::ChangedDuringCopy)]);
        assert_eq!(report.total_bytes, 0);
        assert!(!s.dest.join("grows").exists());
    }

    #[test]
    fn file_truncated_during_copy_is_skipped() {
        let s = setup();
        let target = s.out.join("shrinks");
        fs::write(&target, vec![b'x'; 100_000]).unwrap();
        let mut hook = |point: HookPoint, _: &str| {
            if point == HookPoint::BeforeCopy {
                fs::OpenOptions::new()
                    .write(true)
                    .open(&target)
                    .unwrap()
                    .set_len(10)
                    .unwrap();
            }
        };
        let report =
            ingest_with_hook(&s.out, &s.dest, &IngestLimits::default(), &mut hook).unwrap();
        assert_eq!(
            reasons(&report),
            [("shrinks", SkipReason::ChangedDuringCopy)]
        );
    }

    #[test]
    fn file_swapped_for_a_symlink_after_examination_is_not_followed() {
        let s = setup();
        let target = s.out.join("swapped");
        fs::write(&target, "innocent").unwrap();
        let canary = s.canary.clone();
        let mut hook = |point: HookPoint, _: &str| {
            if point == HookPoint::BeforeOpen {
                fs::remove_file(&target).unwrap();
                symlink(&canary, &target).unwrap();
            }
        };
        let report =
            ingest_with_hook(&s.out, &s.dest, &IngestLimits::default(), &mut hook).unwrap();
        assert_eq!(
            reasons(&report),
            [("swapped", SkipReason::ChangedDuringCopy)]
        );
        assert!(report.files.is_empty());
        assert_eq!(fs::read_to_string(&s.canary).unwrap(), "host secret");
        assert_eq!(fs::read_dir(&s.dest).unwrap().count(), 0);
    }

    #[test]
    fn file_swapped_for_another_file_is_skipped() {
        let s = setup();
        let target = s.out.join("swapped");
        fs::write(&target, "first").unwrap();
        let mut hook = |point: HookPoint, _: &str| {
            if point == HookPoint::BeforeOpen {
                let replacement = target.with_extension("new");
                fs::write(&replacement, "other").unwrap();
                fs::rename(&replacement, &target).unwrap();
            }
        };
        let report =
            ingest_with_hook(&s.out, &s.dest, &IngestLimits::default(), &mut hook).unwrap();
        assert_eq!(
            reasons(&report),
            [("swapped", SkipReason::ChangedDuringCopy)]
        );
    }

    #[test]
    fn file_swapped_for_a_fifo_does_not_block() {
        let s = setup();
        let target = s.out.join("swapped");
        fs::write(&target, "data").unwrap();
        let mut hook = |point: HookPoint, _: &str| {
            if point == HookPoint::BeforeOpen {
                fs::remove_file(&target).unwrap();
                nix::unistd::mkfifo(&target, nix::sys::stat::Mode::from_bits_truncate(0o666))
                    .unwrap();
            }
        };
        let report =
            ingest_with_hook(&s.out, &s.dest, &IngestLimits::default(), &mut hook).unwrap();
        assert_eq!(
            reasons(&report),
            [("swapped", SkipReason::ChangedDuringCopy)]
        );
    }

    #[test]
    fn unchanged_files_pass_the_hooks() {
        let s = setup();
        fs::write(s.out.join("steady"), "same").unwrap();
        let mut calls = Vec::new();
        let mut hook = |point: HookPoint, rel: &str| calls.push((point, rel.to_owned()));
        let report =
            ingest_with_hook(&s.out, &s.dest, &IngestLimits::default(), &mut hook).unwrap();
        assert!(report.skipped.is_empty(), "{report:?}");
        assert_eq!(fs::read_to_string(s.dest.join("steady")).unwrap(), "same");
        assert_eq!(
            calls,
            [
                (HookPoint::BeforeOpen, "steady".to_owned()),
                (HookPoint::BeforeCopy, "steady".to_owned())
            ]
        );
    }

    #[test]
    fn display_name_escapes_control_characters() {
        assert_eq!(display_name(c"a\nb\x1b"), "a\\u{a}b\\u{1b}");
        assert_eq!(display_name(c"plain.txt"), "plain.txt");
    }
}
