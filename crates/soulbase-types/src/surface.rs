//! Which serving surface a call came through.

use serde::{Deserialize, Serialize};

/// Which surface served a call: recorded in its Begin (so evidence can be read
/// back by surface) and used as the metrics label.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Surface {
    /// `soulbase.tools.v1.ToolInvoker`.
    Grpc,
    /// The HTTP/JSON API.
    Http,
    /// MCP `tools/call` (streamable HTTP or stdio).
    Mcp,
    /// The CLI's local mode.
    Cli,
}

impl Surface {
    /// The lowercase label (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            Surface::Grpc => "grpc",
            Surface::Http => "http",
            Surface::Mcp => "mcp",
            Surface::Cli => "cli",
        }
    }
}
