//! What the hostile suites (`tests/tests/hostile*.rs`) share: the report every group writes
//! (`artifacts/reports/hostile-<group>.md`, printed by `scripts/test.sh`) and the bystander
//! probe that shows a node still serving others while an attack runs.

use std::time::{Duration, Instant};

use brig_sdk::{Client, Sandbox};

use crate::artifacts;

/// The rows of one group of attempts.
pub struct Report {
    group: &'static str,
    rows: Vec<(String, String, bool)>,
}

impl Report {
    pub fn new(group: &'static str) -> Report {
        Report { group, rows: Vec::new() }
    }

    pub fn row(&mut self, attempt: &str, contained: bool, outcome: String) {
        self.rows.push((attempt.to_string(), outcome.replace('\n', " "), contained));
    }

    /// Writes the report, then fails if any attempt got through.
    pub fn finish(self) {
        let mut text = format!(
            "### hostile agents: {}\n\n| attempt | result | outcome |\n|---|---|---|\n",
            self.group
        );
        for (attempt, outcome, ok) in &self.rows {
            let verdict = if *ok { "contained" } else { "**GOT THROUGH**" };
            text += &format!("| {attempt} | {verdict} | {outcome} |\n");
        }
        let dir = artifacts().join("reports");
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(dir.join(format!("hostile-{}.md", self.group)), &text);
        println!("{text}");
        assert!(self.rows.iter().all(|r| r.2), "{text}");
    }
}

/// The slowest answer of the node's status and of a bystander's `echo ok`, probed one after
/// the other every 100 ms until `until` resolves, and once more after; `Err` if either failed
/// or answered wrongly.
pub async fn worst_bystander_latency<T>(
    client: &Client,
    bystander: &Sandbox,
    until: impl std::future::Future<Output = T>,
) -> (T, Result<Duration, String>) {
    let worst: std::sync::Mutex<Result<Duration, String>> =
        std::sync::Mutex::new(Ok(Duration::ZERO));
    let probe_once = || async {
        let started = Instant::now();
        client.node_status().await.map_err(|e| format!("node status: {e}"))?;
        let status = started.elapsed();
        let started = Instant::now();
        let out = bystander.exec(["echo", "ok"]).await.map_err(|e| format!("bystander: {e}"))?;
        if out.stdout_text() != "ok\n" {
            return Err("the bystander answered wrongly".to_string());
        }
        Ok(status.max(started.elapsed()))
    };
    let record = |probed: Result<Duration, String>| {
        let mut worst = worst.lock().expect("probe lock");
        *worst = match (&*worst, probed) {
            (Err(e), _) => Err(e.clone()),
            (Ok(_), Err(e)) => Err(e),
            (Ok(w), Ok(d)) => Ok((*w).max(d)),
        };
    };
    let probe = async {
        loop {
            record(probe_once().await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let value = tokio::select! {
        value = until => value,
        _ = probe => unreachable!("the probe never ends"),
    };
    record(probe_once().await);
    let worst = worst.into_inner().expect("probe lock");
    (value, worst)
}
