//! A Dockerfile becomes build steps (parsed by the `dockerfile-parser` crate). One stage;
//! `ARG`s are substituted where Docker substitutes them (FROM with the global ones; ENV,
//! WORKDIR, USER, COPY/ADD, LABEL with those in scope) and reach RUN as variables.

use dockerfile_parser::{Dockerfile, Instruction, ShellOrExecExpr};
use thiserror::Error;

use crate::step::{Command, CopySpec, Step};

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DockerfileError {
    #[error("the Dockerfile does not parse: {0}")]
    Parse(String),
    #[error("the Dockerfile has no FROM")]
    NoFrom,
    #[error("multi-stage Dockerfiles (FROM {0}) are not built yet: one FROM per Dockerfile")]
    MultiStage(String),
    #[error("{instruction} is not supported{detail}")]
    Unsupported { instruction: String, detail: String },
    #[error("{instruction}: {detail}")]
    Bad { instruction: String, detail: String },
}

/// The steps of a Dockerfile, with `build_args` (`--build-arg`) over the ARG defaults. The ARG
/// values a RUN sees reach it as variables ([`Parsed::args_of`]), not in the image config.
pub fn parse_dockerfile(
    text: &str,
    build_args: &[(String, String)],
) -> Result<Parsed, DockerfileError> {
    let file = Dockerfile::parse(text).map_err(|e| DockerfileError::Parse(e.to_string()))?;
    let asked = |name: &str| build_args.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v);
    let arg_value = |name: &str, default: Option<&str>, scope: &Vars| {
        asked(name).cloned().or_else(|| default.map(|d| expand(d, scope)))
    };
    let mut global = Vars::default();
    for arg in &file.global_args {
        let default = arg.value.as_ref().map(|v| v.content.as_str());
        if let Some(value) = arg_value(&arg.name.content, default, &global) {
            global.set(&arg.name.content, value);
        }
    }
    let mut steps = Vec::new();
    let mut run_args = Vec::new();
    // ARGs of the stage, and ENV: what `$X` means in a stage.
    let (mut args, mut env) = (Vars::default(), Vars::default());
    let mut seen_from = false;
    let scope = |args: &Vars, env: &Vars| args.overlaid(env);
    for instruction in file.instructions {
        let step = match instruction {
            Instruction::From(from) => {
                let image = expand(&from.image.content, &global);
                if seen_from {
                    return Err(DockerfileError::MultiStage(image));
                }
                seen_from = true;
                Step::From(image)
            }
            Instruction::Arg(arg) if seen_from => {
                let name = arg.name.content.clone();
                let default = arg.value.as_ref().map(|v| v.content.clone());
                // A bare `ARG X` in a stage takes the global value.
                let value = arg_value(&name, default.as_deref(), &scope(&args, &env))
                    .or_else(|| global.get(&name).map(str::to_string));
                if let Some(value) = value {
                    args.set(&name, value);
                }
                continue;
            }
            Instruction::Arg(_) => continue,
            _ if !seen_from => return Err(DockerfileError::NoFrom),
            Instruction::Run(run) => {
                run_args.push((steps.len(), args.0.clone()));
                Step::Run(command(run.expr))
            }
            Instruction::Cmd(cmd) => Step::Cmd(command(cmd.expr)),
            Instruction::Entrypoint(e) => Step::Entrypoint(command(e.expr)),
            Instruction::Env(e) => {
                let mut vars = Vec::new();
                for var in e.vars {
                    let value = expand(&var.value.to_string(), &scope(&args, &env));
                    env.set(&var.key.content, value.clone());
                    vars.push((var.key.content, value));
                }
                Step::Env(vars)
            }
            Instruction::Label(l) => Step::Label(
                l.labels
                    .into_iter()
                    .map(|l| (l.name.content, expand(&l.value.content, &scope(&args, &env))))
                    .collect(),
            ),
            Instruction::Copy(copy) => {
                let vars = scope(&args, &env);
                let mut flags = Vec::new();
                for flag in copy.flags {
                    flags.push((flag.name.content, expand(&flag.value.content, &vars)));
                }
                let sources = copy.sources.iter().map(|s| expand(&s.content, &vars)).collect();
                let dest = expand(&copy.destination.content, &vars);
                Step::Copy(copy_spec("COPY", flags, sources, dest)?)
            }
            Instruction::Misc(misc) => {
                let name = misc.instruction.content.to_ascii_uppercase();
                let text = expand(misc.arguments.to_string().trim(), &scope(&args, &env));
                match name.as_str() {
                    "WORKDIR" => Step::Workdir(nonempty(&name, text)?),
                    "USER" => Step::User(nonempty(&name, text)?),
                    "ADD" => Step::Copy(add(text)?),
                    // Metadata a sandbox has no use for.
                    "EXPOSE" | "VOLUME" | "STOPSIGNAL" | "HEALTHCHECK" | "MAINTAINER" => continue,
                    other => {
                        return Err(DockerfileError::Unsupported {
                            instruction: other.to_string(),
                            detail: String::new(),
                        })
                    }
                }
            }
        };
        steps.push(step);
    }
    if !seen_from {
        return Err(DockerfileError::NoFrom);
    }
    Ok(Parsed { steps, run_args })
}

