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
    for (name, value) in env {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(CommandError::BadEnvName { name: name.clone() });
        }
        if value.contains('\0') {
            return Err(CommandError::NulInEnvValue { name: name.clone() });
        }
    }
    if cwd.contains('\0') {
        return Err(CommandError::NulInCwd);
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
}
