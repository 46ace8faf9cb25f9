//! The layer store on a real FUSE mount and real EROFS: import, dedup, lazy reads, damage.

use std::path::{Path, PathBuf};

use brig_images::backend::{Backend, BackendSpec};
use brig_images::{ImportSource, LayerStore, StoreConfig};

fn write(dir: &Path, rel: &str, bytes: &[u8]) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, bytes).expect("write");
}

/// Pseudo-random bytes (no repeating blocks, so mkfs's own chunk dedup does not kick in).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(seed);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn mount(layer: &brig_images::ResolvedLayer, at: &Path) -> Mounted {
    std::fs::create_dir_all(at).expect("mkdir");
    let device = format!("device={}", layer.blob.display());
    nix::mount::mount(
        Some(&layer.meta),
        at,
        Some("erofs"),
        nix::mount::MsFlags::MS_RDONLY,
        Some(device.as_str()),
    )
    .expect("mount layer");
    Mounted(at.to_owned())
}

/// A store under `dir` on a local backend (`<dir>/backend`), with its own lazy server.
fn open_store(dir: &Path) -> LayerStore {
    let backend_dir = dir.join("backend");
    let backend = Backend::local(&backend_dir).expect("backend");
    LayerStore::open(
        StoreConfig {
            dir: dir.join("store"),
            lazy_mount: dir.join("lazy"),
            cache_dir: dir.join("cache"),
            cache_max_bytes: 64 << 20,
            cache_memory_bytes: 1 << 20,
            id_base: 100_000,
            lazy_server_bin: env!("CARGO_BIN_EXE_brig-lazyfs").into(),
            backend_spec: BackendSpec::Local { dir: backend_dir },
        },
        backend,
    )
    .expect("store")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_dedup_lazy_read_and_damage() {
    let tmp = tempfile::tempdir().expect("tmp");
    let backend_dir = tmp.path().join("backend");
    let store = open_store(tmp.path());
    let server = Server(store.lazy_server_pid());

    let a = tmp.path().join("a");
    write(&a, "lib/big.bin", &pattern(900_000, 1));
    write(&a, "lib/other.bin", &pattern(300_000, 2));
    for i in 0..50 {
        write(&a, &format!("src/m{i}.py"), format!("x = {i}\n").as_bytes());
    }
    let first =
        store.import("base/test", None, ImportSource::Dir(a.clone())).await.expect("import a");
    assert_eq!(first.version, 1);
    assert!(first.new_chunks > 0);
    // A second layer sharing the big file: its chunks are not stored again.
    let b = tmp.path().join("b");
    write(&b, "opt/big-copy.bin", &pattern(900_000, 1));
    write(&b, "opt/new.txt", b"new\n");
    let second = store.import("toolkit/test", None, ImportSource::Dir(b)).await.expect("import b");
    let big_chunks = 900_000u64.div_ceil(256 << 10);
    assert!(second.new_chunks < second.chunks, "{second:?}");
    assert!(
        second.chunks - second.new_chunks >= big_chunks,
        "big file not deduplicated: {second:?}"
    );
    let again =
        store.import("base/test", None, ImportSource::Dir(a.clone())).await.expect("reimport");
    assert_eq!((again.version, again.new_chunks), (2, 0));

    // Lazy: mounting reads nothing; reading one small file fetches one chunk, not the layer.
    let layers = store.acquire(&["base/test@1".to_string()]).await.expect("acquire");
    store.clear_cache().await.expect("clear");
    let before = store.stats().await.fetched_bytes;
    let m = mount(&layers[0], &tmp.path().join("mnt"));
    assert_eq!(std::fs::read(m.0.join("src/m7.py")).expect("read"), b"x = 7\n");
    let fetched = store.stats().await.fetched_bytes - before;
    assert!(fetched > 0 && fetched <= 256 << 10, "fetched {fetched} bytes for one small file");
    assert_eq!(std::fs::read(m.0.join("lib/big.bin")).expect("read"), pattern(900_000, 1));
    let owner = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata(m.0.join("lib/big.bin")).expect("stat"),
    );
    assert!(owner >= 100_000, "ownership not shifted: {owner}");

    // Damage: corrupt one chunk in the backend; it is detected and never served.
    let (_, paths) = store.inspect("base/test@1").await.expect("inspect");
    assert!(paths.contains(&"/lib/other.bin".to_string()));
    let chunks_dir = backend_dir.join("chunks");
    let victim = std::fs::read_dir(&chunks_dir)
        .expect("chunks")
        .flatten()
        .find(|e| {
            std::fs::read(e.path())
                .map(|b| b.starts_with(&pattern(300_000, 2)[..4096]))
                .unwrap_or(false)
        })
        .expect("chunk of other.bin");
    let mut bytes = std::fs::read(victim.path()).expect("read chunk");
    bytes[100] ^= 0xff;
    std::fs::write(victim.path(), bytes).expect("corrupt");
    drop(m);
    store.clear_cache().await.expect("clear");
    let m = mount(&layers[0], &tmp.path().join("mnt2"));
    let read = std::fs::read(m.0.join("lib/other.bin"));
    assert!(read.is_err(), "a corrupt chunk was served");
    assert!(store.stats().await.corrupt_chunks >= 1);
    let err = store.verify("base/test@1").await.expect_err("verify must fail");
    assert!(err.to_string().contains("corrupt"), "{err}");
    // A missing chunk is named too.
    std::fs::remove_file(victim.path()).expect("remove");
    store.clear_cache().await.expect("clear");
    let err = store.verify("base/test@1").await.expect_err("verify must fail");
    assert!(err.to_string().contains("missing"), "{err}");
    drop(m);
    store.release(&layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>());

    // Removing and collecting garbage.
    store.remove("toolkit/test").await.expect("remove");
    let report = store.gc().await.expect("gc");
    assert!(report.removed_layers >= 1 && report.removed_chunks >= 1, "{report:?}");
    assert!(store.inspect("toolkit/test").await.is_err());
    assert!(store.inspect("base/test@2").await.is_ok());
    server.stop(&store).await;
}

