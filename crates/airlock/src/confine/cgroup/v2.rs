//! cgroup v2: a single run directory in the unified hierarchy, with controllers enabled down the
//! path through each ancestor's `cgroup.subtree_control`.

use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::parse::{keyed_value, parse_controller_list, parse_pids, single_value};
use super::{
    canonical_order, cfs_quota, control_file_offered, create_dir_if_missing, create_run_dir,
    read_optional, trial_create, write_control, CgroupConfig, CgroupError, CgroupLimits,
    CgroupSupport, CgroupUsage, CgroupVersion, Layout, RunCgroup, RunDir, V2Mount, CPU_LIMIT_HINT,
};

/// Controllers a v2 run enables; accounting of cpu time and the freezer are core features.
const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

pub(super) fn probe(layout: &Layout, cfg: &CgroupConfig, support: &mut CgroupSupport) {
    let Some(v2) = &layout.v2 else {
        support.version = None;
        support.problems.push(layout.nothing_usable_reason());
        return;
    };
    let mut usable = Vec::new();
    for name in V2_CONTROLLERS {
        if layout.v2_offers(name) {
            usable.push(name.to_string());
        } else {
            support.problems.push(missing_reason(layout, v2, name));
        }
    }
    if let Some(problem) = internal_process_problem(v2) {
        support.problems.push(problem);
    }
    match trial_create(&v2.path, &cfg.parent, |dir| {
        control_file_offered(dir, "cgroup.freeze")
    }) {
        Ok(true) => usable.push("freezer".to_string()),
        Ok(false) => support.notes.push(
            "cgroup.freeze is missing (kernel older than 5.2): killing a fork bomb relies on \
             repeated kill rounds"
                .to_string(),
        ),
        Err(err) => {
            support
                .problems
                .push(format!("cannot create cgroups: {err}"));
            support.version = None;
            usable.clear();
        }
    }
    support.controllers = canonical_order(&usable);
}

pub(super) fn create(
    layout: &Layout,
    cfg: &CgroupConfig,
    run_id: &str,
    limits: &CgroupLimits,
) -> Result<RunCgroup, CgroupError> {
    let Some(v2) = &layout.v2 else {
        return Err(CgroupError::Unavailable {
            root: layout.root.clone(),
            reason: layout.nothing_usable_reason(),
        });
    };
    let requested = requested_controllers(limits);
    for &controller in &requested {
        if !layout.v2_offers(controller) {
            return Err(CgroupError::ControllerUnavailable {
                limit: controller,
                reason: missing_reason(layout, v2, controller),
            });
        }
    }
    let wanted: Vec<&str> = V2_CONTROLLERS
        .into_iter()
        .filter(|name| layout.v2_offers(name))
        .collect();
    let prepare = || enable_down_to_parent(&v2.path, &cfg.parent, &wanted);
    let path = create_run_dir(&v2.path, &cfg.parent, run_id, true, prepare)?;
    let mut run = RunCgroup {
        version: CgroupVersion::V2,
        dirs: vec![RunDir {
            controllers: run_controllers(&path),
            path,
        }],
        keep_parent: cfg.keep_parent,
    };
    let outcome = check_delegated(&run.dirs[0], &requested)
        .and_then(|()| apply_limits(&run.dirs[0].path, limits));
    match outcome {
        Ok(()) => Ok(run),
        Err(err) => {
            let _ = run.roll_back();
            run.dirs.clear();
            Err(err)
        }
    }
}

/// Controllers needed by the requested limits (each limit is named after its controller).
fn requested_controllers(limits: &CgroupLimits) -> Vec<&'static str> {
    [
        ("memory", limits.memory_bytes.is_some()),
        ("pids", limits.pids.is_some()),
        ("cpu", limits.cpu_millicores.is_some()),
    ]
    .into_iter()
    .filter(|(_, requested)| *requested)
    .map(|(name, _)| name)
    .collect()
}

