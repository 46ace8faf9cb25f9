//! The host side of virtio-vsock: the Unix socket host processes connect to, their
//! `CONNECT <port>` lines, and the streams it relays under the guest's credit (see the
//! device's module).

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::{
    Conn, ConnState, Header, VsockShared, BUF_ALLOC, HOST_CID, MAX_PAYLOAD, OP_CREDIT_UPDATE,
    OP_REQUEST, OP_RST, OP_RW, OP_SHUTDOWN, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM,
};

/// The host side: accepts connections on the Unix socket and reads host streams. Call
/// [`VsockBackend::step`] in a loop on its own thread; it returns whether the guest has
/// packets waiting (then poll the transport).
#[derive(Debug)]
pub struct VsockBackend {
    pub(super) listener: UnixListener,
    pub(super) shared: Arc<Mutex<VsockShared>>,
    pub(super) guest_cid: u64,
    pub path: PathBuf,
}

impl crate::virtio::Backend for VsockBackend {
    fn wait(&self, limit: std::time::Duration) {
        VsockBackend::wait(self, limit)
    }

    fn step(&self) -> bool {
        VsockBackend::step(self)
    }
}

impl VsockBackend {
    /// Sleeps until a host socket has something for us (a connection, a `CONNECT` line, data
    /// the guest has credit for) or `limit` passes. Streams the guest has no credit for are not
    /// watched; the limit bounds how late a credit update is noticed.
    pub fn wait(&self, limit: std::time::Duration) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::{AsFd, OwnedFd};
        // Copies of the descriptors, so the device's lock is not held while we sleep.
        let watched: Vec<(OwnedFd, PollFlags)> = {
            let Ok(shared) = self.shared.lock() else { return };
            let mut fds = vec![self.listener.as_fd().try_clone_to_owned()];
            fds.extend(shared.pending.iter().map(|(s, _)| s.as_fd().try_clone_to_owned()));
            let mut flags = vec![PollFlags::POLLIN; fds.len()];
            for c in shared.conns.values().filter(|c| c.state == ConnState::Established) {
                let mut want = PollFlags::empty();
                if c.peer_credit() > 0 {
                    want |= PollFlags::POLLIN;
                }
                if !c.to_host.is_empty() {
                    want |= PollFlags::POLLOUT;
                }
                if !want.is_empty() {
                    fds.push(c.stream.as_fd().try_clone_to_owned());
                    flags.push(want);
                }
            }
            fds.into_iter().zip(flags).filter_map(|(fd, f)| Some((fd.ok()?, f))).collect()
        };
        let mut fds: Vec<PollFd<'_>> =
            watched.iter().map(|(fd, flags)| PollFd::new(fd.as_fd(), *flags)).collect();
        let timeout = PollTimeout::try_from(limit).unwrap_or(PollTimeout::MAX);
        let _ = poll(&mut fds, timeout);
    }

    /// One round: accept, read `CONNECT` lines, read host data within the guest's credit.
    pub fn step(&self) -> bool {
        let Ok(mut guard) = self.shared.lock() else { return false };
        let shared = &mut *guard;
        while let Ok((stream, _)) = self.listener.accept() {
            if stream.set_nonblocking(true).is_ok() {
                shared.pending.push((stream, Vec::new()));
            }
        }
        let mut still = Vec::new();
        for (mut stream, mut line) in std::mem::take(&mut shared.pending) {
            let mut byte = [0u8; 1];
            let mut done = false;
            while line.len() < 64 {
                match stream.read(&mut byte) {
                    Ok(1) if byte[0] == b'\n' => {
                        done = true;
                        break;
                    }
                    Ok(1) => line.push(byte[0]),
                    _ => break,
                }
            }
            if !done {
                if line.len() < 64 {
                    still.push((stream, line));
                }
                continue;
            }
            let port = String::from_utf8_lossy(&line)
                .strip_prefix("CONNECT ")
                .and_then(|p| p.trim().parse::<u32>().ok());
            let Some(port) = port else { continue };
            let host_port = shared.next_host_port;
            shared.next_host_port = shared.next_host_port.wrapping_add(1).max(1 << 30);
            let request = Header {
                src_cid: HOST_CID,
                dst_cid: self.guest_cid,
                src_port: host_port,
                dst_port: port,
                type_: TYPE_STREAM,
                op: OP_REQUEST,
                buf_alloc: BUF_ALLOC,
                ..Header::default()
            };
            shared.to_guest.push_back((request, Vec::new()));
            shared.conns.insert((host_port, port), Conn::new(stream));
        }
        shared.pending = still;
        let mut closed = Vec::new();
        let mut out = Vec::new();
        for (&(host_port, guest_port), conn) in shared.conns.iter_mut() {
            if conn.state != ConnState::Established {
                continue;
            }
            let control = |op, fwd_cnt| Header {
                src_cid: HOST_CID,
                dst_cid: self.guest_cid,
                src_port: host_port,
                dst_port: guest_port,
                type_: TYPE_STREAM,
                op,
                buf_alloc: BUF_ALLOC,
                fwd_cnt,
                ..Header::default()
            };
            // Guest data waiting for the host reader: out first, then news of the space.
            if !conn.to_host.is_empty() {
                match conn.flush() {
                    Ok(n) => {
                        let crossed = conn.consumed(n);
                        if crossed || (n > 0 && conn.to_host.is_empty()) {
                            out.push((control(OP_CREDIT_UPDATE, conn.fwd_cnt), Vec::new()));
                        }
                    }
                    Err(_) => {
                        out.push((control(OP_RST, conn.fwd_cnt), Vec::new()));
                        closed.push((host_port, guest_port));
                        continue;
                    }
                }
                if conn.guest_done && conn.to_host.is_empty() {
                    let _ = conn.stream.shutdown(std::net::Shutdown::Both);
                    out.push((control(OP_RST, conn.fwd_cnt), Vec::new()));
                    closed.push((host_port, guest_port));
                    continue;
                }
            }
            if conn.guest_done {
                continue;
            }
            let room = (conn.peer_credit() as usize).min(MAX_PAYLOAD);
            if room == 0 {
                continue;
            }
            let mut buf = vec![0u8; room];
            let header = |op, len: usize, fwd_cnt| Header {
                src_cid: HOST_CID,
                dst_cid: self.guest_cid,
                src_port: host_port,
                dst_port: guest_port,
                len: len as u32,
                type_: TYPE_STREAM,
                op,
                buf_alloc: BUF_ALLOC,
                fwd_cnt,
                ..Header::default()
            };
            match conn.stream.read(&mut buf) {
                Ok(0) => {
                    // The host hung up: no more sending or receiving on this stream.
                    let mut shutdown = header(OP_SHUTDOWN, 0, conn.fwd_cnt);
                    shutdown.flags = SHUTDOWN_RCV | SHUTDOWN_SEND;
                    out.push((shutdown, Vec::new()));
                    closed.push((host_port, guest_port));
                }
                Ok(n) => {
                    buf.truncate(n);
                    conn.tx_cnt = conn.tx_cnt.wrapping_add(n as u32);
                    out.push((header(OP_RW, n, conn.fwd_cnt), buf));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => {
                    out.push((header(OP_RST, 0, conn.fwd_cnt), Vec::new()));
                    closed.push((host_port, guest_port));
                }
            }
        }
        for key in closed {
            shared.conns.remove(&key);
        }
        shared.to_guest.extend(out);
        !shared.to_guest.is_empty() || shared.reset_pending
    }
}
