//! Sending and receiving control messages with attached descriptors over a `SOCK_SEQPACKET`
//! socket. Used blocking by the shim and non-blocking by the node.
#![allow(unsafe_code)]

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::cmsg_space;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::shim_proto::{MAX_FDS, MAX_MESSAGE_BYTES};

/// Sends one message with `fds` attached.
pub fn send(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> nix::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let iov = [IoSlice::new(bytes)];
    let cmsgs = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsgs };
    let sent = sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    if sent != bytes.len() {
        return Err(nix::Error::EMSGSIZE);
    }
    Ok(())
}

/// The length of the next message without taking it off the socket; `Ok(0)` also when the
/// peer closed the socket (the following [`recv`] tells which). Lets an idle reader hold no
/// buffer: [`MAX_MESSAGE_BYTES`] per connection, thousands of connections, was a GiB.
pub fn peek_len(sock: BorrowedFd<'_>) -> nix::Result<usize> {
    // MSG_TRUNC makes a datagram or seqpacket socket report the message's whole length.
    nix::sys::socket::recv(
        sock.as_raw_fd(),
        &mut [],
        MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC | MsgFlags::MSG_DONTWAIT,
    )
}

/// Receives one message into `buf`; `None` when the peer closed the socket.
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> nix::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut cmsg = cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg =
        recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = c {
            for fd in received {
                // SAFETY: SCM_RIGHTS just installed `fd` in this process for us; nothing else
                // refers to it, so wrapping it in an OwnedFd makes us its sole owner.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    if msg.flags.contains(MsgFlags::MSG_TRUNC) || msg.bytes > MAX_MESSAGE_BYTES {
        return Err(nix::Error::EMSGSIZE);
    }
    Ok(Some((msg.bytes, fds)))
}
