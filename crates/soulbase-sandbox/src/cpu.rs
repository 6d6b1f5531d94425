//! CPU time: how the executors measure what a call used (`ExecOutput::cpu_ms`,
//! charged to `quota.budgets[].cpu_ms` and recorded in the End's usage).
//!
//! In-process executors read the calling thread's CPU clock
//! (`CLOCK_THREAD_CPUTIME_ID`): [`ThreadCpu`] around code that runs on one thread,
//! [`Metered`] around a future, summing what each `poll` used on whichever thread it
//! ran (by the wall clock while a call's polls stay under 1 ms, where it cannot
//! change the charge: see [`Metered`]).
//! The process executor reads the tool's rusage instead.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

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

/// How a builtin handler's polls are timed: by the wall clock until one of its
/// calls has spent [`WALL_CLOCK_LIMIT`] in polls, by the thread CPU clock for its
/// next [`CPU_CLOCK_CALLS`] calls after that (the count restarted by each of them
/// that reaches the limit too), then by the wall clock again (see [`Metered`]).
/// One per handler.
#[derive(Debug, Default)]
pub struct PollClock {
    /// Calls still to start on the thread CPU clock (zero: the wall clock).
    cpu_calls: AtomicU32,
}

impl PollClock {
    /// A handler's clock: the wall clock until a call reaches the limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the handler's next call starts on the thread CPU clock.
    pub fn is_cpu(&self) -> bool {
        self.cpu_calls.load(Ordering::Relaxed) > 0
    }

    /// Whether a call starting now is timed by the CPU clock; if so, one fewer
    /// call is left to start on it.
    fn start_call(&self) -> bool {
        self.cpu_calls
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    /// A call reached the limit: the next [`CPU_CLOCK_CALLS`] calls start on the
    /// CPU clock.
    fn reached_limit(&self) {
        self.cpu_calls.store(CPU_CLOCK_CALLS, Ordering::Relaxed);
    }
}

/// How many of a handler's calls start on the thread CPU clock after one of its
/// calls reached [`WALL_CLOCK_LIMIT`] (see [`Metered`]).
pub const CPU_CLOCK_CALLS: u32 = 64;

/// How much poll time of one call the wall clock times (see [`Metered`]).
pub const WALL_CLOCK_LIMIT: Duration = Duration::from_millis(1);

/// A future that sums the time each of its polls took, on whichever thread the
/// poll ran: its own code's CPU, not what it waited for (between polls) nor work it
/// handed to other threads or processes.
///
/// A poll runs on one thread from start to end, so its wall-clock time bounds its
/// CPU time from above. The thread CPU clock is a system call (two per poll, ~1 µs
/// each on the development VM, and the kernel's run-queue lock), the wall clock a
/// read of the vDSO: polls are timed by the wall clock until the call's polls have
/// taken [`WALL_CLOCK_LIMIT`], and by the CPU clock after that. Once a call of the
/// handler has reached the limit, its [`PollClock`] starts the handler's next
/// [`CPU_CLOCK_CALLS`] calls on the CPU clock, and each of those that reaches the
/// limit too (on the CPU clock: it used a millisecond of CPU) restarts that count
/// — a handler whose calls use that much CPU stays on it. A light handler's call
/// that reached the limit only because it was preempted (on a busy server a call
/// of the builtin echo is, now and then) puts the handler back on the wall clock
/// after that many calls, instead of two system calls a poll for good.
///
/// Charged in whole milliseconds rounded up ([`cpu_ms`]), a call whose polls take
/// under 1 ms in all is charged 1 ms either way; what a call reaching 1 ms on the
/// wall clock may be charged beyond its CPU is the time its polls up to and
/// including the one that reached the limit were preempted or blocked (not bounded
/// by the limit: a poll blocked 100 ms counts 100 ms) — on a handler's call that
/// reaches the limit while the handler is on the wall clock, at most one of any
/// [`CPU_CLOCK_CALLS`] + 1 calls made one after another (and on its calls already
/// running then, which started on the wall clock).
#[derive(Debug)]
pub struct Metered<'c, F> {
    inner: F,
    used: Duration,
    clock: &'c PollClock,
    cpu: bool,
}

impl<'c, F: Future + Unpin> Metered<'c, F> {
    /// Meters `inner` (already pinned: a handler's future is boxed), timed as
    /// `clock` says.
    pub fn new(inner: F, clock: &'c PollClock) -> Self {
        Self {
            inner,
            used: Duration::ZERO,
            clock,
            cpu: clock.start_call(),
        }
    }
}

