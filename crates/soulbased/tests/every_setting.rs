//! Every configuration key acts (issue 32): one row per key of
//! `docs/configuration.md` (`soulbase_config::reference::markdown()`), naming a
//! test that sets the key and observes its effect — a call refused or limited, a
//! value in evidence, metrics or an answer changed, a process behaving
//! differently — or observes it refused at load, naming the field.
//!
//! Which keys need a row: every key of the reference but the sections. A key is a
//! section when the reference gives it a table of its own (`## `K`` for an
//! object, `## `K[]`` for a list of objects: `server`, `server.tls`,
//! `auth.api_keys`, `auth.jwt[].keys`, …); its leaves have rows instead. So a key
//! the model gains appears in the reference and fails [`every_key_has_a_row`]
//! until it has one, and a row whose key is gone fails it too.
//!
//! [`every_row_names_a_test_that_mentions_its_key`] checks each row mechanically:
//! the file exists (relative to the workspace root), holds `fn NAME(` under a
//! `#[test]` / `#[tokio::test…]` attribute (and no `#[ignore]`), and the test's
//! body mentions the key's last segment (`max_body_bytes` for
//! `server.max_body_bytes`, case-insensitively, so `SOULBASE_…__REDIS_URL_FILE`
//! counts) — directly, or in a `const`, `static` or `fn` of the same file that
//! the body names (and so on, transitively: configurations are often written by a
//! helper or kept in a constant). Whether the test asserts an effect that depends
//! on the key is what the rows were chosen for, by reading the tests.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SOULBASED: &str = "crates/soulbased/tests";

