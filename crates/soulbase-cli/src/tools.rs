//! `soulbase tools list|get|enable|disable|export`, `soulbase invoke` and
//! `soulbase preflight`, remotely over gRPC or locally (see [`crate::target`]).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use soulbase_edge::{Binding, CallMeta, CallRequest, ExportFormat, Surface};
use soulbase_errors::SoulError;
use soulbase_grpc::proto::tool_invoker_client::ToolInvokerClient;
use soulbase_grpc::proto::tool_registry_client::ToolRegistryClient;
use soulbase_grpc::{RemoteInvoker, convert, proto};
use soulbase_tools::pipeline::{CallResult, CallStatus, PreflightReport, ToolCall};
use soulbase_tools::registry::admin::{self, StateChange};
use soulbase_tools::{ToolFilter, ToolOwner};
use soulbase_types::ToolId;
use tonic::transport::Channel;

use crate::options::TargetArgs;
use crate::output;
use crate::target::{self, Failure, Global, Local, soul};

/// Arguments of `soulbase tools`.
#[derive(Debug, Args)]
pub struct ToolsArgs {
    /// Where the command runs and as whom.
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(subcommand)]
    command: ToolsCommand,
}

#[derive(Debug, Subcommand)]
enum ToolsCommand {
    /// Every tool the tenant sees: ID, VERSION, STATE, SIDE EFFECT, DESCRIPTION.
    List,
    /// One tool in full (with its manifest under --json).
    Get {
        /// The tool id (`group.pkg.name`).
        id: String,
    },
    /// Enable a tool (state ENABLED; policy action `enable`).
    Enable {
        /// The tool id.
        id: String,
    },
    /// Pause a tool (state PAUSED; policy action `disable`).
    Disable {
        /// The tool id.
        id: String,
    },
    /// The tools the tenant may be offered, as a model API takes them: a JSON
    /// array of definitions on stdout (with `--json`: also the provider names
    /// used and the export's warnings); warnings on stderr.
    Export {
        /// `openai`, `openai-strict`, `anthropic` or `mcp`.
        #[arg(long, default_value = "openai")]
        format: String,
        /// The model the tools are for: tools whose `provider_compat` does not
        /// admit it are left out.
        #[arg(long)]
        model: Option<String>,
    },
}

/// The call options of `invoke` and `preflight`.
#[derive(Debug, Args)]
pub struct CallArgs {
    /// The tool id (`group.pkg.name`).
    id: String,
    /// The arguments, a JSON object.
    #[arg(long = "args", value_name = "JSON", default_value = "{}")]
    args: String,
    /// The consent token, for tools requiring consent.
    #[arg(long, value_name = "T")]
    consent_token: Option<String>,
}

/// Arguments of `soulbase invoke`.
#[derive(Debug, Args)]
pub struct InvokeArgs {
    /// Where the call runs and as whom.
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    call: CallArgs,
    /// The idempotency key (required by keyed tools; a repeat returns the stored
    /// result with `replayed: true`).
    #[arg(long, value_name = "K")]
    idempotency_key: Option<String>,
}

/// Arguments of `soulbase preflight`.
#[derive(Debug, Args)]
pub struct PreflightArgs {
    /// Where the dry run happens and as whom.
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    call: CallArgs,
}

/// Where a command runs.
pub(crate) enum Mode {
    Remote { url: String },
    Local(Box<Local>),
}

impl Mode {
    pub(crate) async fn open(global: &Global) -> Result<Mode, Failure> {
        match global.server_url() {
            Some(url) => Ok(Mode::Remote { url }),
            None => Ok(Mode::Local(Box::new(Local::open(global).await?))),
        }
    }

    pub(crate) async fn close(self) {
        if let Mode::Local(l) = self {
            l.close().await;
        }
    }
}

pub(crate) fn tool_id(id: &str) -> Result<ToolId, Failure> {
    ToolId::new(id).map_err(|e| Failure::Usage(format!("{id:?} is not a tool id: {}", e.reason)))
}

pub(crate) fn status(s: &tonic::Status) -> Failure {
    soul(&SoulError::from_status(s))
}

pub(crate) async fn registry(url: &str) -> Result<ToolRegistryClient<Channel>, Failure> {
    Ok(ToolRegistryClient::new(target::channel(url).await?))
}

pub(crate) fn request<T>(global: &Global, body: T) -> Result<tonic::Request<T>, Failure> {
    let mut req = tonic::Request::new(body);
    global.authenticate(&mut req)?;
    Ok(req)
}