/// A parsed Dockerfile: its steps, and the ARG values each RUN sees (by step index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub steps: Vec<crate::Step>,
    pub run_args: Vec<(usize, Vec<(String, String)>)>,
}

impl Parsed {
    /// The ARG values RUN step `index` sees.
    pub fn args_of(&self, index: usize) -> &[(String, String)] {
        self.run_args.iter().find(|(i, _)| *i == index).map_or(&[], |(_, v)| v)
    }
}

fn nonempty(instruction: &str, text: String) -> Result<String, DockerfileError> {
    if text.is_empty() {
        return Err(DockerfileError::Bad {
            instruction: instruction.into(),
            detail: "needs an argument".into(),
        });
    }
    Ok(text)
}

fn command(expr: ShellOrExecExpr) -> Command {
    match expr {
        ShellOrExecExpr::Shell(s) => Command::Shell(s.to_string().trim().to_string()),
        ShellOrExecExpr::Exec(a) => {
            Command::Exec(a.as_str_vec().into_iter().map(str::to_string).collect())
        }
    }
}

/// ADD of files of the context: a COPY. URLs, and archives (which ADD would unpack), are not
/// built yet.
fn add(text: String) -> Result<CopySpec, DockerfileError> {
    let words: Vec<String> = if text.starts_with('[') {
        serde_json::from_str(&text).map_err(|e| DockerfileError::Bad {
            instruction: "ADD".into(),
            detail: e.to_string(),
        })?
    } else {
        text.split_whitespace().map(str::to_string).collect()
    };
    let mut flags = Vec::new();
    let mut paths = Vec::new();
    for word in words {
        match word.strip_prefix("--").and_then(|f| f.split_once('=')) {
            Some((name, value)) if paths.is_empty() => flags.push((name.into(), value.into())),
            _ => paths.push(word),
        }
    }
    let dest = paths.pop().unwrap_or_default();
    let unsupported = |detail: &str| DockerfileError::Unsupported {
        instruction: "ADD".into(),
        detail: format!(" {detail}"),
    };
    for source in &paths {
        if source.contains("://") {
            return Err(unsupported("of a URL (download it in a RUN step)"));
        }
        let archive = [".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2", ".tar.zst"];
        if archive.iter().any(|a| source.ends_with(a)) {
            return Err(unsupported("of an archive to unpack (use COPY and RUN tar)"));
        }
    }
    copy_spec("ADD", flags, paths, dest)
}

fn copy_spec(
    instruction: &str,
    flags: Vec<(String, String)>,
    sources: Vec<String>,
    dest: String,
) -> Result<CopySpec, DockerfileError> {
    let bad = |detail: String| DockerfileError::Bad { instruction: instruction.into(), detail };
    if sources.is_empty() || dest.is_empty() {
        return Err(bad("needs a source and a destination".into()));
    }
    let mut spec = CopySpec { sources, dest, chown: None, owner: None, chmod: None };
    for (name, value) in flags {
        match name.as_str() {
            "chown" => {
                spec.chown = Some(owner(&value).ok_or_else(|| {
                    bad(format!(
                        "--chown={value}: numeric uid[:gid] or root (names are not looked up yet)"
                    ))
                })?)
            }
            "chmod" => {
                spec.chmod = Some(
                    u32::from_str_radix(&value, 8)
                        .ok()
                        .filter(|m| *m <= 0o7777)
                        .ok_or_else(|| bad(format!("--chmod={value}: an octal mode")))?,
                )
            }
            "from" => {
                return Err(DockerfileError::Unsupported {
                    instruction: format!("{instruction} --from"),
                    detail: " (multi-stage builds are not built yet)".into(),
                })
            }
            "link" => {}
            other => return Err(bad(format!("unknown flag --{other}"))),
        }
    }
    Ok(spec)
}

/// `uid[:gid]` (or `root`) as numbers; the gid defaults to the uid.
fn owner(text: &str) -> Option<(u32, u32)> {
    let number = |s: &str| if s == "root" { Some(0) } else { s.parse().ok() };
    match text.split_once(':') {
        Some((u, g)) => Some((number(u)?, number(g)?)),
        None => number(text).map(|u| (u, u)),
    }
}

/// Variables in scope, in the order they were set.
#[derive(Debug, Clone, Default)]
struct Vars(Vec<(String, String)>);

