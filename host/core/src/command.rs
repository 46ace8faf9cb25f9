//! A command as every tier runs it: program and arguments, environment and working directory
//! carried as data from the client to the process that execs it, never spliced into a shell
//! line. What `execve` cannot carry is refused before any tier sees it.

/// A command `execve` could not run as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("a command needs at least its program (argv is empty)")]
    EmptyArgv,
    #[error("argument {index} holds a NUL byte, which a command line cannot carry")]
    NulInArgument { index: usize },
    #[error("environment name {name:?} is empty or holds `=` or a NUL byte")]
    BadEnvName { name: String },
    #[error("the value of environment variable {name:?} holds a NUL byte")]
    NulInEnvValue { name: String },
    #[error("the working directory holds a NUL byte")]
    NulInCwd,
    #[error("{what} takes {bytes} bytes; at most {max} are accepted")]
    TooLarge { what: &'static str, bytes: usize, max: usize },
}

/// Most bytes of one command: its arguments, environment and working directory together
/// (Linux takes 128 KiB in one argument; the container's shim takes a command in one message
/// of 256 KiB, which also carries the sandbox's own environment).
pub const MAX_COMMAND_BYTES: usize = 128 << 10;

/// Most bytes of the environment a sandbox is created with (given to every command in it).
pub const MAX_SANDBOX_ENV_BYTES: usize = 64 << 10;

fn env_bytes(env: &[(String, String)]) -> usize {
    env.iter().map(|(k, v)| k.len() + v.len() + 2).sum()
}

/// Checks an environment every command of a sandbox gets: names and values `execve` can
/// carry, within [`MAX_SANDBOX_ENV_BYTES`].
pub fn check_sandbox_env(env: &[(String, String)]) -> Result<(), CommandError> {
    check_env(env)?;
    let bytes = env_bytes(env);
    if bytes > MAX_SANDBOX_ENV_BYTES {
        return Err(CommandError::TooLarge {
            what: "the sandbox's environment",
            bytes,
            max: MAX_SANDBOX_ENV_BYTES,
        });
    }
    Ok(())
}

fn check_env(env: &[(String, String)]) -> Result<(), CommandError> {
    for (name, value) in env {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(CommandError::BadEnvName { name: name.clone() });
        }
        if value.contains('\0') {
            return Err(CommandError::NulInEnvValue { name: name.clone() });
        }
    }
    Ok(())
}

/// Checks that `argv`, `env` and `cwd` reach a process exactly as given. Any other byte is
/// fine: spaces, newlines and quotes in arguments, values and even names go through unchanged.
pub fn check_command(
    argv: &[String],
    env: &[(String, String)],
    cwd: &str,
) -> Result<(), CommandError> {
    if argv.is_empty() {
        return Err(CommandError::EmptyArgv);
    }
    if let Some(index) = argv.iter().position(|a| a.contains('\0')) {
        return Err(CommandError::NulInArgument { index });
    }
    check_env(env)?;
    if cwd.contains('\0') {
        return Err(CommandError::NulInCwd);
    }
    let bytes = argv.iter().map(|a| a.len() + 1).sum::<usize>() + env_bytes(env) + cwd.len();
    if bytes > MAX_COMMAND_BYTES {
        return Err(CommandError::TooLarge { what: "the command", bytes, max: MAX_COMMAND_BYTES });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str, value: &str) -> Vec<(String, String)> {
        vec![(name.to_string(), value.to_string())]
    }

    #[test]
    fn what_execve_can_carry_passes_and_the_rest_is_refused() {
        let argv = vec!["printf".to_string(), "a\nb 'c' $d".to_string()];
        assert_eq!(check_command(&argv, &env("A B\nC", "x\ny"), "/tmp/a b"), Ok(()));
        assert_eq!(check_command(&[], &[], ""), Err(CommandError::EmptyArgv));
        let nul = vec!["echo".to_string(), "a\0b".to_string()];
        assert_eq!(check_command(&nul, &[], ""), Err(CommandError::NulInArgument { index: 1 }));
        for bad in ["", "A=B", "A\0"] {
            assert_eq!(
                check_command(&argv, &env(bad, "v"), ""),
                Err(CommandError::BadEnvName { name: bad.into() })
            );
        }
        assert_eq!(
            check_command(&argv, &env("A", "\0"), ""),
            Err(CommandError::NulInEnvValue { name: "A".into() })
        );
        assert_eq!(check_command(&argv, &[], "/\0"), Err(CommandError::NulInCwd));
    }

    #[test]
    fn oversized_commands_and_environments_are_refused() {
        let big = "x".repeat(MAX_COMMAND_BYTES);
        let argv = vec!["echo".to_string(), big.clone()];
        assert!(matches!(check_command(&argv, &[], "/"), Err(CommandError::TooLarge { .. })));
        let argv = vec!["echo".to_string()];
        assert!(matches!(
            check_command(&argv, &env("A", &big), "/"),
            Err(CommandError::TooLarge { .. })
        ));
        assert_eq!(check_command(&argv, &env("A", &"x".repeat(100 << 10)), "/"), Ok(()));
        assert!(matches!(
            check_sandbox_env(&env("A", &"x".repeat(MAX_SANDBOX_ENV_BYTES))),
            Err(CommandError::TooLarge { .. })
        ));
        assert_eq!(
            check_sandbox_env(&env("A\0B", "v")),
            Err(CommandError::BadEnvName { name: "A\0B".into() })
        );
        assert_eq!(check_sandbox_env(&env("PATH", "/bin")), Ok(()));
    }
}
