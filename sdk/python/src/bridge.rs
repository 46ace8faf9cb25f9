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
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::BoundObject;
use tokio::runtime::Runtime;

/// The runtime, or why it could not start (no threads or descriptors left): every call then
/// raises `RuntimeError` with it, and the process goes on.
static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);
static DELIVERING: AtomicUsize = AtomicUsize::new(0);
/// Longest the exit hook waits for deliveries under way.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// The process's runtime, started by the first call.
fn runtime() -> PyResult<&'static Runtime> {
    let started = RUNTIME.get_or_init(|| {
        // tokio panics, rather than failing, when it cannot start a worker thread: caught, and
        // kept off stderr meanwhile (the caller hears it as a RuntimeError). The hook is the
        // process's: a panic of another thread in this moment would go unprinted too.
        let printing = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let build = std::panic::catch_unwind(|| {
            tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("brig-sdk").build()
        });
        std::panic::set_hook(printing);
        match build {
            Ok(built) => built.map_err(|e| e.to_string()),
            Err(panic) => Err(panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "it panicked".into())),
        }
    });
    started
        .as_ref()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the tokio runtime: {e}")))
}

/// A finished future's outcome, made into a Python object on the loop's thread.
type Outcome = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// Results waiting for one event loop. Many finish at once under load, so they are handed
/// over in batches: the first result of a batch schedules one `drain` on the loop
/// (`call_soon_threadsafe`, which takes the GIL and wakes the loop); the rest only queue.
struct LoopQueue {
    event_loop: Py<PyAny>,
    pending: Mutex<Vec<(Waiting, Outcome)>>,
    scheduled: AtomicBool,
}

/// Who takes an outcome on the loop: a future (its result), or a callback (called with it).
enum Waiting {
    Future(Py<PyAny>),
    Callback(Arc<Py<PyAny>>),
}

/// Event loops by `id()`, each with its queue.
static QUEUES: LazyLock<Mutex<std::collections::HashMap<usize, Arc<LoopQueue>>>> =
    LazyLock::new(Mutex::default);

fn queue_for(event_loop: &Bound<'_, PyAny>) -> Arc<LoopQueue> {
    let key = event_loop.as_ptr() as usize;
    let mut queues = QUEUES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    queues
        .entry(key)
        .or_insert_with(|| {
            Arc::new(LoopQueue {
                event_loop: event_loop.clone().unbind(),
                pending: Mutex::default(),
                scheduled: AtomicBool::new(false),
            })
        })
        .clone()
}

/// Runs on the loop: sets every queued future's outcome (unless it was cancelled meanwhile).
#[pyclass(module = "brig")]
struct Drain(Arc<LoopQueue>);

#[pymethods]
impl Drain {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        self.0.scheduled.store(false, Ordering::Release);
        let batch = std::mem::take(
            &mut *self.0.pending.lock().map_err(|_| PyRuntimeError::new_err("poisoned"))?,
        );
        for (waiting, outcome) in batch {
            let future = match waiting {
                Waiting::Future(future) => future,
                Waiting::Callback(callback) => {
                    // A callback's own error is the program's: shown, and the rest go on.
                    if let Err(e) = outcome(py).and_then(|v| callback.call1(py, (v,))) {
                        e.print(py);
                    }
                    continue;
                }
            };
            let future = future.bind(py);
            if future.call_method0("done")?.extract::<bool>()? {
                continue;
            }
            match outcome(py) {
                Ok(value) => future.call_method1("set_result", (value,))?,
                Err(e) => future.call_method1("set_exception", (e.into_value(py),))?,
            };
        }
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

/// What every async method returns: a coroutine over the asyncio future of its Rust task.
/// `brig/__init__.py` registers it as a `collections.abc.Coroutine`, so `asyncio.create_task`,
/// `TaskGroup.create_task`, `gather` and `wait_for` take it as they take an `async def`'s;
/// awaiting it awaits the future. An exception thrown in (a cancelled task) cancels the future,
/// which aborts the Rust task.
#[pyclass(module = "brig", name = "Coroutine")]
pub(crate) struct Coroutine {
    future: Py<PyAny>,
    /// The future's `__await__` iterator, made at the first step.
    steps: Mutex<Option<Py<PyAny>>>,
}

impl Coroutine {
    fn steps(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let mut steps = self.steps.lock().map_err(|_| PyRuntimeError::new_err("poisoned"))?;
        if let Some(it) = steps.as_ref() {
            return Ok(it.clone_ref(py));
        }
        let it = self.future.bind(py).call_method0("__await__")?.unbind();
        *steps = Some(it.clone_ref(py));
        Ok(it)
    }
}

#[pymethods]
impl Coroutine {
    fn __await__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.steps(py)
    }

