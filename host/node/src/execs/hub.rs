//! Execs decoupled from the client's stream: output goes to a bounded per-exec buffer (the
//! hub) that any number of client streams read from, so a rollout worker that crashes
//! mid-command reconnects (`ExecAttach`) and gets everything kept, then the rest. Container and
//! microVM sandboxes each keep a table of them.
//!
//! ```text
//! tier events ─▶ pump task ─▶ ExecHub { events (≤ HUB_BYTES, oldest dropped), result }
//!                                 ▲ notify
//! client stream(s) ─ cursor ──────┘  replay from the start, then follow, then Exited
//! ```
//! While a client streams an exec, output it has not had is never dropped: the pump waits for
//! it instead (and the command, its pipe full, waits for the pump), so a slow reader slows the
//! command and gets all of its output. Only output nobody is reading is dropped past
//! [`HUB_BYTES`], and a client that attaches later is told how much on its stderr.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_core::exec::ExecArchive;
use brig_proto::{ExecInfo, ExecResult, OutputStream, Reply, TerminalSize};
use brig_transport::{Exchange, TransportError};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::execs::input::StdinSlot;
use crate::limits::Limit;
use crate::NodeError;

/// Output kept per exec for reattaching clients.
const HUB_BYTES: usize = 8 << 20;
/// A streaming client that takes none of an exec's output for this long no longer holds the
/// command back: output past the hub's bound is dropped for it as for nobody (it is told how
/// much when it reads on), so a client that stopped reading without hanging up cannot stall a
/// command, its kill or its timeout for longer.
const READER_STALL: Duration = Duration::from_secs(30);
/// How long a finished exec stays attachable.
const FINISHED_KEEP: Duration = Duration::from_secs(600);
/// Output of one sandbox's finished execs kept in memory together; past it the oldest
/// finished exec's output is let go (its status stays, and a client that attaches is told).
const FINISHED_OUTPUT_BYTES: usize = 32 << 20;
/// The same bound over every sandbox of the node: many sandboxes each within their own bound
/// still hold the node's memory only up to this.
const NODE_FINISHED_OUTPUT_BYTES: usize = 512 << 20;

/// The node's finished execs in the order they finished, and the output they keep in memory
/// together (exact: every hub that lets output go takes it off).
struct NodeFinished {
    order: Mutex<VecDeque<std::sync::Weak<ExecHub>>>,
    bytes: AtomicUsize,
}

/// One node per process (brigd).
static NODE_FINISHED: NodeFinished =
    NodeFinished { order: parking_lot::const_mutex(VecDeque::new()), bytes: AtomicUsize::new(0) };

impl NodeFinished {
    /// Counts a hub that just finished, then lets go of the oldest finished output (never of
    /// a hub a client is still reading) until the node is within its bound.
    fn add(&self, hub: &Arc<ExecHub>, limit: usize) {
        let mut order = self.order.lock();
        order.push_back(Arc::downgrade(hub));
        let mut spared = Vec::new();
        while self.bytes.load(Ordering::Relaxed) > limit {
            let Some(old) = order.pop_front() else { break };
            let Some(old) = old.upgrade() else { continue };
            let mut st = old.state.lock();
            if st.readers.is_empty() {
                old.let_go(&mut st);
            } else {
                drop(st);
                spared.push(Arc::downgrade(&old));
            }
        }
        for hub in spared.into_iter().rev() {
            order.push_front(hub);
        }
    }
}

/// Sets an exec's terminal size.
pub(crate) type Resizer = Box<dyn Fn(TerminalSize) -> std::io::Result<()> + Send + Sync>;
/// Stops a running command.
pub(crate) type Killer = Box<dyn Fn() + Send + Sync>;

/// One exec's output and outcome, shared by its pump and its readers.
pub(crate) struct ExecHub {
    argv: Vec<String>,
    /// Its pid inside the sandbox, where the tier knows it.
    pub(crate) pid: Option<u32>,
    /// Replaced when a detached command is taken back (its new pump has the new control).
    killer: Mutex<Killer>,
    /// Sets the window size, for an exec on a terminal.
    resizer: Option<Resizer>,
    /// Its stdin, while a client may write it (`crate::execs::input`).
    pub(crate) stdin: StdinSlot,
    state: Mutex<HubState>,
    changed: Notify,
    /// Readers moved on: a pump waiting for them looks again.
    drained: Notify,
    /// Its sandbox's finished execs, which it joins when it finishes.
    finished_output: Arc<FinishedOutput>,
    /// Where its tier keeps its output on disk: once it finished and nobody streams it, the
    /// hub keeps none of it, and later readers are served from there (`crate::execs::archive`).
    archive: Option<Arc<dyn ExecArchive>>,
}

