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
    let server = Server::of(tmp.path());
    let store = open_store(tmp.path());

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
    let server = Server::of(tmp.path());
    let store = open_store(tmp.path());
    let old = store.lazy_server_pid();
    let a = tmp.path().join("a");
    write(&a, "lib/big.bin", &pattern(600_000, 3));
    store.import("base/linger", None, ImportSource::Dir(a)).await.expect("import");

    kill(Pid::from_raw(old), Signal::SIGSTOP).expect("stop the server");
    std::fs::remove_file(tmp.path().join("lazyfs.sock")).expect("remove its socket");
    let started = std::time::Instant::now();
    store.clear_cache().await.expect("a call after the grace reaches a new server");
    let new = store.lazy_server_pid();
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

/// A server killed with `kill -9` while a layer is mounted from it: a new server takes its
/// mount over at once. A read the dead server had taken and not answered (its chunk fetch was
/// waiting: the chunk is a FIFO in the backend) is answered by the new one, pages not read
/// before come back whole, and the store goes on publishing layers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_taken_over_and_mounted_layers_read_on() {
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().expect("tmp");
    let server = Server::of(tmp.path());
    let store = open_store(tmp.path());
    let old = store.lazy_server_pid();
    let (files, layers, m, first) = half_read_layer(&store, tmp.path(), "base/takeover", 6).await;

    // f1's first chunk becomes a FIFO: the server's fetch of it waits in open(2).
    let chunks_dir = tmp.path().join("backend/chunks");
    let chunk = std::fs::read_dir(&chunks_dir)
        .expect("chunks")
        .flatten()
        .map(|e| e.path())
        .find(|p| std::fs::read(p).is_ok_and(|b| b.starts_with(&files[1][..4096])))
        .expect("f1's first chunk");
    let parked = chunk.with_extension("parked");
    std::fs::rename(&chunk, &parked).expect("park the chunk");
    nix::unistd::mkfifo(&chunk, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("fifo");
    let (tx, rx) = std::sync::mpsc::channel();
    let root = m.0.clone();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::read(root.join("data/f1.bin")));
    });
    let waiting = Instant::now() + Duration::from_secs(20);
    while !waits_for_a_fifo(old) {
        assert!(Instant::now() < waiting, "the server never started fetching f1's chunk");
        std::thread::sleep(Duration::from_millis(10));
    }
    let killed = std::process::Command::new("kill").args(["-9", &old.to_string()]).status();
    assert!(killed.expect("kill").success());
    std::fs::rename(&parked, &chunk).expect("the real chunk back in place of the FIFO");
    let held = rx.recv_timeout(Duration::from_secs(30)).expect("the held read was never answered");
    assert!(held.expect("f1 read through the kill") == files[1], "f1 read back different");

    // Pages not read before the kill.
    read_the_rest(&files, &m, &first, 2);
    let log = std::fs::read_to_string(tmp.path().join("lazyfs.log")).expect("server log");
    assert!(log.contains("took over the mount"), "{log}");
    assert!(log.contains("asked the kernel to resend"), "{log}");
    // The new server serves the mount before it answers on its socket, and is put on record
    // once it answers.
    let recorded = Instant::now() + Duration::from_secs(15);
    while store.lazy_server_pid() == old {
        assert!(Instant::now() < recorded, "the dead server is still on record");
        std::thread::sleep(Duration::from_millis(10));
    }

    // The store goes on: a second layer is published by the new server and read.
    let b = tmp.path().join("b");
    write(&b, "x.bin", &pattern(300_000, 99));
    store.import("base/after", None, ImportSource::Dir(b)).await.expect("import after");
    let after = store.acquire(&["base/after@1".to_string()]).await.expect("acquire after");
    let m2 = mount(&after[0], &tmp.path().join("mnt2"));
    assert_eq!(std::fs::read(m2.0.join("x.bin")).expect("read"), pattern(300_000, 99));
    drop((m2, first, m));
    store.release(&after.iter().map(|l| l.digest.clone()).collect::<Vec<_>>());
    store.release(&layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>());
    server.stop(&store).await;
}

