//! mkfs.erofs output, re-laid out into store slots, still mounts and reads back exactly.

use std::os::unix::fs::FileExt;
use std::path::Path;

use brig_images::{build, erofs, layout};

fn write(dir: &Path, rel: &str, bytes: &[u8]) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, bytes).expect("write");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn relayout_mounts_and_reads_back() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    for (i, len) in [0usize, 1, 100, 4095, 4096, 4097, 65535, 65536, 262_143, 262_144, 700_000]
        .iter()
        .enumerate()
    {
        write(&src, &format!("sizes/f{i}"), &pattern(*len, i as u8));
    }
    write(&src, "dup/a", &pattern(600_000, 7));
    write(&src, "dup/b", &pattern(600_000, 7));
    for i in 0..400 {
        write(
            &src,
            &format!("many/file-with-a-long-name-{i:04}.py"),
            format!("print({i})\n").as_bytes(),
        );
    }
    std::os::unix::fs::symlink("../sizes/f3", src.join("dup/link")).expect("symlink");
    let meta_path = tmp.path().join("meta.img");
    let blob_path = tmp.path().join("blob.img");
    build::mkfs_chunked(&src, &meta_path, &blob_path, layout::SLOT_BYTES).expect("mkfs");
    let mut meta = std::fs::read(&meta_path).expect("meta");
    let paths = erofs::list_paths(&meta).expect("paths");
    assert!(paths.contains(&"/many/file-with-a-long-name-0399.py".to_string()), "{paths:?}");
    let slots = layout::plan(&mut meta).expect("plan");
    assert!(!slots.is_empty());
    // Rebuild the blob device as the lazy file system would serve it.
    let blob = std::fs::File::open(&blob_path).expect("blob");
    let relaid = std::fs::File::create(tmp.path().join("relaid.img")).expect("create");
    relaid.set_len(slots.len() as u64 * layout::SLOT_BYTES).expect("len");
    for (i, slot) in slots.iter().enumerate() {
        let bytes = layout::assemble(slot, &blob).expect("assemble");
        relaid.write_all_at(&bytes, i as u64 * layout::SLOT_BYTES).expect("write");
    }
    std::fs::write(&meta_path, &meta).expect("meta");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mnt");
    let device = format!("device={}", tmp.path().join("relaid.img").display());
    nix::mount::mount(
        Some(&meta_path),
        &mnt,
        Some("erofs"),
        nix::mount::MsFlags::MS_RDONLY,
        Some(device.as_str()),
    )
    .expect("mount relaid image");
    let result = std::panic::catch_unwind(|| {
        let diff = std::process::Command::new("diff")
            .arg("-r")
            .arg("--no-dereference")
            .arg(&src)
            .arg(&mnt)
            .output()
            .expect("diff");
        assert!(diff.status.success(), "trees differ:\n{}", String::from_utf8_lossy(&diff.stdout));
    });
    nix::mount::umount(&mnt).expect("umount");
    result.expect("contents match");
}
