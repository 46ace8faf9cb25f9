//! Taking over the FUSE connection of a lazy file system server that died, so that the EROFS
//! mounts reading blobs from it keep working.
//!
//! ```text
//!  kernel ◀─ /dev/fuse (same open file: the dead server's, brigd's, now ours) ─┐
//!                                                                 relay threads │
//!  fuser session ◀─ SOCK_SEQPACKET pair ─────────────────────────────────────────┘
//!     first message: a made-up FUSE_INIT (its reply is dropped)
//! ```
//!
//! A FUSE connection lives as long as one descriptor of its `/dev/fuse` file is open. brigd
//! keeps a copy of the server's (taken with `pidfd_getfd`), so a killed server leaves the
//! connection up with its requests queued: those not yet read stay pending, and those the dead
//! server had read are sent again by the kernel when asked (`FUSE_NOTIFY_RESEND`, Linux 6.9).
//! The new server then serves the same connection. fuser starts a session only after the
//! kernel's `FUSE_INIT`, which a connection sends once, so the session is given one end of a
//! socket pair whose first message is a made-up INIT; two threads carry the kernel's requests
//! to it and its replies back, one message per read and per write as on `/dev/fuse` itself.
//! The few bytes written here (the INIT request, the resend notification) are the kernel's
//! FUSE ABI (`include/uapi/linux/fuse.h`), which fuser does not expose.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::socket::{
    recv, send, setsockopt, shutdown, socketpair, sockopt, AddressFamily, MsgFlags, Shutdown,
    SockFlag, SockType,
};

/// `FUSE_INIT`'s opcode.
const FUSE_INIT: u32 = 26;
/// The notification asking the kernel to queue again every request a server read and did not
/// answer.
const FUSE_NOTIFY_RESEND: i32 = 7;
/// `struct fuse_in_header`.
const IN_HEADER_BYTES: usize = 40;
/// `struct fuse_init_in` (protocol 7.36 and later).
const INIT_IN_BYTES: usize = 64;
/// `struct fuse_out_header`.
const OUT_HEADER_BYTES: usize = 16;
/// The protocol the made-up INIT speaks: the newest fuser 0.18 knows, which is what it agreed
/// with the kernel when it mounted.
const PROTOCOL: (u32, u32) = (7, 40);
/// The made-up INIT's request id, which the kernel's never reach: they are even and count up
/// from 2 (an interrupt's is its request's plus one), and bit 63 marks resent requests. Its
/// reply is dropped.
const INIT_UNIQUE: u64 = 0x7fff_ffff_ffff_fff0;
/// A request or reply is at most fuser's largest write (16 MiB) and a page of headers: what the
/// kernel demands of a `/dev/fuse` read buffer once that write size was agreed.
const MESSAGE_BYTES: usize = (16 << 20) + 4096;
/// Socket buffer of each end: room for a few of the largest read replies (1 MiB each).
const SOCKET_BUFFER_BYTES: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum TakeoverError {
    #[error("cannot take over the FUSE connection ({what}): {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn io(what: &'static str) -> impl FnOnce(Errno) -> TakeoverError {
    move |e| TakeoverError::Io { what, source: std::io::Error::from(e) }
}

/// A copy of process `pid`'s descriptor `fd` (the same open file), by `pidfd_getfd`. Needs
/// permission to ptrace `pid` (brigd and its servers run as root).
pub fn copy_descriptor(pid: i32, fd: RawFd) -> std::io::Result<OwnedFd> {
    use rustix::process::{pidfd_getfd, pidfd_open, Pid, PidfdFlags, PidfdGetfdFlags};
    let pid = Pid::from_raw(pid).ok_or_else(|| std::io::Error::other("pid 0"))?;
    let pidfd = pidfd_open(pid, PidfdFlags::empty())?;
    Ok(pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty())?)
}

