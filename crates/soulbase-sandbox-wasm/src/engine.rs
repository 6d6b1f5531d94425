//! The shared wasmtime engine: pooling allocator, epoch interruption and the ticker.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use soulbase_errors::{ErrorCode, SoulError};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the engine's epoch advances; deadlines are accurate to about this.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);

/// An engine plus the thread that ticks its epoch; the thread stops when this drops.
///
/// The thread ticks only while a run holds a [`Ticks`] (a run in progress): with
/// no WASM call running it sleeps on a condition variable, so an idle server does
/// not wake [`EPOCH_TICK`] after [`EPOCH_TICK`] for nothing. A run's deadline is
/// checked at ticks only, so a run must hold its [`Ticks`] from before it enters
/// wasm code until it has left it.
pub(crate) struct Ticking {
    pub(crate) engine: Engine,
    shared: Arc<Shared>,
}

/// What the ticker thread waits on.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    /// Runs holding a [`Ticks`].
    running: usize,
    stop: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Keeps the epoch ticking (and the engine's ticker alive) while held.
pub(crate) struct Ticks {
    ticking: Arc<Ticking>,
}

impl Drop for Ticks {
    fn drop(&mut self) {
        let mut state = self.ticking.shared.lock();
        state.running = state.running.saturating_sub(1);
    }
}

impl Ticking {
    pub(crate) fn new(max_memory: usize, max_instances: u32) -> Result<Self, SoulError> {
        let mut pool = PoolingAllocationConfig::new();
        pool.total_core_instances(max_instances)
            .total_memories(max_instances)
            .total_tables(max_instances)
            // Async calls run on fiber stacks, also taken from the pool: one per call.
            .total_stacks(max_instances)
            .max_memory_size(max_memory);
        let mut config = Config::new();
        config
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|e| {
            SoulError::of(ErrorCode::ProviderUnavailable)
                .with_note(format!("cannot start the wasm engine: {e}"))
        })?;
        let shared = Arc::new(Shared::default());
        let (e, s) = (engine.clone(), shared.clone());
        std::thread::Builder::new()
            .name("soulbase-wasm-epoch".into())
            .spawn(move || tick(&e, &s))
            .map_err(|e| {
                SoulError::of(ErrorCode::ProviderUnavailable)
                    .with_note(format!("cannot start the epoch ticker: {e}"))
            })?;
        Ok(Self { engine, shared })
    }

    /// Ticks from now until the returned guard drops.
    pub(crate) fn hold(self: &Arc<Self>) -> Ticks {
        let mut state = self.shared.lock();
        state.running += 1;
        if state.running == 1 {
            self.shared.wake.notify_one();
        }
        Ticks {
            ticking: self.clone(),
        }
    }

    /// Whether the ticker thread is ticking now (some run holds [`Ticks`]).
    #[cfg(test)]
    pub(crate) fn ticking(&self) -> bool {
        self.shared.lock().running > 0
    }
}

/// The ticker thread: advances `engine`'s epoch every [`EPOCH_TICK`] while a run
/// holds [`Ticks`]; waits otherwise; returns once stopped.
fn tick(engine: &Engine, shared: &Shared) {
    loop {
        {
            let mut state = shared.lock();
            while state.running == 0 && !state.stop {
                state = shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if state.stop {
                return;
            }
        }
        std::thread::sleep(EPOCH_TICK);
        engine.increment_epoch();
    }
}

impl Drop for Ticking {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Context switches of this process's epoch ticker thread so far.
    fn ticker_switches() -> u64 {
        let mut found = None;
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let dir = task.unwrap().path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if comm.trim() != "soulbase-wasm-e" {
                continue;
            }
            let status = std::fs::read_to_string(dir.join("status")).unwrap();
            let n: u64 = status
                .lines()
                .filter(|l| l.contains("ctxt_switches"))
                .map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap())
                .sum();
            assert!(found.is_none(), "one ticker thread in this test binary");
            found = Some(n);
        }
        found.unwrap()
    }

    /// The ticker thread sleeps while no run holds ticks and ticks while one
    /// does. (The windows are measurements: 50 windows' worth of ticks.)
    #[test]
    fn the_epoch_ticks_only_while_a_run_holds_it() {
        let ticking = Arc::new(Ticking::new(1 << 20, 1).unwrap());
        let window = EPOCH_TICK * 50;
        // Let the thread start and park.
        std::thread::sleep(EPOCH_TICK * 5);
        let idle = ticker_switches();
        std::thread::sleep(window);
        assert!(ticker_switches() - idle <= 1, "the idle ticker woke up");

        let ticks = ticking.hold();
        assert!(ticking.ticking());
        let busy = ticker_switches();
        std::thread::sleep(window);
        assert!(ticker_switches() - busy >= 10, "the ticker did not tick");

        drop(ticks);
        assert!(!ticking.ticking());
        std::thread::sleep(EPOCH_TICK * 5);
        let after = ticker_switches();
        std::thread::sleep(window);
        assert!(ticker_switches() - after <= 1, "the ticker kept ticking");
        drop(ticking);
    }
}