/// Controllers the run directory really got: those its parent enables, plus the core freezer.
fn run_controllers(run_dir: &Path) -> Vec<String> {
    let parent = run_dir.parent().unwrap_or(run_dir);
    let mut names = read_optional(&parent.join("cgroup.subtree_control"))
        .map(|text| parse_controller_list(&text))
        .unwrap_or_default();
    if control_file_offered(run_dir, "cgroup.freeze") {
        names.push("freezer".to_string());
    }
    canonical_order(&names)
}

fn check_delegated(run_dir: &RunDir, requested: &[&'static str]) -> Result<(), CgroupError> {
    match requested
        .iter()
        .find(|controller| !run_dir.controllers.iter().any(|c| c == *controller))
    {
        Some(controller) => Err(CgroupError::ControllerUnavailable {
            limit: controller,
            reason: format!(
                "the {controller} controller is not enabled in {}/cgroup.subtree_control although \
                 the hierarchy offers it; another manager may have changed it concurrently",
                run_dir.path.parent().unwrap_or(&run_dir.path).display()
            ),
        }),
        None => Ok(()),
    }
}

/// Creates `<mount>/<parent>` and enables `wanted` in `cgroup.subtree_control` of the mount
/// root and every directory down to the parent, as v2 requires for the run to get them.
fn enable_down_to_parent(mount: &Path, parent: &str, wanted: &[&str]) -> Result<(), CgroupError> {
    let mut dir = mount.to_path_buf();
    enable_controllers(&dir, wanted)?;
    for component in Path::new(parent).components() {
        dir.push(component);
        create_dir_if_missing(&dir)?;
        enable_controllers(&dir, wanted)?;
    }
    Ok(())
}

fn enable_controllers(dir: &Path, wanted: &[&str]) -> Result<(), CgroupError> {
    let file = dir.join("cgroup.subtree_control");
    let enabled = read_optional(&file)
        .map(|text| parse_controller_list(&text))
        .unwrap_or_default();
    if wanted.iter().all(|name| enabled.iter().any(|e| e == name)) {
        return Ok(());
    }
    let value = wanted
        .iter()
        .map(|name| format!("+{name}"))
        .collect::<Vec<_>>()
        .join(" ");
    write_control(&file, &value, &subtree_control_hint(dir)).map_err(|err| match err {
        CgroupError::Write {
            path,
            value,
            source,
            hint,
        } => {
            let hint = if source.raw_os_error() == Some(libc::EBUSY) {
                format!(
                    "processes live in {}; cgroup v2 cannot enable controllers for the children \
                     of a cgroup that has member processes: move them into a leaf cgroup first",
                    dir.display()
                )
            } else {
                hint
            };
            CgroupError::Write {
                path,
                value,
                source,
                hint,
            }
        }
        other => other,
    })
}

fn subtree_control_hint(dir: &Path) -> String {
    format!(
        "a controller missing from {}/cgroup.controllers cannot be enabled; enable it in the \
         ancestors' cgroup.subtree_control (with systemd: Delegate=yes)",
        dir.display()
    )
}

fn apply_limits(dir: &Path, limits: &CgroupLimits) -> Result<(), CgroupError> {
    if let Some(bytes) = limits.memory_bytes {
        write_control(
            &dir.join("memory.max"),
            &bytes.to_string(),
            "the memory controller rejected the limit",
        )?;
        // Without swap the limit is a hard ceiling; where swap is not accounted there is no file.
        if control_file_offered(dir, "memory.swap.max") {
            write_control(
                &dir.join("memory.swap.max"),
                "0",
                "memory.swap.max could not be set, so the run could swap past its limit",
            )?;
        }
    }
    if let Some(max) = limits.pids {
        write_control(
            &dir.join("pids.max"),
            &max.to_string(),
            "the pids controller rejected the limit",
        )?;
    }
    if let Some(millicores) = limits.cpu_millicores {
        let (quota, period) = cfs_quota(millicores);
        write_control(
            &dir.join("cpu.max"),
            &format!("{quota} {period}"),
            CPU_LIMIT_HINT,
        )?;
    }
    Ok(())
}

fn missing_reason(layout: &Layout, v2: &V2Mount, controller: &str) -> String {
    let v2_path = v2.path.display();
    match layout.v1_hierarchy(controller) {
        Some(hierarchy) => format!(
            "the {controller} controller is bound to cgroup v1 on this host (mounted at {}), so \
             cgroup v2 at {v2_path} cannot use it; boot with systemd.unified_cgroup_hierarchy=1 \
             or cgroup_no_v1={controller}",
            hierarchy.path.display()
        ),
        None => format!(
            "the {controller} controller is not listed in {v2_path}/cgroup.controllers: the kernel \
             lacks it or an ancestor cgroup did not enable it in cgroup.subtree_control (with \
             systemd: Delegate=yes)"
        ),
    }
}

/// On a namespaced or delegated mount the root is an ordinary cgroup: if processes live there,
/// v2's no-internal-process rule blocks enabling controllers for our parent.
fn internal_process_problem(v2: &V2Mount) -> Option<String> {
    let is_real_root = !v2.path.join("cgroup.type").exists();
    let enabled = read_optional(&v2.path.join("cgroup.subtree_control"))
        .map(|text| parse_controller_list(&text))
        .unwrap_or_default();
    let all_enabled = V2_CONTROLLERS
        .iter()
        .filter(|name| v2.available.iter().any(|a| a == *name))
        .all(|name| enabled.iter().any(|e| e == name));
    let members = read_optional(&v2.path.join("cgroup.procs"))
        .map(|text| parse_pids(&text))
        .unwrap_or_default();
    (!is_real_root && !all_enabled && !members.is_empty()).then(|| {
        format!(
            "processes live in {0}, which is not the root cgroup, so controllers cannot be enabled \
             for airlock's cgroups; move them into a leaf cgroup first (e.g. mkdir {0}/init and \
             write each pid into {0}/init/cgroup.procs)",
            v2.path.display()
        )
    })
}

pub(super) fn usage(dir: &Path) -> CgroupUsage {
    let read = |file: &str| read_optional(&dir.join(file));
    CgroupUsage {
        peak_memory_bytes: read("memory.peak").and_then(|text| single_value(&text)),
        oom_kills: read("memory.events")
            .and_then(|text| keyed_value(&text, "oom_kill"))
            .unwrap_or(0),
        cpu_usage_ns: read("cpu.stat")
            .and_then(|text| keyed_value(&text, "usage_usec"))
            .map(|usec| usec.saturating_mul(1000)),
        pids_limit_hits: read("pids.events")
            .and_then(|text| keyed_value(&text, "max"))
            .unwrap_or(0),
    }
}

/// Kills the whole cgroup atomically through `cgroup.kill` (Linux 5.14+); false if absent.
pub(super) fn request_kill(dir: &Path) -> Result<bool, CgroupError> {
    let file: PathBuf = dir.join("cgroup.kill");
    if !file.exists() {
        return Ok(false);
    }
    write_control(&file, "1", "cgroup.kill refused the request")?;
    Ok(true)
}

pub(super) fn freeze(dir: &Path) -> bool {
    let file = dir.join("cgroup.freeze");
    if !file.exists() || write_control(&file, "1", "").is_err() {
        return false;
    }
    let events = dir.join("cgroup.events");
    let until = Instant::now() + super::FREEZE_SETTLE;
    while read_optional(&events).and_then(|text| keyed_value(&text, "frozen")) != Some(1)
        && Instant::now() < until
    {
        sleep(Duration::from_millis(1));
    }
    true
}

pub(super) fn thaw(dir: &Path) -> Result<(), CgroupError> {
    let file = dir.join("cgroup.freeze");
    if !file.exists() {
        return Ok(());
    }
    write_control(
        &file,
        "0",
        "the run stays frozen until cgroup.freeze is set to 0",
    )
}
