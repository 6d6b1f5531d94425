//! Where a call came from.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::IdError;

/// The origin of a call: proposed by a model, made by an API client, or by the system itself.
///
/// Policies may treat origins differently (e.g. require consent only for `llm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// A tool call proposed by an LLM.
    Llm,
    /// A direct call by an API client.
    Api,
    /// A call made by Soulbase or a trusted internal component.
    System,
}

impl Origin {
    /// The lowercase wire name: `llm`, `api` or `system`.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Llm => "llm",
            Origin::Api => "api",
            Origin::System => "system",
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Origin {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        match s {
            "llm" => Ok(Origin::Llm),
            "api" => Ok(Origin::Api),
            "system" => Ok(Origin::System),
            _ => Err(IdError::new("origin", s, "must be one of llm, api, system")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for o in [Origin::Llm, Origin::Api, Origin::System] {
            assert_eq!(o.as_str().parse::<Origin>().unwrap(), o);
            assert_eq!(serde_json::to_string(&o).unwrap(), format!("\"{o}\""));
        }
        assert!("LLM".parse::<Origin>().is_err());
    }
}