impl Drop for ExecHub {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        if st.finished.is_some() {
            NODE_FINISHED.bytes.fetch_sub(st.bytes, Ordering::Relaxed);
        }
    }
}

/// A sandbox's finished execs in the order they finished, whose kept output together stays
/// within [`FINISHED_OUTPUT_BYTES`].
#[derive(Default)]
struct FinishedOutput {
    hubs: Mutex<VecDeque<std::sync::Weak<ExecHub>>>,
}

impl FinishedOutput {
    /// Adds a finished hub, then lets go of the oldest finished output past the bound (never
    /// of a hub a client is still reading).
    fn add(&self, hub: &Arc<ExecHub>) {
        let mut hubs = self.hubs.lock();
        hubs.push_back(Arc::downgrade(hub));
        hubs.retain(|h| h.strong_count() > 0);
        let live: Vec<Arc<ExecHub>> = hubs.iter().filter_map(std::sync::Weak::upgrade).collect();
        let mut total: usize = live.iter().map(|h| h.state.lock().bytes).sum();
        for old in &live {
            if total <= FINISHED_OUTPUT_BYTES {
                break;
            }
            let mut st = old.state.lock();
            if !st.readers.is_empty() {
                continue;
            }
            total -= st.bytes;
            old.let_go(&mut st);
        }
    }
}

/// A client's place in a hub while it streams; gone with the stream.
pub(crate) struct Reader<'a> {
    hub: &'a ExecHub,
    id: u64,
}

impl Reader<'_> {
    /// The reader has had every event before `next`.
    fn at(&self, next: u64) {
        {
            let mut st = self.hub.state.lock();
            let place =
                st.readers.entry(self.id).or_insert(ReaderPlace { next, moved: Instant::now() });
            if next > place.next {
                *place = ReaderPlace { next, moved: Instant::now() };
            }
        }
        self.hub.drained.notify_waiters();
    }
}

/// Where a streaming client is: the next event it needs, and when it last took any.
#[derive(Debug, Clone, Copy)]
struct ReaderPlace {
    next: u64,
    moved: Instant,
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        {
            let mut st = self.hub.state.lock();
            st.readers.remove(&self.id);
            self.hub.let_go_archived(&mut st);
        }
        self.hub.drained.notify_waiters();
    }
}

#[derive(Default)]
struct HubState {
    /// Output replies; `first` is the absolute index of `events[0]`.
    events: VecDeque<Reply>,
    first: u64,
    bytes: usize,
    dropped_bytes: u64,
    /// Output bytes pushed so far, stdout and stderr (kept or dropped): where a command taken
    /// back after a pause, whose output is read again from its first byte, goes on from.
    seen: Seen,
    /// Its pump stopped with the command still running where the node cannot see it (a VM
    /// saved by a pause); it is taken back, or finished as lost.
    detached: bool,
    result: Option<ExecResult>,
    finished: Option<Instant>,
    /// The clients streaming it now, by reader id.
    readers: HashMap<u64, ReaderPlace>,
    next_reader: u64,
}

impl HubState {
    /// Whether taking in `incoming` more bytes would drop output a reader has not had: until
    /// when to wait for the readers it would drop from (the latest moment one of them becomes
    /// stalled, [`READER_STALL`]), or `None` to take it in now.
    fn wait_for_readers(&self, incoming: usize, now: Instant) -> Option<Instant> {
        if self.readers.is_empty() {
            return None;
        }
        let mut over = (self.bytes + incoming).saturating_sub(HUB_BYTES);
        let mut dropped = 0u64;
        for event in &self.events {
            if over == 0 {
                break;
            }
            over = over.saturating_sub(output_len(event));
            dropped += 1;
        }
        self.readers
            .values()
            .filter(|r| r.next < self.first + dropped)
            .map(|r| r.moved + READER_STALL)
            .filter(|stalled_at| *stalled_at > now)
            .max()
    }
}

/// Output bytes of one command, by stream.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub stdout: u64,
    pub stderr: u64,
}

