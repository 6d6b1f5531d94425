//! `soulbase.tools.v1.ToolRegistry` over a [`Registry`].

use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use soulbase_auth::{Action, Authorizer};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_tools::registry::admin::{self, RegistryAdmin, StateChange};
use soulbase_tools::registry::{TenantOverride, access};
use soulbase_tools::{Registry, ResolvedTool, ToolOwner};
use soulbase_types::{Subject, ToolId};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::convert;
use crate::proto;
use crate::proto::tool_registry_server::ToolRegistry;
use soulbase_edge::{CallMeta, Stack, SubjectResolver, Surface};

/// Default and maximum page sizes of `ListTools`.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// Serves the tool registry. Reads are scoped to the caller's tenant (its own tools
/// and the global tools it may see); writes are authorized with the registry actions.
#[derive(Clone)]
pub struct RegistryService {
    registry: Registry,
    admin: RegistryAdmin,
    stack: Stack,
    authorizer: Arc<dyn Authorizer>,
    auth: Arc<dyn SubjectResolver>,
    shutdown: Option<watch::Receiver<bool>>,
}

impl std::fmt::Debug for RegistryService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryService").finish_non_exhaustive()
    }
}

impl RegistryService {
    /// A service over `admin`'s registry (writes go through `admin`: persisted
    /// first), listing through `stack` (the caller's governed list), authorizing
    /// writes with `authorizer` and authenticating callers with `auth`.
    pub fn new(
        admin: RegistryAdmin,
        stack: Stack,
        authorizer: Arc<dyn Authorizer>,
        auth: Arc<dyn SubjectResolver>,
    ) -> Self {
        Self {
            registry: admin.registry().clone(),
            admin,
            stack,
            authorizer,
            auth,
            shutdown: None,
        }
    }

    /// Ends every `WatchRegistry` stream when `shutdown` becomes `true`, so that
    /// graceful shutdown is not held up by watchers.
    pub fn with_shutdown(mut self, shutdown: watch::Receiver<bool>) -> Self {
        self.shutdown = Some(shutdown);
        self
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> proto::tool_registry_server::ToolRegistryServer<Self> {
        proto::tool_registry_server::ToolRegistryServer::new(self)
    }

    async fn subject<T>(&self, req: &Request<T>) -> Result<Subject, Status> {
        let headers = req.metadata().clone().into_headers();
        self.auth.resolve(&headers).await.map_err(|e| e.to_status())
    }

    async fn authorize(
        &self,
        subject: &Subject,
        owner: &ToolOwner,
        tool: &ToolId,
        action: Action,
    ) -> Result<(), Status> {
        admin::authorize(self.authorizer.as_ref(), subject, owner, tool, action)
            .await
            .map_err(|e| e.to_status())
    }

    /// The tool as the subject now sees it, falling back to the owner's copy.
    fn current(
        &self,
        subject: &Subject,
        owner: &ToolOwner,
        id: &ToolId,
    ) -> Result<ResolvedTool, Status> {
        if let Ok(t) = self.registry.get(&subject.tenant, id)
            && &t.owner == owner
        {
            return Ok(t);
        }
        self.registry
            .list_owned(owner, &Default::default())
            .into_iter()
            .find(|t| t.id() == id)
            .ok_or_else(|| {
                soulbase_errors::SoulError::of(soulbase_errors::ErrorCode::ToolNotFound).to_status()
            })
    }
}

fn status(e: SoulError) -> Status {
    e.to_status()
}

type EventStream = Pin<Box<dyn Stream<Item = Result<proto::RegistryEvent, Status>> + Send>>;

#[tonic::async_trait]
impl ToolRegistry for RegistryService {
    async fn register_tool(
        &self,
        request: Request<proto::RegisterToolRequest>,
    ) -> Result<Response<proto::RegisterToolResponse>, Status> {
        let subject = self.subject(&request).await?;
        let req = request.into_inner();
        let owner = convert::write_owner(req.owner(), &subject);
        let manifest = convert::manifest("manifest", &req.manifest).map_err(status)?;
        let id = manifest.id.clone();
        self.authorize(&subject, &owner, &id, Action::Register)
            .await?;
        // Both permissions are checked before anything changes.
        if req.enable {
            self.authorize(&subject, &owner, &id, Action::Enable)
                .await?;
        }
        self.admin
            .register(&subject, &owner, manifest, req.enable)
            .await
            .map_err(status)?;
        let tool = self.current(&subject, &owner, &id)?;
        Ok(Response::new(proto::RegisterToolResponse {
            tool: Some(convert::tool_to_proto(&tool, false)),
        }))
    }