/// A server that is still in the process table but refuses connections (as one killed a moment
/// ago does while it exits; here it is stopped and its socket gone) is ended after a short grace
/// and replaced: the next call succeeds on a new server, and the layer reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_but_lingers_is_ended_and_replaced() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let tmp = tempfile::tempdir().expect("tmp");
    let store = open_store(tmp.path());
    let old = store.lazy_server_pid();
    let _old_server = Server(old);
    let a = tmp.path().join("a");
    write(&a, "lib/big.bin", &pattern(600_000, 3));
    store.import("base/linger", None, ImportSource::Dir(a)).await.expect("import");

    kill(Pid::from_raw(old), Signal::SIGSTOP).expect("stop the server");
    std::fs::remove_file(tmp.path().join("lazyfs.sock")).expect("remove its socket");
    let started = std::time::Instant::now();
    store.clear_cache().await.expect("a call after the grace reaches a new server");
    let new = store.lazy_server_pid();
    let server = Server(new);
    assert_ne!(new, old, "the lingering server was kept");
    assert!(started.elapsed() >= std::time::Duration::from_secs(1), "no grace for a dying server");
    let state = std::fs::read_to_string(format!("/proc/{old}/stat")).unwrap_or_default();
    assert!(state.is_empty() || state.contains(") Z"), "the old server still runs: {state}");

    let layers = store.acquire(&["base/linger@1".to_string()]).await.expect("acquire");
    let m = mount(&layers[0], &tmp.path().join("mnt"));
    assert_eq!(std::fs::read(m.0.join("lib/big.bin")).expect("read"), pattern(600_000, 3));
    drop(m);
    store.release(&layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>());
    server.stop(&store).await;
}

/// Stops the store's lazy file system server at the end, or kills it if the test failed first.
struct Server(i32);

impl Server {
    async fn stop(self, store: &LayerStore) {
        store.stop_lazy_server().await.expect("stop the lazy file system server");
        std::mem::forget(self);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").arg("-9").arg(self.0.to_string()).status();
    }
}