impl Seen {
    /// What of `reply` is new, counting down what is seen already of its stream.
    pub(crate) fn skip(&mut self, reply: Reply) -> Option<Reply> {
        let Reply::Output { stream, mut data } = reply else { return Some(reply) };
        let seen = match stream {
            OutputStream::Stdout => &mut self.stdout,
            OutputStream::Stderr => &mut self.stderr,
        };
        let n = (*seen).min(data.len() as u64);
        *seen -= n;
        data.drain(..n as usize);
        (!data.is_empty()).then_some(Reply::Output { stream, data })
    }

    /// Counts `reply`'s output.
    pub(crate) fn add(&mut self, reply: &Reply) {
        match reply {
            Reply::Output { stream: OutputStream::Stdout, data } => {
                self.stdout += data.len() as u64
            }
            Reply::Output { stream: OutputStream::Stderr, data } => {
                self.stderr += data.len() as u64
            }
            _ => {}
        }
    }
}

fn output_len(reply: &Reply) -> usize {
    match reply {
        Reply::Output { data, .. } => data.len(),
        _ => 0,
    }
}

impl ExecHub {
    /// Takes in a command's output as its pump reads it, first waiting while that would drop
    /// output a streaming client has not had (see the module's comment).
    pub(crate) async fn push_for_readers(&self, reply: Reply) {
        let incoming = output_len(&reply);
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            let until = self.state.lock().wait_for_readers(incoming, Instant::now());
            let Some(until) = until else { break };
            let _ = tokio::time::timeout_at(until.into(), drained).await;
        }
        self.push(reply);
    }

    /// Takes in output, dropping the oldest past [`HUB_BYTES`] whoever has read it.
    pub(crate) fn push(&self, reply: Reply) {
        let mut st = self.state.lock();
        st.seen.add(&reply);
        st.bytes += output_len(&reply);
        st.events.push_back(reply);
        while st.bytes > HUB_BYTES {
            let Some(old) = st.events.pop_front() else { break };
            let n = output_len(&old);
            st.bytes -= n;
            st.dropped_bytes += n as u64;
            st.first += 1;
        }
        drop(st);
        self.changed.notify_waiters();
    }

    /// Marks the command detached: its pump stopped, and no result comes until it is taken
    /// back ([`ExecHub::reattach`]) or finished. Readers keep waiting.
    pub(crate) fn detach(&self) {
        self.state.lock().detached = true;
        self.changed.notify_waiters();
    }

    /// Waits until `deadline` for the pump to see its command detached (a pause's hang-up
    /// reaches it a moment after the VM stopped); false if it finished or never did.
    pub(crate) async fn detached_by(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.state.lock();
                if st.result.is_some() {
                    return false;
                }
                if st.detached {
                    return true;
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// A detached command taken back: the output it already has (to skip in what is read
    /// again), after its kill switch was replaced by `killer`. `None` if it was not detached.
    pub(crate) fn reattach(&self, killer: Killer) -> Option<Seen> {
        let mut st = self.state.lock();
        if !st.detached || st.result.is_some() {
            return None;
        }
        st.detached = false;
        *self.killer.lock() = killer;
        Some(st.seen)
    }

    pub(crate) fn finish(self: &Arc<Self>, result: ExecResult) {
        let mut st = self.state.lock();
        st.detached = false;
        st.result = Some(result);
        if st.finished.is_none() {
            NODE_FINISHED.bytes.fetch_add(st.bytes, Ordering::Relaxed);
        }
        st.finished = Some(Instant::now());
        self.let_go_archived(&mut st);
        drop(st);
        self.finished_output.add(self);
        NODE_FINISHED.add(self, NODE_FINISHED_OUTPUT_BYTES);
        // Nothing reads its stdin any more: the tier's writer lets go of the pipe.
        self.stdin.close();
        self.changed.notify_waiters();
    }

    /// Lets go of a finished command's output that its tier keeps on disk, once nobody reads it.
    fn let_go_archived(&self, st: &mut HubState) {
        if self.archive.is_some() && st.finished.is_some() && st.readers.is_empty() {
            self.let_go(st);
        }
    }

    /// Lets go of the output it keeps (a client that attaches is told how much).
    fn let_go(&self, st: &mut HubState) {
        if st.finished.is_some() {
            NODE_FINISHED.bytes.fetch_sub(st.bytes, Ordering::Relaxed);
        }
        st.dropped_bytes += st.bytes as u64;
        st.first += st.events.len() as u64;
        st.events.clear();
        st.bytes = 0;
    }

    /// Its stdout and stderr as kept, and its result (for tests).
    #[cfg(test)]
    pub(crate) fn kept_output(&self) -> (String, String, Option<ExecResult>) {
        let st = self.state.lock();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        for reply in &st.events {
            match reply {
                Reply::Output { stream: OutputStream::Stdout, data } => out.extend(data),
                Reply::Output { stream: OutputStream::Stderr, data } => err.extend(data),
                _ => {}
            }
        }
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        (text(out), text(err), st.result.clone())
    }

    fn info(&self, exec_id: u64) -> ExecInfo {
        let st = self.state.lock();
        ExecInfo {
            exec_id,
            pid: self.pid,
            argv: self.argv.clone(),
            result: st.result.clone(),
            buffered_bytes: st.bytes as u64,
        }
    }

    /// A place for a client that will stream it, from the oldest output kept: taken before the
    /// command's pump starts, so nothing it has not read is dropped before it reads.
    pub(crate) fn reader(&self) -> Reader<'_> {
        let mut st = self.state.lock();
        st.next_reader += 1;
        let id = st.next_reader;
        let place = ReaderPlace { next: st.first, moved: Instant::now() };
        st.readers.insert(id, place);
        Reader { hub: self, id }
    }

    /// Streams everything kept and then what follows, until the exec ends.
    pub(crate) async fn stream(&self, exchange: &mut Exchange) -> Result<Option<Reply>, NodeError> {
        let reader = self.reader();
        self.stream_as(reader, exchange).await
    }

    /// As [`ExecHub::stream`], for a client whose place was taken ahead ([`ExecHub::reader`]).
    pub(crate) async fn stream_as(
        &self,
        reader: Reader<'_>,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        // A finished command whose output was let go: from the archive, if it reads.
        let archived = self.archive.as_ref().and_then(|archive| {
            let st = self.state.lock();
            (st.first > 0).then(|| st.result.clone()).flatten().map(|r| (archive.clone(), r))
        });
        if let Some((archive, result)) = archived {
            if crate::execs::archive::replay(archive.as_ref(), exchange, READER_STALL).await? {
                return Ok(Some(Reply::Exited(result)));
            }
        }
        let peer_gone = exchange.peer_gone();
        tokio::pin!(peer_gone);
        let mut next = 0u64;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (batch, result) = {
                let st = self.state.lock();
                let mut batch = Vec::new();
                if next < st.first {
                    let note = format!(
                        "[brig: {} bytes of earlier output were not kept]\n",
                        st.dropped_bytes
                    );
                    batch.push(Reply::Output {
                        stream: OutputStream::Stderr,
                        data: note.into_bytes(),
                    });
                    next = st.first;
                }
                let skip = (next - st.first) as usize;
                batch.extend(st.events.iter().skip(skip).cloned());
                next = st.first + st.events.len() as u64;
                (batch, st.result.clone())
            };
            for reply in &batch {
                // A client that takes nothing for so long has left without hanging up.
                tokio::time::timeout(READER_STALL, exchange.reply(reply))
                    .await
                    .map_err(|_| TransportError::PeerGone)??;
            }
            reader.at(next);
            if let Some(result) = result {
                return Ok(Some(Reply::Exited(result)));
            }
            tokio::select! {
                () = notified => {}
                () = &mut peer_gone => return Err(TransportError::PeerGone.into()),
            }
        }
    }
}

