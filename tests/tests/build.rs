//! `brig image build`: a Dockerfile run step by step on the node's container tier from a base
//! pulled from a real registry (Debian's `docker-registry` on loopback), each layer step kept
//! in the step cache; an unchanged rebuild runs nothing, a changed file re-runs its COPY and
//! what follows; a failing step, a link out of the context and an unknown base are typed
//! errors that leave no environment and no container behind.

use std::path::Path;
use std::sync::{Arc, Mutex};

use brig_sdk::{BuildEvent, BuildEventKind, BuildOptions, Client, ErrorCode, SandboxOptions};
use brig_tests::registry::{busybox_base, write_image, Registry};
use brig_tests::Daemon;

const DOCKERFILE: &str = r#"ARG BASE
FROM ${BASE}
ARG GREETING=hi
ENV APP_HOME=/home/agent
RUN mkdir -p /home/agent && chown 1000:1000 /home/agent && echo "built with $GREETING"
WORKDIR /home/agent
COPY app ./app/
COPY --chown=1000:1000 a.txt link ./
USER agent
RUN id -u > whoami && echo "ran as $(id -u)"
ENV LEVEL=2
CMD ["sh", "-c", "cat whoami; echo $LEVEL"]
"#;

fn context(dir: &Path) {
    std::fs::create_dir_all(dir.join("app/data")).expect("app");
    std::fs::write(dir.join("app/main.sh"), "echo main\n").expect("main");
    std::fs::write(dir.join("app/data/x.txt"), "x\n").expect("x");
    std::fs::write(dir.join("a.txt"), "first\n").expect("a");
    std::os::unix::fs::symlink("a.txt", dir.join("link")).expect("link");
    std::os::unix::fs::symlink("/etc/passwd", dir.join("out")).expect("out");
}

async fn sh(client: &Client, env: &str, script: &str) -> String {
    let sb = client.create(SandboxOptions::container(env)).await.expect("create");
    let out = sb.exec(["sh", "-c", script]).await.expect("exec");
    sb.destroy().await.expect("destroy");
    format!("{}{}", out.stdout_text(), out.stderr_text())
}

/// Builds, keeping the events.
async fn build(
    client: &Client,
    options: BuildOptions,
) -> (Result<brig_sdk::BuiltImage, brig_sdk::Error>, Vec<BuildEvent>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let built =
        client.build_image(options, move |e| seen.lock().expect("lock").push(e.clone())).await;
    let events = events.lock().expect("lock").clone();
    (built, events)
}

