//! The connection to Redis, shared by every backend made from one (see
//! [`RedisQuota::sharing`](crate::RedisQuota::sharing)), and what is known of its
//! health.
//!
//! Once [`TRIP_AFTER`] operations in a row find Redis down (no connection, or no
//! answer within the operation timeout), the link stays *down* for a hold-off:
//! decisions then go straight to the fail mode instead of each waiting out the
//! timeout against a Redis that is not answering, which under load would hold every
//! rated call for the whole timeout. One slow answer alone does not trip it: a
//! latency spike fails that call only. When the hold-off has passed, one operation
//! tries Redis again (the others keep failing fast until it has an answer or the
//! hold-off passes again); an answer makes the link healthy, a failure starts a
//! new hold-off. Settling and refunding are skipped during a hold-off as well:
//! like a failed one, a skipped settle leaves that call's usage uncounted and a
//! skipped refund leaves its rate slot taken.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use soulbase_errors::SoulError;
use tokio::sync::Mutex;

use crate::unavailable;

/// Failures in a row (with no answer between them) that hold Redis down.
pub(crate) const TRIP_AFTER: u32 = 2;

/// One Redis connection, reconnected on demand, with its hold-off state.
pub(crate) struct Link {
    client: redis::Client,
    /// The live connection (lock-free on the fast path).
    conn: ArcSwapOption<ConnectionManager>,
    /// Serializes (re)connecting.
    connecting: Mutex<()>,
    health: Health,
    /// The origin of [`Health`]'s clock.
    epoch: Instant,
}

impl Link {
    /// A link to `client`'s Redis; connects on first use.
    pub(crate) fn new(client: redis::Client) -> Self {
        Self {
            client,
            conn: ArcSwapOption::empty(),
            connecting: Mutex::new(()),
            health: Health::default(),
            epoch: Instant::now(),
        }
    }

    /// The client this link connects with.
    #[cfg(test)]
    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// `Ok` when an operation may try Redis now; otherwise the error it fails
    /// with, saying how long the hold-off has left (also as its retry hint).
    pub(crate) fn admit(&self, hold_off: Duration) -> Result<(), SoulError> {
        self.health
            .admit(self.now_us(), micros(hold_off))
            .map_err(|left_us| {
                let left_ms = left_us.div_ceil(1_000);
                unavailable(format!(
                    "marked down after failures in a row; next try in {left_ms} ms"
                ))
                .retry_after(Duration::from_millis(left_ms))
            })
    }

    /// Records that Redis answered.
    pub(crate) fn answered(&self) {
        self.health.up();
    }

    /// Records that Redis could not be reached: drops the connection, so the next
    /// try reconnects from scratch, and starts a hold-off once that has happened
    /// [`TRIP_AFTER`] times in a row (so again after each failed try).
    pub(crate) fn failed(&self, hold_off: Duration) {
        self.conn.store(None);
        self.health.failed(self.now_us(), micros(hold_off));
    }

    /// The live connection, connecting first when there is none.
    pub(crate) async fn connection(
        &self,
        op_timeout: Duration,
    ) -> Result<ConnectionManager, SoulError> {
        if let Some(c) = self.conn.load().as_ref() {
            return Ok(ConnectionManager::clone(c));
        }
        let _guard = self.connecting.lock().await;
        if let Some(c) = self.conn.load().as_ref() {
            return Ok(ConnectionManager::clone(c));
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(op_timeout))
            .set_response_timeout(Some(op_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(100));
        let c = ConnectionManager::new_with_config(self.client.clone(), config)
            .await
            .map_err(unavailable)?;
        self.conn.store(Some(std::sync::Arc::new(c.clone())));
        Ok(c)
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Whether Redis is held to be down, on a clock of microseconds passed in by the
/// caller (so the rules can be tested without waiting).
#[derive(Default)]
struct Health {
    /// When the hold-off ends (µs on the link's clock, plus one); 0 while healthy.
    down_until: AtomicU64,
    /// Failures since Redis last answered.
    failures: AtomicU32,
}

impl Health {
    /// `Ok` when an operation may try Redis at `now`; else the µs left. When a
    /// hold-off has passed, one caller is let through, and the window is pushed
    /// on by `hold_off` for the others: they wait for that try's outcome, or for
    /// the window to pass again (a try whose caller gave up).
    fn admit(&self, now: u64, hold_off: u64) -> Result<(), u64> {
        let mut until = self.down_until.load(Ordering::Acquire);
        loop {
            if until == 0 {
                return Ok(());
            }
            let end = until - 1;
            if now < end {
                return Err(end - now);
            }
            let next = now.saturating_add(hold_off).saturating_add(1);
            match self
                .down_until
                .compare_exchange(until, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(seen) => until = seen,
            }
        }
    }

    fn up(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.down_until.load(Ordering::Relaxed) != 0 {
            self.down_until.store(0, Ordering::Release);
        }
    }

    fn failed(&self, now: u64, hold_off: u64) {
        let failures = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        // Also a failed try after a hold-off: the count has not been reset.
        if failures >= TRIP_AFTER {
            self.down_until.store(
                now.saturating_add(hold_off).saturating_add(1),
                Ordering::Release,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Health, TRIP_AFTER};

    /// A link that has failed often enough to be held down at `now`.
    fn tripped(now: u64, hold_off: u64) -> Health {
        let h = Health::default();
        for _ in 0..TRIP_AFTER {
            h.failed(now, hold_off);
        }
        h
    }

    #[test]
    fn a_healthy_link_admits_everyone() {
        let h = Health::default();
        assert_eq!(h.admit(0, 100), Ok(()));
        assert_eq!(h.admit(5, 100), Ok(()));
    }

    #[test]
    fn one_failure_alone_does_not_hold_redis_down() {
        let h = Health::default();
        h.failed(0, 100);
        assert_eq!(h.admit(1, 100), Ok(()));
        // An answer in between: the count starts again.
        h.up();
        h.failed(2, 100);
        assert_eq!(h.admit(3, 100), Ok(()));
        h.failed(4, 100);
        assert_eq!(h.admit(5, 100), Err(99));
    }

    #[test]
    fn failures_in_a_row_hold_every_caller_off_until_the_hold_off_ends() {
        let h = tripped(1_000, 100);
        assert_eq!(h.admit(1_000, 100), Err(100));
        assert_eq!(h.admit(1_099, 100), Err(1));
        // The hold-off has passed: one caller tries, the others keep failing fast.
        assert_eq!(h.admit(1_100, 100), Ok(()));
        assert_eq!(h.admit(1_100, 100), Err(100));
        assert_eq!(h.admit(1_150, 100), Err(50));
        // Its try answered: everyone is admitted again.
        h.up();
        assert_eq!(h.admit(1_150, 100), Ok(()));
        assert_eq!(h.admit(1_151, 100), Ok(()));
    }

    #[test]
    fn a_failed_try_starts_a_new_hold_off() {
        let h = tripped(0, 100);
        assert_eq!(h.admit(100, 100), Ok(()));
        h.failed(130, 100);
        assert_eq!(h.admit(200, 100), Err(30));
        assert_eq!(h.admit(230, 100), Ok(()));
    }
}
