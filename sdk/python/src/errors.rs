//! Brig errors as Python exceptions. The classes live in `brig/errors.py` (one per Brig error
//! code, under `BrigError`, each with `code` and `retryable`); this module picks the class
//! for an SDK error. The exception is built lazily, when Python raises it, so an error can be
//! made on a tokio thread without the GIL.

use brig_sdk::{Error, ErrorCode};
use pyo3::import_exception;
use pyo3::PyErr;

import_exception!(brig.errors, BrigError);
import_exception!(brig.errors, Unauthenticated);
import_exception!(brig.errors, VersionMismatch);
import_exception!(brig.errors, BadRequest);
import_exception!(brig.errors, SandboxNotFound);
import_exception!(brig.errors, AlreadyExists);
import_exception!(brig.errors, PermissionDenied);
import_exception!(brig.errors, InvalidComponent);
import_exception!(brig.errors, ResourceExhausted);
import_exception!(brig.errors, Unavailable);
import_exception!(brig.errors, Conflict);
import_exception!(brig.errors, TooLarge);
import_exception!(brig.errors, InternalError);
import_exception!(brig.errors, Expired);
import_exception!(brig.errors, DataLoss);
import_exception!(brig.errors, SandboxLost);
import_exception!(brig.errors, QuotaExceeded);
import_exception!(brig.errors, ConnectionFailed);
import_exception!(brig.errors, ConfigError);

/// The message with its causes (`cannot connect to brigd at …: <why>`).
fn message(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The Python exception for an SDK error.
pub(crate) fn to_py(e: Error) -> PyErr {
    let args = (message(&e), e.code().map(ErrorCode::as_str), e.retryable());
    match e.code() {
        Some(ErrorCode::Unauthenticated) => PyErr::new::<Unauthenticated, _>(args),
        Some(ErrorCode::VersionMismatch) => PyErr::new::<VersionMismatch, _>(args),
        Some(ErrorCode::BadRequest) => PyErr::new::<BadRequest, _>(args),
        Some(ErrorCode::NotFound) => PyErr::new::<SandboxNotFound, _>(args),
        Some(ErrorCode::AlreadyExists) => PyErr::new::<AlreadyExists, _>(args),
        Some(ErrorCode::PermissionDenied) => PyErr::new::<PermissionDenied, _>(args),
        Some(ErrorCode::InvalidComponent) => PyErr::new::<InvalidComponent, _>(args),
        Some(ErrorCode::ResourceExhausted) => PyErr::new::<ResourceExhausted, _>(args),
        Some(ErrorCode::Unavailable) => PyErr::new::<Unavailable, _>(args),
        Some(ErrorCode::Conflict) => PyErr::new::<Conflict, _>(args),
        Some(ErrorCode::TooLarge) => PyErr::new::<TooLarge, _>(args),
        Some(ErrorCode::Internal) => PyErr::new::<InternalError, _>(args),
        Some(ErrorCode::Expired) => PyErr::new::<Expired, _>(args),
        Some(ErrorCode::DataLoss) => PyErr::new::<DataLoss, _>(args),
        Some(ErrorCode::SandboxLost) => PyErr::new::<SandboxLost, _>(args),
        Some(ErrorCode::QuotaExceeded) => PyErr::new::<QuotaExceeded, _>(args),
        None => match e {
            Error::Connect { .. } | Error::Transport(_) | Error::ShortDownload { .. } => {
                PyErr::new::<ConnectionFailed, _>(args)
            }
            Error::Config(_) | Error::LocalIo { .. } => PyErr::new::<ConfigError, _>(args),
            _ => PyErr::new::<BrigError, _>(args),
        },
    }
}
