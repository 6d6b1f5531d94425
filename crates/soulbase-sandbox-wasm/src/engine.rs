//! The shared wasmtime engine: pooling allocator, epoch interruption and the ticker.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use soulbase_errors::{ErrorCode, SoulError};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the engine's epoch advances; deadlines are accurate to about this.
pub const EPOCH_TICK: Duration = Duration::from_millis(2);

/// An engine plus the thread that ticks its epoch; the thread stops when this drops.
pub(crate) struct Ticking {
    pub(crate) engine: Engine,
    stop: Arc<AtomicBool>,
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
        let stop = Arc::new(AtomicBool::new(false));
        let (e, s) = (engine.clone(), stop.clone());
        std::thread::Builder::new()
            .name("soulbase-wasm-epoch".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    e.increment_epoch();
                }
            })
            .map_err(|e| {
                SoulError::of(ErrorCode::ProviderUnavailable)
                    .with_note(format!("cannot start the epoch ticker: {e}"))
            })?;
        Ok(Self { engine, stop })
    }
}

impl Drop for Ticking {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
