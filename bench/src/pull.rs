//! `pull`: an image of five layers (~500 MiB unpacked) from a registry on loopback (Debian's
//! `docker-registry`), pulled by brigd against the eager path a user has without Brig, in the
//! same run: `skopeo copy docker://… oci:…` then `umoci unpack`.
//!
//! - `pull_convert_mib_per_sec`: uncompressed MiB per second of `brig image pull` (download,
//!   digest and diff-digest checks, conversion into store layers); `peer_mib_per_sec` the same
//!   for skopeo + umoci; their ratio;
//! - `second_image_downloaded_mib`: an image sharing four of the five layers, next to
//!   `second_image_own_layer_mib` (the compressed size of the one it does not share);
//! - `create_after_pull_ms`: create → first exec of the freshly pulled image;
//! - `other_node_create_ms`, `other_node_fetched_fraction`: a second node sharing the blob
//!   backend, which never pulled the image, creates from `oci:REF` and runs a first exec; the
//!   share of the image's bytes it fetched.
//!
//! Layer data is pseudo-random (it compresses as real binaries barely do), files of 1 MiB.

use std::time::Instant;

use brig_sdk::SandboxOptions;
use brig_tests::registry::{busybox_base, write_image, Layer, Registry};
use serde_json::json;

use crate::stats::round3;

#[derive(clap::Args, Debug)]
pub struct Options {
    /// MiB of file data per layer (five layers).
    #[arg(long, default_value_t = 100)]
    layer_mib: usize,
}

/// `mib` files of 1 MiB of xorshift bytes, seeded by `seed`, under `dir/`.
fn data_layer(dir: &str, mib: usize, seed: u64) -> Layer {
    let mut state = seed | 1;
    let mut layer = Layer::default().dir(&format!("{dir}/"));
    for i in 0..mib {
        let mut data = vec![0u8; 1 << 20];
        for chunk in data.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
        layer = layer.file(&format!("{dir}/f{i:04}"), 0o644, &data);
    }
    layer
}

fn du_mib(path: &std::path::Path) -> f64 {
    let out = std::process::Command::new("du").args(["-sbx"]).arg(path).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let bytes: f64 = text.split_whitespace().next().and_then(|b| b.parse().ok()).unwrap_or(0.0);
    bytes / (1 << 20) as f64
}