async fn list(global: &Global, mode: &Mode) -> Result<Vec<proto::Tool>, Failure> {
    match mode {
        Mode::Remote { url } => {
            let mut client = registry(url).await?;
            let mut tools = Vec::new();
            let mut page_token = String::new();
            loop {
                let req = request(
                    global,
                    proto::ListToolsRequest {
                        page_size: 1000,
                        page_token: page_token.clone(),
                        ..Default::default()
                    },
                )?;
                let page = client
                    .list_tools(req)
                    .await
                    .map_err(|s| status(&s))?
                    .into_inner();
                tools.extend(page.tools);
                if page.next_page_token.is_empty() || page.next_page_token == page_token {
                    break;
                }
                page_token = page.next_page_token;
            }
            Ok(tools)
        }
        Mode::Local(l) => {
            let tools = l
                .app
                .stack
                .list(
                    Surface::Cli,
                    &l.subject,
                    &Binding::None,
                    &ToolFilter::default(),
                )
                .await
                .map_err(|e| soul(&e))?;
            Ok(tools
                .iter()
                .map(|t| convert::tool_to_proto(t, false))
                .collect())
        }
    }
}

async fn get(global: &Global, mode: &Mode, id: &ToolId) -> Result<proto::Tool, Failure> {
    match mode {
        Mode::Remote { url } => {
            let req = request(
                global,
                proto::GetToolRequest {
                    tool_id: id.to_string(),
                    include_manifest: true,
                },
            )?;
            let resp = registry(url)
                .await?
                .get_tool(req)
                .await
                .map_err(|s| status(&s))?;
            resp.into_inner()
                .tool
                .ok_or_else(|| Failure::Failed("UNKNOWN.INTERNAL: the server sent no tool".into()))
        }
        Mode::Local(l) => {
            let t = l
                .app
                .registry
                .get(&l.subject.tenant, id)
                .map_err(|e| soul(&e))?;
            Ok(convert::tool_to_proto(&t, true))
        }
    }
}

/// Enables (`enable`) or pauses (`!enable`) the tool as its owner sees it: a global
/// tool as global, the tenant's own tool as the tenant's.
async fn set_state(
    global: &Global,
    mode: &Mode,
    id: &ToolId,
    enable: bool,
) -> Result<proto::Tool, Failure> {
    let current = get(global, mode, id).await?;
    let is_global = current.owner == proto::OwnerScope::Global as i32;
    match mode {
        Mode::Remote { url } => {
            let change = if enable {
                proto::StateChange::Enable
            } else {
                proto::StateChange::Pause
            };
            let owner = if is_global {
                proto::OwnerScope::Global
            } else {
                proto::OwnerScope::Tenant
            };
            let req = request(
                global,
                proto::SetToolStateRequest {
                    tool_id: id.to_string(),
                    owner: owner as i32,
                    change: change as i32,
                },
            )?;
            let resp = registry(url)
                .await?
                .set_tool_state(req)
                .await
                .map_err(|s| status(&s))?;
            resp.into_inner()
                .tool
                .ok_or_else(|| Failure::Failed("UNKNOWN.INTERNAL: the server sent no tool".into()))
        }
        Mode::Local(l) => {
            let owner = if is_global {
                ToolOwner::Global
            } else {
                ToolOwner::tenant(l.subject.tenant.clone())
            };
            let change = if enable {
                StateChange::Enable
            } else {
                StateChange::Pause
            };
            admin::change_state(
                l.app.authorizer.as_ref(),
                &l.app.admin,
                &l.subject,
                &owner,
                id,
                change,
            )
            .await
            .map_err(|e| soul(&e))?;
            get(global, mode, id).await
        }
    }
}

/// An export as the server answered it.
struct Exported {
    format: String,
    tools: Value,
    names: Value,
    warnings: Value,
}

/// The tenant's tools as `format` (see [`ToolsCommand::Export`]).
async fn export(
    global: &Global,
    mode: &Mode,
    format: &str,
    model: Option<&str>,
) -> Result<Exported, Failure> {
    let parsed: ExportFormat = format
        .parse()
        .map_err(|e: SoulError| Failure::Usage(format!("--format: {}", e.public().message)))?;
    let parse = |what: &str, text: &str| {
        serde_json::from_str::<Value>(text).map_err(|e| {
            Failure::Failed(format!("UNKNOWN.INTERNAL: the server sent bad {what}: {e}"))
        })
    };
    match mode {
        Mode::Remote { url } => {
            let wire = match parsed {
                ExportFormat::OpenAi => proto::ExportFormat::Openai,
                ExportFormat::OpenAiStrict => proto::ExportFormat::OpenaiStrict,
                ExportFormat::Anthropic => proto::ExportFormat::Anthropic,
                ExportFormat::Mcp => proto::ExportFormat::Mcp,
            };
            let req = request(
                global,
                proto::ExportToolsRequest {
                    format: wire as i32,
                    model: model.unwrap_or_default().to_owned(),
                },
            )?;
            let resp = ToolInvokerClient::new(target::channel(url).await?)
                .export_tools(req)
                .await
                .map_err(|s| status(&s))?
                .into_inner();
            Ok(Exported {
                format: resp.format,
                tools: parse("tools", &resp.tools_json)?,
                names: json!(resp.names),
                warnings: parse("warnings", &resp.warnings_json)?,
            })
        }
        Mode::Local(l) => {
            let x = l
                .app
                .stack
                .export_tools(Surface::Cli, &l.subject, &Binding::None, parsed, model)
                .await
                .map_err(|e| soul(&e))?;
            let names: serde_json::Map<String, Value> = x
                .names
                .iter()
                .map(|(id, name)| (name.to_owned(), Value::String(id.to_string())))
                .collect();
            Ok(Exported {
                format: parsed.as_str().to_owned(),
                tools: Value::Array(x.tools),
                names: Value::Object(names),
                warnings: json!(x.warnings),
            })
        }
    }
}

