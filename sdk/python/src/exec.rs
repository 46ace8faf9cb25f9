//! Results and streams of commands and calls: `ExecResult`, `ExecStream` (an async iterator
//! of output chunks), `Session` (a persistent shell) and `CallResult`.

use std::sync::{Arc, Mutex};

use crate::bridge::future_into_py;
use brig_sdk::{CallOutcome, ExecEvent, ExecOutput, ExecStdin, ShellSession};
use pyo3::exceptions::{PyRuntimeError, PyStopAsyncIteration};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::mpsc;

use crate::errors::to_py;

/// How a finished command ended, with its output.
#[pyclass(module = "brig", name = "ExecResult", frozen)]
pub struct PyExecResult {
    pub(crate) out: ExecOutput,
}

#[pymethods]
impl PyExecResult {
    #[getter]
    fn exec_id(&self) -> u64 {
        self.out.exec_id
    }
    #[getter]
    fn stdout<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.out.stdout)
    }
    #[getter]
    fn stderr<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.out.stderr)
    }
    /// Stdout decoded as UTF-8 (invalid bytes replaced).
    #[getter]
    fn stdout_text(&self) -> String {
        self.out.stdout_text()
    }
    #[getter]
    fn stderr_text(&self) -> String {
        self.out.stderr_text()
    }
    /// The exit code, or `None` when a signal ended it.
    #[getter]
    fn exit_code(&self) -> Option<i32> {
        self.out.result.exit_code
    }
    #[getter]
    fn signal(&self) -> Option<i32> {
        self.out.result.signal
    }
    #[getter]
    fn ok(&self) -> bool {
        self.out.success()
    }
    #[getter]
    fn timed_out(&self) -> bool {
        self.out.result.timed_out
    }
    #[getter]
    fn killed(&self) -> bool {
        self.out.result.killed
    }
    /// Output passed the cap; what is here stops at it.
    #[getter]
    fn truncated(&self) -> bool {
        self.out.result.truncated
    }
    #[getter]
    fn oom_killed(&self) -> bool {
        self.out.result.oom_killed
    }
    #[getter]
    fn duration_ms(&self) -> f64 {
        self.out.result.duration_us as f64 / 1000.0
    }
    fn __repr__(&self) -> String {
        format!(
            "ExecResult(exit_code={}, signal={}, stdout={} B, stderr={} B, truncated={})",
            self.out.result.exit_code.map_or("None".into(), |c| c.to_string()),
            self.out.result.signal.map_or("None".into(), |s| s.to_string()),
            self.out.stdout.len(),
            self.out.stderr.len(),
            if self.out.result.truncated { "True" } else { "False" }
        )
    }
}