/// The relay between a taken-over `/dev/fuse` file and a fuser session. Its threads end when the
/// connection does (the file system unmounted) or the session's end of the pair is closed.
pub struct Relay {
    device: Arc<OwnedFd>,
    ours: Arc<OwnedFd>,
}

impl Relay {
    /// The `/dev/fuse` descriptor this process serves on.
    pub fn device_fd(&self) -> RawFd {
        self.device.as_raw_fd()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = shutdown(self.ours.as_raw_fd(), Shutdown::Both);
    }
}

/// Takes over `device`, a `/dev/fuse` file whose server is gone: asks the kernel to resend the
/// requests that server had read, and returns the descriptor to give fuser's
/// `Session::from_fd` (its first message is the INIT fuser waits for) and the relay.
pub fn take_over(device: OwnedFd) -> Result<(OwnedFd, Relay), TakeoverError> {
    let (ours, theirs) =
        socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .map_err(io("socket pair"))?;
    for end in [&ours, &theirs] {
        setsockopt(end, sockopt::SndBufForce, &SOCKET_BUFFER_BYTES)
            .or_else(|_| setsockopt(end, sockopt::SndBuf, &SOCKET_BUFFER_BYTES))
            .map_err(io("socket buffer"))?;
    }
    send(ours.as_raw_fd(), &made_up_init(), MsgFlags::empty()).map_err(io("queue the INIT"))?;
    // Before anything is read from the device: a request read now is not resent.
    match nix::unistd::write(&device, &resend_notification()) {
        Ok(_) => tracing::info!("asked the kernel to resend the requests the dead server held"),
        Err(e) => tracing::warn!(
            error = %e,
            "the kernel cannot resend requests (Linux 6.9 or later can): those the dead server \
             held wait until their callers give up"
        ),
    }
    let device = Arc::new(device);
    let ours = Arc::new(ours);
    let (d, o) = (device.clone(), ours.clone());
    std::thread::Builder::new()
        .name("fuse-relay-in".into())
        .spawn(move || carry_requests(&d, &o))
        .map_err(|e| TakeoverError::Io { what: "start the relay", source: e })?;
    let (d, o) = (device.clone(), ours.clone());
    std::thread::Builder::new()
        .name("fuse-relay-out".into())
        .spawn(move || carry_replies(&o, &d))
        .map_err(|e| TakeoverError::Io { what: "start the relay", source: e })?;
    Ok((theirs, Relay { device, ours }))
}

/// `struct fuse_in_header` + `struct fuse_init_in`, native byte order as on `/dev/fuse`.
fn made_up_init() -> Vec<u8> {
    let mut m = Vec::with_capacity(IN_HEADER_BYTES + INIT_IN_BYTES);
    m.extend_from_slice(&((IN_HEADER_BYTES + INIT_IN_BYTES) as u32).to_ne_bytes()); // len
    m.extend_from_slice(&FUSE_INIT.to_ne_bytes()); // opcode
    m.extend_from_slice(&INIT_UNIQUE.to_ne_bytes()); // unique
    m.extend_from_slice(&0u64.to_ne_bytes()); // nodeid
    m.extend_from_slice(&[0u8; 12]); // uid, gid, pid
    m.extend_from_slice(&[0u8; 4]); // total_extlen, padding
    m.extend_from_slice(&PROTOCOL.0.to_ne_bytes()); // major
    m.extend_from_slice(&PROTOCOL.1.to_ne_bytes()); // minor
    m.extend_from_slice(&(128u32 << 10).to_ne_bytes()); // max_readahead
    m.resize(IN_HEADER_BYTES + INIT_IN_BYTES, 0); // flags, flags2, unused
    m
}

/// `struct fuse_out_header` with no request id: a notification, its code in `error`.
fn resend_notification() -> [u8; OUT_HEADER_BYTES] {
    let mut m = [0u8; OUT_HEADER_BYTES];
    m[..4].copy_from_slice(&(OUT_HEADER_BYTES as u32).to_ne_bytes());
    m[4..8].copy_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    m
}

