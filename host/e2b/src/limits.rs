//! What a request may ask for, checked before anything is sent to brigd: a command's size and
//! environment, a sandbox's metadata and environment. Each refusal is a 400 naming the limit.

use std::collections::BTreeMap;

/// Bytes of one command: its arguments, environment and directory (the node passes a command
/// to the sandbox in one message of at most 256 KiB, beside the sandbox's own environment).
pub const MAX_COMMAND_BYTES: usize = 128 << 10;
/// Bytes of a sandbox's environment (E2B's `envVars`), names and values.
pub const MAX_SANDBOX_ENV_BYTES: usize = 64 << 10;
/// Entries of a sandbox's environment.
pub const MAX_SANDBOX_ENV_VARS: usize = 1024;
/// Entries of a sandbox's metadata, and their bytes (keys and values).
pub const MAX_METADATA_ENTRIES: usize = 64;
pub const MAX_METADATA_BYTES: usize = 16 << 10;
/// Longest metadata key.
pub const MAX_METADATA_KEY_BYTES: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("the command's arguments, environment and directory are {bytes} bytes; at most {MAX_COMMAND_BYTES} are taken")]
    CommandTooLarge { bytes: usize },
    #[error("environment variable name {name:?} is empty or holds '=' or a NUL byte")]
    BadEnvName { name: String },
    #[error("the value of environment variable {name:?} holds a NUL byte")]
    NulInEnvValue { name: String },
    #[error("a command argument or its directory holds a NUL byte")]
    NulInCommand,
    #[error("the sandbox's environment has {vars} variables of {bytes} bytes; at most {MAX_SANDBOX_ENV_VARS} variables of {MAX_SANDBOX_ENV_BYTES} bytes are taken")]
    EnvTooLarge { vars: usize, bytes: usize },
    #[error("metadata has {entries} entries of {bytes} bytes; at most {MAX_METADATA_ENTRIES} entries of {MAX_METADATA_BYTES} bytes are taken")]
    MetadataTooLarge { entries: usize, bytes: usize },
    #[error("metadata key {key:?} is empty, longer than {MAX_METADATA_KEY_BYTES} bytes, or holds a control character")]
    BadMetadataKey { key: String },
    #[error("metadata value of {key:?} holds a NUL byte")]
    NulInMetadataValue { key: String },
}

/// An environment's names and values as `execve` can carry them.
pub fn check_env<'a>(
    env: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), LimitError> {
    for (name, value) in env {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(LimitError::BadEnvName { name: name.clone() });
        }
        if value.contains('\0') {
            return Err(LimitError::NulInEnvValue { name: name.clone() });
        }
    }
    Ok(())
}

/// A command (`argv`, `env`, `cwd`) the node can pass on whole.
pub fn check_command(
    argv: &[&str],
    env: &BTreeMap<&String, &String>,
    cwd: &str,
) -> Result<(), LimitError> {
    let bytes = argv.iter().map(|a| a.len() + 1).sum::<usize>()
        + env.iter().map(|(k, v)| k.len() + v.len() + 2).sum::<usize>()
        + cwd.len();
    if bytes > MAX_COMMAND_BYTES {
        return Err(LimitError::CommandTooLarge { bytes });
    }
    if argv.iter().any(|a| a.contains('\0')) || cwd.contains('\0') {
        return Err(LimitError::NulInCommand);
    }
    check_env(env.iter().map(|(k, v)| (*k, *v)))
}

/// A sandbox's environment at create.
pub fn check_sandbox_env(env: &BTreeMap<String, String>) -> Result<(), LimitError> {
    let bytes = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum::<usize>();
    if env.len() > MAX_SANDBOX_ENV_VARS || bytes > MAX_SANDBOX_ENV_BYTES {
        return Err(LimitError::EnvTooLarge { vars: env.len(), bytes });
    }
    check_env(env)
}

/// A sandbox's metadata at create.
pub fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), LimitError> {
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
    Ok(())
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
                Err(LimitError::BadEnvName { .. })
            ));
        }
        assert!(matches!(
            check_sandbox_env(&map(&[("A", "a\0b")])),
            Err(LimitError::NulInEnvValue { .. })
        ));
        let big = "x".repeat(MAX_SANDBOX_ENV_BYTES);
        assert!(matches!(
            check_sandbox_env(&map(&[("A", &big)])),
            Err(LimitError::EnvTooLarge { .. })
        ));
    }

    #[test]
    fn commands_past_the_limit_are_refused_with_their_size() {
        let env = BTreeMap::new();
        assert_eq!(check_command(&["echo", "hi"], &env, "/"), Ok(()));
        let arg = "a".repeat(MAX_COMMAND_BYTES);
        let got = check_command(&["echo", &arg], &env, "/");
        let Err(e @ LimitError::CommandTooLarge { .. }) = got else { panic!("{got:?}") };
        assert!(e.to_string().contains(&MAX_COMMAND_BYTES.to_string()), "{e}");
        let (k, v) = ("A".to_string(), "v".repeat(MAX_COMMAND_BYTES));
        let env = BTreeMap::from([(&k, &v)]);
        assert!(matches!(
            check_command(&["true"], &env, "/"),
            Err(LimitError::CommandTooLarge { .. })
        ));
    }

    #[test]
    fn metadata_is_capped_in_entries_and_bytes() {
        assert_eq!(check_metadata(&map(&[("image", "debian-12")])), Ok(()));
        let many: BTreeMap<String, String> =
            (0..10_000).map(|i| (format!("k{i}"), "v".to_string())).collect();
        assert!(matches!(check_metadata(&many), Err(LimitError::MetadataTooLarge { .. })));
        let long = map(&[("k", &"v".repeat(MAX_METADATA_BYTES))]);
        assert!(matches!(check_metadata(&long), Err(LimitError::MetadataTooLarge { .. })));
        assert!(matches!(
            check_metadata(&map(&[("a\nb", "v")])),
            Err(LimitError::BadMetadataKey { .. })
        ));
    }
}