/// A chunk of a running command's output, or its end.
enum Chunk {
    Out(&'static str, bytes::Bytes),
    End(brig_sdk::ExecResult),
    Failed(brig_sdk::Error),
}

/// A running command. `async for stream, data in it` yields `("stdout" | "stderr", bytes)`
/// as output arrives; `await it.wait()` gives the `ExecResult` (with the output not yet read).
/// A task pumps the command's stream, so cancelling a Python task that awaits it never leaves
/// the stream half read; the command runs on and `AsyncSandbox.attach(exec_id)` finds it again.
#[pyclass(module = "brig", name = "ExecStream", frozen)]
pub struct PyExecStream {
    exec_id: u64,
    chunks: Arc<tokio::sync::Mutex<mpsc::Receiver<Chunk>>>,
    stdin: Arc<tokio::sync::Mutex<Option<ExecStdin>>>,
    result: Arc<Mutex<Option<brig_sdk::ExecResult>>>,
}

/// Chunks in flight between the pump and Python.
const CHUNK_QUEUE: usize = 64;

impl PyExecStream {
    pub(crate) fn start(mut stream: brig_sdk::ExecStream) -> PyExecStream {
        let exec_id = stream.exec_id();
        let stdin = stream.take_stdin();
        let (tx, rx) = mpsc::channel(CHUNK_QUEUE);
        // Called inside a task on the bridge's runtime (a method's future).
        tokio::spawn(async move {
            while let Some(event) = stream.next().await {
                let chunk = match event {
                    Ok(ExecEvent::Stdout(b)) => Chunk::Out("stdout", b),
                    Ok(ExecEvent::Stderr(b)) => Chunk::Out("stderr", b),
                    Ok(ExecEvent::Exited(r)) => Chunk::End(r),
                    Err(e) => Chunk::Failed(e),
                };
                if tx.send(chunk).await.is_err() {
                    break;
                }
            }
        });
        PyExecStream {
            exec_id,
            chunks: Arc::new(tokio::sync::Mutex::new(rx)),
            stdin: Arc::new(tokio::sync::Mutex::new(stdin)),
            result: Arc::default(),
        }
    }
}

#[pymethods]
impl PyExecStream {
    /// The command's id (`AsyncSandbox.kill`, `attach`).
    #[getter]
    fn exec_id(&self) -> u64 {
        self.exec_id
    }

    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (chunks, result) = (self.chunks.clone(), self.result.clone());
        future_into_py(py, async move {
            match chunks.lock().await.recv().await {
                Some(Chunk::Out(stream, data)) => Ok((stream, data.to_vec())),
                Some(Chunk::End(r)) => {
                    *result.lock().map_err(|_| PyRuntimeError::new_err("poisoned"))? = Some(r);
                    Err(PyStopAsyncIteration::new_err(()))
                }
                Some(Chunk::Failed(e)) => Err(to_py(e)),
                None => Err(PyStopAsyncIteration::new_err(())),
            }
        })
    }

    /// Reads the rest and returns the result, with the output not taken by iteration.
    fn wait<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (chunks, result, exec_id) = (self.chunks.clone(), self.result.clone(), self.exec_id);
        future_into_py(py, async move {
            let mut out = ExecOutput { exec_id, ..Default::default() };
            let mut chunks = chunks.lock().await;
            loop {
                match chunks.recv().await {
                    Some(Chunk::Out("stdout", data)) => out.stdout.extend_from_slice(&data),
                    Some(Chunk::Out(_, data)) => out.stderr.extend_from_slice(&data),
                    Some(Chunk::End(r)) => {
                        out.result = r;
                        break;
                    }
                    Some(Chunk::Failed(e)) => return Err(to_py(e)),
                    None => {
                        let seen =
                            result.lock().map_err(|_| PyRuntimeError::new_err("poisoned"))?;
                        match seen.clone() {
                            Some(r) => {
                                out.result = r;
                                break;
                            }
                            None => {
                                return Err(PyRuntimeError::new_err(
                                    "the stream ended without a result",
                                ))
                            }
                        }
                    }
                }
            }
            *result.lock().map_err(|_| PyRuntimeError::new_err("poisoned"))? =
                Some(out.result.clone());
            Ok(PyExecResult { out })
        })
    }

    /// Writes to the command's stdin (`exec_stream(..., stdin=True)`).
    fn write_stdin<'py>(&self, py: Python<'py>, data: Vec<u8>) -> PyResult<Bound<'py, PyAny>> {
        let stdin = self.stdin.clone();
        future_into_py(py, async move {
            let mut stdin = stdin.lock().await;
            let writer = stdin
                .as_mut()
                .ok_or_else(|| PyRuntimeError::new_err("no stdin: start it with stdin=True"))?;
            writer.write(data).await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    /// Ends the command's stdin.
    fn close_stdin<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let stdin = self.stdin.clone();
        future_into_py(py, async move {
            if let Some(mut writer) = stdin.lock().await.take() {
                writer.close().map_err(to_py)?;
            }
            Ok(None::<()>)
        })
    }
}

/// A persistent shell in a sandbox: state (cwd, variables) carries across `run` calls.
#[pyclass(module = "brig", name = "Session", frozen)]
pub struct PySession {
    pub(crate) inner: ShellSession,
}

#[pymethods]
impl PySession {
    #[getter]
    fn id(&self) -> String {
        self.inner.id().to_string()
    }

