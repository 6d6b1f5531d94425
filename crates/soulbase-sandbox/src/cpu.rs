//! CPU time: how the executors measure what a call used (`ExecOutput::cpu_ms`,
//! charged to `quota.budgets[].cpu_ms` and recorded in the End's usage).
//!
//! In-process executors read the calling thread's CPU clock
//! (`CLOCK_THREAD_CPUTIME_ID`): [`ThreadCpu`] around code that runs on one thread,
//! [`Metered`] around a future, summing what each `poll` used on whichever thread it
//! ran. The process executor reads the tool's rusage instead.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// The CPU time the calling thread has used so far (user and system); zero if the
/// clock cannot be read.
///
/// Read through the C library, not rustix: rustix looks the vDSO up itself and
/// faults under valgrind, whose instruction counts are how per-call work is
/// measured on a noisy machine (docs/performance.md). The cost is the same: the
/// thread CPU clock is a system call either way.
#[allow(unsafe_code)]
fn thread_now() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable `timespec` that outlives the call, which
    // only writes it; CLOCK_THREAD_CPUTIME_ID is always supported on Linux, and on
    // failure `t` stays zero.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// Whole milliseconds of `used`, rounded up: a call that used any measured CPU is
/// charged at least 1 ms, so many short calls cannot run free under a `cpu_ms`
/// budget. Zero stays zero.
pub fn cpu_ms(used: Duration) -> u64 {
    let ms = used.as_millis();
    let rounded = if used.subsec_nanos().is_multiple_of(1_000_000) {
        ms
    } else {
        ms + 1
    };
    u64::try_from(rounded).unwrap_or(u64::MAX)
}

/// The CPU time the current thread uses from [`ThreadCpu::start`] to
/// [`ThreadCpu::used`]. Only meaningful when both are read on the same thread.
#[derive(Debug, Clone, Copy)]
pub struct ThreadCpu {
    start: Duration,
}

impl ThreadCpu {
    /// Starts measuring the calling thread.
    pub fn start() -> Self {
        Self {
            start: thread_now(),
        }
    }

    /// The calling thread's CPU time since [`ThreadCpu::start`].
    pub fn used(&self) -> Duration {
        thread_now().saturating_sub(self.start)
    }
}

/// A future that sums the thread CPU time each of its polls used, on whichever
/// thread the poll ran: the CPU its own code spent, not what it waited for nor work
/// it handed to other threads or processes. Two clock reads per poll.
#[derive(Debug)]
pub struct Metered<F> {
    inner: Pin<Box<F>>,
    used: Duration,
}

impl<F: Future> Metered<F> {
    /// Meters `inner`.
    pub fn new(inner: F) -> Self {
        Self {
            inner: Box::pin(inner),
            used: Duration::ZERO,
        }
    }
}

impl<F: Future> Future for Metered<F> {
    /// The inner output and the CPU time its polls used.
    type Output = (F::Output, Duration);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let clock = ThreadCpu::start();
        let polled = self.inner.as_mut().poll(cx);
        let used = self.used.saturating_add(clock.used());
        self.used = used;
        polled.map(|out| (out, used))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_round_up() {
        assert_eq!(cpu_ms(Duration::ZERO), 0);
        assert_eq!(cpu_ms(Duration::from_nanos(1)), 1);
        assert_eq!(cpu_ms(Duration::from_millis(3)), 3);
        assert_eq!(cpu_ms(Duration::from_micros(3_001)), 4);
    }

    /// Burns at least `d` of the calling thread's CPU.
    fn burn(d: Duration) {
        let clock = ThreadCpu::start();
        let mut x = 0u64;
        while clock.used() < d {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
    }

    #[test]
    fn thread_time_counts_this_threads_work_only() {
        let clock = ThreadCpu::start();
        burn(Duration::from_millis(5));
        assert!(clock.used() >= Duration::from_millis(5));
        // Work on another thread is not this thread's.
        let clock = ThreadCpu::start();
        std::thread::spawn(|| burn(Duration::from_millis(50)))
            .join()
            .unwrap();
        assert!(
            clock.used() < Duration::from_millis(50),
            "{:?}",
            clock.used()
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn metered_futures_sum_their_polls() {
        let (out, used) = Metered::new(async {
            burn(Duration::from_millis(4));
            tokio::task::yield_now().await;
            burn(Duration::from_millis(4));
            7
        })
        .await;
        assert_eq!(out, 7);
        assert!(used >= Duration::from_millis(8), "{used:?}");
    }
}
