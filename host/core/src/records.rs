//! The tier part of a sandbox's record: what a restarted node needs to take a sandbox back,
//! tagged with the kind of record it is and its version. Its body is the tier's own type
//! (the tier crate owns it: `brig_container::record::ContainerRecord`,
//! `brig_vmtier::MachineRecord`, …); the node stores it without knowing its fields.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A tier's record of one sandbox ([`crate::Sandbox::record`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierRecord {
    /// Which kind of record it is (each tier crate names its own).
    pub kind: String,
    /// The version of the body's format.
    pub version: u32,
    pub body: serde_json::Value,
}

/// A tier record that is not what its reader takes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("a {found} record is not a {expected} record")]
    Kind { found: String, expected: &'static str },
    #[error("{kind} record version {found}; this build reads versions 1 to {max}")]
    Version { kind: &'static str, found: u32, max: u32 },
    #[error("{kind} record: {why}")]
    Body { kind: &'static str, why: String },
    /// A body that cannot be written as a record (a path that is not UTF-8, say).
    #[error("{kind} record cannot be written: {why}")]
    Encode { kind: String, why: String },
}

impl TierRecord {
    /// `body` as a record of `kind`, version `version`; a body JSON cannot hold (a path
    /// that is not UTF-8) is an error, so the sandbox is refused rather than recorded empty.
    pub fn new<T: Serialize>(
        kind: &str,
        version: u32,
        body: &T,
    ) -> Result<TierRecord, RecordError> {
        let body = serde_json::to_value(body)
            .map_err(|e| RecordError::Encode { kind: kind.to_string(), why: e.to_string() })?;
        Ok(TierRecord { kind: kind.to_string(), version, body })
    }

    /// Its body, read as a record of `kind` of a version up to `max_version`.
    pub fn body<T: DeserializeOwned>(
        &self,
        kind: &'static str,
        max_version: u32,
    ) -> Result<T, RecordError> {
        if self.kind != kind {
            return Err(RecordError::Kind { found: self.kind.clone(), expected: kind });
        }
        if !(1..=max_version).contains(&self.version) {
            return Err(RecordError::Version { kind, found: self.version, max: max_version });
        }
        T::deserialize(&self.body).map_err(|e| RecordError::Body { kind, why: e.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Body {
        shell: String,
        pids: u64,
    }

    #[test]
    fn a_record_reads_back_as_its_kind_and_refuses_others() {
        let body = Body { shell: "/bin/sh".into(), pids: 64 };
        let record = TierRecord::new("box", 1, &body).expect("record");
        assert_eq!(record.body::<Body>("box", 1), Ok(body));
        assert!(matches!(record.body::<Body>("vm", 1), Err(RecordError::Kind { .. })));
        let newer = TierRecord { version: 2, ..record.clone() };
        assert!(matches!(newer.body::<Body>("box", 1), Err(RecordError::Version { found: 2, .. })));
        let wrong = TierRecord { body: serde_json::json!({"shell": 1}), ..record };
        assert!(matches!(wrong.body::<Body>("box", 1), Err(RecordError::Body { .. })));
        // JSON holds no path that is not UTF-8: refused, not written as nothing.
        use std::os::unix::ffi::OsStrExt;
        let odd = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(b"/l/\xff"));
        assert!(matches!(TierRecord::new("box", 1, &odd), Err(RecordError::Encode { .. })));
    }
}
