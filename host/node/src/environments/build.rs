//! Image builds (`ImageOp::Build`): a Dockerfile (parsed by `brig-builder`) or an E2B
//! template's steps, run on the node's own container tier. Each layer step runs in a
//! container on the layers so far (RUN: the command; COPY: the context's files staged with the
//! attributes the image gives their directories; WORKDIR: the directory) and is kept as a
//! store layer named by its cache key (`build-cache/<key>`): a step whose key the store has is
//! not run again. Config steps (ENV, USER, CMD, …) change the image config, which becomes the
//! environment's (`EnvConfig`), and every later key.

use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_builder::context::ContextCaps;
use brig_builder::{Context, ImageConfig, Step, StepKey};
use brig_core::sandbox::{ExecEvent, ExecSpec, Stdin};
use brig_images::{EnvConfig, LayerStore};
use brig_proto::{
    BuildEvent, BuildEventKind, BuiltImage, CreateRequest, ImageBuildRequest, OutputStream, Reply,
    Tier,
};
use brig_transport::Exchange;
use tokio::io::AsyncWriteExt;

use crate::environments::build_step::{blocking, ImageBuildError, StepAt};
use crate::table::sandboxes::Gone;
use crate::{Node, NodeError};

/// Largest build context accepted (its tar, and unpacked).
const MAX_CONTEXT_BYTES: u64 = 4 << 30;
const MAX_CONTEXT_ENTRIES: u64 = 1_000_000;
/// Longest one RUN step may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(3600);
/// Output a RUN step may write (streamed to the client; beyond it the step goes on, unheard).
const STEP_OUTPUT: u64 = 256 << 20;
/// The end of a failed step's output kept for its error.
const FAILED_LOG_TAIL: usize = 2048;

/// Where a build is: the layers so far, the config, the key of the last step.
struct State {
    layers: Vec<String>,
    config: ImageConfig,
    key: StepKey,
}

impl Node {
    /// Builds `req.name` from its steps, telling `exchange` how it goes.
    pub(crate) async fn build_image(
        &self,
        req: ImageBuildRequest,
        exchange: &mut Exchange,
    ) -> Result<Reply, NodeError> {
        let store = self.store()?;
        let staging = brig_images::build::Staging::new_in(&store.work_dir())?;
        let context = match req.context {
            true => Some(receive_context(exchange, staging.path()).await?),
            false => None,
        };
        let (steps, args_of) = steps_of(&req)?;
        let Some((Step::From(base), rest)) = steps.split_first() else {
            return Err(ImageBuildError::NoFrom.into());
        };
        let total = steps.len() as u32;
        let mut state = self.base(&store, base).await?;
        event(
            exchange,
            1,
            total,
            BuildEventKind::Started { text: format!("FROM {base}"), cached: true },
        )
        .await;
        let (mut run, mut cached) = (0u32, 0u32);
        for (i, step) in rest.iter().enumerate() {
            let number = i as u32 + 2;
            let args = args_of(i + 1);
            let started = Instant::now();
            let text = step.describe();
            if !step.makes_layer() {
                state.key = state.key.then(step, &state.config, &[], None);
                state.config.apply(step);
                event(exchange, number, total, BuildEventKind::Started { text, cached: true })
                    .await;
                continue;
            }
            let inputs = match (step, &context) {
                (Step::Copy(spec), Some(context)) => {
                    let (context, spec) = (context.clone(), spec.clone());
                    let hash = blocking(move || context.hash(&spec)).await?;
                    Some(hash.map_err(ImageBuildError::from)?)
                }
                (Step::Copy(_), None) => return Err(ImageBuildError::NoContext.into()),
                _ => None,
            };
            let key = state.key.then(step, &state.config, &args, inputs.as_deref());
            let hit = match req.no_cache {
                true => None,
                false => store.digest_of(&key.layer_name()).ok(),
            };
            event(
                exchange,
                number,
                total,
                BuildEventKind::Started { text: text.clone(), cached: hit.is_some() },
            )
            .await;
            let digest = match hit {
                Some(digest) => {
                    cached += 1;
                    Some(digest)
                }
                None => {
                    run += 1;
                    let at = StepAt { number, total, text, key: key.clone() };
                    self.run_step(&store, &state, step, &args, context.as_ref(), &at, exchange)
                        .await?
                }
            };
            if let Some(digest) = digest {
                state.layers.push(digest);
            }
            state.config.apply(step);
            state.key = key;
            let millis = started.elapsed().as_millis() as u64;
            event(exchange, number, total, BuildEventKind::Finished { millis }).await;
        }
        store.create_env(&req.name, state.layers.clone()).await?;
        let c = state.config;
        let config = EnvConfig {
            env: c.env.clone(),
            working_dir: c.working_dir.clone(),
            user: c.user.clone(),
            entrypoint: c.entrypoint.clone(),
            cmd: c.cmd.clone(),
        };
        store.set_env_config(&req.name, config).await?;
        tracing::info!(name = %req.name, run, cached, "image built");
        Ok(Reply::Built(BuiltImage {
            name: req.name,
            layers: state.layers,
            steps_run: run,
            steps_cached: cached,
            env: c.env,
            working_dir: c.working_dir,
            user: c.user,
            entrypoint: c.entrypoint,
            cmd: c.cmd,
        }))
    }

