//! Spare launches: the next call of a tool finds its sandbox already built.
//!
//! Making a tool's sandbox — forking, creating the namespaces, building the mount
//! tree, applying rlimits, Landlock and seccomp — costs more than running a small tool.
//! After each call the executor starts a **spare** for the same [`LaunchKey`]: a
//! child that goes through every step of the confinement and then blocks, before
//! `exec`, on a pipe. The next call with an equal key takes the spare, writes one byte
//! ("go"), and the child `exec`s the tool at once; only the call's stdin is new.
//!
//! What a spare holds is exactly what a fresh launch would build for that key (same
//! plan, same scratch size, a fresh scratch directory), so taking one changes no
//! guarantee. A spare is used at most once, never after [`MAX_AGE`] (a grant's path
//! may have changed on disk since it was bound), and at most
//! [`crate::ProcessOptions::spares`] wait at a time (the oldest is dropped). Dropping a spare closes its pipe: the child reads
//! end-of-file and exits without running anything, and its scratch directory is
//! removed.

use std::io::Write;
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use soulbase_errors::SoulError;
use soulbase_sandbox::ExecOutput;

use crate::executor::{Job, LaunchKey};

/// How long a spare may wait before it is thrown away unused.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(10);

/// The reply to a job: the call's outcome.
pub(crate) type Reply = tokio::sync::oneshot::Sender<Result<ExecOutput, SoulError>>;

/// A launch waiting for its call.
#[derive(Debug)]
pub(crate) struct Spare {
    pub(crate) key: LaunchKey,
    /// Writing one byte lets the waiting child `exec`; dropping it ends the child.
    pub(crate) go: std::io::PipeWriter,
    /// Where the call's input goes to the thread that watches the child.
    pub(crate) jobs: mpsc::Sender<(Job, Reply)>,
    pub(crate) born: Instant,
}

/// Why a spare could not take a call; the call then launches afresh.
#[derive(Debug)]
pub(crate) struct Unusable;

impl Spare {
    /// Starts the waiting child's tool with `job`; the outcome comes on the returned
    /// receiver. `Err` when the spare is gone (its launch failed before `exec`): the
    /// tool has not run.
    pub(crate) fn start(
        mut self,
        job: &Job,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<ExecOutput, SoulError>>, Unusable> {
        let (reply, outcome) = tokio::sync::oneshot::channel();
        // The job first: once the thread has it, the go byte is all the child needs.
        self.jobs.send((job.clone(), reply)).map_err(|_| Unusable)?;
        self.go.write_all(&[1]).map_err(|_| Unusable)?;
        Ok(outcome)
    }
}

/// The spares waiting, oldest first.
#[derive(Debug)]
pub(crate) struct Spares {
    waiting: Mutex<Vec<Spare>>,
    max: usize,
}

impl Spares {
    /// Room for `max` spares.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            waiting: Mutex::new(Vec::new()),
            max,
        }
    }

    /// Takes the spare for `key`, if one is waiting and young enough; drops the ones
    /// past [`MAX_AGE`].
    pub(crate) fn take(&self, key: &LaunchKey) -> Option<Spare> {
        let mut waiting = self.waiting.lock().ok()?;
        waiting.retain(|s| s.born.elapsed() < MAX_AGE);
        let at = waiting.iter().position(|s| s.key == *key)?;
        Some(waiting.remove(at))
    }

    /// Adds a spare, dropping the oldest beyond the maximum.
    pub(crate) fn put(&self, spare: Spare) {
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.push(spare);
            while waiting.len() > self.max {
                waiting.remove(0);
            }
        }
    }

    /// Whether a spare for `key` is waiting.
    pub(crate) fn has(&self, key: &LaunchKey) -> bool {
        self.waiting
            .lock()
            .map(|w| w.iter().any(|s| s.key == *key))
            .unwrap_or(false)
    }

    /// How many spares are waiting.
    pub(crate) fn len(&self) -> usize {
        self.waiting.lock().map(|w| w.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spare(key: &str, born: Instant) -> Spare {
        let (_, go) = std::io::pipe().unwrap();
        let (jobs, _) = mpsc::channel();
        Spare {
            key: LaunchKey::for_test(key),
            go,
            jobs,
            born,
        }
    }

    #[test]
    fn a_spare_is_taken_once_by_its_own_key() {
        let spares = Spares::new(8);
        spares.put(spare("/bin/a", Instant::now()));
        assert!(spares.take(&LaunchKey::for_test("/bin/b")).is_none());
        assert!(spares.has(&LaunchKey::for_test("/bin/a")));
        assert!(spares.take(&LaunchKey::for_test("/bin/a")).is_some());
        assert!(spares.take(&LaunchKey::for_test("/bin/a")).is_none());
    }

    #[test]
    fn the_oldest_spares_go_first_and_stale_ones_are_never_used() {
        const MAX_SPARES: usize = 3;
        let spares = Spares::new(MAX_SPARES);
        for i in 0..=MAX_SPARES {
            spares.put(spare(&format!("/bin/{i}"), Instant::now()));
        }
        assert_eq!(spares.len(), MAX_SPARES);
        assert!(!spares.has(&LaunchKey::for_test("/bin/0")));
        assert!(spares.has(&LaunchKey::for_test(&format!("/bin/{MAX_SPARES}"))));
        let long_ago = Instant::now()
            .checked_sub(MAX_AGE + Duration::from_secs(1))
            .unwrap();
        spares.put(spare("/bin/stale", long_ago));
        assert!(spares.take(&LaunchKey::for_test("/bin/stale")).is_none());
        // Taking dropped it, and made room.
        assert!(!spares.has(&LaunchKey::for_test("/bin/stale")));
    }

    #[test]
    fn starting_a_spare_whose_launch_is_gone_gives_the_job_back() {
        let (reader, go) = std::io::pipe().unwrap();
        let (jobs, waiting) = mpsc::channel();
        drop((reader, waiting));
        let s = Spare {
            key: LaunchKey::for_test("/bin/a"),
            go,
            jobs,
            born: Instant::now(),
        };
        let job = Job::for_test();
        assert!(s.start(&job).is_err());
    }
}