/// A sandbox's execs: running and recently finished, by id.
#[derive(Default)]
pub(crate) struct ExecTable {
    execs: Mutex<HashMap<u64, Arc<ExecHub>>>,
    next: AtomicU64,
    finished_output: Arc<FinishedOutput>,
}

impl ExecTable {
    pub(crate) fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Makes new ids follow `exec_id` (a command kept across a restart).
    pub(crate) fn continue_after(&self, exec_id: u64) {
        self.next.fetch_max(exec_id, Ordering::Relaxed);
    }

    /// A hub for exec `exec_id` running `argv` (pid `pid` in the sandbox); `kill` stops it,
    /// `resize` resizes its terminal (if it has one).
    pub(crate) fn insert_with(
        &self,
        exec_id: u64,
        argv: Vec<String>,
        pid: Option<u32>,
        kill: Box<dyn Fn() + Send + Sync>,
        resize: Option<Resizer>,
        archive: Option<Arc<dyn ExecArchive>>,
    ) -> Arc<ExecHub> {
        let hub = Arc::new(ExecHub {
            argv,
            pid,
            killer: Mutex::new(kill),
            resizer: resize,
            stdin: StdinSlot::default(),
            state: Mutex::default(),
            changed: Notify::new(),
            drained: Notify::new(),
            finished_output: self.finished_output.clone(),
            archive,
        });
        self.execs.lock().insert(exec_id, hub.clone());
        hub
    }

