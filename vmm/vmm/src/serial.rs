//! The 16550 UART at 0x3f8 (vm-superio), its interrupt on GSI 4 through an eventfd, and a
//! bounded console log: the first [`CONSOLE_CAP`] bytes are kept (and optionally echoed), the
//! rest are counted and dropped, so a guest printing forever cannot fill the host.

use std::io::Write;

use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

pub const COM1: u16 = 0x3f8;
/// Console bytes kept per VM.
pub const CONSOLE_CAP: usize = 1 << 20;

/// Raises the UART's interrupt line.
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

/// Where console bytes go.
#[derive(Default)]
pub struct ConsoleLog {
    pub kept: Vec<u8>,
    pub dropped: u64,
    /// Echo kept bytes to stdout as they come.
    pub echo: bool,
}

impl Write for ConsoleLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = CONSOLE_CAP.saturating_sub(self.kept.len());
        let (keep, drop) = buf.split_at(room.min(buf.len()));
        self.kept.extend_from_slice(keep);
        self.dropped += drop.len() as u64;
        if self.echo && !keep.is_empty() {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(keep);
            let _ = out.flush();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub type Console = Serial<IrqTrigger, vm_superio::serial::NoEvents, ConsoleLog>;

pub fn console(irq: EventFd, echo: bool) -> Console {
    Serial::new(IrqTrigger(irq), ConsoleLog { echo, ..ConsoleLog::default() })
}
