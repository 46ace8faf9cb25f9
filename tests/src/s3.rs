//! A real S3-compatible server for tests (moto's `moto_server`, from PyPI) on a free loopback
//! port, with the bucket `brig-layers` made; killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

pub struct Moto {
    child: Child,
    pub port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    pub fn start() -> anyhow::Result<Moto> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("moto_server (pip install 'moto[server]'; scripts/install-deps.sh does)")?;
        let moto = Moto { child, port };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                // The bucket, with a plain path-style PUT.
                let url = format!("http://127.0.0.1:{port}/brig-layers");
                let out = Command::new("curl").args(["-s", "-X", "PUT", &url]).output()?;
                if !out.status.success() {
                    bail!("cannot make the bucket: {}", String::from_utf8_lossy(&out.stderr));
                }
                return Ok(moto);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("moto did not start")
    }

    /// The node configuration's `[images.backend]` for this server.
    pub fn backend_config(&self) -> String {
        format!(
            "[images.backend]\nkind = \"s3\"\nendpoint = \"http://127.0.0.1:{}\"\nbucket = \"brig-layers\"\naccess_key_id = \"test\"\nsecret_access_key = \"test\"\n",
            self.port
        )
    }
}
