//! Template recycling off the caller's path: when a template nears its end (nine tenths of
//! `max_forks` or of `max_age`), its replacement is started in the background; when the old
//! one is due, the replacement takes over and the old one is stopped in the background. A
//! caller waits only when the replacement is not ready by then (then the bound holds exactly:
//! no template serves more than `max_forks` runs or lives past `max_age` serving).

use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::host::{TemplateProcess, TemplateStart, ZygoteStats};
use crate::error::Error;

/// The running template, the replacement being started, and old templates being stopped.
#[derive(Debug, Default)]
pub(super) struct Templates {
    current: Option<TemplateProcess>,
    next: Option<JoinHandle<Result<TemplateProcess, Error>>>,
    retiring: Vec<JoinHandle<()>>,
}

/// When a template is replaced.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub max_forks: u64,
    pub max_age: Duration,
}

impl Bounds {
    fn due(&self, template: &TemplateProcess) -> bool {
        template.forks >= self.max_forks || template.born.elapsed() >= self.max_age
    }

    /// Close enough to its end that the replacement should start now.
    fn nearly_due(&self, template: &TemplateProcess) -> bool {
        let margin = (self.max_forks / 10).max(1);
        template.forks >= self.max_forks.saturating_sub(margin)
            || template.born.elapsed() >= self.max_age.mul_f64(0.9)
    }
}

impl Templates {
    /// The template to fork the next run from: the current one, or its replacement once it
    /// is due (started now if none was started ahead). Starts the next replacement early.
    pub fn serving(
        &mut self,
        bounds: Bounds,
        start: &TemplateStart,
        stats: &Arc<Mutex<ZygoteStats>>,
    ) -> Result<&mut TemplateProcess, Error> {
        if self.current.as_ref().is_none_or(|t| bounds.due(t)) {
            let fresh = self.replacement(start, stats)?;
            lock(stats).template_pid = Some(fresh.pid.as_raw() as u32);
            if let Some(old) = self.current.replace(fresh) {
                // It exits on its socket closing; its children run on.
                self.retiring.retain(|stop| !stop.is_finished());
                self.retiring.push(std::thread::spawn(move || drop(old)));
            }
        }
        let nearly_due = self.current.as_ref().is_some_and(|t| bounds.nearly_due(t));
        if self.next.is_none() && nearly_due {
            let start = start.clone();
            self.next = Some(std::thread::spawn(move || start.start()));
        }
        match self.current.as_mut() {
            Some(template) => Ok(template),
            None => unreachable!("replaced above"),
        }
    }

    /// Whether a replacement is being started.
    pub fn replacing(&self) -> bool {
        self.next.as_ref().is_some_and(|next| !next.is_finished())
    }

    /// The replacement started ahead (waited for if not ready yet; started again here if it
    /// failed), else one started now.
    fn replacement(
        &mut self,
        start: &TemplateStart,
        stats: &Arc<Mutex<ZygoteStats>>,
    ) -> Result<TemplateProcess, Error> {
        let ahead = self.next.take().map(|next| {
            if !next.is_finished() && self.current.is_some() {
                lock(stats).template_waits += 1;
            }
            next.join()
        });
        match ahead {
            Some(Ok(Ok(template))) => Ok(template),
            _ => start.start(),
        }
    }

    /// Stops every template (the running one, a replacement, the retiring ones) and waits
    /// until each has exited.
    pub fn stop_all(&mut self) {
        self.current.take();
        if let Some(next) = self.next.take() {
            let _ = next.join();
        }
        for stop in self.retiring.drain(..) {
            let _ = stop.join();
        }
    }
}

/// Forks runs from the serving template; shared by the callers and the keeper that forks
/// children ahead.
#[derive(Debug)]
pub(super) struct Forker {
    templates: Mutex<Templates>,
    bounds: Bounds,
    start: TemplateStart,
    stats: Arc<Mutex<ZygoteStats>>,
}

impl Forker {
    pub fn new(bounds: Bounds, start: TemplateStart, stats: Arc<Mutex<ZygoteStats>>) -> Forker {
        Forker {
            templates: Mutex::default(),
            bounds,
            start,
            stats,
        }
    }

    /// Starts the first template (or replaces a due one) without forking.
    pub fn ensure_serving(&self) -> Result<(), Error> {
        let mut templates = lock(&self.templates);
        templates.serving(self.bounds, &self.start, &self.stats)?;
        Ok(())
    }

    /// Hands a run's descriptors to the template, replacing it first when it is due.
    pub fn fork(&self, fds: &[RawFd]) -> Result<(), Error> {
        let mut templates = lock(&self.templates);
        let template = templates.serving(self.bounds, &self.start, &self.stats)?;
        template.forks += 1;
        template.fork_run(fds)?;
        lock(&self.stats).runs += 1;
        Ok(())
    }

    pub fn replacing(&self) -> bool {
        lock(&self.templates).replacing()
    }

    pub fn stop_all(&self) {
        lock(&self.templates).stop_all();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
