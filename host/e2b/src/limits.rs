//! What a request may ask for, checked before anything is sent to brigd: a command's size and
//! environment, a sandbox's metadata and environment. Each refusal is a 400 naming the limit.
//!
//! Commands, sandbox environments and labels are checked by the node's own rules
//! (`brig_core::check_command`, `check_sandbox_env`, `check_labels`), so the gateway refuses
//! exactly what the node would; only E2B's metadata caps are the gateway's own.

use std::collections::BTreeMap;

use brig_core::{CommandError, LabelError};

pub use brig_core::command::{MAX_COMMAND_BYTES, MAX_SANDBOX_ENV_BYTES};

/// Entries of a sandbox's metadata, and their bytes (keys and values).
pub const MAX_METADATA_ENTRIES: usize = 64;
pub const MAX_METADATA_BYTES: usize = 16 << 10;
/// Longest metadata key.
pub const MAX_METADATA_KEY_BYTES: usize = 256;
// Metadata and the gateway's own labels (template, auto-pause) are labels of the sandbox.
const _: () = assert!(MAX_METADATA_ENTRIES + 2 <= brig_core::spec::MAX_LABELS);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// A command or environment the node would refuse.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// Labels the node would refuse.
    #[error("metadata: {0}")]
    Labels(#[from] LabelError),
    #[error("metadata has {entries} entries of {bytes} bytes; at most {MAX_METADATA_ENTRIES} entries of {MAX_METADATA_BYTES} bytes are taken")]
    MetadataTooLarge { entries: usize, bytes: usize },
    #[error("metadata key {key:?} is empty, longer than {MAX_METADATA_KEY_BYTES} bytes, or holds a control character")]
    BadMetadataKey { key: String },
    #[error("metadata value of {key:?} holds a NUL byte")]
    NulInMetadataValue { key: String },
}

/// A command (`argv`, `env`, `cwd`) the node can pass on whole.
pub fn check_command(
    argv: &[&str],
    env: &BTreeMap<&String, &String>,
    cwd: &str,
) -> Result<(), LimitError> {
    let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    let env: Vec<(String, String)> =
        env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Ok(brig_core::check_command(&argv, &env, cwd)?)
}

/// A sandbox's environment at create.
pub fn check_sandbox_env(env: &BTreeMap<String, String>) -> Result<(), LimitError> {
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    Ok(brig_core::check_sandbox_env(&env)?)
}

/// A sandbox's metadata at create: E2B's caps, then the node's rules for the labels it
/// becomes (`extra` are the gateway's own labels that go with it).
pub fn check_metadata(
    metadata: &BTreeMap<String, String>,
    extra: &[(&str, &str)],
) -> Result<(), LimitError> {
    let bytes = metadata.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    if metadata.len() > MAX_METADATA_ENTRIES || bytes > MAX_METADATA_BYTES {
        return Err(LimitError::MetadataTooLarge { entries: metadata.len(), bytes });
    }
    for (key, value) in metadata {
        if key.is_empty() || key.len() > MAX_METADATA_KEY_BYTES || key.chars().any(char::is_control)
        {
            return Err(LimitError::BadMetadataKey { key: key.clone() });
        }
        if value.contains('\0') {
            return Err(LimitError::NulInMetadataValue { key: key.clone() });
        }
    }
    let labels: Vec<(String, String)> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain(metadata.iter().map(|(k, v)| (k.clone(), v.clone())))
        .collect();
    Ok(brig_core::check_labels(&labels)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn environments_execve_cannot_carry_are_refused() {
        assert_eq!(check_sandbox_env(&map(&[("A", "x y"), ("B_2", "")])), Ok(()));
        for bad in ["", "A=B", "A\0"] {
            assert!(matches!(
                check_sandbox_env(&map(&[(bad, "v")])),
                Err(LimitError::Command(CommandError::BadEnvName { .. }))
            ));
        }
        assert!(matches!(
            check_sandbox_env(&map(&[("A", "a\0b")])),
            Err(LimitError::Command(CommandError::NulInEnvValue { .. }))
        ));
        let big = "x".repeat(MAX_SANDBOX_ENV_BYTES);
        assert!(matches!(
            check_sandbox_env(&map(&[("A", &big)])),
            Err(LimitError::Command(CommandError::TooLarge { .. }))
        ));
    }

    #[test]
    fn commands_past_the_limit_are_refused_with_their_size() {
        let env = BTreeMap::new();
        assert_eq!(check_command(&["echo", "hi"], &env, "/"), Ok(()));
        let arg = "a".repeat(MAX_COMMAND_BYTES);
        let got = check_command(&["echo", &arg], &env, "/");
        let Err(e @ LimitError::Command(CommandError::TooLarge { .. })) = got else {
            panic!("{got:?}")
        };
        assert!(e.to_string().contains(&MAX_COMMAND_BYTES.to_string()), "{e}");
        let (k, v) = ("A".to_string(), "v".repeat(MAX_COMMAND_BYTES));
        let env = BTreeMap::from([(&k, &v)]);
        assert!(matches!(
            check_command(&["true"], &env, "/"),
            Err(LimitError::Command(CommandError::TooLarge { .. }))
        ));
        let env = BTreeMap::new();
        assert!(matches!(
            check_command(&["echo", "a\0b"], &env, "/"),
            Err(LimitError::Command(CommandError::NulInArgument { index: 1 }))
        ));
    }

    #[test]
    fn metadata_is_capped_in_entries_and_bytes_and_as_labels() {
        assert_eq!(check_metadata(&map(&[("image", "debian-12")]), &[("e2b.t", "base")]), Ok(()));
        let many: BTreeMap<String, String> =
            (0..10_000).map(|i| (format!("k{i}"), "v".to_string())).collect();
        assert!(matches!(check_metadata(&many, &[]), Err(LimitError::MetadataTooLarge { .. })));
        let long = map(&[("k", &"v".repeat(MAX_METADATA_BYTES))]);
        assert!(matches!(check_metadata(&long, &[]), Err(LimitError::MetadataTooLarge { .. })));
        assert!(matches!(
            check_metadata(&map(&[("a\nb", "v")]), &[]),
            Err(LimitError::BadMetadataKey { .. })
        ));
        // Within E2B's caps but a label value longer than the node takes.
        let value = "v".repeat(brig_core::spec::MAX_LABEL_VALUE_BYTES + 1);
        assert!(matches!(
            check_metadata(&map(&[("k", &value)]), &[]),
            Err(LimitError::Labels(LabelError::ValueTooLong { .. }))
        ));
        // The gateway's own labels count too.
        let template = "t".repeat(brig_core::spec::MAX_LABEL_VALUE_BYTES + 1);
        assert!(check_metadata(&map(&[]), &[("e2b.template", &template)]).is_err());
    }
}