fn logs(events: &[BuildEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            BuildEventKind::Log { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dockerfile_builds_step_by_step_and_an_unchanged_rebuild_runs_nothing() {
    let registry = Registry::start().expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    write_image(layout.path(), "base", &[busybox_base()], &[]).expect("image");
    let base = registry.push(layout.path(), "base", "brig/base").expect("push");
    let dir = tempfile::tempdir().expect("context");
    context(dir.path());
    let config = format!("[images.registries]\ninsecure = [\"{}\"]\n", registry.addr);
    let daemon = Daemon::start_with_config(&config, &[]).expect("brigd");
    let client = daemon.client().await.expect("connect");
    let options = || {
        BuildOptions::dockerfile("test/app", DOCKERFILE)
            .context(dir.path())
            .build_arg("BASE", &base)
            .build_arg("GREETING", "yo")
    };

    let (built, events) = build(&client, options()).await;
    let built = built.expect("build");
    assert!(logs(&events).contains("built with yo"), "the RUN's output streams: {events:?}");
    assert!(logs(&events).contains("ran as 1000"), "{events:?}");
    assert_eq!(built.steps_cached, 0);
    assert_eq!(built.steps_run, 5, "two RUNs, WORKDIR and two COPYs");
    assert_eq!(built.user.as_deref(), Some("agent"));
    assert_eq!(built.working_dir.as_deref(), Some("/home/agent"));
    let starts = events.iter().filter(|e| matches!(e.kind, BuildEventKind::Started { .. }));
    assert_eq!(starts.count(), 10, "every step but the ARGs");

    let env = "env:test/app";
    let out = sh(&client, env, "stat -c '%u %a' /home/agent; cat app/main.sh app/data/x.txt; stat -c %u a.txt; readlink link; cat whoami; echo $APP_HOME $LEVEL; id -u").await;
    assert_eq!(
        out, "1000 755\necho main\nx\n1000\na.txt\n1000\n/home/agent 2\n1000\n",
        "COPY keeps the owner RUN gave its directory; the config applies"
    );
    let sb = client.create(SandboxOptions::container(env)).await.expect("create");
    let own = sb.exec(Vec::<String>::new()).await.expect("CMD");
    assert_eq!(own.stdout_text(), "1000\n2\n");
    sb.destroy().await.expect("destroy");

    // Unchanged: every layer step from the cache, no container made.
    let (again, events) = build(&client, options()).await;
    let again = again.expect("rebuild");
    assert_eq!((again.steps_run, again.steps_cached), (0, 5));
    assert_eq!(again.layers, built.layers);
    assert!(logs(&events).is_empty(), "nothing ran: {events:?}");

    // A changed file: its COPY and what follows run again, the rest is cached. Through the
    // CLI, which prints each step.
    std::fs::write(dir.path().join("a.txt"), "second\n").expect("change");
    let cli = std::process::Command::new(brig_tests::binary("brig"))
        .arg("--state-dir")
        .arg(daemon.state_dir())
        .args(["image", "build", "--name", "test/app", "--build-arg"])
        .arg(format!("BASE={base}"))
        .args(["--build-arg", "GREETING=yo"])
        .arg(dir.path())
        .arg("-f")
        .arg({
            let file = dir.path().join("Dockerfile");
            std::fs::write(&file, DOCKERFILE).expect("Dockerfile");
            file
        })
        .output()
        .expect("brig image build");
    let stderr = String::from_utf8_lossy(&cli.stderr);
    assert!(cli.status.success(), "brig image build: {stderr}");
    assert!(stderr.contains("Step 5/10 : COPY app ./app/ (cached)"), "{stderr}");
    assert!(stderr.contains("Step 6/10 : COPY a.txt link ./\n"), "{stderr}");
    assert!(stderr.contains("ran as 1000"), "{stderr}");
    let stdout = String::from_utf8_lossy(&cli.stdout);
    assert!(stdout.contains("2 steps run, 3 from the cache"), "{stdout}");
    assert_eq!(sh(&client, env, "cat a.txt").await, "second\n");
    assert!(client.list(&[]).await.expect("list").is_empty(), "no build container is left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_steps_escaping_links_and_unknown_bases_are_typed_errors() {
    let registry = Registry::start().expect("registry");
    let layout = tempfile::tempdir().expect("layout");
    write_image(layout.path(), "base", &[busybox_base()], &[]).expect("image");
    let base = registry.push(layout.path(), "base", "brig/base").expect("push");
    let dir = tempfile::tempdir().expect("context");
    context(dir.path());
    let config = format!("[images.registries]\ninsecure = [\"{}\"]\n", registry.addr);
    let daemon = Daemon::start_with_config(&config, &[]).expect("brigd");
    let client = daemon.client().await.expect("connect");

    let failing = format!("FROM {base}\nRUN echo fine > /ok\nRUN echo about to fail; exit 3\n");
    let (result, events) = build(&client, BuildOptions::dockerfile("test/fails", &failing)).await;
    let err = result.expect_err("the step fails");
    assert_eq!(err.code(), Some(ErrorCode::BadRequest), "{err}");
    let message = err.to_string();
    assert!(message.contains("step 3/3") && message.contains("exit code 3"), "{message}");
    assert!(message.contains("about to fail"), "the error ends with the step's output: {message}");
    assert!(logs(&events).contains("about to fail"));
    let envs = client.envs().await.expect("envs");
    assert!(envs.iter().all(|(n, _)| n != "test/fails"), "no environment from a failed build");
    // The step before it is cached; the failed one is not.
    let fixed = format!("FROM {base}\nRUN echo fine > /ok\nRUN echo fixed\n");
    let (built, _) = build(&client, BuildOptions::dockerfile("test/fixed", &fixed)).await;
    let built = built.expect("fixed");
    assert_eq!((built.steps_run, built.steps_cached), (1, 1));

    let escape = format!("FROM {base}\nCOPY out /x\n");
    let options = BuildOptions::dockerfile("test/escape", &escape).context(dir.path());
    let err = build(&client, options).await.0.expect_err("a link out of the context");
    assert_eq!(err.code(), Some(ErrorCode::PermissionDenied), "{err}");
    assert!(err.to_string().contains("out"), "{err}");

    let missing = format!("FROM {base}\nCOPY none /x\n");
    let options = BuildOptions::dockerfile("test/missing", &missing).context(dir.path());
    let err = build(&client, options).await.0.expect_err("no such file");
    assert_eq!(err.code(), Some(ErrorCode::BadRequest), "{err}");

    let unknown = format!("FROM {}/brig/none:1\nRUN true\n", registry.addr);
    let err = build(&client, BuildOptions::dockerfile("test/unknown", &unknown)).await.0;
    assert_eq!(err.expect_err("unknown base").code(), Some(ErrorCode::NotFound));

    let multi = "FROM a AS one\nFROM b\n";
    let err = build(&client, BuildOptions::dockerfile("test/multi", multi)).await.0;
    let err = err.expect_err("multi-stage");
    assert_eq!(err.code(), Some(ErrorCode::BadRequest));
    assert!(err.to_string().contains("multi-stage"), "{err}");
    assert!(client.list(&[]).await.expect("list").is_empty(), "no build container is left");
    let log = daemon.log_text();
    assert!(!log.contains("panicked"), "{log}");
}
