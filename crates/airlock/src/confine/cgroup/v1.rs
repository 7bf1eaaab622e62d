//! cgroup v1: one directory per hierarchy (memory, pids, cpu, cpuacct, freezer), each under the
//! airlock parent of that hierarchy.

use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::parse::{keyed_value, single_value};
use super::{
    canonical_order, cfs_quota, control_file_offered, create_run_dir, ensure_parent, read_optional,
    trial_create, write_control, CgroupConfig, CgroupError, CgroupLimits, CgroupSupport,
    CgroupUsage, CgroupVersion, Layout, RunCgroup, RunDir, V1Hierarchy, CPU_LIMIT_HINT,
    DEFAULT_CFS_PERIOD_US, RUN_CONTROLLERS,
};

pub(super) fn probe(layout: &Layout, cfg: &CgroupConfig, support: &mut CgroupSupport) {
    for name in RUN_CONTROLLERS {
        if layout.v1_hierarchy(name).is_none() {
            support.problems.push(missing_reason(layout, name));
        }
    }
    let mut usable = Vec::new();
    for hierarchy in run_hierarchies(layout) {
        let names = canonical_order(&hierarchy.controllers);
        let memsw_check = |dir: &Path| control_file_offered(dir, "memory.memsw.limit_in_bytes");
        match trial_create(&hierarchy.path, &cfg.parent, memsw_check) {
            Ok(has_memsw) => {
                if names.iter().any(|name| name == "memory") && !has_memsw {
                    support.notes.push(
                        "swap is not accounted (no memory.memsw.limit_in_bytes): the memory limit \
                         does not cover swap; boot with swapaccount=1 or disable swap"
                            .to_string(),
                    );
                }
                usable.extend(names);
            }
            Err(err) => support.problems.push(format!(
                "the {} controller is unusable: {err}",
                names.join("+")
            )),
        }
    }
    support.controllers = canonical_order(&usable);
    if support.controllers.is_empty() {
        support.version = None;
    }
    if let Some(v2) = &layout.v2 {
        support.notes.push(format!(
            "cgroup v2 at {} offers only [{}]; memory and pids are bound to cgroup v1 on this host, \
             so airlock uses v1 (to switch, boot with systemd.unified_cgroup_hierarchy=1 or cgroup_no_v1=all)",
            v2.path.display(),
            v2.available.join(" ")
        ));
    }
}

pub(super) fn create(
    layout: &Layout,
    cfg: &CgroupConfig,
    run_id: &str,
    limits: &CgroupLimits,
) -> Result<RunCgroup, CgroupError> {
    for (limit, requested) in [
        ("memory", limits.memory_bytes.is_some()),
        ("pids", limits.pids.is_some()),
        ("cpu", limits.cpu_millicores.is_some()),
    ] {
        if requested && layout.v1_hierarchy(limit).is_none() {
            return Err(CgroupError::ControllerUnavailable {
                limit,
                reason: missing_reason(layout, limit),
            });
        }
    }
    let mut run = RunCgroup {
        version: CgroupVersion::V1,
        dirs: Vec::new(),
        keep_parent: cfg.keep_parent,
    };
    let outcome =
        create_dirs(layout, cfg, run_id, &mut run).and_then(|()| apply_limits(&run.dirs, limits));
    match outcome {
        Ok(()) => Ok(run),
        Err(err) => {
            let _ = run.roll_back();
            Err(err)
        }
    }
}

fn create_dirs(
    layout: &Layout,
    cfg: &CgroupConfig,
    run_id: &str,
    run: &mut RunCgroup,
) -> Result<(), CgroupError> {
    for hierarchy in run_hierarchies(layout) {
        let prepare = || ensure_parent(&hierarchy.path, &cfg.parent).map(drop);
        let path = create_run_dir(&hierarchy.path, &cfg.parent, run_id, false, prepare)?;
        run.dirs.push(RunDir {
            path,
            controllers: canonical_order(&hierarchy.controllers),
        });
    }
    Ok(())
}

/// Hierarchies carrying at least one run controller; cpuset is skipped on purpose because a
/// new v1 cpuset cgroup has empty cpus/mems and no process could join it.
fn run_hierarchies(layout: &Layout) -> impl Iterator<Item = &V1Hierarchy> {
    layout
        .v1
        .iter()
        .filter(|hierarchy| !canonical_order(&hierarchy.controllers).is_empty())
}

fn dir_with<'a>(dirs: &'a [RunDir], controller: &str) -> Option<&'a Path> {
    dirs.iter()
        .find(|dir| dir.controllers.iter().any(|c| c == controller))
        .map(|dir| dir.path.as_path())
}