/// (key, test file relative to the workspace root, test function).
const ROWS: &[(&str, &str, &str)] = &[
    // ---- top level ----
    (
        "data_dir",
        "crates/soulbase-store/tests/stores.rs",
        "persistence_opens_from_config_with_the_embedded_default",
    ),
    // ---- evidence ----
    (
        "evidence.backend",
        "crates/soulbased/tests/evidence.rs",
        "postgres_evidence_is_read_back_and_everything_survives_a_restart",
    ),
    (
        "evidence.durability",
        "crates/soulbased/tests/settings.rs",
        "evidence_durability_sets_the_spools_mode",
    ),
    (
        "evidence.idempotency_lease_ms",
        "crates/soulbased/tests/exactly_once.rs",
        "a_keyed_call_runs_once_whichever_point_its_replica_is_killed_at",
    ),
    (
        "evidence.migrate_on_start",
        "crates/soulbased/tests/settings.rs",
        "evidence_migrate_on_start_off_leaves_a_fresh_database_unusable",
    ),
    (
        "evidence.retention_days",
        "crates/soulbased/tests/settings.rs",
        "evidence_retention_days_deletes_older_calls_at_start",
    ),
    (
        "evidence.spool_max_bytes",
        "crates/soulbased/tests/settings.rs",
        "evidence_spool_max_bytes_refuses_calls_past_the_cap",
    ),
    (
        "evidence.url",
        "crates/soulbased/tests/evidence.rs",
        "postgres_evidence_is_read_back_and_everything_survives_a_restart",
    ),
    (
        "evidence.url_file",
        "crates/soulbased/tests/settings.rs",
        "evidence_url_file_names_the_database_used",
    ),
    // ---- model ----
    (
        "model.max_iterations",
        "crates/soulbased/tests/settings.rs",
        "model_settings_bound_the_loop_and_reach_the_upstream",
    ),
    (
        "model.max_tool_calls",
        "crates/soulbased/tests/agent.rs",
        "a_conversation_keeps_within_its_tool_call_and_token_budgets",
    ),
    (
        "model.max_tokens",
        "crates/soulbased/tests/agent.rs",
        "a_conversation_keeps_within_its_tool_call_and_token_budgets",
    ),
    (
        "model.max_iterations_cap",
        "crates/soulbased/tests/settings.rs",
        "model_settings_bound_the_loop_and_reach_the_upstream",
    ),
    (
        "model.allow[].models",
        "crates/soulbased/tests/settings.rs",
        "model_settings_bound_the_loop_and_reach_the_upstream",
    ),
    (
        "model.allow[].tenant",
        "crates/soulbased/tests/settings.rs",
        "model_settings_bound_the_loop_and_reach_the_upstream",
    ),
    (
        "model.upstream.api_key_env",
        "crates/soulbased/tests/settings.rs",
        "model_settings_bound_the_loop_and_reach_the_upstream",
    ),
    (
        "model.upstream.base_url",
        "crates/soulbased/tests/agent.rs",
        "a_conversation_runs_the_models_tool_calls_through_the_governed_path",
    ),
    (
        "model.upstream.timeout_ms",
        "crates/soulbased/tests/agent.rs",
        "an_unreachable_or_slow_upstream_ends_the_conversation_with_its_code",
    ),
    // ---- observe ----
    (
        "observe.log_filter",
        "crates/soulbased/tests/settings.rs",
        "observe_log_filter_decides_what_is_logged",
    ),
    (
        "observe.metrics_max_tenants",
        "crates/soulbased/tests/settings.rs",
        "observe_metrics_caps_count_the_rest_as_other",
    ),
    (
        "observe.metrics_max_tools",
        "crates/soulbased/tests/settings.rs",
        "observe_metrics_caps_count_the_rest_as_other",
    ),
    (
        "observe.otlp_endpoint",
        "crates/soulbased/tests/otel.rs",
        "invocations_are_exported_as_execute_tool_spans",
    ),
    // ---- policy ----
    (
        "policy.rules[].actions",
        "crates/soulbased/tests/settings.rs",
        "policy_rules_decide_by_each_field",
    ),
    (
        "policy.rules[].actors",
        "crates/soulbased/tests/settings.rs",
        "policy_rules_decide_by_each_field",
    ),
    (
        "policy.rules[].effect",
        "crates/soulbased/tests/settings.rs",
        "policy_rules_decide_by_each_field",
    ),
    (
        "policy.rules[].require_scopes",
        "crates/soulbased/tests/grpc.rs",
        "manifest_scopes_are_required_by_a_rule_that_asks_for_them",
    ),
    (
        "policy.rules[].tenant",
        "crates/soulbased/tests/settings.rs",
        "policy_rules_decide_by_each_field",
    ),
    (
        "policy.rules[].tools",
        "crates/soulbased/tests/settings.rs",
        "policy_rules_decide_by_each_field",
    ),
    (
        "policy.rules[].obligations[].kind",
        "crates/soulbased/tests/obligations.rs",
        "static_rule_obligations_bind_the_output_and_its_evidence",
    ),
    (
        "policy.rules[].obligations[].on_failure",
        "crates/soulbased/tests/obligations.rs",
        "static_rule_obligations_bind_the_output_and_its_evidence",
    ),
    (
        "policy.rules[].obligations[].pointer",
        "crates/soulbased/tests/obligations.rs",
        "static_rule_obligations_bind_the_output_and_its_evidence",
    ),
    (
        "policy.rules[].obligations[].required",
        "crates/soulbased/tests/obligations.rs",
        "static_rule_obligations_bind_the_output_and_its_evidence",
    ),
    (
        "policy.rules[].obligations[].value",
        "crates/soulbased/tests/settings.rs",
        "policy_obligation_values_replace_and_mark",
    ),
    // ---- quota ----
    (
        "quota.backend",
        "crates/soulbased/tests/quota_redis.rs",
        "two_replicas_share_one_redis_limit_exactly",
    ),
    (
        "quota.on_backend_failure",
        "crates/soulbased/tests/quota_redis.rs",
        "an_unreachable_redis_fails_closed_by_default_and_open_when_configured",
    ),
    (
        "quota.redis_url",
        "crates/soulbased/tests/quota_redis.rs",
        "two_replicas_share_one_redis_limit_exactly",
    ),
    (
        "quota.redis_url_file",
        "crates/soulbased/tests/settings.rs",
        "quota_redis_url_file_is_the_redis_asked",
    ),
    (
        "quota.budgets[].actor",
        "crates/soulbased/tests/settings.rs",
        "quota_budgets_count_each_amount_in_their_scope",
    ),
    (
        "quota.budgets[].bytes_in",
        "crates/soulbased/tests/settings.rs",
        "quota_budgets_count_each_amount_in_their_scope",
    ),
    (
        "quota.budgets[].bytes_out",
        "crates/soulbased/tests/settings.rs",
        "quota_budgets_count_each_amount_in_their_scope",
    ),
    (
        "quota.budgets[].calls",
        "crates/soulbased/tests/settings.rs",
        "quota_budgets_count_each_amount_in_their_scope",
    ),
    (
        "quota.budgets[].cpu_ms",
        "crates/soulbased/tests/cpu_budget.rs",
        "a_cpu_budget_is_charged_from_end_evidence_and_then_refuses",
    ),
    (
        "quota.budgets[].per_actor",
        "crates/soulbased/tests/settings.rs",
        "quota_budgets_count_each_amount_in_their_scope",
    ),
    (
        "quota.budgets[].tenant",
        "crates/soulbased/tests/settings.rs",
        "quota_budgets_count_each_amount_in_their_scope",
    ),
    (
        "quota.budgets[].tool",
        "crates/soulbased/tests/settings.rs",
        "quota_budgets_count_each_amount_in_their_scope",
    ),
    (
        "quota.budgets[].window",
        "crates/soulbased/tests/settings.rs",
        "quota_budgets_count_each_amount_in_their_scope",
    ),
    (
        "quota.limits[].rate",
        "crates/soulbase-qos/src/local.rs",
        "allows_the_burst_then_refuses_with_a_hint",
    ),
    (
        "quota.limits[].tenant",
        "crates/soulbase-qos/src/local.rs",
        "limits_apply_by_tool_pattern_and_tenant",
    ),
    (
        "quota.limits[].tool",
        "crates/soulbase-qos/src/local.rs",
        "limits_apply_by_tool_pattern_and_tenant",
    ),
    // ---- sandbox ----
    (
        "sandbox.ceiling",
        "crates/soulbase-sandbox/tests/config.rs",
        "a_sandbox_section_builds_profiles",
    ),
    (
        "sandbox.default_grant",
        "crates/soulbased/tests/settings.rs",
        "sandbox_default_grant_applies_to_tenants_without_their_own",
    ),
    (
        "sandbox.grants[].capabilities",
        "crates/soulbased/tests/sandbox_reload.rs",
        "a_reload_removing_a_grant_blocks_the_next_call_and_the_running_one_finishes",
    ),
    (
        "sandbox.grants[].tenant",
        "crates/soulbased/tests/sandbox.rs",
        "wasm_and_http_skills_run_under_their_profiles",
    ),
    (
        "sandbox.http_env_allow",
        "crates/soulbased/tests/settings.rs",
        "sandbox_http_env_allow_lets_headers_name_variables",
    ),
    (
        "sandbox.http_max_redirects",
        "crates/soulbased/tests/settings.rs",
        "sandbox_http_max_redirects_are_followed",
    ),
    (
        "sandbox.process_isolation",
        "crates/soulbased/tests/settings.rs",
        "sandbox_process_isolation_and_scratch_dir_shape_native_tools",
    ),
    (
        "sandbox.process_spares",
        "crates/soulbase-sandbox-process/tests/spares.rs",
        "with_no_spares_every_call_launches_afresh",
    ),
    (
        "sandbox.scratch_dir",
        "crates/soulbased/tests/settings.rs",
        "sandbox_process_isolation_and_scratch_dir_shape_native_tools",
    ),
    (
        "sandbox.wasm_max_instances_per_tenant",
        "crates/soulbase-sandbox-wasm/tests/slots.rs",
        "the_configured_share_refuses_a_tenant_at_its_cap_and_no_one_else",
    ),
    (
        "sandbox.wasm_max_memory_bytes",
        "crates/soulbased/tests/settings.rs",
        "sandbox_wasm_memory_cap_and_module_root",
    ),
    (
        "sandbox.wasm_module_root",
        "crates/soulbased/tests/settings.rs",
        "sandbox_wasm_memory_cap_and_module_root",
    ),
    // ---- server ----
    (
        "server.body_read_timeout_ms",
        "crates/soulbased/tests/limits.rs",
        "slow_bodies_are_answered_408_and_their_connection_closed",
    ),
    (
        "server.dev_insecure",
        "crates/soulbased/tests/settings.rs",
        "server_dev_insecure_trusts_the_development_headers",
    ),
    (
        "server.dev_identity.actor",
        "crates/soulbased/tests/http.rs",
        "a_dev_identity_lets_stock_clients_call_without_headers",
    ),
    (
        "server.dev_identity.tenant",
        "crates/soulbased/tests/http.rs",
        "a_dev_identity_lets_stock_clients_call_without_headers",
    ),
    (
        "server.grpc_addr",
        "crates/soulbased/tests/settings.rs",
        "server_listen_addresses_come_from_the_configuration",
    ),
    (
        "server.grpc_max_connections",
        "crates/soulbased/tests/limits.rs",
        "the_grpc_connection_cap_sheds_connections_without_a_request_first",
    ),
    (
        "server.header_read_timeout_ms",
        "crates/soulbased/tests/limits.rs",
        "slow_headers_are_cut_off",
    ),
    (
        "server.http2_keepalive_interval_ms",
        "crates/soulbased/tests/limits.rs",
        "http2_connections_are_capped_and_pinged",
    ),
    (
        "server.http2_keepalive_timeout_ms",
        "crates/soulbased/tests/limits.rs",
        "http2_connections_are_capped_and_pinged",
    ),
    (
        "server.http2_max_concurrent_streams",
        "crates/soulbased/tests/limits.rs",
        "http2_connections_are_capped_and_pinged",
    ),
    (
        "server.http_addr",
        "crates/soulbased/tests/settings.rs",
        "server_listen_addresses_come_from_the_configuration",
    ),
    (
        "server.idle_timeout_ms",
        "crates/soulbased/tests/limits.rs",
        "idle_keep_alive_connections_are_closed",
    ),
    (
        "server.internal_token_env",
        "crates/soulbased/tests/split_roles.rs",
        "role_services_refuse_callers_without_the_internal_token",
    ),
    (
        "server.internal_token_file",
        "crates/soulbased/tests/settings.rs",
        "server_internal_token_file_is_the_token_roles_require",
    ),
    (
        "server.max_body_bytes",
        "crates/soulbased/tests/limits.rs",
        "oversized_bodies_get_the_json_envelope",
    ),
    (
        "server.max_connections",
        "crates/soulbased/tests/limits.rs",
        "the_connection_cap_sheds_half_open_connections_first",
    ),
    (
        "server.mcp_allowed_origins",
        "crates/soulbased/tests/settings.rs",
        "server_mcp_allowed_origins_admit_a_browser_origin",
    ),
    (
        "server.mcp_conformance_tools",
        "crates/soulbased/tests/mcp_content.rs",
        "the_conformance_pack_answers_content_progress_and_logs_by_plain_names",
    ),
    (
        "server.mcp_max_sessions",
        "crates/soulbased/tests/mcp_sessions.rs",
        "sessions_are_capped_per_tenant_and_in_total",
    ),
    (
        "server.mcp_max_sessions_per_tenant",
        "crates/soulbased/tests/mcp_sessions.rs",
        "sessions_are_capped_per_tenant_and_in_total",
    ),
    (
        "server.mcp_session_idle_ms",
        "crates/soulbased/tests/mcp_sessions.rs",
        "idle_sessions_expire",
    ),
    (
        "server.remote.auth",
        "crates/soulbased/tests/split_roles.rs",
        "tools_with_each_role_in_its_own_process",
    ),
    (
        "server.remote.evidence",
        "crates/soulbased/tests/split_roles.rs",
        "tools_with_each_role_in_its_own_process",
    ),
    (
        "server.remote.qos",
        "crates/soulbased/tests/split_roles.rs",
        "tools_with_each_role_in_its_own_process",
    ),
    (
        "server.remote.sandbox",
        "crates/soulbased/tests/sandbox.rs",
        "the_same_runs_on_a_remote_sandbox_role",
    ),
    (
        "server.roles",
        "crates/soulbased/tests/split_roles.rs",
        "tools_with_each_role_in_its_own_process",
    ),
    (
        "server.shutdown_grace_ms",
        "crates/soulbased/tests/shutdown.rs",
        "calls_outliving_the_grace_period_are_reported_not_lost",
    ),
    (
        "server.tcp_keepalive_ms",
        "crates/soulbased/src/listener.rs",
        "accepted_sockets_are_tuned",
    ),
    (
        "server.tls.cert_file",
        "crates/soulbased/tests/tls.rs",
        "grpc_serves_over_tls_and_refuses_plaintext",
    ),
    (
        "server.tls.client_ca_file",
        "crates/soulbased/tests/tls.rs",
        "mtls_requires_a_client_certificate_from_the_configured_ca",
    ),
    (
        "server.tls.key_file",
        "crates/soulbased/tests/tls.rs",
        "grpc_serves_over_tls_and_refuses_plaintext",
    ),
    // ---- skills ----
    (
        "skills.dir",
        "crates/soulbased/tests/mcp_stdio.rs",
        "stdio_started_from_another_directory_serves_the_configured_skills",
    ),
    (
        "skills.poll_interval_ms",
        "crates/soulbased/tests/settings.rs",
        "skills_watch_and_poll_interval_ms_drive_the_watcher",
    ),
    (
        "skills.watch",
        "crates/soulbased/tests/settings.rs",
        "skills_watch_and_poll_interval_ms_drive_the_watcher",
    ),
    (
        "skills.subscriptions[].actor",
        "crates/soulbase-skills/tests/gateway.rs",
        "subscriptions_come_from_config",
    ),
    (
        "skills.subscriptions[].skill",
        "crates/soulbase-skills/tests/gateway.rs",
        "subscriptions_come_from_config",
    ),
    (
        "skills.subscriptions[].tenant",
        "crates/soulbase-skills/tests/gateway.rs",
        "subscriptions_come_from_config",
    ),
    // ---- tenants ----
    (
        "tenants[].allow",
        "crates/soulbased/tests/access.rs",
        "the_configured_view_reloads_and_a_running_call_finishes_on_the_old_one",
    ),
    (
        "tenants[].enable",
        "crates/soulbased/tests/settings.rs",
        "tenants_enable_wins_over_a_stored_pause",
    ),
    (
        "tenants[].pause",
        "crates/soulbased/tests/access.rs",
        "the_configured_view_reloads_and_a_running_call_finishes_on_the_old_one",
    ),
    (
        "tenants[].tenant",
        "crates/soulbased/tests/access.rs",
        "the_configured_view_reloads_and_a_running_call_finishes_on_the_old_one",
    ),
    // ---- auth ----
    (
        "auth.api_keys[].actor",
        "crates/soulbased/tests/settings.rs",
        "auth_api_key_entries_decide_who_a_key_is",
    ),
    (
        "auth.api_keys[].id",
        "crates/soulbased/tests/settings.rs",
        "auth_api_key_entries_decide_who_a_key_is",
    ),
    (
        "auth.api_keys[].revoked",
        "crates/soulbased/tests/settings.rs",
        "auth_api_key_entries_decide_who_a_key_is",
    ),
    (
        "auth.api_keys[].roles",
        "crates/soulbased/tests/settings.rs",
        "auth_api_key_entries_decide_who_a_key_is",
    ),
    (
        "auth.api_keys[].scopes",
        "crates/soulbased/tests/grpc.rs",
        "manifest_scopes_are_required_by_a_rule_that_asks_for_them",
    ),
    (
        "auth.api_keys[].sha256",
        "crates/soulbased/tests/settings.rs",
        "auth_api_key_entries_decide_who_a_key_is",
    ),
    (
        "auth.api_keys[].tenant",
        "crates/soulbased/tests/settings.rs",
        "auth_api_key_entries_decide_who_a_key_is",
    ),
    (
        "auth.cedar.files",
        "crates/soulbase-auth/tests/cedar.rs",
        "policy_files_are_read_and_reloaded_on_demand",
    ),
    (
        "auth.cedar.policies",
        "crates/soulbased/tests/obligations.rs",
        "cedar_permits_carry_obligations_and_bad_ones_are_refused",
    ),
    (
        "auth.consent.default_ttl_ms",
        "crates/soulbased/tests/settings.rs",
        "auth_consent_lifetimes_come_from_the_configuration",
    ),
    (
        "auth.consent.key_file",
        "crates/soulbase-app/src/app.rs",
        "consent_keys_come_from_the_configured_file_or_public_key",
    ),
    (
        "auth.consent.max_ttl_ms",
        "crates/soulbased/tests/settings.rs",
        "auth_consent_lifetimes_come_from_the_configuration",
    ),
    (
        "auth.consent.public_key",
        "crates/soulbase-app/src/app.rs",
        "consent_keys_come_from_the_configured_file_or_public_key",
    ),
    (
        "auth.consent.signing",
        "crates/soulbase-app/src/app.rs",
        "consent_keys_come_from_the_configured_file_or_public_key",
    ),
    (
        "auth.jwt[].audience",
        "crates/soulbase-auth/tests/authn.rs",
        "hs256_tokens_are_checked_for_signature_issuer_audience_and_time",
    ),
    (
        "auth.jwt[].issuer",
        "crates/soulbase-auth/tests/authn.rs",
        "hs256_tokens_are_checked_for_signature_issuer_audience_and_time",
    ),
    (
        "auth.jwt[].jwks_file",
        "crates/soulbase-auth/tests/authn.rs",
        "jwks_files_rotate_on_reload",
    ),
    (
        "auth.jwt[].leeway_s",
        "crates/soulbase-auth/tests/jwt_settings.rs",
        "leeway_s_tolerates_that_much_clock_skew",
    ),
    (
        "auth.jwt[].tenant",
        "crates/soulbase-auth/tests/authn.rs",
        "a_tenant_bound_issuer_cannot_mint_subjects_of_other_tenants",
    ),
    (
        "auth.jwt[].tenant_claim",
        "crates/soulbase-auth/tests/jwt_settings.rs",
        "tenant_claim_names_the_claim_carrying_the_tenant",
    ),
    (
        "auth.jwt[].keys[].alg",
        "crates/soulbase-auth/tests/authn.rs",
        "es256_keys_from_pem_verify_and_refuse_other_keys",
    ),
    (
        "auth.jwt[].keys[].kid",
        "crates/soulbase-auth/tests/jwt_settings.rs",
        "kid_picks_the_key_a_token_names",
    ),
    (
        "auth.jwt[].keys[].public_key_pem",
        "crates/soulbase-auth/tests/authn.rs",
        "es256_keys_from_pem_verify_and_refuse_other_keys",
    ),
    (
        "auth.jwt[].keys[].secret_env",
        "crates/soulbase-auth/tests/authn.rs",
        "hs256_tokens_are_checked_for_signature_issuer_audience_and_time",
    ),
];