fn print_export(global: &Global, x: &Exported) {
    for w in x.warnings.as_array().into_iter().flatten() {
        eprintln!(
            "warning: {}: {}: {}",
            w["tool"].as_str().unwrap_or_default(),
            w["location"].as_str().unwrap_or_default(),
            w["message"].as_str().unwrap_or_default()
        );
    }
    if global.json {
        println!(
            "{}",
            output::pretty(&json!({
                "format": x.format,
                "tools": x.tools,
                "names": x.names,
                "warnings": x.warnings,
            }))
        );
    } else {
        println!("{}", output::pretty(&x.tools));
    }
}

fn print_tool(global: &Global, tool: &proto::Tool) {
    if global.json {
        println!("{}", output::pretty(&output::tool_json(tool)));
    } else {
        print!("{}", output::tool_text(tool));
    }
}

/// Runs `soulbase tools …`.
pub fn run_tools(global: &Global, args: ToolsArgs) -> ExitCode {
    let id = match &args.command {
        ToolsCommand::List | ToolsCommand::Export { .. } => None,
        ToolsCommand::Get { id } | ToolsCommand::Enable { id } | ToolsCommand::Disable { id } => {
            match tool_id(id) {
                Ok(id) => Some(id),
                Err(f) => return f.report(),
            }
        }
    };
    let done = target::runtime().and_then(|rt| {
        rt.block_on(async {
            let mode = Mode::open(global).await?;
            let result = match (&args.command, &id) {
                (ToolsCommand::List, _) => list(global, &mode).await.map(|tools| {
                    if global.json {
                        let list: Vec<Value> = tools.iter().map(output::tool_json).collect();
                        println!("{}", output::pretty(&json!({ "tools": list })));
                    } else {
                        print!("{}", output::tools_table(&tools));
                    }
                }),
                (ToolsCommand::Get { .. }, Some(id)) => {
                    get(global, &mode, id).await.map(|t| print_tool(global, &t))
                }
                (ToolsCommand::Enable { .. }, Some(id)) => set_state(global, &mode, id, true)
                    .await
                    .map(|t| print_tool(global, &t)),
                (ToolsCommand::Disable { .. }, Some(id)) => set_state(global, &mode, id, false)
                    .await
                    .map(|t| print_tool(global, &t)),
                (ToolsCommand::Export { format, model }, _) => {
                    export(global, &mode, format, model.as_deref())
                        .await
                        .map(|x| print_export(global, &x))
                }
                (_, None) => Err(Failure::Usage("a tool id is required".into())),
            };
            mode.close().await;
            result
        })
    });
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => f.report(),
    }
}

/// The call `args` describes, for `subject`.
fn build_call(
    args: &CallArgs,
    subject: soulbase_types::Subject,
    idempotency_key: Option<&String>,
) -> Result<ToolCall, Failure> {
    let tool = tool_id(&args.id)?;
    let value: Value = serde_json::from_str(&args.args)
        .map_err(|e| Failure::Usage(format!("--args: not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(Failure::Usage(
            "--args: must be a JSON object of arguments".into(),
        ));
    }
    let mut call = ToolCall::new(subject, tool, value);
    call.idempotency_key = idempotency_key.cloned();
    call.consent = args.consent_token.clone();
    Ok(call)
}

/// A call made in local mode, as the one stack takes it.
fn local_request(call: ToolCall) -> CallRequest {
    CallRequest {
        meta: CallMeta {
            call_id: Some(call.call_id.to_string()),
            idempotency_key: call.idempotency_key,
            consent: call.consent,
            ..CallMeta::default()
        },
        ..CallRequest::new(Surface::Cli, call.subject, call.tool.as_str(), call.args)
    }
}