/// brigd and its server die together (the store dropped without stopping its server, whose
/// copy of the device goes with it; then the server killed): the device keeper still holds
/// the mount's FUSE connection, so a layer mounted before reads on once a new store (a
/// restarted brigd) has started a server that takes the mount over from the keeper. A store
/// that stops its server ends the keeper too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_with_brigd_is_taken_over_through_the_device_keeper() {
    let tmp = tempfile::tempdir().expect("tmp");
    let server = Server::of(tmp.path());
    let store = open_store(tmp.path());
    let old = store.lazy_server_pid();
    let keeper = keeper_pid(tmp.path()).expect("a device keeper is recorded");
    assert!(Path::new(&format!("/proc/{keeper}")).exists(), "the keeper runs");
    let (files, layers, m, first) = half_read_layer(&store, tmp.path(), "base/kept", 3).await;

    drop(store);
    let killed = std::process::Command::new("kill").args(["-9", &old.to_string()]).status();
    assert!(killed.expect("kill").success());
    let gone = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while Path::new(&format!("/proc/{old}/stat")).exists()
        && !std::fs::read_to_string(format!("/proc/{old}/stat")).unwrap_or_default().contains(") Z")
    {
        assert!(std::time::Instant::now() < gone, "the server did not die");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }

    let store = open_store(tmp.path());
    assert_ne!(store.lazy_server_pid(), old, "a new server serves");
    assert_eq!(keeper_pid(tmp.path()), Some(keeper), "the same keeper is adopted");
    read_the_rest(&files, &m, &first, 1);
    let log = std::fs::read_to_string(tmp.path().join("lazyfs.log")).expect("server log");
    assert!(log.contains("took over the mount"), "{log}");
    drop((first, m));
    store.release(&layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>());
    server.stop(&store).await;
    assert!(keeper_pid(tmp.path()).is_none(), "the keeper's record outlived the stop");
    assert!(
        !std::fs::read_to_string(format!("/proc/{keeper}/stat")).is_ok_and(|s| !s.contains(") Z")),
        "the keeper outlived the stop"
    );
}

/// A layer `name` of `count` files of 700,000 bytes (`data/f<i>.bin`) imported into `store`,
/// its cache cleared, mounted at `<dir>/mnt`, and `f0.bin` open with its first page read:
/// the files, the acquired layers, the mount and the open file.
async fn half_read_layer(
    store: &LayerStore,
    dir: &Path,
    name: &str,
    count: u8,
) -> (Vec<Vec<u8>>, Vec<brig_images::ResolvedLayer>, Mounted, std::fs::File) {
    use std::os::unix::fs::FileExt;
    let a = dir.join("a");
    let files: Vec<Vec<u8>> = (0..count).map(|i| pattern(700_000, 10 + i)).collect();
    for (i, bytes) in files.iter().enumerate() {
        write(&a, &format!("data/f{i}.bin"), bytes);
    }
    store.import(name, None, ImportSource::Dir(a)).await.expect("import");
    let layers = store.acquire(&[format!("{name}@1")]).await.expect("acquire");
    store.clear_cache().await.expect("clear");
    let m = mount(&layers[0], &dir.join("mnt"));
    let first = std::fs::File::open(m.0.join("data/f0.bin")).expect("open");
    let mut page = vec![0u8; 4096];
    first.read_exact_at(&mut page, 0).expect("a first page");
    assert_eq!(page, files[0][..4096]);
    (files, layers, m, first)
}

/// After a server died: the last page of `f0.bin` (open as `first`) and the files from
/// `f<from>.bin` on read back whole through the mount.
fn read_the_rest(files: &[Vec<u8>], m: &Mounted, first: &std::fs::File, from: usize) {
    use std::os::unix::fs::FileExt;
    let mut tail = vec![0u8; 4096];
    first.read_exact_at(&mut tail, 700_000 - 4096).expect("the rest of f0");
    assert_eq!(tail, files[0][700_000 - 4096..]);
    for (i, want) in files.iter().enumerate().skip(from) {
        let got = std::fs::read(m.0.join(format!("data/f{i}.bin"))).expect("read after");
        assert!(got == *want, "f{i}.bin read back different");
    }
}

/// The device keeper `<dir>/lazyfs.keeper` records.
fn keeper_pid(dir: &Path) -> Option<i64> {
    let record = std::fs::read(dir.join("lazyfs.keeper")).ok()?;
    serde_json::from_slice::<serde_json::Value>(&record).ok()?["pid"].as_i64()
}

/// Whether a thread of `pid` waits in `open(2)` of a FIFO for a writer.
fn waits_for_a_fifo(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("wchan")).is_ok_and(|w| w == "wait_for_partner")
    })
}

/// Stops the store's lazy file system server at the end, or, if the test failed first, kills
/// the one serving then (which may have taken over from another) and its device keeper. Made
/// before the store, so it is dropped after it: a live store replaces a server that dies.
struct Server(PathBuf);

impl Server {
    fn of(dir: &Path) -> Server {
        Server(dir.join("lazyfs.pid"))
    }

    async fn stop(self, store: &LayerStore) {
        store.stop_lazy_server().await.expect("stop the lazy file system server");
        std::mem::forget(self);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for record in [self.0.clone(), self.0.with_extension("keeper")] {
            let record = std::fs::read(record).unwrap_or_default();
            let pid = serde_json::from_slice::<serde_json::Value>(&record)
                .ok()
                .and_then(|v| v["pid"].as_i64());
            if let Some(pid) = pid {
                let _ = std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status();
            }
        }
    }
}
