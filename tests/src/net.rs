//! Network fixtures: a "mirror" host in a network namespace of its own, joined to the host by a
//! veth pair, serving HTTP, so egress tests cross a real routed hop without leaving the machine.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip").args(args).output().context("running ip")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// An HTTP server at `addr:port` in its own network namespace; removed on drop.
pub struct Mirror {
    pub addr: String,
    pub port: u16,
    netns: String,
    host_if: String,
    server: Child,
    _www: tempfile::TempDir,
}

impl Mirror {
    /// Serves `body` at `/` on port 8080.
    pub fn start(body: &str) -> anyhow::Result<Mirror> {
        let tag: u32 = u32::from_str_radix(&hex::encode(sha2_bytes()), 16).unwrap_or(7);
        let (b2, b3) = (240 + (tag % 8), (tag / 8) % 256);
        let (netns, host_if) =
            (format!("brigm{:06x}", tag & 0xff_ffff), format!("bm{:06x}", tag & 0xff_ffff));
        let (host_addr, addr) = (format!("10.{b2}.{b3}.1"), format!("10.{b2}.{b3}.2"));
        let _ = ip(&["netns", "del", &netns]);
        let _ = ip(&["link", "del", &host_if]);
        ip(&["netns", "add", &netns])?;
        ip(&["link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &netns])?;
        ip(&["addr", "add", &format!("{host_addr}/30"), "dev", &host_if])?;
        ip(&["link", "set", &host_if, "up"])?;
        let cidr = format!("{addr}/30");
        let steps: [&[&str]; 3] = [
            &["addr", "add", &cidr, "dev", "eth0"],
            &["link", "set", "eth0", "up"],
            &["link", "set", "lo", "up"],
        ];
        for step in steps {
            let mut args = vec!["netns", "exec", netns.as_str(), "ip"];
            args.extend_from_slice(step);
            ip(&args)?;
        }
        let www = tempfile::tempdir()?;
        std::fs::write(www.path().join("index.html"), body)?;
        let port = 8080;
        let server = Command::new("ip")
            .args(["netns", "exec", &netns, "python3", "-m", "http.server", &port.to_string()])
            .args(["--bind", &addr, "--directory"])
            .arg(www.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the mirror's HTTP server")?;
        let mirror = Mirror { addr, port, netns, host_if, server, _www: www };
        let deadline = Instant::now() + Duration::from_secs(20);
        let target = format!("{}:{}", mirror.addr, mirror.port);
        while std::net::TcpStream::connect_timeout(
            &target.parse().context("mirror address")?,
            Duration::from_millis(200),
        )
        .is_err()
        {
            if Instant::now() > deadline {
                bail!("the mirror did not start");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(mirror)
    }

    /// `addr:port` as an egress rule.
    pub fn rule(&self) -> String {
        format!("{}:{}", self.addr, self.port)
    }
}

fn sha2_bytes() -> [u8; 4] {
    use sha2::Digest;
    let seed = format!("{:?}{}", Instant::now(), std::process::id());
    let d = sha2::Sha256::digest(seed.as_bytes());
    [d[0], d[1], d[2], d[3]]
}

impl Drop for Mirror {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.netns]);
    }
}

/// Fetches `GET /metrics` from a daemon's metrics endpoint (from its endpoint.json).
pub fn metrics_text(state_dir: &std::path::Path) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let endpoint: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state_dir.join("endpoint.json"))?)?;
    let addr = endpoint["metrics"].as_str().context("the daemon serves no metrics")?;
    let mut conn = std::net::TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    // The server keeps HTTP/1.1 connections open unless asked not to; the body ends with it.
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: brigd\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP header")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("metrics endpoint answered {head}");
    }
    Ok(body.to_string())
}

/// The value of one metric series (`name{labels}` exactly as exposed), 0 when absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}
