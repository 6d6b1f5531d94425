//! A running tool's requests to the caller's client, as MCP server-to-client
//! requests on the `tools/call`'s session: elicitation (`elicitation/create`,
//! form mode) and sampling (`sampling/createMessage`).
//!
//! `tools/call` gives the governed call a [`ClientSink`] over the request's peer
//! when the client declared `elicitation` or `sampling` at `initialize`; the
//! pipeline governs it (the call's profile must grant the kind; each request is
//! recorded by digest in the call's End) before the tool sees it.

// MCP sampling is deprecated by SEP-2577 (rmcp 3.9) but still what clients speak.
#![allow(deprecated)]

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::{
    CreateMessageRequestParams, ElicitRequestParams, ElicitationAction as McpAction,
    ElicitationSchema, Role, SamplingMessage as McpMessage,
};
use rmcp::{Peer, RoleServer};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_tools::pipeline::{
    ClientRequest, ClientRequestKind, ClientResponse, ClientSink, ElicitationAction, SamplingRole,
};

/// The client of one MCP session, for the requests it declared it can answer.
struct PeerClient {
    peer: Peer<RoleServer>,
    elicitation: bool,
    sampling: bool,
}

/// A sink for the requests `peer`'s client declared (`None` when it declared
/// neither elicitation nor sampling).
pub(crate) fn for_peer(peer: &Peer<RoleServer>) -> Option<Arc<dyn ClientSink>> {
    let info = peer.peer_info()?;
    let elicitation = info.capabilities.elicitation.is_some();
    let sampling = info.capabilities.sampling.is_some();
    (elicitation || sampling).then(|| {
        Arc::new(PeerClient {
            peer: peer.clone(),
            elicitation,
            sampling,
        }) as Arc<dyn ClientSink>
    })
}

/// The client failed to answer (gone, refused the request, answered an error).
fn unanswered(kind: ClientRequestKind, e: rmcp::ServiceError) -> SoulError {
    SoulError::new(
        ErrorCode::ProviderUnavailable,
        format!("the client did not answer the {} request", kind.as_str()),
    )
    .with_field("capability", format!("client.{}", kind.as_str()))
    .with_source(e)
}

#[async_trait]
impl ClientSink for PeerClient {
    fn offers(&self, kind: ClientRequestKind) -> bool {
        match kind {
            ClientRequestKind::Elicitation => self.elicitation,
            ClientRequestKind::Sampling => self.sampling,
        }
    }

    async fn request(&self, request: ClientRequest) -> Result<ClientResponse, SoulError> {
        let kind = request.kind();
        match request {
            ClientRequest::Elicitation { message, schema } => {
                let requested_schema: ElicitationSchema =
                    serde_json::from_value(schema).map_err(|e| {
                        SoulError::new(
                            ErrorCode::ToolExecutionFailed,
                            "the tool's elicitation schema is not one MCP allows (a flat object of primitive properties)",
                        )
                        .with_source(e)
                    })?;
                let params = ElicitRequestParams::FormElicitationParams {
                    meta: None,
                    message,
                    requested_schema,
                };
                let answer = self
                    .peer
                    .create_elicitation(params)
                    .await
                    .map_err(|e| unanswered(kind, e))?;
                let action = match answer.action {
                    McpAction::Accept => ElicitationAction::Accept,
                    McpAction::Decline => ElicitationAction::Decline,
                    // Dismissed, or an action newer than this server: not an answer.
                    _ => ElicitationAction::Cancel,
                };
                Ok(ClientResponse::Elicitation {
                    action,
                    content: answer.content,
                })
            }
            ClientRequest::Sampling {
                messages,
                system_prompt,
                max_tokens,
            } => {
                let messages = messages
                    .into_iter()
                    .map(|m| match m.role {
                        SamplingRole::User => McpMessage::user_text(m.text),
                        SamplingRole::Assistant => McpMessage::assistant_text(m.text),
                    })
                    .collect();
                let mut params = CreateMessageRequestParams::new(messages, max_tokens);
                if let Some(system) = system_prompt {
                    params = params.with_system_prompt(system);
                }
                let answer = self
                    .peer
                    .create_message(params)
                    .await
                    .map_err(|e| unanswered(kind, e))?;
                if answer.message.role != Role::Assistant {
                    return Err(SoulError::new(
                        ErrorCode::ProviderUnavailable,
                        "the client's sampling answer is not the assistant's",
                    ));
                }
                let text: Vec<String> = answer
                    .message
                    .content
                    .into_vec()
                    .into_iter()
                    .filter_map(|block| block.as_text().map(|t| t.text.clone()))
                    .collect();
                Ok(ClientResponse::Sampling {
                    text: text.join("\n"),
                    model: answer.model,
                    stop_reason: answer.stop_reason,
                })
            }
        }
    }
}