/// Kernel → session, one request per message, until the connection ends.
fn carry_requests(device: &OwnedFd, ours: &OwnedFd) {
    let mut buf = vec![0u8; MESSAGE_BYTES];
    loop {
        let n = match nix::unistd::read(device, &mut buf) {
            Ok(n) => n,
            // Interrupted, or a request withdrawn while it was being read.
            Err(Errno::EINTR | Errno::EAGAIN | Errno::ENOENT) => continue,
            Err(e) => {
                if e != Errno::ENODEV {
                    tracing::warn!(error = %e, "reading the taken-over FUSE device failed");
                }
                break;
            }
        };
        if let Err(e) = send(ours.as_raw_fd(), &buf[..n], MsgFlags::empty()) {
            tracing::warn!(error = %e, "the taken-over FUSE session is gone");
            break;
        }
    }
    // The session reads end of file and stops.
    let _ = shutdown(ours.as_raw_fd(), Shutdown::Both);
}

/// Session → kernel, one reply per message; the made-up INIT's reply is dropped.
fn carry_replies(ours: &OwnedFd, device: &OwnedFd) {
    let mut buf = vec![0u8; MESSAGE_BYTES];
    loop {
        let n = match recv(ours.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Ok(0) => break,
            Ok(n) => n,
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        };
        let reply = &buf[..n];
        if reply.len() >= OUT_HEADER_BYTES && unique_of(reply) == INIT_UNIQUE {
            continue;
        }
        match nix::unistd::write(device.as_fd(), reply) {
            Ok(_) => {}
            // The request is gone (its caller gave up, or it was answered already).
            Err(Errno::ENOENT) => {}
            Err(Errno::ENODEV) => break,
            Err(e) => tracing::warn!(error = %e, "a reply to the kernel failed"),
        }
    }
}

fn unique_of(reply: &[u8]) -> u64 {
    let mut id = [0u8; 8];
    id.copy_from_slice(&reply[8..16]);
    u64::from_ne_bytes(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_made_up_init_and_the_resend_notification_have_the_abi_layout() {
        let init = made_up_init();
        assert_eq!(init.len(), IN_HEADER_BYTES + INIT_IN_BYTES);
        assert_eq!(u32::from_ne_bytes(init[0..4].try_into().expect("len")) as usize, init.len());
        assert_eq!(u32::from_ne_bytes(init[4..8].try_into().expect("opcode")), FUSE_INIT);
        assert_eq!(u64::from_ne_bytes(init[8..16].try_into().expect("unique")), INIT_UNIQUE);
        assert_eq!(u32::from_ne_bytes(init[40..44].try_into().expect("major")), 7);
        assert_eq!(u32::from_ne_bytes(init[44..48].try_into().expect("minor")), 40);
        // Neither a resent request's id (bit 63) nor an interrupt's (bit 0).
        assert_eq!((INIT_UNIQUE >> 63, INIT_UNIQUE & 1), (0, 0));
        let note = resend_notification();
        assert_eq!(u32::from_ne_bytes(note[0..4].try_into().expect("len")), 16);
        assert_eq!(i32::from_ne_bytes(note[4..8].try_into().expect("code")), 7);
        assert_eq!(unique_of(&note), 0, "a notification has no request id");
    }

    #[test]
    fn a_descriptor_is_copied_from_another_process() {
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let own = i32::try_from(std::process::id()).expect("pid");
        let copy = copy_descriptor(own, a.as_raw_fd()).expect("pidfd_getfd");
        let mut copy = std::os::unix::net::UnixStream::from(copy);
        std::io::Write::write_all(&mut copy, b"x").expect("write through the copy");
        let mut got = [0u8; 1];
        std::io::Read::read_exact(&mut &b, &mut got).expect("read");
        assert_eq!(&got, b"x");
        assert!(copy_descriptor(own, 9999).is_err(), "a closed descriptor");
    }
}
