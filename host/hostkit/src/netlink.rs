//! A sandbox's link made in-process over rtnetlink, instead of by `ip` processes (each spawn
//! of `ip` or `nsenter` cost a few milliseconds of every sandbox's create):
//!
//! ```text
//!  host netns: <host_if> gw/30 up  ◀─ veth ─▶  sandbox netns: eth0 addr/30 up, lo up,
//!                                                              default via gw
//! ```
//! The peer is created straight in the sandbox's namespace (by its namespace file). Its
//! addresses and route are set over a netlink socket opened inside that namespace: a short-lived
//! thread enters it, opens the socket and exits; the socket stays bound to the namespace it was
//! made in, whichever thread uses it afterwards.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};

use futures::TryStreamExt;
use rtnetlink::packet_route::link::{InfoData, InfoVeth};
use rtnetlink::sys::{protocols::NETLINK_ROUTE, Socket, TokioSocket};
use rtnetlink::{Handle, LinkUnspec, LinkVeth, RouteMessageBuilder};

/// The sandbox-side end of its veth pair.
const PEER_IF: &str = "eth0";
const PREFIX: u8 = 30;

/// A netlink failure, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct NetlinkError {
    what: String,
    #[source]
    source: io::Error,
}

fn fail(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetlinkError {
    let what = what.into();
    move |e| {
        let source = match e {
            rtnetlink::Error::NetlinkError(m) => m.to_io(),
            other => io::Error::other(other.to_string()),
        };
        NetlinkError { what, source }
    }
}

fn io_fail(what: impl Into<String>) -> impl FnOnce(io::Error) -> NetlinkError {
    let what = what.into();
    move |source| NetlinkError { what, source }
}

fn is_errno(e: &rtnetlink::Error, errno: i32) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m) if m.to_io().raw_os_error() == Some(errno))
}

/// A connection in the daemon's own network namespace; it ends when the handle is dropped.
fn host_handle() -> Result<Handle, NetlinkError> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(io_fail("netlink socket"))?;
    tokio::spawn(conn);
    Ok(handle)
}

/// A connection inside the namespace `netns`.
async fn netns_handle(netns: BorrowedFd<'_>) -> Result<Handle, NetlinkError> {
    let ns = netns.try_clone_to_owned().map_err(io_fail("netns file"))?;
    let (tx, rx) = tokio::sync::oneshot::channel::<io::Result<Socket>>();
    // Its own thread, which exits after: a pooled thread would stay in the sandbox's namespace.
    std::thread::Builder::new()
        .name("brig-netns".into())
        .spawn(move || {
            let socket = nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(io::Error::from)
                .and_then(|()| Socket::new(NETLINK_ROUTE));
            let _ = tx.send(socket);
        })
        .map_err(io_fail("netns thread"))?;
    let socket = rx
        .await
        .map_err(|_| NetlinkError {
            what: "netns thread".into(),
            source: io::Error::other("died"),
        })?
        .map_err(io_fail("netlink socket in the sandbox"))?;
    let socket = tokio_socket(socket);
    let (conn, handle, _) = rtnetlink::from_socket(socket);
    tokio::spawn(conn);
    Ok(handle)
}

#[allow(unsafe_code)]
fn tokio_socket(socket: Socket) -> TokioSocket {
    // SAFETY: `into_raw_fd` hands over sole ownership of an open netlink socket, which the
    // TokioSocket takes (and closes on drop); this runs on the runtime, which its registration
    // needs.
    unsafe { TokioSocket::from_raw_fd(socket.into_raw_fd()) }
}

/// The index of link `name`, if it exists.
async fn link_index(handle: &Handle, name: &str) -> Result<Option<u32>, NetlinkError> {
    let mut links = std::pin::pin!(handle.link().get().match_name(name.to_string()).execute());
    match links.try_next().await {
        Ok(link) => Ok(link.map(|l| l.header.index)),
        Err(e) if is_errno(&e, libc::ENODEV) => Ok(None),
        Err(e) => Err(fail(format!("looking up {name}"))(e)),
    }
}

async fn must_index(handle: &Handle, name: &str) -> Result<u32, NetlinkError> {
    link_index(handle, name).await?.ok_or_else(|| NetlinkError {
        what: format!("looking up {name}"),
        source: io::Error::new(io::ErrorKind::NotFound, "no such link"),
    })
}

/// Deletes host link `name` (with its peer); a missing link is not an error.
pub async fn delete_link(name: &str) -> Result<(), NetlinkError> {
    let handle = host_handle()?;
    match handle.link().del_with_message(LinkUnspec::new_with_name(name).build()).execute().await {
        Err(e) if is_errno(&e, libc::ENODEV) => Ok(()),
        other => other.map_err(fail(format!("deleting {name}"))),
    }
}

/// Links the sandbox whose network namespace is `netns` to the host: `host_if` (`gw`/30) on
/// the host, `eth0` (`addr`/30, default route via `gw`) and `lo` up in the sandbox.
pub async fn attach_link(
    host_if: &str,
    netns: BorrowedFd<'_>,
    gw: Ipv4Addr,
    addr: Ipv4Addr,
) -> Result<(), NetlinkError> {
    let host = host_handle()?;
    let peer = LinkUnspec::new_with_name(PEER_IF).setns_by_fd(netns.as_raw_fd()).build();
    let veth =
        LinkVeth::new(host_if, PEER_IF).set_info_data(InfoData::Veth(InfoVeth::Peer(peer))).build();
    host.link().add(veth).execute().await.map_err(fail(format!("adding veth {host_if}")))?;
    let index = must_index(&host, host_if).await?;
    host.address()
        .add(index, IpAddr::V4(gw), PREFIX)
        .replace()
        .execute()
        .await
        .map_err(fail(format!("adding {gw}/{PREFIX} to {host_if}")))?;
    host.link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(fail(format!("setting {host_if} up")))?;
    drop(host);

    let inside = netns_handle(netns).await?;
    let eth0 = must_index(&inside, PEER_IF).await?;
    inside
        .address()
        .add(eth0, IpAddr::V4(addr), PREFIX)
        .replace()
        .execute()
        .await
        .map_err(fail(format!("adding {addr}/{PREFIX} to eth0")))?;
    for link in [eth0, must_index(&inside, "lo").await?] {
        inside
            .link()
            .set(LinkUnspec::new_with_index(link).up().build())
            .execute()
            .await
            .map_err(fail("setting the sandbox's links up"))?;
    }
    // After eth0 is up: the kernel refuses a gateway it cannot reach yet.
    let route = RouteMessageBuilder::<Ipv4Addr>::new().gateway(gw).output_interface(eth0).build();
    inside
        .route()
        .add(route)
        .replace()
        .execute()
        .await
        .map_err(fail(format!("adding the default route via {gw}")))?;
    Ok(())
}

/// Opens a sandbox's network namespace: a process's, or a named one (`ip netns`).
pub fn open_netns(path: &std::path::Path) -> Result<OwnedFd, NetlinkError> {
    std::fs::File::open(path).map(OwnedFd::from).map_err(io_fail(format!("{}", path.display())))
}
