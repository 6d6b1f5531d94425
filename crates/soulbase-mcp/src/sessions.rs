//! Bounding the live MCP sessions of the streamable HTTP transport.
//!
//! Every `initialize` creates a session (rmcp's [`LocalSessionManager`]: a worker
//! task, channels, the server's state). [`McpSessions`] keeps the count bounded in
//! total and per tenant, and closes sessions that had no request in progress for
//! the idle time. The HTTP front (soulbased's `/mcp` gate) asks it before passing
//! on an `initialize` ([`McpSessions::reserve`]), registers the session the answer
//! names ([`Reservation::commit`]), and marks every request on a session in
//! progress until its response is done ([`McpSessions::use_session`]).
//!
//! A refusal is `QUOTA.RATE_LIMITED` naming the limit (`server.mcp_max_sessions`
//! or `server.mcp_max_sessions_per_tenant`) with a retry hint: when the soonest
//! idle session would expire.

use foldhash::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rmcp::transport::streamable_http_server::session::SessionManager as _;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::TenantId;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::transport::LocalSessionManager;

/// The session limits (`server.mcp_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// Most live sessions in total.
    pub max_total: usize,
    /// Most live sessions of one tenant.
    pub max_per_tenant: usize,
    /// A session with no request in progress for this long is closed.
    pub idle: Duration,
}

/// The live sessions, their tenants and their use. Cheap to share (`Arc`).
pub struct McpSessions {
    limits: SessionLimits,
    manager: Arc<LocalSessionManager>,
    state: Mutex<State>,
}

impl std::fmt::Debug for McpSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpSessions")
            .field("limits", &self.limits)
            .field("live", &self.len())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    /// By session id. Looked up on every request, so hashed with foldhash: the
    /// ids are minted here, a client can only name one.
    sessions: HashMap<String, Entry>,
    /// Sessions and reservations per tenant.
    per_tenant: HashMap<TenantId, usize>,
    /// Sessions and reservations.
    total: usize,
}

struct Entry {
    tenant: TenantId,
    uses: usize,
    idle_since: Instant,
}

impl State {
    fn release(&mut self, tenant: &TenantId) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.per_tenant.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_tenant.remove(tenant);
            }
        }
    }

    /// Removes the sessions idle for `idle` at `now`; returns their ids.
    fn take_expired(&mut self, now: Instant, idle: Duration) -> Vec<String> {
        let expired: Vec<String> = self
            .sessions
            .iter()
            .filter(|(_, e)| e.uses == 0 && e.idle_since + idle <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            if let Some(e) = self.sessions.remove(id) {
                self.release(&e.tenant);
            }
        }
        expired
    }

    /// How long until the soonest idle session (of `tenant`, when given) expires.
    fn soonest_expiry(&self, now: Instant, idle: Duration, tenant: Option<&TenantId>) -> Duration {
        self.sessions
            .values()
            .filter(|e| e.uses == 0 && tenant.is_none_or(|t| &e.tenant == t))
            .map(|e| (e.idle_since + idle).saturating_duration_since(now))
            .min()
            .unwrap_or(idle)
    }
}

