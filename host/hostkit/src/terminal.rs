//! Terminals for execs (E2B's PTY, an interactive shell): a pseudo-terminal pair made on the
//! node. The command gets the slave as its stdin, stdout, stderr and controlling terminal;
//! the node keeps the master, reads the command's output from it, writes its input to it and
//! sets its window size (the kernel then sends SIGWINCH to the foreground process group).
//!
//! ```text
//! node: TerminalMaster ◀══ pty ══▶ slave = fds 0,1,2 of the command (TIOCSCTTY after setsid)
//! ```

use std::os::fd::OwnedFd;

use rustix::fs::{Mode, OFlags};
use rustix::pty::OpenptFlags;
use tokio::io::unix::AsyncFd;

/// A window size in character cells (the one the node's tiers use).
pub use brig_core::exec::TerminalSize;

/// A terminal that could not be made or set up.
#[derive(Debug, thiserror::Error)]
#[error("I/O on {what}")]
pub struct TerminalError {
    pub what: String,
    #[source]
    pub source: std::io::Error,
}

fn io_err(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> TerminalError {
    move |e| TerminalError { what: what.into(), source: e.into() }
}

/// A new pseudo-terminal of `size`: (master, slave).
pub fn open(size: TerminalSize) -> Result<(OwnedFd, OwnedFd), TerminalError> {
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
            .map_err(io_err("openpt"))?;
    rustix::pty::grantpt(&master).map_err(io_err("grantpt"))?;
    rustix::pty::unlockpt(&master).map_err(io_err("unlockpt"))?;
    let name = rustix::pty::ptsname(&master, Vec::new()).map_err(io_err("ptsname"))?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err("opening the terminal's slave"))?;
    set_size(&master, size)
        .map_err(|source| TerminalError { what: "TIOCSWINSZ".into(), source })?;
    Ok((master, slave))
}

fn set_size(master: &OwnedFd, size: TerminalSize) -> std::io::Result<()> {
    let winsize = rustix::termios::Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(master, winsize).map_err(std::io::Error::from)
}

/// The node's end of a command's terminal.
pub struct TerminalMaster {
    fd: AsyncFd<OwnedFd>,
}

impl std::fmt::Debug for TerminalMaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalMaster").finish_non_exhaustive()
    }
}

impl TerminalMaster {
    pub fn new(master: OwnedFd) -> Result<TerminalMaster, TerminalError> {
        let flags = rustix::fs::fcntl_getfl(&master).map_err(io_err("fcntl"))?;
        rustix::fs::fcntl_setfl(&master, flags | OFlags::NONBLOCK).map_err(io_err("fcntl"))?;
        #[allow(unsafe_code)]
        // SAFETY: `master` is an OwnedFd moved into the AsyncFd: it stays open and names the
        // same file description until the AsyncFd drops it, and `OwnedFd::as_raw_fd` always
        // returns that one descriptor.
        let registered = unsafe { AsyncFd::register(master) };
        let fd = registered.map_err(|e| TerminalError {
            what: "terminal".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok(TerminalMaster { fd })
    }

    /// Reads the command's output; `Ok(0)` once every holder of the slave has closed it.
    pub async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard
                .try_io(|inner| rustix::io::read(inner.get_ref(), &mut *buf).map_err(Into::into))
            {
                Ok(Ok(n)) => return Ok(n),
                // Linux answers EIO on the master when the last slave descriptor is closed.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Reads what is buffered now without waiting; `WouldBlock` when nothing is.
    pub fn try_read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        match rustix::io::read(self.fd.get_ref(), buf) {
            Ok(n) => Ok(n),
            Err(e) if e.raw_os_error() == libc::EIO => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes all of `data` as the command's input.
    pub async fn write_all(&self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|inner| rustix::io::write(inner.get_ref(), data).map_err(Into::into))
            {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Sets the window size.
    pub fn resize(&self, size: TerminalSize) -> std::io::Result<()> {
        set_size(self.fd.get_ref(), size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_cross_the_terminal_and_its_size_is_set() {
        let (master, slave) = open(TerminalSize { rows: 30, cols: 100 }).expect("pty");
        let size = rustix::termios::tcgetwinsize(&slave).expect("size");
        assert_eq!((size.ws_row, size.ws_col), (30, 100));
        let master = TerminalMaster::new(master).expect("master");
        master.resize(TerminalSize { rows: 40, cols: 120 }).expect("resize");
        assert_eq!(rustix::termios::tcgetwinsize(&slave).expect("size").ws_col, 120);
        rustix::io::write(&slave, b"out\n").expect("write");
        let mut buf = [0u8; 64];
        let n = master.read(&mut buf).await.expect("read");
        // The line discipline turns \n into \r\n on the way out.
        assert_eq!(&buf[..n], b"out\r\n");
        master.write_all(b"in\n").await.expect("input");
        let mut got = [0u8; 8];
        let n = rustix::io::read(&slave, &mut got).expect("slave read");
        assert_eq!(&got[..n], b"in\n");
        drop(slave);
        // The echo of "in" may come first; then the end.
        let mut rest = Vec::new();
        loop {
            let n = master.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            rest.extend_from_slice(&buf[..n]);
        }
        assert!(rest.is_empty() || rest.starts_with(b"in"), "{rest:?}");
    }
}
