//! The XFS calls the writable store needs and no safe crate offers: a directory's project id
//! (`FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR` with `FS_XFLAG_PROJINHERIT`) and a project's
//! block limit (`quotactl_fd` with `Q_XSETQLIM` / `Q_XGETQUOTA` on `PRJQUOTA`).
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, BorrowedFd};

#[derive(Debug, thiserror::Error)]
pub enum XfsQuotaError {
    #[error("cannot read the project id of a directory")]
    GetProject(#[source] std::io::Error),
    #[error("cannot set project id {id} on a directory")]
    SetProject {
        id: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set the block limit of project {id}")]
    SetLimit {
        id: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the quota of project {id}")]
    GetQuota {
        id: u32,
        #[source]
        source: std::io::Error,
    },
}

/// `struct fsxattr` of `<linux/fs.h>`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}
const _: () = assert!(std::mem::size_of::<FsXattr>() == 28);

/// `_IOR('X', 31, struct fsxattr)` and `_IOW('X', 32, struct fsxattr)`.
// `ioctl`'s request is a C unsigned long with glibc and an int with musl (the in-guest agent
// builds this crate for musl): the same 32 bits either way.
const FS_IOC_FSGETXATTR: libc::Ioctl = 0x801c_581f_u32 as libc::Ioctl;
const FS_IOC_FSSETXATTR: libc::Ioctl = 0x401c_5820_u32 as libc::Ioctl;
const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;

/// `struct fs_disk_quota` of `<linux/dqblk_xfs.h>`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FsDiskQuota {
    version: i8,
    flags: i8,
    fieldmask: u16,
    id: u32,
    blk_hardlimit: u64,
    blk_softlimit: u64,
    ino_hardlimit: u64,
    ino_softlimit: u64,
    bcount: u64,
    icount: u64,
    itimer: i32,
    btimer: i32,
    iwarns: u16,
    bwarns: u16,
    itimer_hi: i8,
    btimer_hi: i8,
    rtbtimer_hi: i8,
    padding2: i8,
    rtb_hardlimit: u64,
    rtb_softlimit: u64,
    rtbcount: u64,
    rtbtimer: i32,
    rtbwarns: u16,
    padding3: i16,
    padding4: [u8; 8],
}
const _: () = assert!(std::mem::size_of::<FsDiskQuota>() == 112);

const FS_DQUOT_VERSION: i8 = 1;
const FS_PROJ_QUOTA: i8 = 2;
const FS_DQ_BSOFT: u16 = 1 << 2;
const FS_DQ_BHARD: u16 = 1 << 3;
const PRJQUOTA: i32 = 2;
/// `XQM_CMD(3)` and `XQM_CMD(4)`.
const Q_XGETQUOTA: i32 = (b'X' as i32) << 8 | 3;
const Q_XSETQLIM: i32 = (b'X' as i32) << 8 | 4;
/// XFS quota limits count 512-byte basic blocks.
const BASIC_BLOCK: u64 = 512;

fn qcmd(cmd: i32, kind: i32) -> i32 {
    (cmd << 8) | (kind & 0xff)
}

/// The project id of the file or directory `fd`.
pub fn project_id(fd: BorrowedFd<'_>) -> Result<u32, XfsQuotaError> {
    let mut attr = FsXattr::default();
    // SAFETY: `fd` is a live descriptor (borrowed for the call) and `attr` is a writable
    // `struct fsxattr` of the size this ioctl number encodes; the kernel writes only it.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FSGETXATTR, &mut attr as *mut FsXattr) };
    if rc != 0 {
        return Err(XfsQuotaError::GetProject(std::io::Error::last_os_error()));
    }
    Ok(attr.projid)
}

/// Gives directory `fd` project id `id`, inherited by everything made in it.
pub fn set_project(fd: BorrowedFd<'_>, id: u32) -> Result<(), XfsQuotaError> {
    let failed = |source| XfsQuotaError::SetProject { id, source };
    let mut attr = FsXattr::default();
    // SAFETY: as in `project_id`: a live descriptor and a `struct fsxattr` to fill.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FSGETXATTR, &mut attr as *mut FsXattr) };
    if rc != 0 {
        return Err(failed(std::io::Error::last_os_error()));
    }
    attr.projid = id;
    attr.xflags |= FS_XFLAG_PROJINHERIT;
    // SAFETY: a live descriptor and an initialized `struct fsxattr` the kernel only reads.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FSSETXATTR, &attr as *const FsXattr) };
    if rc != 0 {
        return Err(failed(std::io::Error::last_os_error()));
    }
    Ok(())
}

fn quotactl_fd(root: BorrowedFd<'_>, cmd: i32, id: u32, quota: &mut FsDiskQuota) -> i32 {
    // SAFETY: `root` is a live descriptor on the file system, and `quota` a valid, writable
    // `struct fs_disk_quota` for the whole call (Q_XSETQLIM reads it, Q_XGETQUOTA fills it).
    unsafe {
        libc::syscall(
            libc::SYS_quotactl_fd,
            root.as_raw_fd() as libc::c_long,
            qcmd(cmd, PRJQUOTA) as libc::c_long,
            id as libc::c_long,
            quota as *mut FsDiskQuota,
        ) as i32
    }
}

/// Sets project `id`'s hard (and soft) block limit to `bytes` (0: no limit) on the file
/// system of `root`.
pub fn set_block_limit(root: BorrowedFd<'_>, id: u32, bytes: u64) -> Result<(), XfsQuotaError> {
    let blocks = bytes.div_ceil(BASIC_BLOCK);
    let mut quota = FsDiskQuota {
        version: FS_DQUOT_VERSION,
        flags: FS_PROJ_QUOTA,
        fieldmask: FS_DQ_BHARD | FS_DQ_BSOFT,
        id,
        blk_hardlimit: blocks,
        blk_softlimit: blocks,
        ..Default::default()
    };
    if quotactl_fd(root, Q_XSETQLIM, id, &mut quota) != 0 {
        let source = std::io::Error::last_os_error();
        return Err(XfsQuotaError::SetLimit { id, source });
    }
    Ok(())
}

/// Project `id`'s hard block limit and usage in bytes; `None` when XFS has no quota for it
/// (no limit and nothing used).
pub fn block_quota(root: BorrowedFd<'_>, id: u32) -> Result<Option<(u64, u64)>, XfsQuotaError> {
    let mut quota = FsDiskQuota::default();
    if quotactl_fd(root, Q_XGETQUOTA, id, &mut quota) != 0 {
        let source = std::io::Error::last_os_error();
        if source.raw_os_error() == Some(libc::ENOENT) {
            return Ok(None);
        }
        return Err(XfsQuotaError::GetQuota { id, source });
    }
    Ok(Some((quota.blk_hardlimit * BASIC_BLOCK, quota.bcount * BASIC_BLOCK)))
}