impl<F: Future + Unpin> Future for Metered<'_, F> {
    /// The inner output and the time its polls took.
    type Output = (F::Output, Duration);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let before = this.used;
        let polled = if this.cpu {
            let clock = ThreadCpu::start();
            let polled = Pin::new(&mut this.inner).poll(cx);
            this.used = this.used.saturating_add(clock.used());
            polled
        } else {
            let start = Instant::now();
            let polled = Pin::new(&mut this.inner).poll(cx);
            this.used = this.used.saturating_add(start.elapsed());
            this.cpu = this.used >= WALL_CLOCK_LIMIT;
            polled
        };
        if before < WALL_CLOCK_LIMIT && this.used >= WALL_CLOCK_LIMIT {
            this.clock.reached_limit();
        }
        let used = this.used;
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

    /// Polls `f` to the end under `clock`, as the builtin executor does.
    async fn metered<T>(
        f: impl Future<Output = T> + Send + 'static,
        clock: &PollClock,
    ) -> (T, Duration) {
        let boxed: Pin<Box<dyn Future<Output = T> + Send>> = Box::pin(f);
        Metered::new(boxed, clock).await
    }

    #[tokio::test(flavor = "current_thread")]
    async fn metered_futures_sum_their_polls() {
        let clock = PollClock::new();
        let (out, used) = metered(
            async {
                burn(Duration::from_millis(4));
                tokio::task::yield_now().await;
                burn(Duration::from_millis(4));
                7
            },
            &clock,
        )
        .await;
        assert_eq!(out, 7);
        assert!(used >= Duration::from_millis(8), "{used:?}");
        assert!(clock.is_cpu());
    }

    /// A handler's calls are timed by the wall clock until one reaches the limit
    /// (a poll blocked counts then, as it would not on the CPU clock), by the CPU
    /// clock from then on (blocking does not count).
    #[tokio::test(flavor = "current_thread")]
    async fn calls_use_the_wall_clock_until_one_reaches_the_limit() {
        let clock = PollClock::new();
        let ((), used) = metered(async { tokio::task::yield_now().await }, &clock).await;
        // Preempted for a millisecond, a short call reaches the limit too.
        assert_eq!(clock.is_cpu(), used >= WALL_CLOCK_LIMIT, "{used:?}");
        assert!(cpu_ms(used) >= 1);
        let clock = PollClock::new();
        // Three polls, each blocked 2 ms: the first on the wall clock (it reaches
        // the limit), the others on the CPU clock.
        let block = || async {
            for _ in 0..3 {
                std::thread::sleep(Duration::from_millis(2));
                tokio::task::yield_now().await;
            }
        };
        let started = Instant::now();
        let ((), used) = metered(block(), &clock).await;
        let wall = started.elapsed();
        assert!(clock.is_cpu());
        assert!(used >= Duration::from_millis(2), "{used:?}");
        assert!(
            used + Duration::from_millis(4) <= wall,
            "{used:?} of {wall:?}"
        );
        // The next call by the CPU clock from its first poll.
        let started = Instant::now();
        let ((), used) = metered(block(), &clock).await;
        let wall = started.elapsed();
        assert!(
            used + Duration::from_millis(6) <= wall,
            "{used:?} of {wall:?}"
        );
    }

    /// After a call reaches the limit the handler's next `CPU_CLOCK_CALLS` calls
    /// start on the CPU clock; then the wall clock again, unless one of them used
    /// a millisecond of CPU, which restarts the count.
    #[tokio::test(flavor = "current_thread")]
    async fn the_cpu_clock_times_a_window_of_calls_renewed_by_heavy_ones() {
        let clock = PollClock::new();
        // One poll blocked 2 ms: how long it counts tells which clock timed it.
        let blocked = || async {
            std::thread::sleep(Duration::from_millis(2));
        };
        let ((), used) = metered(blocked(), &clock).await;
        assert!(used >= Duration::from_millis(2), "{used:?}");
        assert!(clock.is_cpu());
        for _ in 1..CPU_CLOCK_CALLS {
            metered(async {}, &clock).await;
        }
        assert!(clock.is_cpu());
        // The window's last call: blocked, on the CPU clock it counts ~nothing.
        let ((), used) = metered(blocked(), &clock).await;
        assert!(used < Duration::from_millis(1), "{used:?}");
        assert!(!clock.is_cpu());
        // Back on the wall clock, blocking counts again (and starts a window).
        let ((), used) = metered(blocked(), &clock).await;
        assert!(used >= Duration::from_millis(2), "{used:?}");
        assert!(clock.is_cpu());
        // A call using a millisecond of CPU renews the window: a heavy handler
        // stays on the CPU clock.
        for _ in 0..CPU_CLOCK_CALLS + 8 {
            let ((), used) = metered(async { burn(WALL_CLOCK_LIMIT) }, &clock).await;
            assert!(used >= WALL_CLOCK_LIMIT, "{used:?}");
            assert!(clock.is_cpu());
        }
    }
}
