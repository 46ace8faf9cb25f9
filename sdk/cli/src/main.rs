//! `brig`: the command line for Brig, over brig-sdk. See `brig --help`.
#![forbid(unsafe_code)]

mod build;
mod cluster;
mod images;
mod lifecycle;
mod output;
mod pull_progress;
mod security;
mod shell;
mod volumes;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use brig_sdk::{CallLimits, CallRequest, Client, ConnectOptions, Pin, SandboxOptions, Tier};
use clap::{Args, Parser, Subcommand};

/// Command line for Brig sandboxes: tool calls, sandboxes, files and tools.
///
/// By default it talks to the local brigd found in its state directory ($BRIG_STATE_DIR or
/// <data dir>/brig). Exit status: 0 on success, 1 when a call's tool failed or a request was
/// refused, 2 on usage errors.
#[derive(Parser, Debug)]
#[command(name = "brig", version)]
struct Cli {
    #[command(flatten)]
    conn: ConnArgs,
    /// Print machine-readable JSON instead of human text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Debug)]
struct ConnArgs {
    /// brigd state directory to read endpoint.json and access-token from.
    #[arg(long, global = true, env = "BRIG_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Server address (instead of a state directory); needs --fingerprint or --cert, and a token.
    #[arg(long, global = true, env = "BRIG_ADDR")]
    addr: Option<std::net::SocketAddr>,
    /// Server certificate SHA-256 fingerprint (hex) to pin.
    #[arg(long, global = true, env = "BRIG_FINGERPRINT")]
    fingerprint: Option<String>,
    /// Server certificate file (DER or PEM) to pin.
    #[arg(long, global = true)]
    cert: Option<PathBuf>,
    /// Access token.
    #[arg(long, global = true, env = "BRIG_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// File holding the access token.
    #[arg(long, global = true)]
    token_file: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Call a tool: one-shot, or inside a sandbox with --sandbox.
    Call(CallArgs),
    /// Create a sandbox and print its id.
    Create {
        #[arg(long, default_value = "fncall")]
        tier: String,
        /// Image for containers: a layer name, or layers bottom first joined by `+`.
        #[arg(long)]
        image: Option<String>,
        #[arg(long)]
        memory_mib: Option<u64>,
        /// CPU in thousandths of a core.
        #[arg(long)]
        cpu_millis: Option<u64>,
        #[arg(long)]
        pids: Option<u64>,
        #[arg(long)]
        disk_mib: Option<u64>,
        /// Environment variable KEY=VALUE for every command (repeatable).
        #[arg(long = "env", value_parser = parse_pair)]
        env: Vec<(String, String)>,
        /// Label as key=value (repeatable).
        #[arg(long = "label", value_parser = parse_pair)]
        labels: Vec<(String, String)>,
        /// Destroy (or pause, with --pause-when-idle) after this many seconds without a request.
        #[arg(long)]
        idle_ttl_s: Option<u64>,
        /// Pause instead of destroy when the idle TTL passes.
        #[arg(long)]
        pause_when_idle: bool,
        /// Destroy after being paused this many seconds.
        #[arg(long)]
        paused_ttl_s: Option<u64>,
        /// Destroy this many seconds after creation.
        #[arg(long)]
        max_lifetime_s: Option<u64>,
        /// Egress rule (repeatable): a service name or `10.1.2.3[:port]`, `10.0.0.0/8[:port]`.
        #[arg(long = "egress")]
        egress: Vec<String>,
        /// Give the sandbox a network link even with no --egress rule (everything denied).
        #[arg(long)]
        network: bool,
        /// Path of the image the agent may read but not change (repeatable).
        #[arg(long = "read-only-path")]
        read_only: Vec<String>,
        /// Path of the image hidden from the agent (repeatable).
        #[arg(long = "hidden-path")]
        hidden: Vec<String>,
        /// CPU QoS class: latency-sensitive (default) or best-effort.
        #[arg(long, value_parser = security::parse_qos)]
        qos: Option<brig_sdk::QosClass>,
        /// Where a container runs: host (the node's kernel) or vm (a container-host VM);
        /// default: the node's policy.
        #[arg(long, value_parser = output::parse_placement)]
        placement: Option<brig_sdk::Placement>,
        /// Mount a volume: NAME:PATH, or NAME:PATH:ro read-only (repeatable).
        #[arg(long = "volume", value_parser = volumes::parse_mount)]
        volumes: Vec<(String, String, bool)>,
    },
    /// List sandboxes, optionally only those with all the given labels.
    Ls {
        #[arg(long = "label", value_parser = parse_pair)]
        labels: Vec<(String, String)>,
    },
    /// Show one sandbox.
    Status { id: String },
    /// Destroy sandboxes, by id or by label.
    Rm {
        ids: Vec<String>,
        /// Every sandbox with this label, key=value (repeatable; all must match).
        #[arg(long = "label", value_parser = parse_pair)]
        labels: Vec<(String, String)>,
    },
    /// Run a command in a container sandbox; output streams as it is produced and the exit
    /// status is the command's.
    Exec(ExecArgs),
    /// Interactive shell session in a container sandbox (cwd and env persist between lines).
    Sh {
        id: String,
        /// Seconds each line may run before the prompt returns (it keeps running).
        #[arg(long, default_value_t = 600)]
        timeout_s: u64,
    },
    /// Kill a running exec (and everything it started).
    Kill { id: String, exec_id: u64 },
    #[command(flatten)]
    Lifecycle(lifecycle::LifecycleCommand),
    #[command(flatten)]
    Security(security::SecurityCommand),
    #[command(flatten)]
    Cluster(cluster::ClusterCommand),
    /// Manage tool components.
    #[command(subcommand)]
    Tool(ToolCommand),
    /// Manage versioned layers in the node's layer store.
    #[command(subcommand)]
    Image(images::ImageCommand),
    /// Manage volumes (named directory trees sandboxes mount) and their files.
    #[command(subcommand)]
    Volume(volumes::VolumeCommand),
    /// Manage environments (ordered layer lists; create with --image env:NAME).
    #[command(subcommand)]
    Env(images::EnvCommand),
    /// Turn a container's writable layer into a new layer.
    Checkpoint {
        id: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        version: Option<u32>,
        /// Path to leave out (repeatable), e.g. an answer file.
        #[arg(long = "scrub")]
        scrub: Vec<String>,
    },
    /// What the node reports about itself.
    Node,
    /// List what the node left on its host that belongs to none of its sandboxes (processes,
    /// cgroups, mounts, links, VMMs, files); exits 1 if it finds any and was not told to
    /// remove them.
    Doctor {
        /// Remove what is found.
        #[arg(long)]
        remove: bool,
        /// Leave out anything touched in the last this many seconds (a create under way).
        #[arg(long, default_value_t = 60)]
        min_age_secs: u32,
    },
    /// Move files in and out of a sandbox.
    #[command(subcommand)]
    File(FileCommand),
}

#[derive(Args, Debug)]
struct CallArgs {
    /// Tool name (see `brig tool ls`) or sha256:<digest>.
    tool: String,
    /// Input for a brig:tool component (usually JSON).
    input: Option<String>,
    /// Read the input from a file (`-` for stdin).
    #[arg(long, conflicts_with = "input")]
    input_file: Option<PathBuf>,
    /// Run inside this sandbox (its workspace at /workspace).
    #[arg(long)]
    sandbox: Option<String>,
    /// Argument for a wasi:cli/run command (repeatable).
    #[arg(long = "arg", allow_hyphen_values = true)]
    args: Vec<String>,
    /// Environment variable KEY=VALUE (repeatable).
    #[arg(long = "env", value_parser = parse_pair)]
    env: Vec<(String, String)>,
    /// File to feed as stdin (`-` for this process's stdin).
    #[arg(long)]
    stdin_file: Option<PathBuf>,
    #[arg(long)]
    timeout_ms: Option<u32>,
    #[arg(long)]
    memory_mib: Option<u32>,
    #[arg(long)]
    output_bytes: Option<u32>,
    #[arg(long)]
    fuel: Option<u64>,
}

#[derive(Args, Debug)]
struct ExecArgs {
    id: String,
    /// Working directory.
    #[arg(long)]
    cwd: Option<String>,
    /// User name or uid[:gid].
    #[arg(long)]
    user: Option<String>,
    /// Environment variable KEY=VALUE (repeatable).
    #[arg(long = "env", value_parser = parse_pair)]
    env: Vec<(String, String)>,
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// Cap on stdout + stderr bytes returned.
    #[arg(long)]
    output_limit: Option<u64>,
    /// Forward this terminal's stdin to the command.
    #[arg(short = 'i', long, conflicts_with = "detach")]
    interactive: bool,
    /// Start the command, print its exec id and return; follow it later with `brig attach`.
    #[arg(short = 'd', long)]
    detach: bool,
    /// The command and its arguments (after `--`); none runs the image's own command
    /// (`Entrypoint` + `Cmd`).
    #[arg(last = true)]
    argv: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum ToolCommand {
    /// Register a component (`.wasm`); the name defaults to the file stem.
    Add {
        file: PathBuf,
        #[arg(long)]
        name: Option<String>,
    },
    /// List registered tools.
    Ls,
    /// Unregister a tool.
    Rm { name: String },
}

#[derive(Subcommand, Debug)]
enum FileCommand {
    /// Upload a local file (`-` for stdin), streamed.
    Put { id: String, local: PathBuf, remote: String },
    /// Download a file to LOCAL (default: stdout), streamed.
    Get { id: String, remote: String, local: Option<PathBuf> },
    /// List a directory.
    Ls {
        id: String,
        #[arg(default_value = ".")]
        path: String,
    },
    /// Show one entry.
    Stat { id: String, path: String },
    /// Make a directory.
    Mkdir {
        id: String,
        path: String,
        #[arg(short = 'p', long)]
        parents: bool,
    },
    /// Remove a file, or a directory with -r.
    Rm {
        id: String,
        path: String,
        #[arg(short = 'r', long)]
        recursive: bool,
    },
    /// Set a file's metadata to these KEY=VALUE pairs (none clears it); print its entry.
    Meta {
        id: String,
        path: String,
        #[arg(value_parser = parse_pair)]
        pairs: Vec<(String, String)>,
    },
    /// Print changes under a directory as they happen (with -r, below it too), until ^C.
    Watch {
        id: String,
        path: String,
        #[arg(short = 'r', long)]
        recursive: bool,
    },
}

pub(crate) fn parse_pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

fn main() {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("brig: cannot start runtime: {e}");
            std::process::exit(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("brig: {e:#}");
            let retry = e.downcast_ref::<brig_sdk::Error>().is_some_and(brig_sdk::Error::retryable);
            if retry {
                eprintln!("brig: (retryable)");
            }
            std::process::exit(1);
        }
    }
}

async fn connect(args: &ConnArgs) -> anyhow::Result<Client> {
    let opts = match args.addr {
        Some(addr) => {
            let pin = match (&args.fingerprint, &args.cert) {
                (Some(hex), _) => Pin::Sha256(hex.clone()),
                (None, Some(path)) => Pin::CertFile(path.clone()),
                (None, None) => bail!("--addr needs --fingerprint or --cert"),
            };
            let token = match (&args.token, &args.token_file) {
                (Some(t), _) => t.clone(),
                (None, Some(path)) => brig_sdk::read_token(path)?,
                (None, None) => bail!("--addr needs --token or --token-file"),
            };
            ConnectOptions::new(addr, pin, token)
        }
        None => match &args.state_dir {
            Some(dir) => ConnectOptions::from_state_dir(dir)?,
            None => ConnectOptions::local()?,
        },
    };
    // A daemon busy restoring a VM, or restarting, can drop a handshake: a connection failure
    // the SDK calls retryable is tried again a few times, backing off.
    let mut wait = std::time::Duration::from_millis(250);
    for _ in 1..CONNECT_ATTEMPTS {
        match Client::connect(opts.clone()).await {
            Err(e @ brig_sdk::Error::Connect { .. }) if e.retryable() => {
                eprintln!("brig: {e}: connecting again in {wait:?}");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            other => return Ok(other?),
        }
    }
    Ok(Client::connect(opts).await?)
}

/// Connection attempts before the CLI gives up (waits of 0.25, 0.5 and 1 s between them).
const CONNECT_ATTEMPTS: u32 = 4;

fn read_input(path: &PathBuf) -> anyhow::Result<Vec<u8>> {
    if path.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)?;
        Ok(buf)
    } else {
        std::fs::read(path).with_context(|| format!("reading {}", path.display()))
    }
}