    /// The layers and config of a build's base.
    async fn base(&self, store: &Arc<LayerStore>, base: &str) -> Result<State, NodeError> {
        if base == "scratch" {
            let key = StepKey::base(&[]);
            return Ok(State { layers: Vec::new(), config: ImageConfig::default(), key });
        }
        // `env:NAME`; the node's own images and store layers (`debian-12`, `/images/x`,
        // `base/a@2+b`); else a registry reference (`oci:REF`, `python:3.12`, `ghcr.io/x/y`).
        let local = |part: &str| {
            part.starts_with('/')
                || !part.contains(['/', ':', '@'])
                || store.digest_of(part).is_ok()
        };
        let registry = base.starts_with(crate::environments::pulls::REGISTRY_PREFIX)
            || (!base.starts_with("env:") && !base.split('+').all(local));
        let spec = match registry {
            true => {
                let reference =
                    base.strip_prefix(crate::environments::pulls::REGISTRY_PREFIX).unwrap_or(base);
                let config = self.inner.config.images.registries.pull_config();
                crate::environments::pulls::registry_image(
                    store,
                    &config,
                    &self.inner.pulls,
                    reference,
                )
                .await?
            }
            false => base.to_string(),
        };
        let mut layers = Vec::new();
        for part in store.expand(&spec)? {
            layers.push(match LayerStore::is_store_reference(&part) {
                true => store.digest_of(&part)?,
                false => part,
            });
        }
        let image = store.env_config(&spec);
        let config = ImageConfig {
            env: image.env,
            working_dir: image.working_dir,
            user: image.user,
            entrypoint: image.entrypoint,
            cmd: image.cmd,
            labels: Vec::new(),
        };
        Ok(State { key: StepKey::base(&layers), layers, config })
    }
}

/// A RUN's command, the user it runs as and the build variables it sees.
struct RunCommand<'a> {
    command: &'a brig_builder::Command,
    user: Option<String>,
    args: &'a [(String, String)],
}

/// The steps of a request, and the build variables each RUN sees (by step index).
#[allow(clippy::type_complexity)]
fn steps_of(
    req: &ImageBuildRequest,
) -> Result<(Vec<Step>, Box<dyn Fn(usize) -> Vec<(String, String)> + Send>), NodeError> {
    match &req.source {
        brig_proto::BuildSource::Dockerfile(text) => {
            let parsed = brig_builder::parse_dockerfile(text, &req.build_args)
                .map_err(ImageBuildError::from)?;
            let steps = parsed.steps.clone();
            Ok((steps, Box::new(move |i| parsed.args_of(i).to_vec())))
        }
        brig_proto::BuildSource::Steps(steps) => {
            Ok((steps.iter().cloned().map(step_of).collect(), Box::new(|_| Vec::new())))
        }
    }
}

fn command_of(c: brig_proto::BuildCommand) -> brig_builder::Command {
    match c {
        brig_proto::BuildCommand::Shell(s) => brig_builder::Command::Shell(s),
        brig_proto::BuildCommand::Exec(argv) => brig_builder::Command::Exec(argv),
    }
}

