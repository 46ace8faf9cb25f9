//! One call: a fresh store and WASI context, instantiate from the `InstancePre`, run, classify
//! how it ended, drop everything.
//!
//! Limits and how each is enforced:
//! - deadline: the epoch callback interrupts the guest at the first tick past the deadline and
//!   yields to the executor at every earlier tick; an outer timer also covers time spent
//!   blocked in host calls;
//! - memory: a `ResourceLimiter` refuses growth past the cap (per linear memory) and records it;
//! - output: stdout and stderr are [`CappedOutput`]s that trap the guest at the cap;
//! - fuel: when the engine meters fuel, the store gets the call's budget.

use std::time::{Duration, Instant};

use brig_core::{CallOutcome, CallReport, ToolCall};
use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, Trap, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::engine::BrigEngine;
use crate::output::CappedOutput;
use crate::registry::{LoadedTool, ToolPre};
use crate::{FncallConfig, FncallError, Workspace};

wasmtime::component::bindgen!({
    path: "../../wasm-guests/wit",
    world: "tool-component",
    exports: { default: async },
});

/// Where the workspace appears inside the guest.
pub const GUEST_WORKSPACE: &str = "/workspace";
/// Extra time the outer timer allows past the deadline before cancelling the call.
const OUTER_GRACE: Duration = Duration::from_millis(250);
/// Table elements a guest may grow to.
const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Longest trap message kept.
const MAX_TRAP_MESSAGE: usize = 2048;

/// Per-store host state.
pub(crate) struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: CallLimiter,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

struct CallLimiter {
    memory_max: usize,
    memory_hit: bool,
}

impl ResourceLimiter for CallLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_max {
            self.memory_hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// Limits after defaults and clamping.
struct Effective {
    timeout: Duration,
    memory: usize,
    output: usize,
    fuel: u64,
}

impl Effective {
    fn new(config: &FncallConfig, call: &ToolCall) -> Effective {
        let l = &call.limits;
        let timeout = l
            .timeout
            .unwrap_or(Duration::from_millis(config.default_timeout_ms))
            .min(Duration::from_millis(config.max_timeout_ms));
        let memory = l
            .memory_bytes
            .unwrap_or(config.default_memory_mib << 20)
            .min(config.max_memory_mib << 20);
        let output =
            l.output_bytes.unwrap_or(config.default_output_bytes).min(config.max_output_bytes);
        Effective {
            timeout,
            memory: memory as usize,
            output: output as usize,
            fuel: l.fuel.unwrap_or(u64::MAX),
        }
    }
}

fn new_store(
    engine: &BrigEngine,
    wasi: WasiCtx,
    limits: &Effective,
    fuel: bool,
) -> Result<Store<HostState>, FncallError> {
    let state = HostState {
        wasi,
        table: ResourceTable::new(),
        limiter: CallLimiter { memory_max: limits.memory, memory_hit: false },
    };
    let mut store = Store::new(&engine.engine, state);
    store.limiter(|s| &mut s.limiter);
    if fuel {
        store
            .set_fuel(limits.fuel)
            .map_err(|e| FncallError::Internal(format!("cannot set fuel: {e:#}")))?;
    }
    let deadline = Instant::now() + limits.timeout;
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        Ok(if Instant::now() >= deadline {
            UpdateDeadline::Interrupt
        } else {
            UpdateDeadline::Yield(1)
        })
    });
    Ok(store)
}

enum Returned {
    Tool(Result<String, String>),
    Command(Result<(), ()>),
}