    async fn update_tool(
        &self,
        request: Request<proto::UpdateToolRequest>,
    ) -> Result<Response<proto::UpdateToolResponse>, Status> {
        let subject = self.subject(&request).await?;
        let req = request.into_inner();
        let owner = convert::write_owner(req.owner(), &subject);
        let manifest = convert::manifest("manifest", &req.manifest).map_err(status)?;
        let id = manifest.id.clone();
        self.authorize(&subject, &owner, &id, Action::Update)
            .await?;
        self.admin
            .update(&subject, &owner, manifest)
            .await
            .map_err(status)?;
        let tool = self.current(&subject, &owner, &id)?;
        Ok(Response::new(proto::UpdateToolResponse {
            tool: Some(convert::tool_to_proto(&tool, false)),
        }))
    }

    async fn set_tool_state(
        &self,
        request: Request<proto::SetToolStateRequest>,
    ) -> Result<Response<proto::SetToolStateResponse>, Status> {
        let subject = self.subject(&request).await?;
        let req = request.into_inner();
        let owner = convert::write_owner(req.owner(), &subject);
        let id = convert::tool_id("tool_id", &req.tool_id).map_err(status)?;
        let change = match req.change() {
            proto::StateChange::Enable => StateChange::Enable,
            proto::StateChange::Pause => StateChange::Pause,
            proto::StateChange::Deprecate => StateChange::Deprecate,
            proto::StateChange::Unspecified => {
                return Err(status(convert::invalid(
                    "change",
                    "change must be ENABLE, PAUSE or DEPRECATE",
                )));
            }
        };
        admin::change_state(
            self.authorizer.as_ref(),
            &self.admin,
            &subject,
            &owner,
            &id,
            change,
        )
        .await
        .map_err(status)?;
        let tool = self.current(&subject, &owner, &id)?;
        Ok(Response::new(proto::SetToolStateResponse {
            tool: Some(convert::tool_to_proto(&tool, false)),
        }))
    }