fn step_of(step: brig_proto::BuildStep) -> Step {
    use brig_proto::BuildStep as W;
    match step {
        W::From(image) => Step::From(image),
        W::Run(c) => Step::Run(command_of(c)),
        W::Copy { sources, dest, chown, owner, chmod } => {
            Step::Copy(brig_builder::CopySpec { sources, dest, chown, owner, chmod })
        }
        W::RunAs { command, user } => Step::RunAs { command: command_of(command), user },
        W::Env(vars) => Step::Env(vars),
        W::Workdir(dir) => Step::Workdir(dir),
        W::User(user) => Step::User(user),
        W::Cmd(c) => Step::Cmd(command_of(c)),
        W::Entrypoint(c) => Step::Entrypoint(command_of(c)),
        W::Label(labels) => Step::Label(labels),
    }
}

/// Sends a build event; a client that left misses it (the build goes on).
pub(crate) async fn event(exchange: &mut Exchange, step: u32, steps: u32, kind: BuildEventKind) {
    let _ = exchange.reply(&Reply::BuildEvent(BuildEvent { step, steps, kind })).await;
}

/// Reads the context upload (a tar, gzip-compressed or not) and unpacks it under `dir`.
async fn receive_context(
    exchange: &mut Exchange,
    dir: &std::path::Path,
) -> Result<Context, NodeError> {
    let file = dir.join("context.tar");
    let io = |what: &'static str| move |source| NodeError::Io { what: what.into(), source };
    let mut out = tokio::fs::File::create(&file).await.map_err(io("build context"))?;
    let mut bytes = 0u64;
    while let Some(chunk) = exchange.read_upload().await? {
        bytes += chunk.len() as u64;
        if bytes > MAX_CONTEXT_BYTES {
            exchange.refuse_upload();
            return Err(NodeError::UploadTooLarge(MAX_CONTEXT_BYTES));
        }
        out.write_all(&chunk).await.map_err(io("build context"))?;
    }
    out.flush().await.map_err(io("build context"))?;
    let root = dir.join("context");
    let caps = ContextCaps { max_bytes: MAX_CONTEXT_BYTES, max_entries: MAX_CONTEXT_ENTRIES };
    let unpacked = blocking(move || {
        std::fs::create_dir(&root).map_err(|source| brig_builder::ContextError::Io {
            what: "context directory".into(),
            source,
        })?;
        let mut reader =
            std::io::BufReader::new(std::fs::File::open(&file).map_err(|source| {
                brig_builder::ContextError::Io { what: "context".into(), source }
            })?);
        let gzip =
            std::io::BufRead::fill_buf(&mut reader).is_ok_and(|b| b.starts_with(&[0x1f, 0x8b]));
        let context = match gzip {
            true => Context::unpack(flate2::read::GzDecoder::new(reader), &root, caps),
            false => Context::unpack(reader, &root, caps),
        };
        let _ = std::fs::remove_file(&file);
        context
    })
    .await?;
    Ok(unpacked.map_err(ImageBuildError::from)?)
}

impl Node {
    /// Runs a layer step in a container on the layers so far; the layer it made.
    #[allow(clippy::too_many_arguments)]
    async fn run_step(
        &self,
        store: &Arc<LayerStore>,
        state: &State,
        step: &Step,
        args: &[(String, String)],
        context: Option<&Context>,
        at: &StepAt,
        exchange: &mut Exchange,
    ) -> Result<Option<String>, NodeError> {
        let network = matches!(step, Step::Run(_) | Step::RunAs { .. });
        let sandbox = self.build_container(state, network).await?;
        let result = async {
            let entry = self.live(&sandbox).await?;
            match step {
                Step::Run(_) | Step::RunAs { .. } => {
                    let (command, user) = match step {
                        Step::RunAs { command, user } => (command, Some(user.clone())),
                        Step::Run(command) => (command, state.config.user.clone()),
                        _ => return Ok(None),
                    };
                    let run = RunCommand { command, user, args };
                    self.run_command(&entry, state, run, at, exchange).await?;
                    let req = brig_proto::CheckpointRequest {
                        sandbox: sandbox.clone(),
                        name: at.key.layer_name(),
                        version: None,
                        scrub: Vec::new(),
                    };
                    Ok(Some(
                        crate::environments::images::checkpoint(store, &entry, req).await?.digest,
                    ))
                }
                Step::Copy(spec) => {
                    let context = context.ok_or(ImageBuildError::NoContext)?;
                    let mut spec = spec.clone();
                    if let Some(owner) = spec.owner.take() {
                        spec.chown = Some(self.owner_ids(&entry, &owner, at).await?);
                    }
                    let spec = &spec;
                    let dest = state.config.resolve(&spec.dest);
                    let dest = if spec.dest.ends_with('/') { format!("{dest}/") } else { dest };
                    let dirs = image_dirs(&entry, &dest).await;
                    let layer = crate::environments::build_layers::copy_layer(
                        store, context, spec, &dest, dirs, at,
                    )
                    .await?;
                    Ok(Some(layer))
                }
                Step::Workdir(dir) => {
                    let dir = state.config.resolve(dir);
                    // A layer even when the image has the directory (as Docker makes one): the
                    // step's cache entry; the directory keeps the image's attributes.
                    let dirs = image_dirs(&entry, &dir).await;
                    Ok(Some(
                        crate::environments::build_layers::dir_layer(store, &dir, dirs, at).await?,
                    ))
                }
                _ => Ok(None),
            }
        }
        .await;
        if let Ok(id) = sandbox.parse() {
            self.destroy(&id, Gone::Destroyed).await;
        }
        result
    }

