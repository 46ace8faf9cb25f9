//! The Wasmtime engine, its pooling allocator, the WASI linker and the epoch ticker.
//!
//! Pool tuning follows docs/GUEST.md §5: keeping memory and table slots resident between calls and
//! resetting them with `PAGEMAP_SCAN` (Linux ≥ 6.7) avoids madvise/munmap, whose TLB-shootdown
//! IPIs made two threads slower than one inside a VM; with it the pool reaches ~37k
//! instantiate+call per second per core.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::Linker;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::invoke::HostState;
use crate::{FncallConfig, FncallError};

/// Core instances a component may use; Rust wasip2 components use about three.
const CORE_INSTANCES_PER_COMPONENT: u32 = 4;
/// Memories and tables per component, pooled.
const MEMORIES_PER_COMPONENT: u32 = 2;

pub(crate) struct BrigEngine {
    pub engine: Engine,
    pub linker: Linker<HostState>,
    /// Identifies engine settings; precompiled artifacts are stored under it.
    pub key: String,
    /// Whether code is compiled with fuel metering.
    pub fuel: bool,
    _ticker: EpochTicker,
}

impl BrigEngine {
    pub fn new(config: &FncallConfig) -> Result<BrigEngine, FncallError> {
        let slots = config.max_concurrent_calls.max(1);
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(slots)
            .total_core_instances(slots.saturating_mul(CORE_INSTANCES_PER_COMPONENT))
            .total_memories(slots.saturating_mul(MEMORIES_PER_COMPONENT))
            .total_tables(slots.saturating_mul(MEMORIES_PER_COMPONENT))
            .total_stacks(slots)
            .max_memory_size((config.max_memory_mib << 20) as usize)
            .linear_memory_keep_resident(config.keep_resident_bytes as usize)
            .table_keep_resident(64 << 10)
            .async_stack_keep_resident(64 << 10);
        if PoolingAllocationConfig::is_pagemap_scan_available() {
            pool.pagemap_scan(Enabled::Yes);
        }
        let mut wasm = Config::new();
        wasm.epoch_interruption(true)
            .consume_fuel(config.fuel)
            .memory_init_cow(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&wasm).map_err(|e| FncallError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| FncallError::Engine(format!("{e:#}")))?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let key = format!("{:016x}", hasher.finish());
        let ticker =
            EpochTicker::start(engine.clone(), Duration::from_millis(config.epoch_tick_ms.max(1)));
        Ok(BrigEngine { engine, linker, key, fuel: config.fuel, _ticker: ticker })
    }
}

/// Advances the engine's epoch every tick until dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
}

impl EpochTicker {
    fn start(engine: Engine, tick: Duration) -> EpochTicker {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let spawned = std::thread::Builder::new().name("brig-epoch".into()).spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(tick);
                engine.increment_epoch();
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start epoch ticker; deadlines will not fire");
        }
        EpochTicker { stop }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
