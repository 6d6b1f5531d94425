//! The operator console, `/ui`: a page of the HTTP API's own calls, served from
//! assets embedded in the binary (`crates/soulbased/console/`: one HTML page, one
//! script, one stylesheet; no CDN, no build step).
//!
//! It adds no data route: the assets are the same for everyone and hold nothing
//! of any tenant, and everything the page shows or does is an API request made
//! with the signed-in caller's credentials (an API key, or the development
//! identity headers), which the API authorizes like any other. So the console
//! can show or do nothing its user could not with `curl`. The assets are served
//! with a strict Content-Security-Policy (same-origin script, style and
//! requests; no framing) and `nosniff`. See `docs/console.md`.

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use soulbase_app::App;

const INDEX: &str = include_str!("../console/index.html");
const SCRIPT: &str = include_str!("../console/console.js");
const STYLE: &str = include_str!("../console/console.css");

/// Same-origin everything; inline script and style refused; never framed.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

/// The console's paths (served by a process with the `tools` role, beside the
/// API it calls).
pub const PATHS: [&str; 4] = ["/ui", "/ui/", "/ui/console.js", "/ui/console.css"];

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut res = (StatusCode::OK, body).into_response();
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    res
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

/// The console's routes ([`PATHS`]).
pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route(PATHS[0], get(index))
        .route(PATHS[1], get(index))
        .route(PATHS[2], get(script))
        .route(PATHS[3], get(style))
}