    /// A container on `state`'s layers for one build step (with a network for RUN).
    async fn build_container(&self, state: &State, network: bool) -> Result<String, NodeError> {
        if state.layers.is_empty() {
            return Err(ImageBuildError::StepFailed {
                step: 0,
                steps: 0,
                text: "FROM scratch".into(),
                how: "a RUN, COPY or WORKDIR step needs a base with files (scratch has none)"
                    .into(),
                log: String::new(),
            }
            .into());
        }
        let req = CreateRequest {
            tier: Some(Tier::Container),
            image: Some(state.layers.join("+")),
            labels: vec![("brig.build".into(), state.key.0[..16].to_string())],
            // A build the client left is not kept past its step's time.
            max_lifetime_ms: Some((STEP_TIMEOUT + Duration::from_secs(300)).as_millis() as u64),
            egress: network.then(|| vec!["0.0.0.0/0".to_string()]),
            ..CreateRequest::default()
        };
        Ok(self.create(req).await?.id)
    }

    /// The uid and gid of `owner` (`name` or `name:group`, names or numbers) in the image,
    /// read from its /etc/passwd and /etc/group (a user alone: its primary group).
    async fn owner_ids(
        &self,
        entry: &crate::table::sandboxes::SandboxEntry,
        owner: &str,
        at: &StepAt,
    ) -> Result<(u32, u32), NodeError> {
        let (user, group) = owner.split_once(':').map_or((owner, None), |(u, g)| (u, Some(g)));
        let missing = |what: &str, name: &str| -> NodeError {
            at.failed(format!("no {what} {name:?} in the image"), String::new()).into()
        };
        // A field of the line of `name` in `file` (names are checked to need no quoting).
        let field = |file: &str, name: &str, field: u8| {
            let script = format!("grep '^{name}:' {file} | head -n 1 | cut -d: -f{field}");
            vec!["/bin/sh".to_string(), "-c".to_string(), script]
        };
        let safe = |name: &str| {
            !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        };
        let number = |s: &str| if s == "root" { Some(0) } else { s.parse::<u32>().ok() };
        let uid = match number(user) {
            Some(uid) => uid,
            None if safe(user) => {
                let out = self.capture(entry, field("/etc/passwd", user, 3)).await?;
                out.trim().parse().map_err(|_| missing("user", user))?
            }
            None => return Err(missing("user", user)),
        };
        let gid = match group {
            Some(g) => match number(g) {
                Some(gid) => gid,
                None if safe(g) => {
                    let out = self.capture(entry, field("/etc/group", g, 3)).await?;
                    out.trim().parse().map_err(|_| missing("group", g))?
                }
                None => return Err(missing("group", g)),
            },
            None if number(user).is_some() => uid,
            None => {
                let out = self.capture(entry, field("/etc/passwd", user, 4)).await?;
                out.trim().parse().unwrap_or(uid)
            }
        };
        Ok((uid, gid))
    }

