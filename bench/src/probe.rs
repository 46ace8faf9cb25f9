//! A same-run baseline for how fast this shared machine itself is: a fixed CPU loop, timed
//! every few seconds on a thread of its own at real-time priority (`SCHED_FIFO`), so the load
//! under test cannot delay it and only the machine can (its clock, a busy hypervisor: steal
//! that the guest's accounting does not show). A benchmark that compares windows of one run
//! reports the probe's change beside its own, so a slower machine is not read as a slower
//! Brig. The loop runs in registers, so it also times a chase of dependent loads through
//! memory far larger than the caches (`memory_ns`: nanoseconds per load), which slows when
//! neighbours on the same host contend for caches and memory bandwidth and the loop does not.
//! The probe cannot see other processes taking the CPUs from the load (it preempts them), so
//! [`CpuCensus`] counts the CPU time of the processes that are not Brig's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Iterations of the loop: about 25 ms on this development VM at its usual speed.
const LOOP_ITERATIONS: u64 = 40_000_000;
/// Entries of the memory chase (4 bytes each: 64 MiB, larger than any cache here).
const CHASE_ENTRIES: usize = 16 << 20;
/// Loads per memory sample (tens of ms).
const CHASE_LOADS: usize = 400_000;

/// One sample: when it started, how long the loop took, nanoseconds per chased load.
type Sample = (Instant, Duration, f64);

/// The probe thread and its samples.
pub struct MachineProbe {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Whether the thread got real-time priority (it needs root); without it, the probe is
    /// delayed by the load too and says less.
    pub realtime: bool,
}

impl MachineProbe {
    /// Starts timing the loop every `every`.
    pub fn start(every: Duration) -> MachineProbe {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = {
            let (samples, stop) = (samples.clone(), stop.clone());
            std::thread::Builder::new()
                .name("machine-probe".into())
                .spawn(move || {
                    let chain = chase_chain(CHASE_ENTRIES);
                    let _ = tx.send(realtime_priority());
                    let mut at = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        std::hint::black_box(fixed_work(LOOP_ITERATIONS));
                        let took = started.elapsed();
                        let chased = Instant::now();
                        at = chase(&chain, at, CHASE_LOADS);
                        let per_load = chased.elapsed().as_secs_f64() * 1e9 / CHASE_LOADS as f64;
                        samples.lock().push((started, took, per_load));
                        let next = started + every;
                        while !stop.load(Ordering::Relaxed) && Instant::now() < next {
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                })
                .ok()
        };
        let realtime = rx.recv().unwrap_or(false);
        MachineProbe { samples, stop, thread, realtime }
    }

    /// The median loop time in ms of the samples started in `[from, to)`.
    pub fn median_ms(&self, from: Instant, to: Instant) -> Option<f64> {
        self.median(from, to, |(_, took, _)| took.as_secs_f64() * 1e3)
    }

    /// The median nanoseconds per chased load of the samples started in `[from, to)`.
    pub fn median_memory_ns(&self, from: Instant, to: Instant) -> Option<f64> {
        self.median(from, to, |(_, _, ns)| *ns)
    }

    fn median(&self, from: Instant, to: Instant, of: impl Fn(&Sample) -> f64) -> Option<f64> {
        let mut values: Vec<f64> =
            self.samples.lock().iter().filter(|s| s.0 >= from && s.0 < to).map(of).collect();
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied()
    }
}

impl Drop for MachineProbe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The same arithmetic every time (a xorshift generator), with nothing to wait on.
fn fixed_work(iterations: u64) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..iterations {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    x
}

/// A single cycle through `entries` slots in random order (Sattolo's shuffle), so each load's
/// address depends on the one before and no prefetcher can guess it.
fn chase_chain(entries: usize) -> Vec<u32> {
    let mut next: Vec<u32> = (0..entries as u32).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..entries).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        next.swap(i, (x % i as u64) as usize);
    }
    next
}

/// Follows `chain` for `loads` steps from `at`; where it stopped.
fn chase(chain: &[u32], mut at: usize, loads: usize) -> usize {
    for _ in 0..loads {
        at = chain[at] as usize;
    }
    std::hint::black_box(at)
}

/// Puts the calling thread under `SCHED_FIFO` (with util-linux's `chrt`, by its thread id);
/// whether it could.
fn realtime_priority() -> bool {
    let Ok(link) = std::fs::read_link("/proc/thread-self") else { return false };
    let Some(tid) = link.file_name().and_then(|t| t.to_str()).map(str::to_string) else {
        return false;
    };
    std::process::Command::new("chrt")
        .args(["-f", "-p", "10", &tid])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// CPU time of the whole machine and of the processes that are neither Brig's (brigd, its
/// `brig-*` helpers, anything in a `brig-*` cgroup) nor this benchmark's, in clock ticks, read
/// from `/proc`. Processes that ended between two censuses are not counted, so the share of
/// short-lived outsiders is a lower bound.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuCensus {
    /// All CPUs' time (busy and idle), from `/proc/stat`.
    pub total: u64,
    /// Busy time of all CPUs.
    pub busy: u64,
    /// User and system time of the processes outside Brig and the benchmark.
    pub outside: u64,
    /// User and system time of brigd.
    pub brigd: u64,
    /// User and system time of Brig's other processes (`brig-*` helpers and what runs in
    /// `brig-*` cgroups) that are alive at the census.
    pub brig_others: u64,
}

impl CpuCensus {
    /// Takes a census; `brig` is brigd's pid.
    pub fn take(brig: u32) -> CpuCensus {
        let mut census = CpuCensus::default();
        if let Some(cpu) = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| s.lines().next().map(str::to_string))
        {
            let fields: Vec<u64> =
                cpu.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
            census.total = fields.iter().take(8).sum();
            // idle and iowait are the 4th and 5th fields.
            census.busy = census.total - fields.get(3).unwrap_or(&0) - fields.get(4).unwrap_or(&0);
        }
        let own = std::process::id();
        let Ok(procs) = std::fs::read_dir("/proc") else { return census };
        for entry in procs.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if pid == own {
                continue;
            }
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            let Some((head, rest)) = stat.rsplit_once(')') else { continue };
            // utime and stime: fields 14 and 15, the 12th and 13th after the name.
            let times: u64 = rest
                .split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|f| f.parse::<u64>().ok())
                .sum();
            if pid == brig {
                census.brigd += times;
                continue;
            }
            let brigs = head.contains("(brig")
                || std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .is_ok_and(|c| c.contains("/brig-"));
            if brigs {
                census.brig_others += times;
            } else {
                census.outside += times;
            }
        }
        census
    }

    /// From `earlier` to this census: the machine's busy share and the outsiders' share of
    /// all CPU time, in percent.
    pub fn shares_since(&self, earlier: &CpuCensus) -> (f64, f64) {
        let total = self.total.saturating_sub(earlier.total).max(1) as f64;
        let busy = self.busy.saturating_sub(earlier.busy) as f64;
        let outside = self.outside.saturating_sub(earlier.outside) as f64;
        (busy / total * 100.0, outside / total * 100.0)
    }

    /// From `earlier` to this census: CPU milliseconds of brigd and of Brig's other processes
    /// (those alive at both censuses; a process that ended meanwhile took its time with it).
    pub fn brig_ms_since(&self, earlier: &CpuCensus) -> (f64, f64) {
        // /proc counts in USER_HZ ticks, which Linux fixes at 100 a second.
        let ms = |now: u64, then: u64| now.saturating_sub(then) as f64 * 10.0;
        (ms(self.brigd, earlier.brigd), ms(self.brig_others, earlier.brig_others))
    }
}
