//! The public `soulbase.auth.v1.Consent` service: issue and revoke consent tokens
//! through the one [`ConsentDesk`], for callers authenticated like ToolInvoker's.

use std::sync::Arc;

use soulbase_edge::{CallObserver, ConsentAsk, ConsentDesk, SubjectResolver, Surface};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_proto::soulbase::auth::v1 as pb;
use soulbase_types::Subject;
use tonic::{Request, Response, Status};

use crate::roles::non_empty;

/// Serves `Consent.Issue` and `Consent.Revoke`.
#[derive(Clone)]
pub struct ConsentGrpcService {
    desk: ConsentDesk,
    auth: Arc<dyn SubjectResolver>,
    observer: Arc<dyn CallObserver>,
}

impl std::fmt::Debug for ConsentGrpcService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsentGrpcService").finish_non_exhaustive()
    }
}

impl ConsentGrpcService {
    /// A service over `desk` for subjects resolved by `auth`; refusals are
    /// counted by `observer` (the stack's).
    pub fn new(
        desk: ConsentDesk,
        auth: Arc<dyn SubjectResolver>,
        observer: Arc<dyn CallObserver>,
    ) -> Self {
        Self {
            desk,
            auth,
            observer,
        }
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> pb::consent_server::ConsentServer<Self> {
        pb::consent_server::ConsentServer::new(self)
    }

    fn refuse(&self, e: &SoulError) -> Status {
        self.observer.refused(Surface::Grpc, e.code());
        e.to_status()
    }

    async fn caller<T>(&self, request: &Request<T>) -> Result<Subject, Status> {
        let headers = request.metadata().clone().into_headers();
        self.auth
            .resolve(&headers)
            .await
            .map_err(|e| self.refuse(&e))
    }
}

fn args(json: &str) -> Result<Option<serde_json::Value>, SoulError> {
    non_empty(json)
        .map(|j| {
            serde_json::from_str(j).map_err(|e| {
                SoulError::new(ErrorCode::SchemaValidationFailed, "args_json is not JSON")
                    .with_field("field", "args_json")
                    .with_source(e)
            })
        })
        .transpose()
}

#[tonic::async_trait]
impl pb::consent_server::Consent for ConsentGrpcService {
    async fn issue(
        &self,
        request: Request<pb::IssueConsentRequest>,
    ) -> Result<Response<pb::IssueConsentResponse>, Status> {
        let approver = self.caller(&request).await?;
        let r = request.get_ref();
        let ask = ConsentAsk {
            tool: r.tool_id.clone(),
            actor: non_empty(&r.actor).map(str::to_owned),
            args: args(&r.args_json).map_err(|e| self.refuse(&e))?,
            ttl_ms: (r.ttl_ms > 0).then_some(r.ttl_ms),
        };
        let issued = self
            .desk
            .issue(&approver, ask)
            .await
            .map_err(|e| self.refuse(&e))?;
        let g = &issued.grant;
        Ok(Response::new(pb::IssueConsentResponse {
            token: issued.token.clone(),
            id: g.id.clone().unwrap_or_default(),
            tenant: g.tenant.to_string(),
            actor: g.actor.to_string(),
            tool_id: g.tool.as_ref().map(ToString::to_string).unwrap_or_default(),
            args_digest: g.args_digest.clone().unwrap_or_default(),
            issued_at_ms: g.issued_at.map_or(0, |t| t.0),
            expires_at_ms: g.expires_at.0,
        }))
    }

    async fn revoke(
        &self,
        request: Request<pb::RevokeConsentRequest>,
    ) -> Result<Response<pb::RevokeConsentResponse>, Status> {
        let approver = self.caller(&request).await?;
        self.desk
            .revoke(&approver, &request.get_ref().id)
            .await
            .map_err(|e| self.refuse(&e))?;
        Ok(Response::new(pb::RevokeConsentResponse {}))
    }
}