    fn send(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.steps(py)?.call_method1(py, "send", (value,))
    }

    #[pyo3(signature = (kind, value=None, traceback=None))]
    fn throw(
        &self,
        py: Python<'_>,
        kind: &Bound<'_, PyAny>,
        value: Option<&Bound<'_, PyAny>>,
        traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        // Whoever awaited it gives up on the result: the work stops too.
        self.future.bind(py).call_method0("cancel")?;
        let steps = self.steps(py)?;
        match (value, traceback) {
            (None, _) => steps.call_method1(py, "throw", (kind,)),
            (Some(v), None) => steps.call_method1(py, "throw", (kind, v)),
            (Some(v), Some(tb)) => steps.call_method1(py, "throw", (kind, v, tb)),
        }
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.future.bind(py).call_method0("cancel")?;
        Ok(())
    }
}

static GET_RUNNING_LOOP: pyo3::sync::PyOnceLock<Py<PyAny>> = pyo3::sync::PyOnceLock::new();

/// Runs `fut` on the runtime; returns a [`Coroutine`] over an asyncio future of its result.
pub(crate) fn future_into_py<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let get_loop = GET_RUNNING_LOOP.get_or_try_init(py, || {
        py.import("asyncio")?.getattr("get_running_loop").map(Bound::unbind)
    })?;
    let event_loop = get_loop.call0(py)?.into_bound(py);
    let future = event_loop.call_method0("create_future")?;
    let (queue, future_ref) = (queue_for(&event_loop), future.clone().unbind());
    let task = runtime()?.spawn(async move {
        let outcome = fut.await;
        let outcome: Outcome = Box::new(move |py| {
            outcome.and_then(|v| {
                v.into_pyobject(py).map(|b| b.into_bound().into_any().unbind()).map_err(Into::into)
            })
        });
        deliver(&queue, Waiting::Future(future_ref), outcome);
    });
    future.call_method1("add_done_callback", (AbortOnCancel(task.abort_handle()),))?;
    let coroutine = Coroutine { future: future.unbind(), steps: Mutex::new(None) };
    Ok(Bound::new(py, coroutine)?.into_any())
}

/// A Python callable that Rust tasks call on the event loop running now (it is scheduled
/// there, as results are), so the program's callback runs on its own thread.
#[derive(Clone)]
pub(crate) struct LoopCallback {
    queue: Arc<LoopQueue>,
    callback: Arc<Py<PyAny>>,
}

impl LoopCallback {
    pub(crate) fn new(py: Python<'_>, callback: Py<PyAny>) -> PyResult<LoopCallback> {
        let get_loop = GET_RUNNING_LOOP.get_or_try_init(py, || {
            py.import("asyncio")?.getattr("get_running_loop").map(Bound::unbind)
        })?;
        let event_loop = get_loop.call0(py)?.into_bound(py);
        Ok(LoopCallback { queue: queue_for(&event_loop), callback: Arc::new(callback) })
    }

    /// Schedules a call with `value` (made into a Python object on the loop).
    pub(crate) fn call<T: for<'a> IntoPyObject<'a> + Send + 'static>(&self, value: T) {
        let outcome: Outcome = Box::new(move |py| {
            value.into_pyobject(py).map(|b| b.into_bound().into_any().unbind()).map_err(Into::into)
        });
        deliver(&self.queue, Waiting::Callback(self.callback.clone()), outcome);
    }
}

fn deliver(queue: &Arc<LoopQueue>, waiting: Waiting, outcome: Outcome) {
    if SHUTTING_DOWN.load(Ordering::Acquire) {
        return;
    }
    queue
        .pending
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((waiting, outcome));
    if queue.scheduled.swap(true, Ordering::AcqRel) {
        return;
    }
    DELIVERING.fetch_add(1, Ordering::AcqRel);
    // Checked again after counting: `_shutdown` sets the flag, then waits for the count.
    if !SHUTTING_DOWN.load(Ordering::Acquire) {
        Python::attach(|py| {
            // A closed loop (its program is gone) refuses: nobody is waiting.
            let drain = Drain(queue.clone());
            if queue.event_loop.call_method1(py, "call_soon_threadsafe", (drain,)).is_err() {
                queue.scheduled.store(false, Ordering::Release);
            }
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