    /// Forgets execs that finished long ago, then makes room for one more when `max` are
    /// kept: the oldest finished one is forgotten; if every kept exec still runs, the limit
    /// error. Called before each exec is inserted.
    pub(crate) fn make_room(&self, max: usize) -> Result<(), NodeError> {
        self.prune();
        let mut execs = self.execs.lock();
        while execs.len() >= max {
            let oldest_finished = execs
                .iter()
                .filter_map(|(id, hub)| hub.state.lock().finished.map(|t| (t, *id)))
                .min();
            match oldest_finished {
                Some((_, id)) => execs.remove(&id),
                None => return Err(Limit::ExecsPerSandbox.reached(max)),
            };
        }
        Ok(())
    }

    /// Exec `exec_id`'s hub, if the node has it.
    pub(crate) fn find(&self, exec_id: u64) -> Option<Arc<ExecHub>> {
        self.execs.lock().get(&exec_id).cloned()
    }

    /// Finishes every detached command nobody took back (its sandbox came back without it):
    /// `note` goes to its stderr, and its status is unknown.
    pub(crate) fn finish_detached(&self, note: &str) -> usize {
        let hubs: Vec<_> = self.execs.lock().values().cloned().collect();
        let mut finished = 0;
        for hub in hubs {
            if hub.state.lock().detached {
                hub.push(Reply::Output { stream: OutputStream::Stderr, data: note.into() });
                hub.finish(ExecResult::default());
                finished += 1;
            }
        }
        finished
    }

    fn get(&self, exec_id: u64) -> Result<Arc<ExecHub>, NodeError> {
        self.execs.lock().get(&exec_id).cloned().ok_or(NodeError::NoSuchExec(exec_id))
    }

    /// Streams an exec again: everything kept from its start, then the rest.
    pub(crate) async fn attach(
        &self,
        exec_id: u64,
        exchange: &mut Exchange,
    ) -> Result<Option<Reply>, NodeError> {
        let hub = self.get(exec_id)?;
        exchange.reply(&Reply::ExecStarted { exec_id, pid: hub.pid }).await?;
        hub.stream(exchange).await
    }

    pub(crate) fn kill(&self, exec_id: u64) -> Result<(), NodeError> {
        let hub = self.get(exec_id)?;
        (hub.killer.lock())();
        Ok(())
    }

    /// Writes `data` to exec `exec_id`'s stdin, then with `close` closes it (end of file).
    /// Closing a closed stdin does nothing; writing to one is refused.
    pub(crate) async fn input(
        &self,
        exec_id: u64,
        data: Vec<u8>,
        close: bool,
    ) -> Result<(), NodeError> {
        let hub = self.get(exec_id)?;
        if !data.is_empty() || !close {
            hub.stdin.write(data.into(), true).await.map_err(|e| e.into_node_error(exec_id))?;
        }
        if close {
            hub.stdin.close();
        }
        Ok(())
    }

    /// Sets the window size of an exec that runs on a terminal.
    pub(crate) fn resize(&self, exec_id: u64, size: TerminalSize) -> Result<(), NodeError> {
        let hub = self.get(exec_id)?;
        let resize = hub.resizer.as_ref().ok_or(NodeError::NotATerminal(exec_id))?;
        resize(size)
            .map_err(|source| NodeError::Io { what: format!("exec {exec_id}'s terminal"), source })
    }

    /// Running and recently finished execs.
    pub(crate) fn list(&self) -> Vec<ExecInfo> {
        self.prune();
        let mut out: Vec<ExecInfo> =
            self.execs.lock().iter().map(|(id, hub)| hub.info(*id)).collect();
        out.sort_by_key(|e| e.exec_id);
        out
    }