    async fn unregister_tool(
        &self,
        request: Request<proto::UnregisterToolRequest>,
    ) -> Result<Response<proto::UnregisterToolResponse>, Status> {
        let subject = self.subject(&request).await?;
        let req = request.into_inner();
        let owner = convert::write_owner(req.owner(), &subject);
        let id = convert::tool_id("tool_id", &req.tool_id).map_err(status)?;
        self.authorize(&subject, &owner, &id, Action::Unregister)
            .await?;
        self.admin
            .unregister(&subject, &owner, &id)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::UnregisterToolResponse {}))
    }

    async fn get_tool(
        &self,
        request: Request<proto::GetToolRequest>,
    ) -> Result<Response<proto::GetToolResponse>, Status> {
        let subject = self.subject(&request).await?;
        let req = request.into_inner();
        let id = convert::tool_id("tool_id", &req.tool_id).map_err(status)?;
        let tool = self.registry.get(&subject.tenant, &id).map_err(status)?;
        // Governed like the lists: a tool the caller may not `list` is not there.
        let invoker = self.stack.invoker();
        if !invoker
            .permits(&subject, &id, &tool.owner, Action::List)
            .await
        {
            return Err(status(SoulError::of(ErrorCode::ToolNotFound)));
        }
        Ok(Response::new(proto::GetToolResponse {
            tool: Some(convert::tool_to_proto(&tool, req.include_manifest)),
        }))
    }

    async fn list_tools(
        &self,
        request: Request<proto::ListToolsRequest>,
    ) -> Result<Response<proto::ListToolsResponse>, Status> {
        let subject = self.subject(&request).await?;
        let binding = CallMeta::from_headers(&request.metadata().clone().into_headers()).binding;
        let req = request.into_inner();
        let filter = convert::filter(&req).map_err(status)?;
        let page = match req.page_size {
            0 => DEFAULT_PAGE,
            n => (n as usize).min(MAX_PAGE),
        };
        let tools = self
            .stack
            .list(Surface::Grpc, &subject, &binding, &filter)
            .await
            .map_err(status)?;
        let start = if req.page_token.is_empty() {
            0
        } else {
            tools.partition_point(|t| t.id().as_str() <= req.page_token.as_str())
        };
        let rest = tools.get(start..).unwrap_or_default();
        let taken = &rest[..rest.len().min(page)];
        let next_page_token = if rest.len() > page {
            taken.last().map(|t| t.id().to_string()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(proto::ListToolsResponse {
            tools: taken
                .iter()
                .map(|t| convert::tool_to_proto(t, req.include_manifest))
                .collect(),
            next_page_token,
        }))
    }

    type WatchRegistryStream = EventStream;

    async fn watch_registry(
        &self,
        request: Request<proto::WatchRegistryRequest>,
    ) -> Result<Response<Self::WatchRegistryStream>, Status> {
        let subject = self.subject(&request).await?;
        let tenant = subject.tenant;
        let registry = self.registry.clone();
        // The registry filters by tenant (own tools, visible global tools, its
        // overrides); a lagging watcher is told to list again.
        let events =
            futures_util::stream::unfold(self.registry.subscribe_for(&tenant), move |mut rx| {
                let registry = registry.clone();
                async move {
                    let item = match rx.recv().await {
                        Ok(e) => convert::event_to_proto(&e, registry.snapshot_version()),
                        Err(RecvError::Lagged(_)) => proto::RegistryEvent {
                            kind: proto::RegistryEventKind::Resync as i32,
                            ..Default::default()
                        },
                        Err(RecvError::Closed) => return None,
                    };
                    Some((Ok(item), rx))
                }
            });
        let stream: EventStream = match self.shutdown.clone() {
            Some(mut rx) => Box::pin(events.take_until(async move {
                let _ = rx.wait_for(|stop| *stop).await;
            })),
            None => Box::pin(events),
        };
        Ok(Response::new(stream))
    }

    async fn get_tenant_access(
        &self,
        request: Request<proto::GetTenantAccessRequest>,
    ) -> Result<Response<proto::TenantAccessResponse>, Status> {
        let subject = self.subject(&request).await?;
        access_response(access::access_of(&self.registry.view(), &subject.tenant))
    }

    async fn set_allow_list(
        &self,
        request: Request<proto::SetAllowListRequest>,
    ) -> Result<Response<proto::TenantAccessResponse>, Status> {
        let subject = self.subject(&request).await?;
        let req = request.into_inner();
        let allow = if req.every_tool {
            if !req.tools.is_empty() {
                return Err(status(convert::invalid(
                    "tools",
                    "tools must be empty when every_tool is set",
                )));
            }
            None
        } else {
            let mut ids = std::collections::BTreeSet::new();
            for (i, t) in req.tools.iter().enumerate() {
                ids.insert(convert::tool_id(&format!("tools[{i}]"), t).map_err(status)?);
            }
            Some(ids)
        };
        let view = access::set_allow_list(self.authorizer.as_ref(), &self.admin, &subject, allow)
            .await
            .map_err(status)?;
        access_response(view)
    }

    async fn set_tenant_override(
        &self,
        request: Request<proto::SetTenantOverrideRequest>,
    ) -> Result<Response<proto::TenantAccessResponse>, Status> {
        let subject = self.subject(&request).await?;
        let req = request.into_inner();
        let id = convert::tool_id("tool_id", &req.tool_id).map_err(status)?;
        let value = match req.state() {
            proto::TenantToolState::Unspecified => None,
            proto::TenantToolState::Enabled => Some(TenantOverride::Enabled),
            proto::TenantToolState::Paused => Some(TenantOverride::Paused),
        };
        let view =
            access::set_override(self.authorizer.as_ref(), &self.admin, &subject, &id, value)
                .await
                .map_err(status)?;
        access_response(view)
    }
}

/// A tenant's view as the RPC answers it: the JSON of `GET /api/access`.
fn access_response(
    view: access::AccessView,
) -> Result<Response<proto::TenantAccessResponse>, Status> {
    let access_json = serde_json::to_string(&view).map_err(|e| status(SoulError::internal(e)))?;
    Ok(Response::new(proto::TenantAccessResponse { access_json }))
}