impl McpSessions {
    /// Bounds the sessions of `manager` (the one the MCP service uses) by `limits`.
    pub fn new(manager: Arc<LocalSessionManager>, limits: SessionLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            manager,
            state: Mutex::new(State::default()),
        })
    }

    /// The limits in force.
    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Live sessions (with reservations for `initialize`s in progress).
    pub fn len(&self) -> usize {
        self.lock().total
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live sessions of `tenant`.
    pub fn tenant_len(&self, tenant: &TenantId) -> usize {
        self.lock().per_tenant.get(tenant).copied().unwrap_or(0)
    }

    /// Room for one more session of `tenant` (an `initialize` about to be served),
    /// or `QUOTA.RATE_LIMITED` naming the limit reached. Sessions found idle past
    /// the idle time are closed first.
    pub fn reserve(self: &Arc<Self>, tenant: &TenantId) -> Result<Reservation, SoulError> {
        let now = Instant::now();
        let mut st = self.lock();
        let full = |st: &State| {
            st.total >= self.limits.max_total
                || st.per_tenant.get(tenant).copied().unwrap_or(0) >= self.limits.max_per_tenant
        };
        if full(&st) {
            let expired = st.take_expired(now, self.limits.idle);
            self.close_later(expired);
        }
        let tenant_full =
            st.per_tenant.get(tenant).copied().unwrap_or(0) >= self.limits.max_per_tenant;
        if tenant_full || st.total >= self.limits.max_total {
            let (field, max, of) = if tenant_full {
                (
                    "server.mcp_max_sessions_per_tenant",
                    self.limits.max_per_tenant,
                    Some(tenant),
                )
            } else {
                ("server.mcp_max_sessions", self.limits.max_total, None)
            };
            let retry = st.soonest_expiry(now, self.limits.idle, of);
            let message = if tenant_full {
                "too many live MCP sessions for this tenant: close one (HTTP DELETE) or retry once an idle one has expired"
            } else {
                "too many live MCP sessions on this server: retry once an idle one has expired"
            };
            return Err(SoulError::new(ErrorCode::QuotaRateLimited, message)
                .with_field("limit", field)
                .with_field("max", max.to_string())
                .retry_after(retry.max(Duration::from_millis(1))));
        }
        st.total += 1;
        *st.per_tenant.entry(tenant.clone()).or_insert(0) += 1;
        Ok(Reservation {
            sessions: self.clone(),
            tenant: Some(tenant.clone()),
        })
    }

    /// Marks a request on session `id` in progress until the returned use is
    /// dropped. `Ok(None)`: not a session known here (the transport answers it);
    /// `AUTH.FORBIDDEN`: another tenant's session.
    pub fn use_session(
        self: &Arc<Self>,
        id: &str,
        tenant: &TenantId,
    ) -> Result<Option<SessionUse>, SoulError> {
        let mut st = self.lock();
        let Some(entry) = st.sessions.get_mut(id) else {
            return Ok(None);
        };
        if &entry.tenant != tenant {
            return Err(SoulError::new(
                ErrorCode::AuthForbidden,
                "this MCP session belongs to another tenant",
            )
            .with_field("field", "mcp-session-id"));
        }
        entry.uses += 1;
        Ok(Some(SessionUse {
            sessions: self.clone(),
            id: id.to_owned(),
        }))
    }

    /// Registers session `id` of `tenant`, created without a reservation (a body
    /// [`is_initialize`] did not recognize), or closes it when there is no room.
    pub async fn adopt(
        self: &Arc<Self>,
        id: &str,
        tenant: &TenantId,
    ) -> Result<SessionUse, SoulError> {
        match self.reserve(tenant) {
            Ok(r) => Ok(r.commit(id)),
            Err(e) => {
                self.close(id.to_owned()).await;
                Err(e)
            }
        }
    }

    /// Forgets session `id` (closed by its client with HTTP DELETE).
    pub fn forget(&self, id: &str) {
        let mut st = self.lock();
        if let Some(e) = st.sessions.remove(id) {
            st.release(&e.tenant);
        }
    }

    /// Closes the sessions idle past the idle time; returns how many.
    pub async fn sweep(&self) -> usize {
        let expired = self.lock().take_expired(Instant::now(), self.limits.idle);
        let n = expired.len();
        for id in expired {
            self.close(id).await;
        }
        n
    }

    /// Sweeps every quarter of the idle time (10 ms – 30 s) until `stop`.
    pub fn spawn_sweeper(self: &Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let sessions = self.clone();
        let every =
            (self.limits.idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(30));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let n = sessions.sweep().await;
                if n > 0 {
                    tracing::debug!(closed = n, "idle MCP sessions closed");
                }
            }
        })
    }

    async fn close(&self, id: String) {
        let id: rmcp::transport::streamable_http_server::session::SessionId = id.into();
        if let Err(e) = self.manager.close_session(&id).await {
            tracing::debug!(error = %e, "closing an idle MCP session failed");
        }
    }

    fn close_later(self: &Arc<Self>, ids: Vec<String>) {
        if ids.is_empty() {
            return;
        }
        let sessions = self.clone();
        tokio::spawn(async move {
            for id in ids {
                sessions.close(id).await;
            }
        });
    }
}

/// Room for one session, held while an `initialize` is served; released on drop
/// unless [committed](Reservation::commit).
#[derive(Debug)]
pub struct Reservation {
    sessions: Arc<McpSessions>,
    tenant: Option<TenantId>,
}

