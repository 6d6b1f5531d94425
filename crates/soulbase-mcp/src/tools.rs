//! `tools/list`: governed tool lists as MCP tools, a page at a time.

use std::sync::Arc;

use rmcp::model::{ListToolsResult, Tool, ToolAnnotations};
use serde_json::{Map, Value, json};
use soulbase_tools::CompiledTool;
use soulbase_tools::manifest::{Idempotency, SideEffect};

/// Tools per `tools/list` page.
pub const PAGE_SIZE: usize = 200;

/// The MCP annotations a manifest implies.
pub fn annotations(tool: &CompiledTool) -> ToolAnnotations {
    let m = &tool.manifest;
    let read_only = matches!(m.side_effect, SideEffect::None | SideEffect::Read);
    let destructive = matches!(
        m.side_effect,
        SideEffect::Write | SideEffect::Filesystem | SideEffect::Process
    );
    let idempotent = read_only || m.idempotency == Idempotency::Keyed;
    let open_world = matches!(m.side_effect, SideEffect::Network | SideEffect::Browser);
    let mut a = ToolAnnotations::new()
        .read_only(read_only)
        .destructive(destructive)
        .idempotent(idempotent)
        .open_world(open_world);
    a.title = m.display_name.clone();
    a
}

fn object(v: &Value) -> Option<Map<String, Value>> {
    v.as_object().cloned()
}

/// The MCP tool for a compiled tool: name = its manifest's `mcp_name`, else the
/// tool id.
pub fn to_mcp_tool(tool: &CompiledTool) -> Tool {
    let m = &tool.manifest;
    let input = object(&m.input_schema).unwrap_or_else(|| {
        json!({"type": "object"})
            .as_object()
            .cloned()
            .unwrap_or_default()
    });
    // The spec's description: a deprecated tool's carries its notes.
    let name = m.mcp_name.clone().unwrap_or_else(|| m.id.to_string());
    let mut t = Tool::new(name, tool.spec().description, Arc::new(input))
        .with_annotations(annotations(tool));
    if !m.deprecations.is_empty() {
        let mut meta = serde_json::Map::new();
        meta.insert(
            crate::META_DEPRECATIONS.into(),
            serde_json::to_value(&m.deprecations).unwrap_or_default(),
        );
        t.meta = Some(rmcp::model::MetaObject(meta));
    }
    // MCP requires an object-typed outputSchema; other schemas are not advertised.
    if let Some(out) = object(&m.output_schema)
        && out.get("type").and_then(Value::as_str) == Some("object")
    {
        t = t.with_raw_output_schema(Arc::new(out));
    }
    if let Some(title) = &m.display_name {
        t = t.with_title(title.clone());
    }
    t
}

/// One page of `tools` after `cursor` (a tool name), in name order.
pub fn page(mut tools: Vec<Tool>, cursor: Option<&str>) -> ListToolsResult {
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    let start = cursor.map_or(0, |c| tools.partition_point(|t| t.name.as_ref() <= c));
    let mut rest = tools.split_off(start.min(tools.len()));
    let more = rest.len() > PAGE_SIZE;
    rest.truncate(PAGE_SIZE);
    let next = more
        .then(|| rest.last().map(|t| t.name.to_string()))
        .flatten();
    let mut result = ListToolsResult::with_all_items(rest);
    result.next_cursor = next;
    result
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use soulbase_tools::{Registry, ToolManifest, ToolOwner};
    use soulbase_types::TenantId;

    fn list(registry: &Registry, tenant: &TenantId, cursor: Option<&str>) -> ListToolsResult {
        let tools = registry
            .available_specs(tenant)
            .iter()
            .map(|s| to_mcp_tool(&s.tool))
            .collect();
        page(tools, cursor)
    }

    fn register(registry: &Registry, id: &str, extra: Value) {
        let mut m = json!({
            "id": id,
            "version": "1.0.0",
            "description": "d",
            "input_schema": {"type": "object"},
            "output_schema": {"type": "object"},
            "side_effect": "none"
        });
        for (k, v) in extra.as_object().unwrap() {
            m[k] = v.clone();
        }
        let manifest = ToolManifest::from_json_str(&m.to_string()).unwrap();
        let tid = manifest.id.clone();
        registry.register(manifest).unwrap();
        registry.enable(&ToolOwner::Global, &tid).unwrap();
    }

    #[test]
    fn annotations_follow_the_manifest() {
        let registry = Registry::new();
        register(&registry, "a.b.read", json!({}));
        register(
            &registry,
            "a.b.write",
            json!({"side_effect": "write",
                   "capabilities": [{"kind": "fs", "paths": ["/data"], "access": ["write"]}],
                   "consent": {"required": true}, "idempotency": "keyed"}),
        );
        register(
            &registry,
            "a.b.net",
            json!({"side_effect": "network",
                   "capabilities": [{"kind": "net", "hosts": ["a.example.com"]}]}),
        );
        let tenant = TenantId::new("t").unwrap();
        let page = list(&registry, &tenant, None);
        let get = |name: &str| page.tools.iter().find(|t| t.name == name).unwrap().clone();
        let read = get("a.b.read").annotations.unwrap();
        assert_eq!(read.read_only_hint, Some(true));
        assert_eq!(read.destructive_hint, Some(false));
        assert_eq!(read.open_world_hint, Some(false));
        let w = get("a.b.write").annotations.unwrap();
        assert_eq!(w.read_only_hint, Some(false));
        assert_eq!(w.destructive_hint, Some(true));
        assert_eq!(w.idempotent_hint, Some(true));
        let n = get("a.b.net").annotations.unwrap();
        assert_eq!(n.open_world_hint, Some(true));
        assert_eq!(n.idempotent_hint, Some(false));
    }

    #[test]
    fn a_tool_with_an_mcp_name_is_listed_by_it() {
        let registry = Registry::new();
        register(&registry, "a.b.named", json!({"mcp_name": "plain_name"}));
        register(&registry, "a.b.unnamed", json!({}));
        let tenant = TenantId::new("t").unwrap();
        let names: Vec<String> = list(&registry, &tenant, None)
            .tools
            .iter()
            .map(|t| t.name.to_string())
            .collect();
        assert_eq!(names, ["a.b.unnamed", "plain_name"]);
    }

    #[test]
    fn pages_are_in_id_order_and_complete() {
        let registry = Registry::new();
        for i in 0..(PAGE_SIZE + 5) {
            register(&registry, &format!("g.p.t{i:04}"), json!({}));
        }
        let tenant = TenantId::new("t").unwrap();
        let first = list(&registry, &tenant, None);
        assert_eq!(first.tools.len(), PAGE_SIZE);
        let cursor = first.next_cursor.clone().unwrap();
        let second = list(&registry, &tenant, Some(&cursor));
        assert_eq!(second.tools.len(), 5);
        assert!(second.next_cursor.is_none());
        let names: Vec<_> = first
            .tools
            .iter()
            .chain(second.tools.iter())
            .map(|t| t.name.to_string())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(names.len(), PAGE_SIZE + 5);
    }
}