/// The token `args` name (as `connect` finds it), as an E2B API key.
fn own_token(args: &ConnArgs) -> anyhow::Result<String> {
    let token = match (&args.token, &args.token_file, &args.state_dir) {
        (Some(t), _, _) => t.clone(),
        (None, Some(path), _) => brig_sdk::read_token(path)?,
        (None, None, Some(dir)) => ConnectOptions::from_state_dir(dir)?.token,
        (None, None, None) => ConnectOptions::local()?.token,
    };
    Ok(brig_sdk::e2b_key(&token))
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    // `brig token`: the token this CLI connects with, as an E2B API key (the same secret).
    if let Command::Cluster(cluster::ClusterCommand::Token { project: None }) = cli.command {
        println!("{}", own_token(&cli.conn)?);
        return Ok(0);
    }
    let client = connect(&cli.conn).await?;
    let json = cli.json;
    match cli.command {
        Command::Call(args) => {
            let input = match (&args.input, &args.input_file) {
                (Some(i), _) => i.clone(),
                (None, Some(path)) => {
                    String::from_utf8(read_input(path)?).context("input is not UTF-8")?
                }
                (None, None) => String::new(),
            };
            let stdin = match &args.stdin_file {
                Some(path) => read_input(path)?,
                None => Vec::new(),
            };
            let call = CallRequest {
                tool: args.tool.clone(),
                input,
                args: args.args.clone(),
                env: args.env.clone(),
                stdin,
                limits: CallLimits {
                    timeout_ms: args.timeout_ms,
                    memory_mib: args.memory_mib,
                    output_bytes: args.output_bytes,
                    fuel: args.fuel,
                },
            };
            let result = match &args.sandbox {
                Some(id) => client.sandbox(id).call_with(call).await?,
                None => client.call_with(call).await?,
            };
            Ok(output::call_result(&result, json))
        }
        Command::Create {
            tier,
            image,
            memory_mib,
            cpu_millis,
            pids,
            disk_mib,
            env,
            labels,
            idle_ttl_s,
            pause_when_idle,
            paused_ttl_s,
            max_lifetime_s,
            egress,
            network,
            read_only,
            hidden,
            qos,
            placement,
            volumes,
        } => {
            let tier: Tier = output::parse_tier(&tier)?;
            let mut options = SandboxOptions::tier(tier);
            for (name, path, read_only) in &volumes {
                options = options.volume(name, path, *read_only);
            }
            for (value, set) in [
                (
                    memory_mib,
                    SandboxOptions::memory_mib as fn(SandboxOptions, u64) -> SandboxOptions,
                ),
                (cpu_millis, SandboxOptions::cpu_millis),
                (pids, SandboxOptions::pids),
                (disk_mib, SandboxOptions::disk_mib),
            ] {
                if let Some(v) = value {
                    options = set(options, v);
                }
            }
            for (k, v) in &env {
                options = options.env(k, v);
            }
            if let Some(image) = &image {
                options = options.image(image);
            }
            for (k, v) in &labels {
                options = options.label(k, v);
            }
            if let Some(s) = idle_ttl_s {
                options = options.idle_ttl(Duration::from_secs(s));
            }
            if pause_when_idle {
                options = options.pause_when_idle();
            }
            if let Some(s) = paused_ttl_s {
                options = options.paused_ttl(Duration::from_secs(s));
            }
            if let Some(s) = max_lifetime_s {
                options = options.max_lifetime(Duration::from_secs(s));
            }
            if network || !egress.is_empty() {
                options = options.egress(&egress);
            }
            for path in &read_only {
                options = options.read_only_path(path);
            }
            for path in &hidden {
                options = options.hidden_path(path);
            }
            if let Some(class) = qos {
                options = options.qos(class);
            }
            if let Some(placement) = placement {
                options = options.placement(placement);
            }
            // A create that pulls its image (`oci:REF`) shows the pull as it goes.
            let mut view = pull_progress::PullView::new(json);
            let sandbox = client.create_with_progress(options, |p| view.show(p)).await?;
            view.finish();
            output::sandbox(&sandbox.status().await?, json, true);
            Ok(0)
        }
        Command::Ls { labels } => {
            let selector: Vec<(&str, &str)> =
                labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            output::sandboxes(&client.list(&selector).await?, json);
            Ok(0)
        }
        Command::Status { id } => {
            output::sandbox(&client.sandbox(&id).status().await?, json, false);
            Ok(0)
        }
        Command::Rm { ids, labels } => {
            if ids.is_empty() == labels.is_empty() {
                bail!("give sandbox ids or --label selectors (not both)");
            }
            if !labels.is_empty() {
                let refs: Vec<(&str, &str)> =
                    labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                let gone = client.destroy_matching(&refs).await?;
                output::line(json, &serde_json::json!({ "destroyed": gone }), &gone.join("\n"));
                return Ok(0);
            }
            let mut failed = 0;
            for id in &ids {
                match client.sandbox(id).destroy().await {
                    Ok(()) => output::line(json, &serde_json::json!({ "destroyed": id }), id),
                    Err(e) => {
                        eprintln!("brig: {id}: {e}");
                        failed += 1;
                    }
                }
            }
            Ok(i32::from(failed > 0))
        }
        Command::Exec(args) => shell::exec(&client, args, json).await,
        Command::Sh { id, timeout_s } => {
            shell::interactive(&client, &id, Duration::from_secs(timeout_s)).await
        }
        Command::Kill { id, exec_id } => {
            client.sandbox(&id).kill(exec_id).await?;
            Ok(0)
        }
        Command::Lifecycle(cmd) => lifecycle::run(&client, cmd, json).await,
        Command::Security(cmd) => security::run(&client, cmd, json).await,
        Command::Cluster(cmd) => cluster::run(&client, cmd, json).await,
        Command::Tool(cmd) => tool(&client, cmd, json).await,
        Command::Image(cmd) => images::image(&client, cmd, json).await,
        Command::Volume(cmd) => {
            let text = volumes::run(&client, cmd, json).await?;
            if !text.is_empty() {
                println!("{text}");
            }
            Ok(0)
        }
        Command::Env(cmd) => images::env(&client, cmd, json).await,
        Command::Checkpoint { id, name, version, scrub } => {
            let refs: Vec<&str> = scrub.iter().map(String::as_str).collect();
            let layer = client.sandbox(&id).checkpoint(&name, version, &refs).await?;
            output::line(
                json,
                &serde_json::json!({ "name": layer.name, "version": layer.version, "digest": layer.digest }),
                &format!("{}@{} {}", layer.name, layer.version, layer.digest),
            );
            Ok(0)
        }
        Command::Node => {
            let s = client.node_status().await?;
            let images = s.images.as_ref().map(|i| serde_json::json!({ "backend": i.backend, "fetched_bytes": i.fetched_bytes, "fetched_chunks": i.fetched_chunks, "cache_bytes": i.cache_bytes, "corrupt_chunks": i.corrupt_chunks }));
            let swap = s.swap.as_ref().map(|z| serde_json::json!({ "device": z.device, "size_bytes": z.size_bytes, "stored_bytes": z.stored_bytes, "ram_used_bytes": z.ram_used_bytes }));
            let c = &s.capacity;
            let capacity = serde_json::json!({ "memory_total_bytes": c.memory_total_bytes, "memory_available_bytes": c.memory_available_bytes, "memory_requested_bytes": c.memory_requested_bytes, "working_set_bytes": c.working_set_bytes, "containers": c.containers, "cpus": c.cpus, "cpu_requested_millis": c.cpu_requested_millis, "memory_overcommit_pct": c.memory_overcommit_pct, "cpu_overcommit_pct": c.cpu_overcommit_pct, "min_free_bytes": c.min_free_bytes, "latency_sensitive": c.latency_sensitive, "best_effort": c.best_effort });
            let value = serde_json::json!({ "node_id": s.node_id, "tiers": s.tiers.iter().map(|t| format!("{t:?}").to_lowercase()).collect::<Vec<_>>(), "sandboxes": s.sandboxes, "images": images, "capacity": capacity, "daemon_rss_bytes": s.daemon_rss_bytes, "swap": swap });
            if json {
                println!("{value}");
            } else {
                println!("{}", serde_json::to_string_pretty(&value)?);
            }
            Ok(0)
        }
        Command::Doctor { remove, min_age_secs } => {
            let min_age = std::time::Duration::from_secs(u64::from(min_age_secs));
            let found = client.doctor(remove, min_age).await?;
            output::strays(&found, json);
            Ok(i32::from(!found.is_empty() && !remove))
        }
        Command::File(cmd) => file(&client, cmd, json).await,
    }
}

