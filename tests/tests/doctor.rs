//! `brig doctor`: what a node left on its host that belongs to none of its sandboxes is
//! listed (by the real CLI, and counted by the `brig_stray_objects` metric) and removed,
//! and nothing of a live sandbox is touched.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use brig_sdk::{Cmd, SandboxOptions};
use brig_tests::net::{metric, metrics_text};
use brig_tests::{image, Daemon};

/// Runs the CLI against `daemon`: exit code and the JSON objects it printed, one per line.
fn doctor(daemon: &Daemon, args: &[&str]) -> (i32, Vec<serde_json::Value>) {
    let out = Command::new(brig_tests::binary("brig"))
        .arg("--state-dir")
        .arg(daemon.state_dir())
        .args(["--json", "doctor"])
        .args(args)
        .output()
        .expect("brig doctor");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let found = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let code = out.status.code().expect("an exit code");
    assert!(code <= 1, "brig doctor failed: {}", String::from_utf8_lossy(&out.stderr));
    (code, found)
}

fn run(cmd: &str, args: &[&str]) {
    let status = Command::new(cmd).args(args).status().expect(cmd);
    assert!(status.success(), "{cmd} {args:?}");
}

fn stray_metric(daemon: &Daemon) -> f64 {
    metric(&metrics_text(daemon.state_dir()).expect("metrics"), "brig_stray_objects ")
}

#[tokio::test]
async fn doctor_lists_and_removes_what_belongs_to_no_sandbox() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("connect");
    // A live sandbox with a network link: nothing of it is stray.
    let options = SandboxOptions::container(&image("busybox")).egress(Vec::<String>::new());
    let sb = client.create(options).await.expect("create");
    let (code, found) = doctor(&daemon, &["--min-age-secs", "0"]);
    assert_eq!((code, found.len()), (0, 0), "{found:?}");

    // Leftovers of a sandbox the node no longer has, as a removal cut short leaves them.
    let (tag, run_dir, state) = (daemon.tag(), daemon.run_dir(), daemon.state_dir().to_owned());
    let name = "sb-00000000-00000000000000ff";
    let mut sleeper = Command::new("sleep").arg("600").spawn().expect("sleep");
    let cgroups: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .expect("cgroupfs")
        .flatten()
        .map(|c| c.path().join(format!("brig-0-{tag}")))
        .filter(|p| p.is_dir())
        .map(|p| p.join(name))
        .collect();
    assert!(!cgroups.is_empty(), "the node made no cgroup parent");
    for cg in &cgroups {
        std::fs::create_dir(cg).expect("cgroup");
    }
    std::fs::write(cgroups[0].join("cgroup.procs"), sleeper.id().to_string()).expect("join");
    let rootfs = run_dir.join("c").join(name).join("rootfs");
    std::fs::create_dir_all(&rootfs).expect("run dir");
    run("mount", &["-t", "tmpfs", "-o", "size=1m", "stray", &rootfs.display().to_string()]);
    let spool = state.join("spool").join(name);
    std::fs::create_dir_all(&spool).expect("spool dir");
    std::fs::write(spool.join("1.spool"), b"x").expect("spool");
    let record = state.join("sandboxes").join("sb-00000000-00000000000000fe.json");
    std::fs::write(&record, b"{}").expect("record");
    let intent = state.join("ops").join(format!("fork-{name}.json"));
    std::fs::write(&intent, b"{}").expect("intent");
    let link = format!("b{tag}00ff");
    // A veth pair (no dummy driver here); its peer's name is no slot's.
    let peer = format!("xs{}", std::process::id());
    run("ip", &["link", "add", &link, "type", "veth", "peer", "name", &peer]);
    // A full VM's network namespace of this node, and one of another daemon (not its own).
    let netns_id = "sb-00000000-00000000000000fd";
    let netns = format!("brig-{tag}-{netns_id}");
    let foreign = format!("brig-0ther{}-{netns_id}", std::process::id());
    run("ip", &["netns", "add", &netns]);
    run("ip", &["netns", "add", &foreign]);

    // Fresh leftovers may be a create under way: the default minimum age leaves them out,
    // except the link (the node holds a slot before it makes the slot's link).
    let (code, found) = doctor(&daemon, &[]);
    assert_eq!((code, found.len()), (1, 1), "{found:?}");
    assert_eq!(found[0]["name"], link.as_str());

    let (code, found) = doctor(&daemon, &["--min-age-secs", "0"]);
    assert_eq!(code, 1, "strays found and kept exit 1");
    let kinds: Vec<(&str, &str)> = found
        .iter()
        .map(|s| (s["kind"].as_str().unwrap_or(""), s["name"].as_str().unwrap_or("")))
        .collect();
    for want in [
        ("container", name),
        ("record", "sb-00000000-00000000000000fe.json"),
        ("intent", &format!("fork-{name}.json")),
        ("link", &link),
        ("netns", netns_id),
    ] {
        assert!(kinds.contains(&want), "{want:?} not in {found:#?}");
    }
    assert_eq!(found.len(), 5, "{found:#?}");
    assert!(!kinds.iter().any(|(_, n)| n.contains(&sb.id()[3..])), "a live sandbox listed");
    let container = found.iter().find(|s| s["kind"] == "container").expect("container");
    let parts: Vec<&str> =
        container["parts"].as_array().expect("parts").iter().filter_map(|p| p.as_str()).collect();
    let has = |prefix: &str| parts.iter().any(|p| p.starts_with(prefix));
    assert!(parts.contains(&format!("process {} (sleep)", sleeper.id()).as_str()), "{parts:?}");
    assert!(parts.contains(&format!("mount {}", rootfs.display()).as_str()), "{parts:?}");
    assert!(has("cgroup ") && has("run directory ") && has("spool "), "{parts:?}");
    assert!(found.iter().all(|s| s["removed"] == false));
    assert_eq!(stray_metric(&daemon), 5.0);

    let (code, found) = doctor(&daemon, &["--remove", "--min-age-secs", "0"]);
    assert_eq!((code, found.len()), (0, 5), "{found:#?}");
    assert!(found.iter().all(|s| s["removed"] == true));
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = sleeper.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "the stray process outlived doctor --remove");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "{status:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains(&rootfs.display().to_string()), "the stray mount is still there");
    for gone in cgroups
        .iter()
        .chain([&run_dir.join("c").join(name), &spool, &record, &intent])
        .map(PathBuf::as_path)
    {
        assert!(!gone.exists(), "{} is still there", gone.display());
    }
    assert!(!Path::new("/sys/class/net").join(&link).exists(), "the stray link is still there");
    assert!(!Path::new("/run/netns").join(&netns).exists(), "the stray namespace is still there");
    // Another daemon's namespace is not this node's to remove.
    assert!(Path::new("/run/netns").join(&foreign).exists(), "another daemon's namespace went");
    run("ip", &["netns", "del", &foreign]);
    assert_eq!(stray_metric(&daemon), 0.0);
    let (code, found) = doctor(&daemon, &["--min-age-secs", "0"]);
    assert_eq!((code, found.len()), (0, 0), "{found:?}");

    // The live sandbox was not touched.
    let out = sb.exec_with(Cmd::shell("echo still here")).await.expect("exec");
    assert_eq!(out.stdout_text(), "still here\n");
    sb.destroy().await.expect("destroy");
    assert!(daemon.leaks().is_empty(), "{:#?}", daemon.leaks());
}