impl Reservation {
    /// Registers session `id` (named by the `initialize` answer) in this room; it
    /// is in use until the returned use is dropped (the answer is sent).
    pub fn commit(mut self, id: &str) -> SessionUse {
        let sessions = self.sessions.clone();
        if let Some(tenant) = self.tenant.take() {
            let mut st = sessions.lock();
            let old = st.sessions.insert(
                id.to_owned(),
                Entry {
                    tenant,
                    uses: 1,
                    idle_since: Instant::now(),
                },
            );
            // A session id is never reused; if it were, its room is released.
            if let Some(old) = old {
                st.release(&old.tenant);
            }
        }
        SessionUse {
            sessions,
            id: id.to_owned(),
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(t) = self.tenant.take() {
            self.sessions.lock().release(&t);
        }
    }
}

/// A request in progress on a session; the session's idle time starts when the
/// last one is dropped.
#[derive(Debug)]
pub struct SessionUse {
    sessions: Arc<McpSessions>,
    id: String,
}

impl Drop for SessionUse {
    fn drop(&mut self) {
        let mut st = self.sessions.lock();
        if let Some(e) = st.sessions.get_mut(&self.id) {
            e.uses = e.uses.saturating_sub(1);
            if e.uses == 0 {
                e.idle_since = Instant::now();
            }
        }
    }
}

/// Whether a JSON-RPC body is an `initialize` request (which creates a session).
pub fn is_initialize(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Peek<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_slice::<Peek<'_>>(body)
        .is_ok_and(|p| p.method.as_deref() == Some("initialize"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn table(total: usize, per: usize, idle_ms: u64) -> Arc<McpSessions> {
        McpSessions::new(
            Arc::new(LocalSessionManager::default()),
            SessionLimits {
                max_total: total,
                max_per_tenant: per,
                idle: Duration::from_millis(idle_ms),
            },
        )
    }

    fn t(name: &str) -> TenantId {
        TenantId::new(name).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn caps_per_tenant_and_in_total_and_idle_sessions_expire() {
        let s = table(3, 2, 1_000);
        let a1 = s.reserve(&t("a")).unwrap().commit("a1");
        let a2 = s.reserve(&t("a")).unwrap().commit("a2");
        let e = s.reserve(&t("a")).unwrap_err();
        assert_eq!(e.code(), ErrorCode::QuotaRateLimited);
        assert_eq!(e.field("limit"), Some("server.mcp_max_sessions_per_tenant"));
        // In use: the hint is the whole idle time.
        assert_eq!(e.retry_after_ms(), Some(1_000));
        let b1 = s.reserve(&t("b")).unwrap();
        let e = s.reserve(&t("c")).unwrap_err();
        assert_eq!(e.field("limit"), Some("server.mcp_max_sessions"));
        // An initialize that created no session gives its room back.
        drop(b1);
        assert_eq!(s.len(), 2);
        let _c1 = s.reserve(&t("c")).unwrap().commit("c1");
        // Another tenant's session is refused.
        assert_eq!(
            s.use_session("a1", &t("c")).unwrap_err().code(),
            ErrorCode::AuthForbidden
        );
        assert!(s.use_session("nope", &t("a")).unwrap().is_none());
        // a1 stays in use; a2 goes idle and expires after the idle time.
        let busy = s.use_session("a1", &t("a")).unwrap().unwrap();
        drop(a1);
        drop(a2);
        tokio::time::advance(Duration::from_millis(400)).await;
        let e = s.reserve(&t("a")).unwrap_err();
        assert_eq!(e.retry_after_ms(), Some(600));
        tokio::time::advance(Duration::from_millis(600)).await;
        let _a3 = s.reserve(&t("a")).unwrap().commit("a3");
        assert!(
            s.use_session("a2", &t("a")).unwrap().is_none(),
            "a2 expired"
        );
        assert!(
            s.use_session("a1", &t("a")).unwrap().is_some(),
            "a1 was busy"
        );
        drop(busy);
        // DELETE forgets.
        s.forget("c1");
        assert_eq!(s.tenant_len(&t("c")), 0);
        assert_eq!(s.tenant_len(&t("a")), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweeper_closes_idle_sessions() {
        let s = table(10, 10, 100);
        drop(s.reserve(&t("a")).unwrap().commit("a1"));
        let stop = CancellationToken::new();
        let task = s.spawn_sweeper(stop.clone());
        tokio::time::advance(Duration::from_millis(99)).await;
        assert_eq!(s.len(), 1);
        // The sweeper ticks every 25 ms: expired by 125 ms at the latest.
        for _ in 0..10 {
            tokio::time::advance(Duration::from_millis(10)).await;
            tokio::task::yield_now().await;
        }
        assert_eq!(s.len(), 0);
        stop.cancel();
        task.await.unwrap();
    }

    #[test]
    fn initialize_is_recognized() {
        assert!(is_initialize(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#
        ));
        assert!(!is_initialize(
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#
        ));
        assert!(!is_initialize(b"[1,2]"));
        assert!(!is_initialize(b"not json"));
        assert!(is_initialize(br#"{"method":"initiali\u007ae"}"#));
    }
}
