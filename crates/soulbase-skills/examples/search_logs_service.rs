//! The example HTTP service behind `skills/search_logs.yaml`.
//!
//! ```sh
//! SEARCH_LOGS_TOKEN=dev cargo run -p soulbase-skills --example search_logs_service
//! curl -s -XPOST localhost:8081/execute -H 'Authorization: Bearer dev' \
//!      -d '{"namespace":"default","pod":"web-0","keyword":"ERROR"}'
//! ```
//!
//! Listens on `SEARCH_LOGS_ADDR` (default `127.0.0.1:8081`); requires the bearer
//! token in `SEARCH_LOGS_TOKEN` when it is set.

#![allow(missing_docs)]

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let addr = std::env::var("SEARCH_LOGS_ADDR").unwrap_or_else(|_| "127.0.0.1:8081".into());
    let token = std::env::var("SEARCH_LOGS_TOKEN").ok();
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("search_logs service on http://{addr}/execute");
    soulbase_skills::service::serve(listener, token).await;
    Ok(())
}