impl Vars {
    fn set(&mut self, name: &str, value: String) {
        self.0.retain(|(k, _)| k != name);
        self.0.push((name.to_string(), value));
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// These with `top`'s on top (ENV wins over ARG, as in Docker).
    fn overlaid(&self, top: &Vars) -> Vars {
        let mut all = self.clone();
        for (k, v) in &top.0 {
            all.set(k, v.clone());
        }
        all
    }
}

/// Docker's variable substitution: `$X`, `${X}`, `${X:-default}`, `${X:+alternative}`; `\$`
/// is a literal `$`. An unset variable is empty.
fn expand(text: &str, vars: &Vars) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'$') => {
                out.push('$');
                chars.next();
            }
            '$' if chars.peek() == Some(&'{') => {
                chars.next();
                let inner: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let (name, op) = match inner.find(':') {
                    Some(i) => (&inner[..i], Some(&inner[i + 1..])),
                    None => (inner.as_str(), None),
                };
                let value = vars.get(name).filter(|v| !v.is_empty());
                match op {
                    Some(rest) if rest.starts_with('-') => {
                        out.push_str(value.unwrap_or(&rest[1..]));
                    }
                    Some(rest) if rest.starts_with('+') => {
                        if value.is_some() {
                            out.push_str(&rest[1..]);
                        }
                    }
                    _ => out.push_str(value.unwrap_or_default()),
                }
            }
            '$' if chars.peek().is_some_and(|c| c.is_ascii_alphabetic() || *c == '_') => {
                let mut name = String::new();
                while let Some(&c) = chars.peek() {
                    if !(c.is_ascii_alphanumeric() || c == '_') {
                        break;
                    }
                    name.push(c);
                    chars.next();
                }
                out.push_str(vars.get(&name).unwrap_or_default());
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"ARG BASE=env:base
FROM ${BASE}
ARG VERSION=1
ENV APP=/app GREETING="hello world"
WORKDIR $APP
RUN echo "$GREETING" > greeting && \
    echo v$VERSION
COPY --chown=1000:1000 a.txt dir/ ./
ADD --chmod=755 run.sh /usr/local/bin/
USER 1000
LABEL version=$VERSION
EXPOSE 80
CMD ["serve", "--port", "80"]
"#;

    #[test]
    fn a_dockerfile_becomes_steps_with_args_substituted() {
        let args = [("VERSION".to_string(), "2".to_string())];
        let parsed = parse_dockerfile(FILE, &args).expect("parse");
        let steps = &parsed.steps;
        assert_eq!(steps[0], Step::From("env:base".into()));
        assert_eq!(
            steps[1],
            Step::Env(vec![
                ("APP".into(), "/app".into()),
                ("GREETING".into(), "hello world".into())
            ])
        );
        assert_eq!(steps[2], Step::Workdir("/app".into()));
        assert_eq!(
            steps[3],
            Step::Run(Command::Shell("echo \"$GREETING\" > greeting &&     echo v$VERSION".into()))
        );
        assert_eq!(parsed.args_of(3), [("VERSION".to_string(), "2".to_string())]);
        let Step::Copy(copy) = &steps[4] else { panic!("{:?}", steps[4]) };
        assert_eq!(
            (copy.sources.clone(), copy.dest.as_str()),
            (vec!["a.txt".into(), "dir/".into()], "./")
        );
        assert_eq!(copy.chown, Some((1000, 1000)));
        let Step::Copy(add) = &steps[5] else { panic!("{:?}", steps[5]) };
        assert_eq!((add.chmod, add.dest.as_str()), (Some(0o755), "/usr/local/bin/"));
        assert_eq!(steps[6], Step::User("1000".into()));
        assert_eq!(steps[7], Step::Label(vec![("version".into(), "2".into())]));
        assert_eq!(
            steps[8],
            Step::Cmd(Command::Exec(vec!["serve".into(), "--port".into(), "80".into()]))
        );
        assert_eq!(steps.len(), 9, "EXPOSE is left out");
    }

    #[test]
    fn what_is_not_built_is_a_typed_error() {
        let cases = [
            ("RUN true\n", DockerfileError::NoFrom),
            ("FROM a\nFROM b\n", DockerfileError::MultiStage("b".into())),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_dockerfile(text, &[]), Err(expected), "{text}");
        }
        for text in [
            "FROM a\nCOPY --from=b x y\n",
            "FROM a\nADD https://example.com/x /x\n",
            "FROM a\nADD x.tar.gz /x\n",
            "FROM a\nSHELL [\"bash\", \"-c\"]\n",
        ] {
            let err = parse_dockerfile(text, &[]).expect_err(text);
            assert!(matches!(err, DockerfileError::Unsupported { .. }), "{text}: {err}");
        }
        for text in ["FROM a\nCOPY --chown=alice x y\n", "FROM a\nCOPY x\n", "FROM a\nWORKDIR\n"] {
            assert!(parse_dockerfile(text, &[]).is_err(), "{text}");
        }
    }

    #[test]
    fn substitution_follows_docker() {
        let mut vars = Vars::default();
        vars.set("A", "1".into());
        vars.set("EMPTY", String::new());
        assert_eq!(
            expand("$A ${A} ${B:-d} ${A:+alt} ${B:+alt} \\$A $A_x", &vars),
            "1 1 d alt  $A "
        );
        assert_eq!(expand("${EMPTY:-fallback}", &vars), "fallback");
    }
}
