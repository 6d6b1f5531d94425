//! Anthropic tool use export: `{name, description, input_schema}`.
//!
//! Anthropic accepts JSON Schema as is, so the schema is passed through (minus
//! `$schema`); only the name is mapped with [`NameMap`].

use serde_json::{Value, json};

use super::{Export, NameMap, ToolSpec};

/// Exports `specs` for Anthropic tool use.
pub fn export(specs: &[ToolSpec]) -> Export {
    let names = NameMap::new(specs.iter().map(|s| &s.name));
    let tools = specs
        .iter()
        .map(|spec| {
            let name = names
                .name(&spec.name)
                .map(str::to_owned)
                .unwrap_or_else(|| NameMap::provider_name(&spec.name));
            let mut schema = (*spec.input_schema).clone();
            if let Some(map) = schema.as_object_mut() {
                map.remove("$schema");
            }
            json!({"name": name, "description": spec.description, "input_schema": schema})
        })
        .collect::<Vec<Value>>();
    Export {
        tools,
        names,
        warnings: Vec::new(),
    }
}