/// Checks `--args` before connecting or building anything (usage errors first).
fn check_args(args: &CallArgs) -> Result<(), Failure> {
    tool_id(&args.id)?;
    let value: Value = serde_json::from_str(&args.args)
        .map_err(|e| Failure::Usage(format!("--args: not valid JSON: {e}")))?;
    if value.is_object() {
        Ok(())
    } else {
        Err(Failure::Usage(
            "--args: must be a JSON object of arguments".into(),
        ))
    }
}

fn result_failure(r: &CallResult) -> Failure {
    let code = r
        .error_code
        .map_or_else(|| "UNKNOWN.INTERNAL".to_owned(), |c| c.as_str().to_owned());
    let message = r.error.as_ref().map_or_else(
        || format!("the call ended {:?}", r.status),
        |e| e.message.clone(),
    );
    Failure::Failed(format!("{code}: {message}"))
}

fn print_result(global: &Global, r: &CallResult) {
    if global.json {
        let v = serde_json::to_value(r).unwrap_or(Value::Null);
        println!("{}", output::pretty(&v));
        return;
    }
    let status = match r.status {
        CallStatus::Ok => "ok",
        CallStatus::Denied => "denied",
        CallStatus::Error => "error",
    };
    println!("call_id   {}", r.call_id);
    println!("status    {status}");
    if let Some(e) = &r.evidence_ref {
        println!("evidence  {e}");
    }
    println!("replayed  {}", r.replayed);
    if let Some(out) = &r.output {
        println!("output:");
        println!("{}", output::pretty(out));
    }
}

/// Runs `soulbase invoke`.
pub fn run_invoke(global: &Global, args: InvokeArgs) -> ExitCode {
    if let Err(f) = check_args(&args.call) {
        return f.report();
    }
    let done = target::runtime().and_then(|rt| {
        rt.block_on(async {
            let mode = Mode::open(global).await?;
            let result = invoke(global, &mode, &args).await;
            mode.close().await;
            result
        })
    });
    match done {
        Ok(r) => {
            print_result(global, &r);
            if r.status == CallStatus::Ok {
                ExitCode::SUCCESS
            } else {
                result_failure(&r).report()
            }
        }
        Err(f) => f.report(),
    }
}

async fn invoke(global: &Global, mode: &Mode, args: &InvokeArgs) -> Result<CallResult, Failure> {
    match mode {
        Mode::Remote { url } => {
            let call = build_call(
                &args.call,
                global.remote_subject()?,
                args.idempotency_key.as_ref(),
            )?;
            let invoker = RemoteInvoker::new(target::channel(url).await?, global.credentials());
            Ok(invoker.invoke(call).await)
        }
        Mode::Local(l) => {
            let call = build_call(&args.call, l.subject.clone(), args.idempotency_key.as_ref())?;
            Ok(l.app.stack.invoke(local_request(call)).await)
        }
    }
}

/// Runs `soulbase preflight`.
pub fn run_preflight(global: &Global, args: PreflightArgs) -> ExitCode {
    if let Err(f) = check_args(&args.call) {
        return f.report();
    }
    let done = target::runtime().and_then(|rt| {
        rt.block_on(async {
            let mode = Mode::open(global).await?;
            let result = preflight(global, &mode, &args.call).await;
            mode.close().await;
            result
        })
    });
    match done {
        Ok(report) => {
            let v = serde_json::to_value(&report).unwrap_or(Value::Null);
            if global.json {
                println!("{}", output::pretty(&v));
            } else {
                print!("{}", key_values(&v));
            }
            ExitCode::SUCCESS
        }
        Err(f) => f.report(),
    }
}

async fn preflight(
    global: &Global,
    mode: &Mode,
    args: &CallArgs,
) -> Result<PreflightReport, Failure> {
    match mode {
        Mode::Remote { url } => {
            let call = build_call(args, global.remote_subject()?, None)?;
            let invoker = RemoteInvoker::new(target::channel(url).await?, global.credentials());
            invoker.preflight(&call).await.map_err(|e| soul(&e))
        }
        Mode::Local(l) => {
            let call = build_call(args, l.subject.clone(), None)?;
            l.app
                .stack
                .preflight(local_request(call))
                .await
                .map_err(|e| soul(&e))
        }
    }
}

/// An object's scalar members as `key  value` lines, the others as indented JSON.
fn key_values(v: &Value) -> String {
    let Some(o) = v.as_object() else {
        return format!("{}\n", output::pretty(v));
    };
    let width = o.keys().map(|k| k.chars().count()).max().unwrap_or(0) + 2;
    let mut out = String::new();
    for (k, v) in o {
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Object(_) | Value::Array(_) => output::pretty(v).replace('\n', "\n  "),
            other => other.to_string(),
        };
        if matches!(v, Value::Object(_) | Value::Array(_)) && text.contains('\n') {
            out.push_str(&format!("{k}:\n  {text}\n"));
        } else {
            out.push_str(&format!("{k:<width$}{text}\n"));
        }
    }
    out
}
