//! Rust futures as asyncio awaitables, safe at interpreter exit.
//!
//! pyo3-async-runtimes hands a finished future's result to its asyncio future from a tokio
//! thread, taking the GIL. After Python has begun to finalize that is a crash, and tokio
//! threads outlive the interpreter. So `brig` registers an `atexit` hook (`_shutdown`): from
//! then on no future delivers anything; they stay pending until the process is gone.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::LazyLock;

use pyo3::prelude::*;
use tokio::sync::Notify;

static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);
static SHUTDOWN: LazyLock<Notify> = LazyLock::new(Notify::new);

async fn shutdown() {
    loop {
        let woken = SHUTDOWN.notified();
        if SHUTTING_DOWN.load(Ordering::Acquire) {
            return;
        }
        woken.await;
    }
}

/// `pyo3_async_runtimes::tokio::future_into_py`, except that nothing is delivered once the
/// interpreter is exiting.
pub(crate) fn future_into_py<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let out = tokio::select! {
            out = fut => out,
            () = shutdown() => std::future::pending().await,
        };
        if SHUTTING_DOWN.load(Ordering::Acquire) {
            std::future::pending::<()>().await;
        }
        out
    })
}

/// Called by `atexit`: stops every future from delivering its result.
#[pyfunction]
pub(crate) fn _shutdown() {
    SHUTTING_DOWN.store(true, Ordering::Release);
    SHUTDOWN.notify_waiters();
}
