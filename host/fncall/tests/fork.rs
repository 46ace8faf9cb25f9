//! Forking fncall workspaces: children share the parent's files copy-on-write (overlayfs), see
//! none of each other's writes, and leave nothing behind when they go. Needs root (mounts).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use brig_core::{CallOutcome, ToolCall};
use brig_fncall::{FncallBackend, FncallConfig, Workspace, MAX_LAYER_DEPTH};

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn read(ws: &Workspace, path: &str) -> Option<String> {
    std::fs::read_to_string(ws.path().join(path)).ok()
}

fn write(ws: &Workspace, path: &str, text: &str) {
    std::fs::write(ws.path().join(path), text).expect("write");
}

/// Mounts under `root`, from the kernel's own table.
fn mounts_under(root: &Path) -> usize {
    let root = root.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter(|l| l.split_whitespace().nth(4).is_some_and(|m| m.starts_with(&root)))
        .count()
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

fn open(state: &Path) -> FncallBackend {
    FncallBackend::open(FncallConfig::default(), state).expect("open")
}

#[test]
fn children_share_the_parent_copy_on_write_and_see_no_one_elses_writes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let b = open(tmp.path());
    let root = tmp.path().join("workspaces");
    let parent = b.create_workspace("parent").expect("ws");
    std::fs::create_dir(parent.path().join("src")).expect("mkdir");
    write(&parent, "src/main.py", "print(1)");
    write(&parent, "big", &"x".repeat(1 << 20));

    let kids = b.fork_workspaces(&parent, &keys("kid", 3)).expect("fork");
    assert_eq!(kids.len(), 3);
    let plain_dev = std::fs::metadata(&root).expect("root").dev();
    for kid in &kids {
        assert_eq!(read(kid, "src/main.py").as_deref(), Some("print(1)"));
        assert_eq!(read(kid, "big").map(|s| s.len()), Some(1 << 20));
        // An overlay mount, not a copy.
        assert_ne!(std::fs::metadata(kid.path()).expect("kid").dev(), plain_dev);
    }
    assert_eq!(b.shared_layers(), 1);
    assert_eq!(mounts_under(&root), 4, "the parent and three children");

    // Writes after the fork stay where they were made.
    write(&kids[0], "src/main.py", "print(0)");
    write(&kids[1], "only-1", "1");
    write(&parent, "src/main.py", "print('parent')");
    std::fs::remove_file(kids[2].path().join("big")).expect("rm in a child");
    assert_eq!(read(&kids[0], "src/main.py").as_deref(), Some("print(0)"));
    assert_eq!(read(&kids[1], "src/main.py").as_deref(), Some("print(1)"));
    assert_eq!(read(&kids[2], "src/main.py").as_deref(), Some("print(1)"));
    assert_eq!(read(&parent, "src/main.py").as_deref(), Some("print('parent')"));
    assert_eq!(read(&kids[0], "only-1"), None);
    assert_eq!(read(&parent, "only-1"), None);
    assert!(read(&parent, "big").is_some() && read(&kids[0], "big").is_some());

    // The workspace API works through the overlay as on a plain directory.
    let listed: Vec<String> = kids[1].list("").expect("list").into_iter().map(|e| e.path).collect();
    assert_eq!(listed, ["big", "only-1", "src"]);
    assert!(kids[0].disk_usage() >= 1 << 20);

    for kid in &kids {
        b.remove_workspace(kid).expect("remove");
    }
    b.remove_workspace(&parent).expect("remove");
    assert_eq!(mounts_under(&root), 0, "no mount left");
    assert_eq!(b.shared_layers(), 0);
    assert_eq!(entries(&root.join(".frozen")), 0, "no layer left");
    assert_eq!(entries(&root.join(".cow")), 0, "no upper left");
    assert_eq!(entries(&root), 2, "only .cow and .frozen remain");
}