/// The workspace root (this crate is `crates/soulbased`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The keys of the reference that need a row: every key but the sections (keys
/// with a table of their own, `## `K`` or `## `K[]``).
fn leaf_keys(markdown: &str) -> BTreeSet<String> {
    let mut keys = Vec::new();
    let mut sections = BTreeSet::new();
    for line in markdown.lines() {
        if let Some(title) = line.strip_prefix("## `").and_then(|t| t.strip_suffix('`')) {
            sections.insert(title.to_owned());
        } else if let Some((key, _)) = line.strip_prefix("| `").and_then(|r| r.split_once("` |")) {
            keys.push(key.to_owned());
        }
    }
    keys.into_iter()
        .filter(|k| !sections.contains(k) && !sections.contains(&format!("{k}[]")))
        .collect()
}

#[test]
fn every_key_has_a_row() {
    let keys = leaf_keys(&soulbase_config::reference::markdown());
    assert!(keys.len() > 100, "the reference was not parsed: {keys:?}");
    for section in ["server", "server.tls", "auth.api_keys", "auth.jwt[].keys"] {
        assert!(!keys.contains(section), "{section} is a section");
    }
    let mut rows = BTreeSet::new();
    for (key, _, _) in ROWS {
        assert!(rows.insert((*key).to_owned()), "{key} has two rows");
    }
    let missing: Vec<&String> = keys.difference(&rows).collect();
    let stale: Vec<&String> = rows.difference(&keys).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "keys without a row: {missing:?}; rows without a key: {stale:?}"
    );
}