    /// Forgets execs that finished long ago.
    fn prune(&self) {
        self.execs
            .lock()
            .retain(|_, hub| hub.state.lock().finished.is_none_or(|t| t.elapsed() < FINISHED_KEEP));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(bytes: usize) -> Reply {
        Reply::Output { stream: OutputStream::Stdout, data: vec![b'x'; bytes] }
    }

    fn hub(table: &ExecTable, id: u64) -> Arc<ExecHub> {
        table.insert_with(id, vec!["yes".into()], None, Box::new(|| {}), None, None)
    }

    #[test]
    fn output_a_reader_has_not_had_is_not_dropped() {
        let table = ExecTable::default();
        let hub = hub(&table, 1);
        for _ in 0..8 {
            hub.push(out(1 << 20));
        }
        let now = Instant::now();
        let waits = |incoming: usize| hub.state.lock().wait_for_readers(incoming, now).is_some();
        assert!(!waits(1 << 20), "nobody reads: drop freely");
        let place = |next| ReaderPlace { next, moved: now };
        hub.state.lock().readers.insert(1, place(0));
        assert!(waits(1 << 20), "the reader has not had event 0");
        assert!(!waits(0));
        hub.state.lock().readers.insert(1, place(1));
        assert!(!waits(1 << 20), "event 0 is read");
        assert!(waits(2 << 20), "event 1 is not");
        // A reader that took nothing for READER_STALL holds nothing back.
        let stalled = ReaderPlace { next: 0, moved: now - READER_STALL };
        hub.state.lock().readers.insert(1, stalled);
        assert!(!waits(2 << 20), "a stalled reader does not hold the command");
    }

    #[tokio::test]
    async fn a_pump_waits_for_a_slow_reader_and_goes_on_when_it_reads() {
        let table = ExecTable::default();
        let hub = hub(&table, 1);
        for _ in 0..8 {
            hub.push(out(1 << 20));
        }
        let reader = hub.reader();
        let pushed = {
            let hub = hub.clone();
            tokio::spawn(async move { hub.push_for_readers(out(1 << 20)).await })
        };
        // The test's runtime has one thread: while this sleeps, the pump runs up to its wait.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!pushed.is_finished(), "the pump must wait for the reader");
        assert_eq!(hub.state.lock().events.len(), 8, "nothing taken in meanwhile");
        reader.at(8);
        tokio::time::timeout(Duration::from_secs(5), pushed).await.expect("went on").expect("join");
        assert_eq!(hub.state.lock().dropped_bytes, 1 << 20, "only read output was dropped");
    }

    #[test]
    fn finished_output_of_a_sandbox_is_bounded_and_spares_readers() {
        let table = ExecTable::default();
        let hubs: Vec<_> = (1..=6).map(|id| hub(&table, id)).collect();
        // Hub 1 is still being read; the others are not.
        hubs[0].state.lock().readers.insert(1, ReaderPlace { next: 0, moved: Instant::now() });
        for hub in &hubs {
            for _ in 0..8 {
                hub.push(out(1 << 20));
            }
            hub.finish(ExecResult::default());
        }
        let kept: Vec<usize> = hubs.iter().map(|h| h.state.lock().bytes).collect();
        assert_eq!(kept[0], 8 << 20, "a hub being read keeps its output");
        let others: usize = kept[1..].iter().sum();
        assert!(kept.iter().sum::<usize>() <= FINISHED_OUTPUT_BYTES + (8 << 20), "{kept:?}");
        assert_eq!(others, 24 << 20, "{kept:?}");
        assert_eq!(kept[1], 0, "the oldest unread output went first: {kept:?}");
        assert!(hubs.iter().all(|h| h.state.lock().result.is_some()), "statuses stay");
    }

    #[test]
    fn finished_output_of_the_node_is_bounded_and_counted_exactly() {
        // Six sandboxes, each within its own bound; the node's bound (here 20 MiB) holds.
        let tables: Vec<ExecTable> = (0..6).map(|_| ExecTable::default()).collect();
        let hubs: Vec<_> = tables.iter().map(|t| hub(t, 1)).collect();
        hubs[0].state.lock().readers.insert(1, ReaderPlace { next: 0, moved: Instant::now() });
        for hub in &hubs {
            for _ in 0..8 {
                hub.push(out(1 << 20));
            }
            hub.finish(ExecResult::default());
            NODE_FINISHED.add(hub, 20 << 20);
        }
        let kept: Vec<usize> = hubs.iter().map(|h| h.state.lock().bytes).collect();
        assert_eq!(kept[0], 8 << 20, "a hub being read keeps its output: {kept:?}");
        assert!(kept.iter().sum::<usize>() <= (20 << 20) + (8 << 20), "{kept:?}");
        assert_eq!(kept[5], 8 << 20, "the newest stays: {kept:?}");
        let counted = NODE_FINISHED.bytes.load(Ordering::Relaxed);
        assert_eq!(counted, kept.iter().sum::<usize>(), "the count is exact");
        drop(hubs);
        drop(tables);
        assert_eq!(NODE_FINISHED.bytes.load(Ordering::Relaxed), 0, "gone with the hubs");
    }
}
