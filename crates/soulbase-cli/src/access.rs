//! `soulbase access show|allow|override`: the tenant's view of the global tools —
//! its allow-list and its states of global tools — remotely over gRPC
//! (`ToolRegistry.GetTenantAccess` / `SetAllowList` / `SetTenantOverride`) or
//! locally, through the same code path as HTTP's `/api/access`
//! ([`soulbase_tools::registry::access`]).

use std::collections::BTreeSet;
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;
use soulbase_grpc::proto;
use soulbase_tools::registry::TenantOverride;
use soulbase_tools::registry::access;

use crate::options::TargetArgs;
use crate::output;
use crate::target::{self, Failure, Global, soul};
use crate::tools::{Mode, registry, request, status, tool_id};

/// Arguments of `soulbase access`.
#[derive(Debug, Args)]
pub struct AccessArgs {
    /// Where the command runs and as whom.
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(subcommand)]
    command: AccessCommand,
}

#[derive(Debug, Subcommand)]
enum AccessCommand {
    /// The tenant's allow-list and states of global tools, and what the
    /// configuration (`tenants[]`) decides on top.
    Show,
    /// Replace the tenant's allow-list: the only global tools it sees (policy
    /// action `update` on `soulbase.server.access`).
    Allow {
        /// Tool ids.
        #[arg(required_unless_present = "every_tool")]
        tools: Vec<String>,
        /// Remove the allow-list: every global tool.
        #[arg(long, conflicts_with = "tools")]
        every_tool: bool,
    },
    /// Set the tenant's state of a global tool (policy action `enable`,
    /// `disable`, or both to clear).
    Override {
        /// The tool id.
        id: String,
        /// The state for the tenant, or `clear` for the tool's own.
        state: OverrideState,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OverrideState {
    Enabled,
    Paused,
    Clear,
}

/// Runs `soulbase access …`.
pub fn run(global: &Global, args: AccessArgs) -> ExitCode {
    let done = target::runtime().and_then(|rt| {
        rt.block_on(async {
            let mode = Mode::open(global).await?;
            let result = match &args.command {
                AccessCommand::Show => show(global, &mode).await,
                AccessCommand::Allow { tools, every_tool } => {
                    allow(global, &mode, tools, *every_tool).await
                }
                AccessCommand::Override { id, state } => {
                    set_override(global, &mode, id, *state).await
                }
            };
            mode.close().await;
            result.map(|view| print(global, &view))
        })
    });
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => f.report(),
    }
}

fn parse(text: &str) -> Result<Value, Failure> {
    serde_json::from_str(text)
        .map_err(|e| Failure::Failed(format!("UNKNOWN.INTERNAL: the server sent a bad view: {e}")))
}

fn view_json(view: &access::AccessView) -> Result<Value, Failure> {
    serde_json::to_value(view).map_err(|e| Failure::Failed(format!("UNKNOWN.INTERNAL: {e}")))
}

async fn show(global: &Global, mode: &Mode) -> Result<Value, Failure> {
    match mode {
        Mode::Remote { url } => {
            let req = request(global, proto::GetTenantAccessRequest {})?;
            let resp = registry(url)
                .await?
                .get_tenant_access(req)
                .await
                .map_err(|s| status(&s))?;
            parse(&resp.into_inner().access_json)
        }
        Mode::Local(l) => view_json(&access::access_of(
            &l.app.registry.view(),
            &l.subject.tenant,
        )),
    }
}

async fn allow(
    global: &Global,
    mode: &Mode,
    tools: &[String],
    every_tool: bool,
) -> Result<Value, Failure> {
    let ids = tools
        .iter()
        .map(|t| tool_id(t))
        .collect::<Result<BTreeSet<_>, _>>()?;
    match mode {
        Mode::Remote { url } => {
            let req = request(
                global,
                proto::SetAllowListRequest {
                    tools: ids.iter().map(ToString::to_string).collect(),
                    every_tool,
                },
            )?;
            let resp = registry(url)
                .await?
                .set_allow_list(req)
                .await
                .map_err(|s| status(&s))?;
            parse(&resp.into_inner().access_json)
        }
        Mode::Local(l) => {
            let allow = (!every_tool).then_some(ids);
            let view =
                access::set_allow_list(l.app.authorizer.as_ref(), &l.app.admin, &l.subject, allow)
                    .await
                    .map_err(|e| soul(&e))?;
            view_json(&view)
        }
    }
}

async fn set_override(
    global: &Global,
    mode: &Mode,
    id: &str,
    state: OverrideState,
) -> Result<Value, Failure> {
    let id = tool_id(id)?;
    match mode {
        Mode::Remote { url } => {
            let wire = match state {
                OverrideState::Enabled => proto::TenantToolState::Enabled,
                OverrideState::Paused => proto::TenantToolState::Paused,
                OverrideState::Clear => proto::TenantToolState::Unspecified,
            };
            let req = request(
                global,
                proto::SetTenantOverrideRequest {
                    tool_id: id.to_string(),
                    state: wire as i32,
                },
            )?;
            let resp = registry(url)
                .await?
                .set_tenant_override(req)
                .await
                .map_err(|s| status(&s))?;
            parse(&resp.into_inner().access_json)
        }
        Mode::Local(l) => {
            let value = match state {
                OverrideState::Enabled => Some(TenantOverride::Enabled),
                OverrideState::Paused => Some(TenantOverride::Paused),
                OverrideState::Clear => None,
            };
            let view = access::set_override(
                l.app.authorizer.as_ref(),
                &l.app.admin,
                &l.subject,
                &id,
                value,
            )
            .await
            .map_err(|e| soul(&e))?;
            view_json(&view)
        }
    }
}

/// The view as JSON (`--json`) or as lines of text.
fn print(global: &Global, view: &Value) {
    if global.json {
        println!("{}", output::pretty(view));
        return;
    }
    let list = |v: &Value| match v.as_array() {
        None => "every global tool".to_owned(),
        Some(ids) if ids.is_empty() => "no global tool".to_owned(),
        Some(ids) => ids
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(", "),
    };
    let states = |v: &Value| -> Vec<String> {
        v.as_object()
            .map(|m| {
                m.iter()
                    .map(|(id, s)| format!("{id} {}", s.as_str().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default()
    };
    println!("tenant: {}", view["tenant"].as_str().unwrap_or_default());
    println!("allow-list: {}", list(&view["allow"]));
    for line in states(&view["overrides"]) {
        println!("override: {line}");
    }
    let configured = &view["configured"];
    if !configured.is_null() {
        println!("configured allow-list: {}", list(&configured["allow"]));
        for line in states(&configured["overrides"]) {
            println!("configured override: {line}");
        }
    }
}