    /// Runs `command`; returns `{"stdout", "stderr", "exit_code", "cwd"}` (`exit_code` is
    /// `None` while it still runs at `timeout`: `wait`, `input` or `interrupt` it).
    #[pyo3(signature = (command, timeout = 60.0))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        command: String,
        timeout: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (session, timeout) = (self.inner.clone(), seconds(timeout)?);
        future_into_py(py, async move {
            session.run(&command, timeout).await.map(SessionResult).map_err(to_py)
        })
    }

    #[pyo3(signature = (timeout = 60.0))]
    fn wait<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Bound<'py, PyAny>> {
        let (session, timeout) = (self.inner.clone(), seconds(timeout)?);
        future_into_py(
            py,
            async move { session.wait(timeout).await.map(SessionResult).map_err(to_py) },
        )
    }

    /// Types `data` into the running command.
    fn input<'py>(&self, py: Python<'py>, data: Vec<u8>) -> PyResult<Bound<'py, PyAny>> {
        let session = self.inner.clone();
        future_into_py(py, async move {
            session.input(&data).await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    /// Ctrl-C to the running command.
    fn interrupt<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let session = self.inner.clone();
        future_into_py(py, async move {
            session.interrupt().await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }

    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let session = self.inner.clone();
        future_into_py(py, async move {
            session.close().await.map_err(to_py)?;
            Ok(None::<()>)
        })
    }
}

fn seconds(s: f64) -> PyResult<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(s)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("{s} s: {e}")))
}

/// A session command's output, as a `brig.records.SessionOutput`.
struct SessionResult(brig_sdk::SessionOutput);

impl<'py> IntoPyObject<'py> for SessionResult {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        let out = serde_json::json!({
            "stdout": String::from_utf8_lossy(&self.0.stdout),
            "stderr": String::from_utf8_lossy(&self.0.stderr),
            "exit_code": self.0.exit_code,
            "cwd": self.0.cwd,
        });
        crate::convert::Json::record("SessionOutput", &out)?.into_pyobject(py)
    }
}

/// How a tool call ended. A guest failure is an outcome, not an exception.
#[pyclass(module = "brig", name = "CallResult", frozen)]
pub struct PyCallResult {
    pub(crate) inner: brig_sdk::CallResult,
}

#[pymethods]
impl PyCallResult {
    /// `ok`, `tool_error`, `exit`, `timeout`, `out_of_memory`, `output_overflow`,
    /// `fuel_exhausted` or `trap`.
    #[getter]
    fn outcome(&self) -> &'static str {
        match self.inner.outcome {
            CallOutcome::Ok => "ok",
            CallOutcome::ToolError(_) => "tool_error",
            CallOutcome::Exit(_) => "exit",
            CallOutcome::Timeout => "timeout",
            CallOutcome::OutOfMemory => "out_of_memory",
            CallOutcome::OutputOverflow => "output_overflow",
            CallOutcome::FuelExhausted => "fuel_exhausted",
            CallOutcome::Trap(_) => "trap",
        }
    }
    /// The tool returned `ok` or the command exited 0.
    #[getter]
    fn ok(&self) -> bool {
        self.inner.is_success()
    }
    /// The `ok` string of a `brig:tool` call.
    #[getter]
    fn output(&self) -> String {
        self.inner.output.clone()
    }
    /// The tool's error message or the trap's description.
    #[getter]
    fn error(&self) -> Option<String> {
        match &self.inner.outcome {
            CallOutcome::ToolError(m) | CallOutcome::Trap(m) => Some(m.clone()),
            _ => None,
        }
    }
    #[getter]
    fn exit_code(&self) -> Option<i32> {
        match self.inner.outcome {
            CallOutcome::Exit(code) => Some(code),
            _ => None,
        }
    }
    #[getter]
    fn stdout<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.stdout)
    }
    #[getter]
    fn stderr<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.stderr)
    }
    #[getter]
    fn duration_us(&self) -> u64 {
        self.inner.duration_us
    }
    fn __repr__(&self) -> String {
        format!("CallResult(outcome={:?}, output={:?})", self.outcome(), self.inner.output)
    }
}
