//! Named points on a keyed call's path where a test can stop the process (a crash
//! drill): the hook is called at each point and may, e.g., kill the process there.

use std::sync::Arc;

/// A point on a keyed call's path, in the order a call passes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// The key is claimed (owned); nothing else happened yet.
    Claimed,
    /// The call's Begin is durable; the key is not yet marked begun.
    Begun,
    /// The key is marked begun; the tool has not run yet.
    Running,
    /// The tool ran; neither its End nor its outcome is stored.
    Executed,
    /// The outcome and the End are stored together (the idempotency store); the
    /// End is not yet in the evidence sink.
    Completed,
    /// The End is recorded in the evidence sink; the caller has no answer yet.
    Ended,
}

impl FaultPoint {
    /// Every point, in path order.
    pub const ALL: [FaultPoint; 6] = [
        FaultPoint::Claimed,
        FaultPoint::Begun,
        FaultPoint::Running,
        FaultPoint::Executed,
        FaultPoint::Completed,
        FaultPoint::Ended,
    ];

    /// The point's name (`claimed`, `begun`, `running`, `executed`, `completed`,
    /// `ended`).
    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::Claimed => "claimed",
            FaultPoint::Begun => "begun",
            FaultPoint::Running => "running",
            FaultPoint::Executed => "executed",
            FaultPoint::Completed => "completed",
            FaultPoint::Ended => "ended",
        }
    }

    /// The point named `name`.
    pub fn from_name(name: &str) -> Option<FaultPoint> {
        FaultPoint::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// Called at every [`FaultPoint`] a keyed call passes (tests only; none by default).
pub type FaultHook = Arc<dyn Fn(FaultPoint) + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in FaultPoint::ALL {
            assert_eq!(FaultPoint::from_name(p.name()), Some(p));
        }
        assert_eq!(FaultPoint::from_name("nowhere"), None);
    }
}
