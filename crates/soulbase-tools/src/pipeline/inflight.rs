//! Calls between their Begin and their End, and the signal that cuts them off when
//! the process stops.
//!
//! A call takes an [`OpenCall`] just before its Begin is written and gives it back
//! once its End is recorded (or, when its future is dropped, once the `EndGuard`'s
//! End is). [`InFlight::abandon`] cuts every running call off: each one stops its
//! execution and records a `cancelled` End itself, and no new call writes a Begin
//! after it. [`InFlight::closed`] resolves when no Begin is left without its End, so
//! a server can wait for those Ends before it flushes evidence and exits.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Notify, watch};

/// The open calls of one invoker and its abandon signal.
#[derive(Debug)]
pub(crate) struct InFlight {
    /// Begins taken without their End recorded yet.
    open: Arc<Open>,
    /// Turns true once, when the process abandons its running calls.
    abandon: watch::Sender<bool>,
}

/// The count of open calls, and who waits for it to reach zero. A plain counter:
/// every call changes it twice, and only a server that stops waits on it, so a
/// change wakes nobody unless the count reaches zero.
#[derive(Debug, Default)]
struct Open {
    count: AtomicUsize,
    zero: Notify,
}

impl Default for InFlight {
    fn default() -> Self {
        Self {
            open: Arc::default(),
            abandon: watch::Sender::new(false),
        }
    }
}

impl InFlight {
    /// Registers a call about to write its Begin; `None` once the calls are
    /// abandoned (the call must then be refused without a Begin). The count goes up
    /// before the abandon flag is read, so a call either sees the flag or is counted
    /// by [`closed`](Self::closed).
    pub(crate) fn open(&self) -> Option<OpenCall> {
        self.open.count.fetch_add(1, Ordering::SeqCst);
        let call = OpenCall {
            open: self.open.clone(),
        };
        if *self.abandon.borrow() {
            return None;
        }
        Some(call)
    }

    /// How many calls have a Begin without their End.
    pub(crate) fn count(&self) -> usize {
        self.open.count.load(Ordering::SeqCst)
    }

    /// Cuts every running call off; returns how many calls were open.
    pub(crate) fn abandon(&self) -> usize {
        self.abandon.send_replace(true);
        self.count()
    }

    /// Resolves once calls are abandoned (never before).
    pub(crate) async fn abandoned(&self) {
        let mut rx = self.abandon.subscribe();
        // The sender lives in `self`, so this only ends when the flag is set.
        let _ = rx.wait_for(|a| *a).await;
    }

    /// Resolves when every Begin has its End recorded.
    pub(crate) async fn closed(&self) {
        loop {
            // Listening before looking: a call that ends in between still wakes us.
            let zero = self.open.zero.notified();
            tokio::pin!(zero);
            zero.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            zero.await;
        }
    }
}

/// One call's place among the open calls; gives it back when dropped (after the
/// call's End is recorded).
#[derive(Debug)]
pub(crate) struct OpenCall {
    open: Arc<Open>,
}

impl Drop for OpenCall {
    fn drop(&mut self) {
        if self.open.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.open.zero.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use futures_util::FutureExt;

    use super::*;

    /// Open calls are counted until dropped; after `abandon` no call opens, and
    /// `closed` resolves once the last one is given back.
    #[tokio::test]
    async fn abandon_refuses_new_calls_and_closed_waits_for_the_open_ones() {
        let f = InFlight::default();
        let a = f.open().unwrap();
        let b = f.open().unwrap();
        assert_eq!(f.count(), 2);
        assert_eq!(f.abandon(), 2);
        f.abandoned().await;
        assert!(f.open().is_none());
        assert_eq!(f.count(), 2);
        drop(a);
        assert_eq!(f.count(), 1);
        let closed = f.closed();
        tokio::pin!(closed);
        assert!((&mut closed).now_or_never().is_none());
        drop(b);
        // Woken by the last call's end (already waiting when it ended): bounded,
        // so a lost notification fails the test instead of hanging it.
        tokio::time::timeout(std::time::Duration::from_secs(5), closed)
            .await
            .expect("closed resolves once the last open call ends");
        assert_eq!(f.count(), 0);
    }
}
