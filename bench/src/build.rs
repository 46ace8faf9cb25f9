//! `build`: image builds and what E2B templates bring, on one release brigd in one run.
//!
//! - Builds (Brig's builder through the SDK, the steps an E2B template becomes): a 10-step
//!   build on a base pulled from a loopback registry (`template_build_ms`), the same again
//!   (`template_rebuild_unchanged_ms`: every step from the step cache), and with its last
//!   step changed (`template_rebuild_last_step_ms`: only that step runs).
//! - E2B (`bench/scripts/build_measure.py`, the real `e2b-code-interpreter` package): `run_code`
//!   of `x + 1` in a warm context (`run_code_p50_ms`), and small HTTP requests/s to a server in a
//!   sandbox through the gateway's port route (`port_proxy_rps`) against the same server from
//!   the node at the sandbox's own address (`direct_rps`).

use std::time::{Duration, Instant};

use brig_sdk::{BuildCommand, BuildOptions, BuildStep, Client};
use brig_tests::registry::{busybox_base, write_image, Registry};
use brig_tests::{artifacts, image, repo_root};
use serde_json::json;

use crate::stats::{round3, Latencies};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// `run_code` samples.
    #[arg(long, default_value_t = 200)]
    runs: usize,
    /// Seconds of each requests/s phase.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// HTTP clients at once in the requests/s phases.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
}

/// Ten steps as an E2B template makes them (its base first).
fn steps(base: &str, last: &str) -> Vec<BuildStep> {
    let run = |s: &str| BuildStep::Run(BuildCommand::Shell(s.to_string()));
    vec![
        BuildStep::From(base.to_string()),
        BuildStep::Env(vec![("APP".into(), "/srv/app".into())]),
        run("mkdir -p /srv/app && echo one > /srv/app/one && chown 1000 /srv/app"),
        BuildStep::Workdir("/srv/app".into()),
        BuildStep::Copy {
            sources: vec!["app".into()],
            dest: "/srv/app/src".into(),
            chown: None,
            owner: None,
            chmod: None,
        },
        run("cat src/main.txt > copied"),
        BuildStep::Env(vec![("LEVEL".into(), "2".into())]),
        run("echo $LEVEL > level"),
        BuildStep::User("1000".into()),
        run(last),
    ]
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    crate::build_daemon()?;
    let registry = Registry::start()?;
    let layout = tempfile::tempdir()?;
    write_image(layout.path(), "base", &[busybox_base()], &["PATH=/bin"])?;
    let base = registry.push(layout.path(), "base", "bench/base")?;
    let context = tempfile::tempdir()?;
    std::fs::create_dir_all(context.path().join("app"))?;
    std::fs::write(context.path().join("app/main.txt"), "main\n")?;
    let config = format!(
        "[images.registries]\ninsecure = [\"{}\"]\n[e2b]\nmemory_mib = 1024\ndisk_mib = 1024\n\
         [e2b.templates]\nbase = {:?}\n",
        registry.addr,
        image("debian-12")
    );
    let daemon = brig_tests::Daemon::start_with_config(&config, &[])?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (first, unchanged, last_step) = rt.block_on(async {
        let client = daemon.client().await?;
        client.pull_image(&base, None).await?;
        builds(&client, &base, context.path()).await
    })?;

    let python = artifacts().join("venv/bin/python");
    anyhow::ensure!(
        python.exists(),
        "{} is missing: run scripts/install-deps.sh",
        python.display()
    );
    let url = daemon.e2b_url()?;
    let out = std::process::Command::new(python)
        .arg(repo_root().join("bench/scripts/build_measure.py"))
        .args([opts.runs.to_string(), opts.seconds.to_string(), opts.concurrency.to_string()])
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", daemon.access_token()?)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "the E2B side failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let e2b: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("{}"))
        .map_err(|e| anyhow::anyhow!("the E2B side printed no result ({e}): {stdout}"))?;
    let mut run_code = Latencies::default();
    for ms in e2b["run_code_ms"].as_array().into_iter().flatten().filter_map(|v| v.as_f64()) {
        run_code.record(Duration::from_secs_f64(ms / 1000.0));
    }
    let proxied = e2b["port_proxy_rps"].as_f64().unwrap_or(0.0);
    let direct = e2b["direct_rps"].as_f64();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("Builds and E2B templates (release brigd, same run)");
    println!("  {:<48} {:>9.1}", "10-step build from a pulled base, ms", ms(first));
    println!("  {:<48} {:>9.1}", "rebuild, nothing changed (all cached), ms", ms(unchanged));
    println!("  {:<48} {:>9.1}", "rebuild, last step changed, ms", ms(last_step));
    println!(
        "  {:<48} {:>9.2}",
        "run_code `x + 1` p50 ms (warm context)",
        run_code.quantile_ms(0.5)
    );
    println!("  {:<48} {:>9.0}", "requests/s through the port route", proxied);
    println!("  {:<48} {:>9.0}", "requests/s from the node directly", direct.unwrap_or(f64::NAN));
    Ok(json!({
        "bench": "build",
        "template_build_ms": round3(ms(first)),
        "template_rebuild_unchanged_ms": round3(ms(unchanged)),
        "template_rebuild_last_step_ms": round3(ms(last_step)),
        "run_code_p50_ms": round3(run_code.quantile_ms(0.5)),
        "run_code_p99_ms": round3(run_code.quantile_ms(0.99)),
        "code_interpreter_first_create_s": e2b["first_create_s"],
        "port_proxy_rps": round3(proxied),
        "direct_rps": direct.map(round3),
        "port_proxy_ratio": direct.map(|d| round3(proxied / d)),
        "runs": opts.runs,
        "seconds": opts.seconds,
        "concurrency": opts.concurrency,
    }))
}

/// The first build, the unchanged rebuild and the rebuild with its last step changed.
async fn builds(
    client: &Client,
    base: &str,
    context: &std::path::Path,
) -> anyhow::Result<(Duration, Duration, Duration)> {
    let build = |last: &str| BuildOptions::steps("bench/built", steps(base, last)).context(context);
    let timed = |options: BuildOptions| async move {
        let started = Instant::now();
        let built = client.build_image(options, |_| {}).await?;
        Ok::<_, anyhow::Error>((started.elapsed(), built))
    };
    let (first, built) = timed(build("echo last > last")).await?;
    anyhow::ensure!(
        built.steps_cached == 0,
        "a cold build took {} steps from the cache",
        built.steps_cached
    );
    let (unchanged, again) = timed(build("echo last > last")).await?;
    anyhow::ensure!(again.steps_run == 0, "an unchanged rebuild ran {} steps", again.steps_run);
    let (last_step, changed) = timed(build("echo changed > last")).await?;
    anyhow::ensure!(changed.steps_run == 1, "the changed rebuild ran {} steps", changed.steps_run);
    Ok((first, unchanged, last_step))
}
