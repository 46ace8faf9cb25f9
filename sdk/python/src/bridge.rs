//! Rust futures as asyncio futures, on one tokio runtime per process, safe at interpreter exit.
//!
//! A method creates an asyncio future on the running loop and spawns its Rust future on the
//! runtime; when that finishes, a tokio thread takes the GIL and schedules the result with
//! `loop.call_soon_threadsafe`. Cancelling the asyncio future aborts the Rust task.
//!
//! Exit is the delicate part: `call_soon_threadsafe` wakes the loop by writing to a socket
//! with the GIL released, so the awaiting thread can finish and the interpreter begin to
//! finalize while a tokio thread is still inside that call; retaking the GIL then kills the
//! thread mid-Rust and aborts the process. So deliveries are counted, and the `atexit` hook
//! (`_shutdown`, registered by `brig/__init__.py`) stops new ones and waits, without the GIL,
//! for those under way.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::BoundObject;
use tokio::runtime::Runtime;

static RUNTIME: LazyLock<Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("brig-sdk")
        .build()
        .unwrap_or_else(|e| panic!("cannot start the tokio runtime: {e}"))
});

static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);
static DELIVERING: AtomicUsize = AtomicUsize::new(0);
/// Longest the exit hook waits for deliveries under way.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// The process's runtime (for tasks that never touch Python, like stream pumps).
pub(crate) fn runtime() -> &'static Runtime {
    &RUNTIME
}

/// Sets a cancelled-or-not asyncio future's outcome from the loop's own thread.
#[pyclass(module = "brig")]
struct Deliver {
    future: Py<PyAny>,
    outcome: Mutex<Option<PyResult<Py<PyAny>>>>,
}

#[pymethods]
impl Deliver {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        let future = self.future.bind(py);
        if future.call_method0("done")?.extract::<bool>()? {
            return Ok(());
        }
        let outcome = self.outcome.lock().map_err(|_| PyRuntimeError::new_err("poisoned"))?.take();
        match outcome {
            Some(Ok(value)) => future.call_method1("set_result", (value,))?,
            Some(Err(e)) => future.call_method1("set_exception", (e.into_value(py),))?,
            None => return Ok(()),
        };
        Ok(())
    }
}

/// Aborts the Rust task when its asyncio future is cancelled.
#[pyclass(module = "brig")]
struct AbortOnCancel(tokio::task::AbortHandle);

#[pymethods]
impl AbortOnCancel {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future.call_method0("cancelled")?.extract::<bool>()? {
            self.0.abort();
        }
        Ok(())
    }
}

/// Runs `fut` on the runtime; returns an asyncio future of its result.
pub(crate) fn future_into_py<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let future = event_loop.call_method0("create_future")?;
    let (loop_ref, future_ref) = (event_loop.unbind(), future.clone().unbind());
    let task = RUNTIME.spawn(async move {
        let outcome = fut.await;
        deliver(loop_ref, future_ref, outcome);
    });
    future.call_method1("add_done_callback", (AbortOnCancel(task.abort_handle()),))?;
    Ok(future)
}

fn deliver<T>(event_loop: Py<PyAny>, future: Py<PyAny>, outcome: PyResult<T>)
where
    T: for<'a> IntoPyObject<'a>,
{
    if SHUTTING_DOWN.load(Ordering::Acquire) {
        return;
    }
    DELIVERING.fetch_add(1, Ordering::AcqRel);
    // Checked again after counting: `_shutdown` sets the flag, then waits for the count.
    if !SHUTTING_DOWN.load(Ordering::Acquire) {
        Python::attach(|py| {
            let outcome = outcome.and_then(|v| {
                v.into_pyobject(py).map(|b| b.into_bound().into_any().unbind()).map_err(Into::into)
            });
            let deliver = Deliver { future, outcome: Mutex::new(Some(outcome)) };
            // A closed loop (its program is gone) refuses: nobody is waiting.
            let _ = event_loop.call_method1(py, "call_soon_threadsafe", (deliver,));
        });
    }
    DELIVERING.fetch_sub(1, Ordering::AcqRel);
}

/// The `atexit` hook: no result is delivered from now on; waits for those under way.
#[pyfunction]
pub(crate) fn _shutdown(py: Python<'_>) {
    SHUTTING_DOWN.store(true, Ordering::Release);
    py.detach(|| {
        let started = Instant::now();
        while DELIVERING.load(Ordering::Acquire) > 0 && started.elapsed() < EXIT_WAIT {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}