    /// The stdout of a short command in a build container (root, no input).
    async fn capture(
        &self,
        entry: &crate::table::sandboxes::SandboxEntry,
        argv: Vec<String>,
    ) -> Result<String, NodeError> {
        let spec = ExecSpec {
            exec_id: entry.execs.next_id(),
            argv,
            env: vec![("PATH".into(), brig_builder::step::DEFAULT_PATH.into())],
            cwd: None,
            user: None,
            stdin: Stdin::Empty,
            timeout: Duration::from_secs(30),
            output_limit: 64 << 10,
            terminal: None,
        };
        let mut running = entry.sandbox.exec(spec).await.map_err(|e| entry.fail(e))?;
        let mut out = Vec::new();
        while let Some(happened) = running.events.recv().await {
            match happened {
                ExecEvent::Stdout(b) => out.extend_from_slice(&b),
                ExecEvent::Stderr(_) => {}
                ExecEvent::Exited(_) | ExecEvent::Detached(_) => break,
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Runs a RUN step's command, its output to the client; an error unless it exits 0.
    async fn run_command(
        &self,
        entry: &crate::table::sandboxes::SandboxEntry,
        state: &State,
        run: RunCommand<'_>,
        at: &StepAt,
        exchange: &mut Exchange,
    ) -> Result<(), NodeError> {
        let RunCommand { command, user, args } = run;
        let mut env = state.config.run_env();
        for (k, v) in args {
            if !env.iter().any(|(name, _)| name == k) {
                env.push((k.clone(), v.clone()));
            }
        }
        let spec = ExecSpec {
            exec_id: entry.execs.next_id(),
            argv: command.argv(),
            env,
            cwd: state.config.working_dir.clone(),
            user,
            stdin: Stdin::Empty,
            timeout: STEP_TIMEOUT,
            output_limit: STEP_OUTPUT,
            terminal: None,
        };
        let mut running = entry.sandbox.exec(spec).await.map_err(|e| entry.fail(e))?;
        let mut log = String::new();
        while let Some(happened) = running.events.recv().await {
            let (stream, bytes) = match happened {
                ExecEvent::Stdout(b) => (OutputStream::Stdout, b),
                ExecEvent::Stderr(b) => (OutputStream::Stderr, b),
                ExecEvent::Exited(exit) => {
                    if exit.exit_code == Some(0) {
                        return Ok(());
                    }
                    let how = match (exit.exit_code, exit.signal, exit.timed_out) {
                        (_, _, true) => format!("it ran past {STEP_TIMEOUT:?}"),
                        (Some(code), _, _) => format!("exit code {code}"),
                        (None, Some(signal), _) => format!("killed by signal {signal}"),
                        _ => "it ended without an exit code".into(),
                    };
                    return Err(at.failed(how, log).into());
                }
                ExecEvent::Detached(why) => return Err(at.failed(why, log).into()),
            };
            let text = String::from_utf8_lossy(&bytes).into_owned();
            log.push_str(&text);
            if log.len() > FAILED_LOG_TAIL {
                let cut = log.len() - FAILED_LOG_TAIL;
                let cut = (cut..log.len()).find(|i| log.is_char_boundary(*i)).unwrap_or(log.len());
                log.drain(..cut);
            }
            event(exchange, at.number, at.total, BuildEventKind::Log { stream, text }).await;
        }
        Err(at.failed("its output ended without an exit".into(), log).into())
    }
}

/// The image's attributes (mode, uid, gid) of `path` and each directory above it, as the
/// build container sees them (`None` where it has none).
async fn image_dirs(
    entry: &crate::table::sandboxes::SandboxEntry,
    path: &str,
) -> std::collections::HashMap<String, brig_builder::context::DirAttributes> {
    let mut dirs = std::collections::HashMap::new();
    let mut prefix = String::new();
    let parts = std::iter::once("").chain(path.split('/').filter(|p| !p.is_empty()));
    for part in parts {
        if !part.is_empty() {
            prefix.push('/');
            prefix.push_str(part);
        }
        let shown = if prefix.is_empty() { "/".to_string() } else { prefix.clone() };
        let found = match entry.sandbox.stat(&shown).await {
            Ok(e) if e.kind == brig_core::files::EntryKind::Dir => Some((e.mode, e.uid, e.gid)),
            _ => None,
        };
        dirs.insert(shown, found);
    }
    dirs
}
