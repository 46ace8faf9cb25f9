use brig_sdk::{Cmd, SandboxOptions};
use brig_tests::{image, Daemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apt() {
    let daemon = Daemon::start().expect("brigd");
    let client = daemon.client().await.expect("c");
    let sb = client
        .create(
            SandboxOptions::container(&image("debian-12"))
                .egress(&["0.0.0.0/0"])
                .memory_mib(2048)
                .disk_mib(2048),
        )
        .await
        .expect("create");
    let t = std::time::Instant::now();
    let out = sb.exec_with(Cmd::shell("cat /etc/resolv.conf; apt-get update 2>&1 | tail -3 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-ipykernel python3-jupyter-client 2>&1 | tail -5; python3 -c 'import ipykernel, jupyter_client; print(jupyter_client.__version__)'").timeout(std::time::Duration::from_secs(600))).await.expect("exec");
    println!("took {:?}\n{}\n{}", t.elapsed(), out.stdout_text(), out.stderr_text());
}