fn apply_limits(dirs: &[RunDir], limits: &CgroupLimits) -> Result<(), CgroupError> {
    if let (Some(bytes), Some(dir)) = (limits.memory_bytes, dir_with(dirs, "memory")) {
        let value = bytes.to_string();
        write_control(
            &dir.join("memory.limit_in_bytes"),
            &value,
            "the memory controller rejected the limit; it must be a byte count the kernel accepts",
        )?;
        // Equal memory+swap and memory limits mean the run cannot use swap at all.
        if control_file_offered(dir, "memory.memsw.limit_in_bytes") {
            write_control(
                &dir.join("memory.memsw.limit_in_bytes"),
                &value,
                "memory.memsw.limit_in_bytes must be at least memory.limit_in_bytes",
            )?;
        }
    }
    if let (Some(max), Some(dir)) = (limits.pids, dir_with(dirs, "pids")) {
        write_control(
            &dir.join("pids.max"),
            &max.to_string(),
            "the pids controller rejected the limit",
        )?;
    }
    if let (Some(millicores), Some(dir)) = (limits.cpu_millicores, dir_with(dirs, "cpu")) {
        let (quota, period) = cfs_quota(millicores);
        // A new cgroup starts with the kernel's default period (`default_bw_period_us`), and
        // the quota is counted against the period in force: writing the default again would
        // cost a kernfs open and a bandwidth update on every run's path for nothing.
        if period != DEFAULT_CFS_PERIOD_US {
            let period_file = dir.join("cpu.cfs_period_us");
            write_control(&period_file, &period.to_string(), CPU_LIMIT_HINT)?;
        }
        write_control(
            &dir.join("cpu.cfs_quota_us"),
            &quota.to_string(),
            CPU_LIMIT_HINT,
        )?;
    }
    Ok(())
}

fn missing_reason(layout: &Layout, controller: &str) -> String {
    let root = layout.root.display();
    format!(
        "no cgroup v1 hierarchy with the {controller} controller is mounted under {root} and cgroup v2 \
         does not offer it; mount one with `mount -t cgroup -o {controller} cgroup {root}/{controller}`"
    )
}

pub(super) fn usage(dirs: &[RunDir]) -> CgroupUsage {
    let read = |controller: &str, file: &str| {
        dir_with(dirs, controller).and_then(|dir| read_optional(&dir.join(file)))
    };
    CgroupUsage {
        peak_memory_bytes: read("memory", "memory.max_usage_in_bytes")
            .and_then(|text| single_value(&text)),
        oom_kills: read("memory", "memory.oom_control")
            .and_then(|text| keyed_value(&text, "oom_kill"))
            .unwrap_or(0),
        cpu_usage_ns: cpu_usage_ns(dirs),
        pids_limit_hits: read("pids", "pids.events")
            .and_then(|text| keyed_value(&text, "max"))
            .unwrap_or(0),
    }
}

pub(super) fn cpu_usage_ns(dirs: &[RunDir]) -> Option<u64> {
    dir_with(dirs, "cpuacct")
        .and_then(|dir| read_optional(&dir.join("cpuacct.usage")))
        .and_then(|text| single_value(&text))
}

/// Writing to `memory.max_usage_in_bytes` sets it to the current usage.
pub(super) fn reset_peak_memory(dirs: &[RunDir]) -> bool {
    dir_with(dirs, "memory")
        .is_some_and(|dir| write_control(&dir.join("memory.max_usage_in_bytes"), "0", "").is_ok())
}

/// Freezes the run so its members cannot fork while being killed; false if there is no
/// freezer (the caller then relies on repeated kill rounds).
pub(super) fn freeze(dirs: &[RunDir]) -> bool {
    let Some(dir) = dir_with(dirs, "freezer") else {
        return false;
    };
    let state = dir.join("freezer.state");
    if write_control(&state, "FROZEN", "").is_err() {
        return false;
    }
    let until = Instant::now() + super::FREEZE_SETTLE;
    while read_optional(&state).is_some_and(|text| text.trim() != "FROZEN")
        && Instant::now() < until
    {
        sleep(Duration::from_millis(1));
    }
    true
}

pub(super) fn thaw(dirs: &[RunDir]) -> Result<(), CgroupError> {
    match dir_with(dirs, "freezer") {
        Some(dir) => write_control(
            &dir.join("freezer.state"),
            "THAWED",
            "the run stays frozen until freezer.state is set to THAWED",
        ),
        None => Ok(()),
    }
}
