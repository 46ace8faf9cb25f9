//! A build's steps and the image config they shape.

use serde::{Deserialize, Serialize};

/// A command of RUN, CMD or ENTRYPOINT: the shell form runs through `/bin/sh -c`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    Shell(String),
    Exec(Vec<String>),
}

impl Command {
    /// The argv it runs.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Command::Shell(script) => vec!["/bin/sh".into(), "-c".into(), script.clone()],
            Command::Exec(argv) => argv.clone(),
        }
    }
}

/// What a COPY (or ADD of local files) takes from the build context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopySpec {
    /// Paths in the context (files or directories; `.` is all of it).
    pub sources: Vec<String>,
    /// Where in the image (relative to the working directory unless absolute; a trailing `/`
    /// or several sources make it a directory).
    pub dest: String,
    /// `uid[:gid]` the copies belong to (root by default).
    pub chown: Option<(u32, u32)>,
    /// A user (`name` or `name:group`) of the image the copies belong to, looked up in the
    /// image when the step runs (instead of `chown`).
    pub owner: Option<String>,
    /// Mode bits for every copy instead of the source's.
    pub chmod: Option<u32>,
}

/// One build step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// The base: `scratch`, an environment (`env:NAME`) or a registry image.
    From(String),
    Run(Command),
    /// A command run as `user`, the config's user unchanged (an E2B `run_cmd(..., user=)`).
    RunAs {
        command: Command,
        user: String,
    },
    Copy(CopySpec),
    Env(Vec<(String, String)>),
    /// Sets (and makes) the working directory.
    Workdir(String),
    User(String),
    Cmd(Command),
    Entrypoint(Command),
    Label(Vec<(String, String)>),
}

impl Step {
    /// Whether the step adds a layer (the rest change only the config).
    pub fn makes_layer(&self) -> bool {
        matches!(self, Step::Run(_) | Step::RunAs { .. } | Step::Copy(_) | Step::Workdir(_))
    }

    /// The step as a Dockerfile line, for logs.
    pub fn describe(&self) -> String {
        let command = |c: &Command| match c {
            Command::Shell(s) => s.clone(),
            Command::Exec(argv) => serde_json::to_string(argv).unwrap_or_default(),
        };
        let pairs = |p: &[(String, String)]| {
            p.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
        };
        match self {
            Step::From(image) => format!("FROM {image}"),
            Step::Run(c) => format!("RUN {}", command(c)),
            Step::RunAs { command: c, user } => format!("RUN (as {user}) {}", command(c)),
            Step::Copy(c) => format!("COPY {} {}", c.sources.join(" "), c.dest),
            Step::Env(vars) => format!("ENV {}", pairs(vars)),
            Step::Workdir(dir) => format!("WORKDIR {dir}"),
            Step::User(user) => format!("USER {user}"),
            Step::Cmd(c) => format!("CMD {}", command(c)),
            Step::Entrypoint(c) => format!("ENTRYPOINT {}", command(c)),
            Step::Label(labels) => format!("LABEL {}", pairs(labels)),
        }
    }
}

/// The image config the steps shape: what sandboxes of the built image start with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    pub env: Vec<(String, String)>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub labels: Vec<(String, String)>,
}

/// `PATH` when an image sets none (Docker's default).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl ImageConfig {
    /// Applies a config step (a layer step changes nothing here but WORKDIR).
    pub fn apply(&mut self, step: &Step) {
        match step {
            Step::Env(vars) => {
                for (k, v) in vars {
                    self.env.retain(|(name, _)| name != k);
                    self.env.push((k.clone(), v.clone()));
                }
            }
            Step::Workdir(dir) => self.working_dir = Some(self.resolve(dir)),
            Step::User(user) => self.user = Some(user.clone()),
            // As in Docker: a new ENTRYPOINT clears an inherited CMD.
            Step::Entrypoint(c) => {
                self.entrypoint = c.argv();
                self.cmd.clear();
            }
            Step::Cmd(c) => self.cmd = c.argv(),
            Step::Label(labels) => {
                for (k, v) in labels {
                    self.labels.retain(|(name, _)| name != k);
                    self.labels.push((k.clone(), v.clone()));
                }
            }
            Step::From(_) | Step::Run(_) | Step::RunAs { .. } | Step::Copy(_) => {}
        }
    }

    /// `path` made absolute against the working directory, without `.`, `..` or empty
    /// components (a `..` above `/` stays at `/`).
    pub fn resolve(&self, path: &str) -> String {
        let base = match path.starts_with('/') {
            true => "",
            false => self.working_dir.as_deref().unwrap_or("/"),
        };
        let mut parts: Vec<&str> = Vec::new();
        for part in base.split('/').chain(path.split('/')) {
            match part {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                part => parts.push(part),
            }
        }
        format!("/{}", parts.join("/"))
    }

    /// The variables a RUN starts with: the config's, with a default `PATH`.
    pub fn run_env(&self) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        if !env.iter().any(|(k, _)| k == "PATH") {
            env.insert(0, ("PATH".into(), DEFAULT_PATH.into()));
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_steps_shape_the_config_as_docker_does() {
        let mut c = ImageConfig::default();
        c.apply(&Step::Env(vec![("A".into(), "1".into())]));
        c.apply(&Step::Env(vec![("A".into(), "2".into()), ("B".into(), "3".into())]));
        c.apply(&Step::Workdir("/app".into()));
        c.apply(&Step::Workdir("sub".into()));
        c.apply(&Step::Cmd(Command::Shell("serve".into())));
        c.apply(&Step::Entrypoint(Command::Exec(vec!["/bin/tini".into()])));
        assert_eq!(c.env, [("A".to_string(), "2".to_string()), ("B".into(), "3".into())]);
        assert_eq!(c.working_dir.as_deref(), Some("/app/sub"));
        assert_eq!(c.entrypoint, ["/bin/tini"]);
        assert!(c.cmd.is_empty(), "a new ENTRYPOINT clears CMD");
        assert_eq!(c.run_env()[0].0, "PATH");
        assert_eq!(c.resolve("x"), "/app/sub/x");
        assert_eq!(c.resolve("./"), "/app/sub");
        assert_eq!(c.resolve("../x/./y//"), "/app/x/y");
        assert_eq!(c.resolve("/../../etc"), "/etc");
    }
}
