//! Text tables and JSON documents.

use serde_json::{Value, json};
use soulbase_grpc::proto;

/// Prints `rows` under `headers` as plain left-aligned columns (two spaces apart;
/// the last column is not padded).
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let cells: Vec<&str> = cells.collect();
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            text.push_str(cell);
            if i < last {
                let pad = widths.get(i).copied().unwrap_or(0) - cell.chars().count();
                text.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// `s` cut to `max` characters, with `…` when cut; first line only.
pub fn truncate(s: &str, max: usize) -> String {
    let first = s.lines().next().unwrap_or("");
    if first.chars().count() <= max && first.len() == s.trim_end().len() {
        return first.to_owned();
    }
    let mut t: String = first.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// `enabled`, `paused`, … for a wire state.
pub fn state_name(state: i32) -> &'static str {
    match proto::ToolState::try_from(state) {
        Ok(proto::ToolState::Registered) => "registered",
        Ok(proto::ToolState::Enabled) => "enabled",
        Ok(proto::ToolState::Paused) => "paused",
        Ok(proto::ToolState::Deprecated) => "deprecated",
        Ok(proto::ToolState::Unspecified) | Err(_) => "unknown",
    }
}

fn owner(t: &proto::Tool) -> String {
    match proto::OwnerScope::try_from(t.owner) {
        Ok(proto::OwnerScope::Global) => "global".into(),
        _ if !t.owner_tenant.is_empty() => t.owner_tenant.clone(),
        _ => "tenant".into(),
    }
}

fn parsed(text: &str) -> Value {
    if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
    }
}

/// A tool as JSON (the shape of the HTTP API's tool objects).
pub fn tool_json(t: &proto::Tool) -> Value {
    let mut v = json!({
        "id": t.id,
        "version": t.version,
        "state": state_name(t.state),
        "owner": owner(t),
        "display_name": t.display_name,
        "description": t.description,
        "tags": t.tags,
        "safety_class": t.safety_class,
        "side_effect": t.side_effect,
        "consent_required": t.consent_required,
        "idempotency": t.idempotency,
        "input_schema": parsed(&t.input_schema_json),
        "output_schema": parsed(&t.output_schema_json),
        "digest": t.digest,
    });
    if !t.manifest_json.is_empty()
        && let Some(o) = v.as_object_mut()
    {
        o.insert("manifest".into(), parsed(&t.manifest_json));
    }
    v
}

/// The `tools list` table.
pub fn tools_table(tools: &[proto::Tool]) -> String {
    let rows: Vec<Vec<String>> = tools
        .iter()
        .map(|t| {
            vec![
                t.id.clone(),
                t.version.clone(),
                state_name(t.state).to_owned(),
                t.side_effect.clone(),
                truncate(&t.description, 60),
            ]
        })
        .collect();
    table(
        &["ID", "VERSION", "STATE", "SIDE EFFECT", "DESCRIPTION"],
        &rows,
    )
}

/// One tool in full, as `key  value` lines, then its input schema.
pub fn tool_text(t: &proto::Tool) -> String {
    let rows = vec![
        vec!["id".into(), t.id.clone()],
        vec!["version".into(), t.version.clone()],
        vec!["state".into(), state_name(t.state).to_owned()],
        vec!["owner".into(), owner(t)],
        vec!["title".into(), t.display_name.clone()],
        vec!["description".into(), t.description.clone()],
        vec!["tags".into(), t.tags.join(", ")],
        vec!["safety class".into(), t.safety_class.clone()],
        vec!["side effect".into(), t.side_effect.clone()],
        vec!["consent".into(), t.consent_required.to_string()],
        vec!["idempotency".into(), t.idempotency.clone()],
        vec!["digest".into(), t.digest.clone()],
    ];
    let mut out = String::new();
    for row in &rows {
        let (k, v) = (&row[0], &row[1]);
        out.push_str(&format!("{k:<14}{v}\n"));
    }
    let schema = parsed(&t.input_schema_json);
    if !schema.is_null() {
        out.push_str("input schema:\n");
        out.push_str(&serde_json::to_string_pretty(&schema).unwrap_or_default());
        out.push('\n');
    }
    out
}

/// Pretty JSON text.
pub fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_columns() {
        let t = table(
            &["ID", "STATE"],
            &[
                vec!["a.b.c".into(), "enabled".into()],
                vec!["x".into(), "".into()],
            ],
        );
        assert_eq!(t, "ID     STATE\na.b.c  enabled\nx\n");
    }

    #[test]
    fn truncation() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("abcdefghijk", 5), "abcd…");
        assert_eq!(truncate("one\ntwo", 10), "one…");
    }
}