/// Runs `call` against `tool`. Only platform failures are `Err`.
pub(crate) async fn run(
    engine: &BrigEngine,
    config: &FncallConfig,
    tool: &LoadedTool,
    call: ToolCall,
    workspace: Option<&Workspace>,
) -> Result<CallReport, FncallError> {
    let limits = Effective::new(config, &call);
    let stdout = CappedOutput::new(limits.output);
    let stderr = CappedOutput::new(limits.output);
    let mut wasi = WasiCtxBuilder::new();
    wasi.stdin(MemoryInputPipe::new(call.stdin))
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .arg(&call.tool)
        .args(&call.args)
        .envs(&call.env);
    if let Some(ws) = workspace {
        for guest in [GUEST_WORKSPACE, "."] {
            wasi.preopened_dir(ws.path(), guest, FsPerms::ReadWrite)
                .map_err(|e| FncallError::Internal(format!("cannot preopen workspace: {e:#}")))?;
        }
        wasi.env("PWD", GUEST_WORKSPACE);
    }
    let mut store = new_store(engine, wasi.build(), &limits, config.fuel)?;
    let started = Instant::now();
    let executed = tokio::time::timeout(
        limits.timeout + OUTER_GRACE,
        execute(&mut store, &tool.pre, &call.input),
    )
    .await;
    let duration = started.elapsed();
    let (out_bytes, out_over) = stdout.take();
    let (err_bytes, err_over) = stderr.take();
    let memory_hit = store.data().limiter.memory_hit;
    let (outcome, output) = match executed {
        Err(_elapsed) => (CallOutcome::Timeout, String::new()),
        Ok(Ok(Returned::Tool(Ok(output)))) => (CallOutcome::Ok, output),
        Ok(Ok(Returned::Tool(Err(message)))) => (CallOutcome::ToolError(message), String::new()),
        Ok(Ok(Returned::Command(status))) => {
            (CallOutcome::Exit(i32::from(status.is_err())), String::new())
        }
        Ok(Err(error)) => {
            if error.downcast_ref::<wasmtime::PoolConcurrencyLimitError>().is_some() {
                return Err(FncallError::Busy(config.max_concurrent_calls));
            }
            (classify(&error, memory_hit, out_over || err_over), String::new())
        }
    };
    Ok(CallReport { outcome, output, stdout: out_bytes, stderr: err_bytes, duration })
}

async fn execute(
    store: &mut Store<HostState>,
    pre: &ToolPre,
    input: &str,
) -> wasmtime::Result<Returned> {
    match pre {
        ToolPre::Tool(pre) => {
            let bindings = pre.instantiate_async(&mut *store).await?;
            let result = bindings.brig_tool_tool().call_call(&mut *store, input).await?;
            Ok(Returned::Tool(result))
        }
        ToolPre::Command(pre) => {
            let command = pre.instantiate_async(&mut *store).await?;
            let status = command.wasi_cli_run().call_run(&mut *store).await?;
            Ok(Returned::Command(status))
        }
    }
}

/// Maps a guest error to an outcome. Order matters: an out-of-memory guest usually ends in an
/// `unreachable` trap from its allocator, and an output flood in a trap from the pipe.
fn classify(error: &wasmtime::Error, memory_hit: bool, output_over: bool) -> CallOutcome {
    if let Some(exit) = error.downcast_ref::<I32Exit>() {
        return CallOutcome::Exit(exit.0);
    }
    if output_over {
        return CallOutcome::OutputOverflow;
    }
    if memory_hit {
        return CallOutcome::OutOfMemory;
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => CallOutcome::Timeout,
        Some(Trap::OutOfFuel) => CallOutcome::FuelExhausted,
        _ => {
            let mut message = format!("{error:#}");
            if message.len() > MAX_TRAP_MESSAGE {
                let mut cut = MAX_TRAP_MESSAGE;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
            }
            CallOutcome::Trap(message)
        }
    }
}

/// Asks a tool component to describe itself (at registration), under default limits.
pub(crate) async fn describe(
    engine: &BrigEngine,
    pre: &ToolComponentPre<HostState>,
) -> Result<String, FncallError> {
    let limits = Effective {
        timeout: Duration::from_secs(2),
        memory: 64 << 20,
        output: 64 << 10,
        fuel: u64::MAX,
    };
    let mut store = new_store(engine, WasiCtxBuilder::new().build(), &limits, engine.fuel)?;
    let described = async {
        let bindings = pre.instantiate_async(&mut store).await?;
        bindings.brig_tool_tool().call_describe(&mut store).await
    };
    match tokio::time::timeout(limits.timeout + OUTER_GRACE, described).await {
        Ok(Ok(info)) => Ok(info.description),
        Ok(Err(e)) => Err(FncallError::InvalidComponent(format!("describe() failed: {e:#}"))),
        Err(_) => Err(FncallError::InvalidComponent("describe() did not return within 2 s".into())),
    }
}
