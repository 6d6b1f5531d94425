//! Time-ordered UUIDv7s without a system call per id.
//!
//! Every call mints several ids (call, Begin, End), so asking the kernel for
//! randomness each time (what `Uuid::now_v7` does) costs more than the rest of an
//! in-process invocation. Each thread instead seeds a small generator once from the
//! operating system and draws the 74 random bits of each id from it.
//!
//! The ids need to be unique and time-ordered, not secret: nothing may use one as a
//! capability. Ordering holds to the millisecond; within one millisecond ids are in
//! random order.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

use uuid::{Builder, Uuid};

thread_local! {
    static STATE: Cell<u64> = Cell::new(seed());
}

/// A seed from the operating system's randomness (a v4 UUID is exactly that).
fn seed() -> u64 {
    let bytes = Uuid::new_v4().into_bytes();
    let mut seed = [0u8; 8];
    seed.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(seed)
}

/// wyrand: a 64-bit generator with a full period, good statistical quality and a
/// handful of instructions per draw.
fn next() -> u64 {
    STATE.with(|state| {
        let s = state.get().wrapping_add(0xa076_1d64_78bd_642f);
        state.set(s);
        let t = u128::from(s).wrapping_mul(u128::from(s ^ 0xe703_7ed1_a0b4_28db));
        ((t >> 64) as u64) ^ (t as u64)
    })
}

/// A fresh UUIDv7: the current Unix time in milliseconds and 74 random bits.
pub(crate) fn uuid_v7() -> Uuid {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let mut random = [0u8; 10];
    random[..8].copy_from_slice(&next().to_le_bytes());
    random[8..].copy_from_slice(&next().to_le_bytes()[..2]);
    Builder::from_unix_timestamp_millis(millis, &random).into_uuid()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn ids_are_version_7_and_distinct() {
        let ids: HashSet<Uuid> = (0..10_000).map(|_| uuid_v7()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|u| u.get_version_num() == 7));
    }

    #[test]
    fn ids_are_ordered_by_millisecond() {
        let a = uuid_v7();
        let start = SystemTime::now();
        while SystemTime::now()
            .duration_since(start)
            .map(|d| d.as_millis() < 2)
            .unwrap_or(true)
        {}
        let b = uuid_v7();
        assert!(a < b, "{a} should sort before {b}");
    }

    #[test]
    fn threads_draw_different_sequences() {
        let here = uuid_v7();
        let there = std::thread::spawn(uuid_v7).join().unwrap();
        assert_ne!(here.as_bytes()[6..], there.as_bytes()[6..]);
    }
}