#[tokio::test]
async fn a_tool_call_in_a_child_writes_to_that_child_only() {
    let tmp = tempfile::tempdir().expect("tmp");
    let b = open(tmp.path());
    let guests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../artifacts/guests/tools");
    b.add_tools_from_dir(&guests).await.expect("tools (run scripts/build-guests.sh first)");
    let parent = b.create_workspace("p").expect("ws");
    write(&parent, "a.txt", "from the parent");
    let kids = b.fork_workspaces(&parent, &keys("k", 2)).expect("fork");
    let call = ToolCall::new_tool("files", r#"{"op":"write","path":"a.txt","content":"kid 0"}"#);
    assert_eq!(b.call(call, Some(&kids[0])).await.expect("call").outcome, CallOutcome::Ok);
    assert_eq!(read(&kids[0], "a.txt").as_deref(), Some("kid 0"));
    assert_eq!(read(&kids[1], "a.txt").as_deref(), Some("from the parent"));
    assert_eq!(read(&parent, "a.txt").as_deref(), Some("from the parent"));
    for ws in kids.iter().chain([&parent]) {
        b.remove_workspace(ws).expect("remove");
    }
}

#[test]
fn layers_grow_only_with_writes_and_a_deep_chain_falls_back_to_copying() {
    let tmp = tempfile::tempdir().expect("tmp");
    let b = open(tmp.path());
    let parent = b.create_workspace("p").expect("ws");
    write(&parent, "f", "0");
    let first = b.fork_workspaces(&parent, &keys("a", 2)).expect("fork");
    let again = b.fork_workspaces(&parent, &keys("b", 2)).expect("fork again");
    assert_eq!(b.shared_layers(), 1, "a fork with nothing written since adds no layer");
    write(&parent, "f", "1");
    let third = b.fork_workspaces(&parent, &keys("c", 1)).expect("fork after a write");
    assert_eq!(b.shared_layers(), 2);
    assert_eq!(read(&first[0], "f").as_deref(), Some("0"));
    assert_eq!(read(&third[0], "f").as_deref(), Some("1"));
    for ws in first.iter().chain(&again).chain(&third) {
        b.remove_workspace(ws).expect("remove");
    }

    // A chain of forks, each child written then forked: past the depth limit children are
    // copies, and every generation still holds every earlier write.
    let mut current = parent;
    for generation in 0..MAX_LAYER_DEPTH + 3 {
        write(&current, &format!("g{generation}"), &generation.to_string());
        let mut next = b.fork_workspaces(&current, &[format!("g{generation}")]).expect("fork");
        let child = next.pop().expect("child");
        for earlier in 0..=generation {
            let want = earlier.to_string();
            assert_eq!(read(&child, &format!("g{earlier}")).as_deref(), Some(want.as_str()));
        }
        b.remove_workspace(&current).expect("remove");
        current = child;
    }
    b.remove_workspace(&current).expect("remove");
    let root = tmp.path().join("workspaces");
    assert_eq!(mounts_under(&root), 0);
    assert_eq!(entries(&root.join(".frozen")), 0);
}

#[test]
fn a_restarted_node_mounts_its_layered_workspaces_again_and_sweeps_stray_layers() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("workspaces");
    {
        let b = open(tmp.path());
        let parent = b.create_workspace("p").expect("ws");
        write(&parent, "f", "kept");
        b.fork_workspaces(&parent, &keys("k", 2)).expect("fork");
    }
    // A reboot: the mounts are gone, the files are not; and a crash left a layer no one lists.
    for key in ["p", "k0", "k1"] {
        nix::mount::umount2(&root.join(key), nix::mount::MntFlags::MNT_DETACH).expect("umount");
    }
    std::fs::create_dir_all(root.join(".frozen/stray")).expect("stray");
    let b = open(tmp.path());
    let parent = b.open_workspace("p").expect("adopt parent");
    let kid = b.open_workspace("k0").expect("adopt child");
    let other = b.open_workspace("k1").expect("adopt the other child");
    assert_eq!(read(&parent, "f").as_deref(), Some("kept"));
    assert_eq!(read(&kid, "f").as_deref(), Some("kept"));
    assert_eq!(b.sweep_layers(), 1, "only the stray layer goes");
    write(&kid, "f", "changed");
    assert_eq!(read(&parent, "f").as_deref(), Some("kept"));
    assert_eq!(read(&other, "f").as_deref(), Some("kept"));
    for ws in [&kid, &parent, &other] {
        b.remove_workspace(ws).expect("remove");
    }
    assert_eq!(mounts_under(&root), 0);
    assert_eq!(entries(&root.join(".frozen")), 0);
}
