//! `brig._native`: the Brig Rust SDK (brig-sdk) for Python, on one tokio runtime per process
//! bridged to asyncio (`bridge`). The Python package `brig` re-exports these
//! classes and adds the exception classes (`brig.errors`) and a synchronous `Client`.
//!
//! ```text
//! Python (asyncio)  ── await ──▶  bridge::future_into_py ──▶ tokio task ──▶ brig-sdk ──QUIC──▶ brigd
//! ```
//! Every method that talks to brigd returns an awaitable; its work runs on the tokio runtime
//! without the GIL. Streams (command output, audit events) are pumped by tokio tasks into
//! channels, so a cancelled Python task never leaves a stream half read.
#![deny(unsafe_code)]

mod bridge;
mod client;
mod convert;
mod errors;
mod exec;
mod sandbox;

use pyo3::prelude::*;

#[pymodule(name = "_native")]
fn brig_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::PyClient>()?;
    m.add_class::<client::PyAuditStream>()?;
    m.add_class::<sandbox::PySandbox>()?;
    m.add_class::<exec::PyExecResult>()?;
    m.add_class::<exec::PyExecStream>()?;
    m.add_class::<exec::PySession>()?;
    m.add_class::<exec::PyCallResult>()?;
    m.add_class::<bridge::Coroutine>()?;
    m.add_function(wrap_pyfunction!(bridge::_shutdown, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