pub fn run(opts: Options) -> anyhow::Result<serde_json::Value> {
    let registry = Registry::start()?;
    let work = tempfile::tempdir()?;
    let layout = work.path().join("layout");
    println!("building a five-layer image of {} MiB per layer (not timed)", opts.layer_mib);
    let mut base_layer = busybox_base();
    base_layer.entries.extend(data_layer("data0", opts.layer_mib, 1).entries);
    let shared: Vec<Layer> =
        (1..4).map(|i| data_layer(&format!("data{i}"), opts.layer_mib, i as u64 + 1)).collect();
    let mut first = vec![base_layer];
    let mut second = vec![busybox_base()];
    second[0].entries.extend(data_layer("data0", opts.layer_mib, 1).entries);
    for (i, l) in shared.into_iter().enumerate() {
        second.push(data_layer(&format!("data{}", i + 1), opts.layer_mib, i as u64 + 2));
        first.push(l);
    }
    first.push(data_layer("data4", opts.layer_mib, 5));
    second.push(data_layer("own", opts.layer_mib / 10, 99));
    let a = write_image(&layout, "a", &first, &[])?;
    let b = write_image(&layout, "b", &second, &[])?;
    anyhow::ensure!(a.diff_ids[..4] == b.diff_ids[..4], "the two images must share four layers");
    let ref_a = registry.push(&layout, "a", "bench/a")?;
    let ref_b = registry.push(&layout, "b", "bench/b")?;

    // The peer: download into an OCI layout, then unpack it.
    let peer_layout = work.path().join("peer");
    let bundle = work.path().join("bundle");
    let started = Instant::now();
    let copied = std::process::Command::new("skopeo")
        .args(["--insecure-policy", "copy", "--quiet", "--src-tls-verify=false"])
        .arg(format!("docker://{ref_a}"))
        .arg(format!("oci:{}:a", peer_layout.display()))
        .status()?;
    anyhow::ensure!(copied.success(), "skopeo copy failed");
    let unpacked = std::process::Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:a", peer_layout.display()))
        .arg(&bundle)
        .status()?;
    anyhow::ensure!(unpacked.success(), "umoci unpack failed");
    let peer_secs = started.elapsed().as_secs_f64();
    let image_mib = du_mib(&bundle.join("rootfs"));
    let _ = std::fs::remove_dir_all(&bundle);

    // Two nodes share one blob backend (a directory here, S3 in production).
    let shared = work.path().join("backend");
    let config = format!(
        "[images.backend]\nkind = \"local\"\ndir = \"{}\"\n[images.registries]\ninsecure = [\"{}\"]\n",
        shared.display(),
        registry.addr
    );
    let (daemon, rt) = crate::start_daemon_with_config(&config)?;
    let result = rt.block_on(async {
        let client = daemon.client().await?;
        let started = Instant::now();
        let pulled = client.pull_image(&ref_a, Some("bench/a")).await?;
        let pull_secs = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let sb = client.create(SandboxOptions::container("env:bench/a")).await?;
        let out = sb.exec(["true"]).await?;
        anyhow::ensure!(out.success(), "true failed in the pulled image");
        let create_ms = started.elapsed().as_secs_f64() * 1e3;
        sb.destroy().await?;
        let second = client.pull_image(&ref_b, Some("bench/b")).await?;
        Ok::<_, anyhow::Error>((pulled, pull_secs, create_ms, second))
    });
    drop(daemon);
    let (pulled, pull_secs, create_ms, second) = result?;
    // A node that never pulled the image: its create pulls the manifest, finds every layer in
    // the shared backend and fetches data only as the first exec reads it.
    let other = brig_tests::Daemon::start_with_config(&config, &[])?;
    let (other_ms, other_fetched) = rt.block_on(async {
        let client = other.client().await?;
        let started = Instant::now();
        let sb = client.create(SandboxOptions::container(&format!("oci:{ref_a}"))).await?;
        let out = sb.exec(["true"]).await?;
        anyhow::ensure!(out.success(), "true failed on the other node");
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let fetched = client.node_status().await?.images.map_or(0, |i| i.fetched_bytes);
        sb.destroy().await?;
        Ok::<_, anyhow::Error>((ms, fetched))
    })?;
    drop(rt);
    drop(other);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let brig_rate = image_mib / pull_secs;
    let peer_rate = image_mib / peer_secs;
    let own_mib = mib(b.layer_sizes[4]);
    let second_mib = mib(second.downloaded_bytes);
    println!("pull of a five-layer image ({image_mib:.0} MiB unpacked) from a loopback registry");
    println!(
        "  {:<44} {:>8.1} MiB/s ({pull_secs:.2} s)",
        "brig image pull (download + convert)", brig_rate
    );
    println!("  {:<44} {:>8.1} MiB/s ({peer_secs:.2} s)", "skopeo copy + umoci unpack", peer_rate);
    println!(
        "  {:<44} {:>8.2} / {own_mib:.2} MiB",
        "second image downloaded / its own layer", second_mib
    );
    println!("  {:<44} {:>8.1} ms", "create → first exec after the pull", create_ms);
    let other_fraction = mib(other_fetched) / image_mib;
    println!(
        "  {:<44} {:>8.1} ms, {:.2}% fetched",
        "create → first exec on another node",
        other_ms,
        other_fraction * 100.0
    );
    Ok(json!({
        "bench": "pull",
        "image_mib": round3(image_mib),
        "layers": pulled.layers.len(),
        "downloaded_mib": round3(mib(pulled.downloaded_bytes)),
        "pull_convert_mib_per_sec": round3(brig_rate),
        "peer_mib_per_sec": round3(peer_rate),
        "ratio": round3(brig_rate / peer_rate),
        "second_image_downloaded_mib": round3(second_mib),
        "second_image_own_layer_mib": round3(own_mib),
        "create_after_pull_ms": round3(create_ms),
        "other_node_create_ms": round3(other_ms),
        "other_node_fetched_fraction": round3(other_fraction),
    }))
}