async fn tool(client: &Client, cmd: ToolCommand, json: bool) -> anyhow::Result<i32> {
    match cmd {
        ToolCommand::Add { file, name } => {
            let name = match name {
                Some(n) => n,
                None => file
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .context("cannot derive a tool name from the file name; pass --name")?
                    .to_string(),
            };
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let info = client.add_tool(&name, bytes).await?;
            output::tools(&[info], json);
        }
        ToolCommand::Ls => output::tools(&client.tools().await?, json),
        ToolCommand::Rm { name } => {
            client.remove_tool(&name).await?;
            output::line(json, &serde_json::json!({ "removed": name }), &name);
        }
    }
    Ok(0)
}

async fn file(client: &Client, cmd: FileCommand, json: bool) -> anyhow::Result<i32> {
    match cmd {
        FileCommand::Put { id, local, remote } => {
            let sandbox = client.sandbox(&id);
            let bytes = if local.as_os_str() == "-" {
                sandbox.upload(&remote, tokio::io::stdin()).await?
            } else {
                sandbox.upload_file(&remote, &local).await?
            };
            output::line(
                json,
                &serde_json::json!({ "path": remote, "bytes": bytes }),
                &format!("{bytes} bytes -> {remote}"),
            );
        }
        FileCommand::Get { id, remote, local } => {
            let sandbox = client.sandbox(&id);
            match local {
                Some(path) if path.as_os_str() != "-" => {
                    let bytes = sandbox.download_file(&remote, &path).await?;
                    output::line(
                        json,
                        &serde_json::json!({ "path": remote, "bytes": bytes }),
                        &format!("{bytes} bytes -> {}", path.display()),
                    );
                }
                _ => {
                    sandbox.download(&remote, tokio::io::stdout()).await?;
                }
            }
        }
        FileCommand::Ls { id, path } => {
            output::entries(&client.sandbox(&id).list_dir(&path).await?, json)
        }
        FileCommand::Stat { id, path } => {
            output::entries(&[client.sandbox(&id).stat(&path).await?], json)
        }
        FileCommand::Mkdir { id, path, parents } => {
            client.sandbox(&id).mkdir(&path, parents).await?;
            output::line(json, &serde_json::json!({ "created": path }), &path);
        }
        FileCommand::Rm { id, path, recursive } => {
            client.sandbox(&id).remove(&path, recursive).await?;
            output::line(json, &serde_json::json!({ "removed": path }), &path);
        }
        FileCommand::Meta { id, path, pairs } => {
            let entry =
                client.sandbox(&id).set_file_metadata(&path, pairs.into_iter().collect()).await?;
            output::entries(&[entry], json)
        }
        FileCommand::Watch { id, path, recursive } => {
            let mut watch = client.sandbox(&id).watch(&path, recursive).await?;
            while let Some(batch) = watch.next_batch().await? {
                output::file_events(&batch, json);
            }
        }
    }
    Ok(0)
}