#[test]
fn every_row_names_a_test_that_mentions_its_key() {
    let root = root();
    let mut sources: BTreeMap<&str, Source> = BTreeMap::new();
    let mut problems = Vec::new();
    for (key, file, test) in ROWS {
        if !sources.contains_key(file) {
            match std::fs::read_to_string(root.join(file)) {
                Ok(text) => {
                    sources.insert(file, Source::new(text));
                }
                Err(e) => {
                    problems.push(format!("{key}: {file}: {e}"));
                    continue;
                }
            }
        }
        let source = &sources[file];
        let Some(body) = source.test_body(test) else {
            problems.push(format!(
                "{key}: {file} has no test `fn {test}(` (with #[test] or #[tokio::test], not ignored)"
            ));
            continue;
        };
        let leaf = key.rsplit('.').next().unwrap_or(key).trim_end_matches("[]");
        if !source.mentions(body, leaf) {
            problems.push(format!(
                "{key}: {file}::{test} never mentions `{leaf}` (nor does anything of its file it names)"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The settings tests of this crate are real files (a typo in a row's path would
/// otherwise show only as a missing file).
#[test]
fn the_rows_files_are_under_the_workspace() {
    for (_, file, _) in ROWS {
        assert!(!file.starts_with('/') && !file.contains(".."), "{file}");
        assert!(file.starts_with("crates/"), "{file}");
    }
    assert!(root().join(SOULBASED).join("settings.rs").is_file());
}

/// A Rust source file: its text, the same text with comments and the contents of
/// string and character literals blanked (so braces and names there do not
/// count as code), and its named items (`fn`, `const`, `static`) by name.
struct Source {
    text: String,
    code: Vec<u8>,
    items: BTreeMap<String, Vec<(usize, usize)>>,
}

impl Source {
    fn new(text: String) -> Source {
        let code = blank(&text);
        let mut s = Source {
            text,
            code,
            items: BTreeMap::new(),
        };
        s.items = s.find_items();
        s
    }

    /// The body (`{ … }`) of test function `name`, as a byte range.
    fn test_body(&self, name: &str) -> Option<(usize, usize)> {
        let needle = format!("fn {name}(");
        let mut from = 0;
        while let Some(at) = find(&self.code, needle.as_bytes(), from) {
            from = at + needle.len();
            if at > 0 && is_ident(self.code[at - 1]) {
                continue;
            }
            // The attributes: from the end of the previous item (or the opening of
            // the enclosing block) to the function.
            let start = self.code[..at]
                .iter()
                .rposition(|&c| matches!(c, b'{' | b'}' | b';'))
                .map_or(0, |i| i + 1);
            let head = &self.text[start..at];
            let is_test = head.contains("#[test]") || head.contains("#[tokio::test");
            if !is_test || head.contains("#[ignore") {
                continue;
            }
            let open = self.code[from..].iter().position(|&c| c == b'{')? + from;
            return Some((open, self.matching(open)?));
        }
        None
    }

    /// Where the bracket opened at `open` closes (inclusive).
    fn matching(&self, open: usize) -> Option<usize> {
        let mut depth = 0usize;
        for (i, &c) in self.code.iter().enumerate().skip(open) {
            match c {
                b'{' | b'(' | b'[' => depth += 1,
                b'}' | b')' | b']' => {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        return Some(i);
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// Every `fn`, `const` and `static` of the file: name → (start, end) of its
    /// text (a function's up to the end of its body, a constant's to its `;`).
    fn find_items(&self) -> BTreeMap<String, Vec<(usize, usize)>> {
        let mut items: BTreeMap<String, Vec<(usize, usize)>> = BTreeMap::new();
        let code = &self.code;
        let mut i = 0;
        while i < code.len() {
            if !is_ident(code[i]) {
                i += 1;
                continue;
            }
            let word_end = code[i..]
                .iter()
                .position(|&c| !is_ident(c))
                .map_or(code.len(), |n| i + n);
            let word = &self.text[i..word_end];
            // `'static` is a lifetime, not an item.
            let preceded = i > 0 && (is_ident(code[i - 1]) || code[i - 1] == b'\'');
            if !preceded && matches!(word, "fn" | "const" | "static") {
                let name_start = code[word_end..]
                    .iter()
                    .position(|c| !c.is_ascii_whitespace())
                    .map_or(code.len(), |n| word_end + n);
                let name_end = code[name_start..]
                    .iter()
                    .position(|&c| !is_ident(c))
                    .map_or(code.len(), |n| name_start + n);
                if name_end > name_start {
                    let name = self.text[name_start..name_end].to_owned();
                    if let Some(end) = self.item_end(name_end, word == "fn") {
                        items.entry(name).or_default().push((i, end));
                    }
                }
            }
            i = word_end;
        }
        items
    }

    /// The end of an item whose name ends at `from`: a function's body's closing
    /// brace (or the `;` of a declaration without one), a constant's `;`.
    fn item_end(&self, from: usize, function: bool) -> Option<usize> {
        let mut depth = 0usize;
        for (i, &c) in self.code.iter().enumerate().skip(from) {
            match c {
                b'{' if function && depth == 0 => return self.matching(i),
                b'{' | b'(' | b'[' => depth += 1,
                b'}' | b')' | b']' => depth = depth.checked_sub(1)?,
                b';' if depth == 0 => return Some(i),
                _ => {}
            }
        }
        None
    }

    /// Whether `leaf` occurs (case-insensitively) in `body` or in an item of the
    /// file that the body names, directly or through other items.
    fn mentions(&self, body: (usize, usize), leaf: &str) -> bool {
        let leaf = leaf.to_ascii_lowercase();
        let mut seen = BTreeSet::new();
        let mut todo = vec![body];
        while let Some((start, end)) = todo.pop() {
            let text = &self.text[start..=end.min(self.text.len() - 1)];
            if text.to_ascii_lowercase().contains(&leaf) {
                return true;
            }
            for word in words(text) {
                if let Some(spans) = self.items.get(word)
                    && seen.insert(word.to_owned())
                {
                    todo.extend(spans.iter().copied());
                }
            }
        }
        false
    }
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// The identifiers of `text`.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

/// `text` with comments and the contents of string, raw string, byte string and
/// character literals replaced by spaces (same length, so offsets agree).
fn blank(text: &str) -> Vec<u8> {
    let src = text.as_bytes();
    let mut out = src.to_vec();
    let n = src.len();
    let mut i = 0;
    let clear = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(n)] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    while i < n {
        let c = src[i];
        let prev_ident = i > 0 && is_ident(src[i - 1]);
        if c == b'/' && src.get(i + 1) == Some(&b'/') {
            let end = src[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(n, |p| i + p);
            clear(&mut out, i, end);
            i = end;
        } else if c == b'/' && src.get(i + 1) == Some(&b'*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < n && depth > 0 {
                if src[j] == b'/' && src.get(j + 1) == Some(&b'*') {
                    depth += 1;
                    j += 2;
                } else if src[j] == b'*' && src.get(j + 1) == Some(&b'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            clear(&mut out, i, j);
            i = j;
        } else if (c == b'r' || (c == b'b' && src.get(i + 1) == Some(&b'r')))
            && !prev_ident
            && raw_string_at(src, i).is_some()
        {
            let end = raw_string_at(src, i).unwrap_or(n);
            clear(&mut out, i, end);
            i = end;
        } else if c == b'"' {
            let mut j = i + 1;
            while j < n && src[j] != b'"' {
                j += if src[j] == b'\\' { 2 } else { 1 };
            }
            clear(&mut out, i, j + 1);
            i = j + 1;
        } else if c == b'\'' {
            // A character literal ('x', '\n', '\u{7f}', 'é'), or a lifetime ('a).
            if src.get(i + 1) == Some(&b'\\') {
                // The escaped character is skipped: '\'' ends at its second quote.
                let end = src
                    .get(i + 3..)
                    .and_then(|rest| rest.iter().position(|&c| c == b'\''))
                    .map_or(n, |p| i + 3 + p + 1);
                clear(&mut out, i, end);
                i = end;
            } else {
                let ch_len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                if src.get(i + 1 + ch_len) == Some(&b'\'') {
                    clear(&mut out, i, i + ch_len + 2);
                    i += ch_len + 2;
                } else {
                    i += 1;
                }
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The end (exclusive) of the raw string (`r"…"`, `r#"…"#`, `br…`) starting at
/// `i`, if one does.
fn raw_string_at(src: &[u8], i: usize) -> Option<usize> {
    let mut j = i + if src[i] == b'b' { 2 } else { 1 };
    let hashes = src[j..].iter().take_while(|&&c| c == b'#').count();
    j += hashes;
    if src.get(j) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    find(src, &close, j + 1).map(|p| p + close.len())
}

#[test]
fn the_scanner_reads_test_bodies_and_items() {
    let text = r###"
const CONFIG: &str = r#"
server:
  max_body_bytes: 1
"#;
fn helper() -> String { format!("{CONFIG}") }
/// Not a test: `fn fake(`.
fn plain() { let _ = "}"; let _ = '\''; let _: &'static str = "{"; }
const NAME: &'static str = "x";
#[tokio::test(flavor = "multi_thread")]
async fn uses_a_helper() {
    let c = '{';
    let _ = helper();
}
#[test]
#[ignore]
fn ignored() { let _ = "max_body_bytes"; }
#[test]
fn direct() { let _ = "SOULBASE_SERVER__IDLE_TIMEOUT_MS"; }
"###;
    let s = Source::new(text.to_owned());
    let body = s.test_body("uses_a_helper").unwrap();
    assert!(s.text[body.0..=body.1].ends_with("helper();\n}"));
    assert!(s.mentions(body, "max_body_bytes"));
    assert!(!s.mentions(body, "tcp_keepalive_ms"));
    assert!(s.test_body("plain").is_none(), "not a test");
    assert!(s.test_body("fake").is_none(), "in a comment");
    assert!(s.test_body("ignored").is_none(), "ignored");
    assert!(s.items.contains_key("NAME") && !s.items.contains_key("str"));
    let direct = s.test_body("direct").unwrap();
    assert!(s.mentions(direct, "idle_timeout_ms"));
}
