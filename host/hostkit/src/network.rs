//! Sandbox networking and egress enforcement on the node, outside every sandbox.
//!
//! ```text
//!  sandbox netns                 host (init netns)                       nftables table brig_<tag>
//!  eth0 10.x.y.(4s+2)/30 ◀─veth─▶ b<tag><slot> 10.x.y.(4s+1)/30         forward/input hooks:
//!  lo (always up)                 ip_forward on, masquerade out          iifname vmap @sandboxes
//!                                                                         → chain s<slot>:
//!                                                                           services, guard,
//!                                                                           denied, allowed sets,
//!                                                                           else log + drop
//! ```
//! A slot's chain serves both hooks: traffic to the node itself arrives on `input`, not
//! `forward`. After the node's services (which its operator configured, so they may name the
//! node's own addresses), every packet passes the table's `guard` chain, which refuses the
//! node's own addresses (by address type: every local address, each sandbox's gateway among
//! them), this daemon's sandbox subnet, [`brig_core::egress::PROTECTED_NETWORKS`], IPv6 and
//! connections the host's own NAT redirected (a forwarded port); then the sandbox's denied
//! destinations, then its allowed ones. So no rule a client gives, the default allow-all
//! included, reaches the host, another sandbox or a metadata service.
//! Each daemon claims its own /20 of 10.128.0.0/9 and its own table, so daemons on one host
//! never collide. A sandbox's traffic is matched by the host-side interface it arrives on, not
//! by source address, so root inside the sandbox (which has no `CAP_NET_ADMIN` or
//! `CAP_NET_RAW` anyway) cannot lift or dodge its rules. New connections, allowed or denied,
//! are logged by the kernel with this daemon's prefix; [`watch_kernel_log`] turns them into
//! [`EgressEvent`]s for the audit trail.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use brig_core::EgressPolicy;
use parking_lot::Mutex;

pub use crate::nft_rules::SlotOutcome;
use crate::nft_rules::{
    closed_slot_script, guard_script, slot_script, unguarded_slots, write_or_close, SLOT_SETS,
};

/// Sandboxes one daemon can network (a /20 of /30 links).
pub const MAX_SLOTS: u32 = 1024;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{tool} failed: {detail}")]
    Tool { tool: &'static str, detail: String },
    #[error("cannot run {tool}")]
    Spawn {
        tool: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("no free network for this daemon under 10.128.0.0/9")]
    NoSubnet,
    #[error("all {MAX_SLOTS} sandbox links of this node are in use")]
    NoSlot,
    #[error(transparent)]
    Netlink(#[from] crate::netlink::NetlinkError),
    #[error("network setup task: {0}")]
    Task(String),
    #[error("I/O on {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Slots kept ready per rule set, and rule sets kept ready.
pub const WARM_PER_RULES: usize = 4;
pub const WARM_RULE_SETS: usize = 8;

/// Slots made ready ahead, by rule set (an [`EgressPolicy`] is canonical: sorted, no repeats).
#[derive(Debug, Default)]
struct WarmSlots {
    ready: HashMap<EgressPolicy, Vec<u32>>,
    /// Rule sets being made ready now.
    refilling: HashSet<EgressPolicy>,
    /// The rule set of each slot in use.
    in_use: HashMap<u32, EgressPolicy>,
}

impl WarmSlots {
    fn take(&mut self, key: &EgressPolicy) -> Option<u32> {
        self.ready.get_mut(key)?.pop()
    }

    /// Whether `key` needs more slots made ready (and is not being served already).
    fn wants(&self, key: &EgressPolicy) -> bool {
        let have = self.ready.get(key).map_or(0, Vec::len);
        let known = self.ready.contains_key(key) || self.ready.len() < WARM_RULE_SETS;
        known && have < WARM_PER_RULES / 2 && !self.refilling.contains(key)
    }

    /// Keeps a freed slot (rules unchanged) if its rule set's pool has room.
    fn give_back(&mut self, key: EgressPolicy, slot: u32) -> bool {
        match self.ready.get_mut(&key) {
            Some(ready) if ready.len() < WARM_PER_RULES => {
                ready.push(slot);
                true
            }
            _ => false,
        }
    }
}

/// Runs `tool args…` with `script` on stdin; fails with its stderr.
fn run(tool: &'static str, args: &[&str], script: &str) -> Result<(), NetError> {
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| NetError::Spawn { tool, source })?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(script.as_bytes());
    }
    let out = child.wait_with_output().map_err(|source| NetError::Spawn { tool, source })?;
    if !out.status.success() {
        let detail = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(NetError::Tool { tool, detail: format!("{detail} (script: {script})") });
    }
    Ok(())
}

/// `nft list table inet <t>`: its text, or why it could not be read.
fn list_table(t: &str) -> Result<String, NetError> {
    let tool = "nft";
    let out = Command::new(tool)
        .args(["list", "table", "inet", t])
        .output()
        .map_err(|source| NetError::Spawn { tool, source })?;
    if !out.status.success() {
        let detail = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(NetError::Tool { tool, detail: format!("listing table {t}: {detail}") });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The node's sandbox network.
#[derive(Debug)]
pub struct Network {
    tag: String,
    table: String,
    base: Ipv4Addr,
    slots: Mutex<HashSet<u32>>,
    /// Slots whose nftables part (chain, sets, rules, verdict-map entry) is made ahead, per
    /// rule set, and the rule set of each slot in use; see [`Network::attach_in`].
    warm: Mutex<WarmSlots>,
    /// This daemon's claim on its subnet (a directory naming the owner).
    claim: PathBuf,
    /// Slots whose chain an older daemon wrote without the guard (found in a table kept
    /// across a restart): closed on open, their sandboxes' rules written again when restored.
    unguarded: Mutex<HashSet<u32>>,
}

impl Network {
    /// Claims this daemon's subnet (`tag`: 8 hex digits unique to the daemon), makes sure its
    /// nftables table exists (kept as is if it does: sandboxes survive daemon restarts), and
    /// turns on IPv4 forwarding.
    pub fn open(tag: &str, claims_dir: &Path) -> Result<Network, NetError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| NetError::Io { path, source }
        };
        std::fs::create_dir_all(claims_dir).map_err(io(claims_dir))?;
        let table = format!("brig_{tag}");
        let start = u32::from_str_radix(tag, 16).unwrap_or(0) % 2048;
        let mut claimed = None;
        for i in 0..2048 {
            let idx = (start + i) % 2048;
            let claim = claims_dir.join(idx.to_string());
            if std::fs::create_dir(&claim).is_ok() {
                std::fs::write(claim.join("owner"), tag).map_err(io(&claim))?;
                claimed = Some(idx);
                break;
            }
            let owner = std::fs::read_to_string(claim.join("owner")).unwrap_or_default();
            let owner_alive =
                run("nft", &["list", "table", "inet", &format!("brig_{owner}")], "").is_ok();
            if owner == tag || !owner_alive {
                std::fs::write(claim.join("owner"), tag).map_err(io(&claim))?;
                claimed = Some(idx);
                break;
            }
        }
        let idx = claimed.ok_or(NetError::NoSubnet)?;
        let base = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (idx << 12));
        let claim = claims_dir.join(idx.to_string());
        let net = Network {
            tag: tag.to_string(),
            table,
            base,
            slots: Mutex::default(),
            warm: Mutex::default(),
            claim,
            unguarded: Mutex::default(),
        };
        net.ensure_table()?;
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
            .map_err(io(Path::new("/proc/sys/net/ipv4/ip_forward")))?;
        tracing::info!(table = %net.table, subnet = %format!("{base}/20"), "sandbox network ready");
        Ok(net)
    }

    fn ensure_table(&self) -> Result<(), NetError> {
        let (t, ifs, log) = (&self.table, format!("b{}*", self.tag), self.log_prefix());
        let mut script = format!(
            "add table inet {t}\n\
             add map inet {t} sandboxes {{ type ifname : verdict; }}\n\
             add chain inet {t} postrouting {{ type nat hook postrouting priority 100; }}\n"
        );
        let exists = run("nft", &["list", "chain", "inet", t, "forward"], "").is_ok();
        if exists {
            // Slots an older daemon wrote without the guard are closed in the same transaction
            // as the guard is written, until their sandboxes' rules are written again (see
            // `restore_rules`): a sandbox never restored keeps no way to the node. A listing
            // that cannot be read fails the open rather than leave them as they are.
            let unguarded = unguarded_slots(&list_table(t)?);
            for &slot in &unguarded {
                tracing::warn!(table = %t, slot, "slot without the guard closed until restored");
                script += &closed_slot_script(t, slot);
            }
            *self.unguarded.lock() = unguarded;
        } else {
            for (chain, hook) in [("forward", "forward"), ("input", "input")] {
                script += &format!(
                    "add chain inet {t} {chain} {{ type filter hook {hook} priority 0; }}\n\
                     add rule inet {t} {chain} iifname \"{ifs}\" iifname vmap @sandboxes\n\
                     add rule inet {t} {chain} iifname \"{ifs}\" ct state new \
                       limit rate 100/second burst 200 packets log prefix \"{log}deny \"\n\
                     add rule inet {t} {chain} iifname \"{ifs}\" drop\n"
                );
            }
            script += &format!(
                "add rule inet {t} forward oifname \"{ifs}\" ct state established,related accept\n\
                 add rule inet {t} forward oifname \"{ifs}\" drop\n\
                 add rule inet {t} postrouting ip saddr {}/20 oifname != \"{ifs}\" masquerade\n",
                self.base
            );
        }
        // Made again on every start (a table an older daemon left has none of it).
        script += &guard_script(&self.table, &self.log_prefix(), self.base);
        run("nft", &["-f", "-"], &script)
    }

    /// The kernel log prefix of this daemon's egress log lines.
    pub fn log_prefix(&self) -> String {
        format!("brig-{} ", self.tag)
    }

    fn ifname(&self, slot: u32) -> String {
        format!("b{}{slot:04x}", self.tag)
    }

    /// The host side of a slot's link (the sandbox's gateway).
    pub fn gateway(&self, slot: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) + slot * 4 + 1)
    }

    /// The sandbox side of a slot's link.
    pub fn sandbox_addr(&self, slot: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) + slot * 4 + 2)
    }

    /// The slot a host-side interface name belongs to.
    pub fn slot_of_ifname(&self, ifname: &str) -> Option<u32> {
        let rest = ifname.strip_prefix('b')?.strip_prefix(self.tag.as_str())?;
        u32::from_str_radix(rest, 16).ok()
    }

    /// Marks a slot used (a sandbox restored after a daemon restart).
    pub fn reserve(&self, slot: u32) {
        self.slots.lock().insert(slot);
    }

    /// Whether a restored slot's chain predates the guard, so its rules must be written again
    /// ([`Network::restore_rules`]): until then it refuses everything.
    pub fn unguarded(&self, slot: u32) -> bool {
        self.unguarded.lock().contains(&slot)
    }

    /// Gives the sandbox whose init is `pid` a link with `rules`; returns its slot.
    pub async fn attach(self: &Arc<Self>, pid: i32, rules: &EgressPolicy) -> Result<u32, NetError> {
        self.attach_in(Netns::Pid(pid), rules).await
    }

    /// Gives the sandbox whose network namespace is `netns` a link (`eth0` there) with
    /// `rules`; returns its slot.
    ///
    /// Running `nft` costs more than all the rest of a link, so rule sets seen before are
    /// served from slots made ready ahead ([`WARM_PER_RULES`] per rule set, for the last
    /// [`WARM_RULE_SETS`] rule sets): such a sandbox only needs its link. A sandbox going
    /// away gives its slot back to the pool, rules and all. A rule set seen for the first time
    /// runs `nft` beside the link, then has slots made ready in the background.
    pub async fn attach_in(
        self: &Arc<Self>,
        netns: Netns<'_>,
        rules: &EgressPolicy,
    ) -> Result<u32, NetError> {
        let key = rules.clone();
        let warm = self.warm.lock().take(&key);
        let slot = match warm {
            Some(slot) => slot,
            None => self.allocate()?,
        };
        self.warm.lock().in_use.insert(slot, key.clone());
        let made = match warm {
            Some(_) => self.link(netns, slot).await,
            None => self.attach_slot(netns, slot, rules.clone()).await,
        };
        if let Err(e) = made {
            // Its nftables part may be half made: removed, not pooled.
            self.warm.lock().in_use.remove(&slot);
            self.detach(slot);
            return Err(e);
        }
        self.refill(key);
        Ok(slot)
    }

    fn allocate(&self) -> Result<u32, NetError> {
        let mut slots = self.slots.lock();
        let slot = (0..MAX_SLOTS).find(|s| !slots.contains(s)).ok_or(NetError::NoSlot)?;
        slots.insert(slot);
        Ok(slot)
    }

    /// The slot's veth pair and addresses (its rules exist already).
    async fn link(&self, netns: Netns<'_>, slot: u32) -> Result<(), NetError> {
        let ifname = self.ifname(slot);
        let ns = crate::netlink::open_netns(&netns.path())?;
        crate::netlink::delete_link(&ifname).await?;
        crate::netlink::attach_link(
            &ifname,
            ns.as_fd(),
            self.gateway(slot),
            self.sandbox_addr(slot),
        )
        .await?;
        Ok(())
    }

    /// Makes slots ready ahead for `key` in the background, if it has too few.
    fn refill(self: &Arc<Self>, key: EgressPolicy) {
        let want = {
            let mut warm = self.warm.lock();
            if !warm.wants(&key) {
                return;
            }
            warm.refilling.insert(key.clone());
            WARM_PER_RULES.saturating_sub(warm.ready.get(&key).map_or(0, Vec::len))
        };
        let net = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut made = Vec::new();
            for _ in 0..want {
                match net.allocate() {
                    Ok(slot) => made.push(slot),
                    Err(_) => break,
                }
            }
            let script: String = made.iter().map(|&s| net.slot_script(s, &key)).collect();
            let result = if made.is_empty() { Ok(()) } else { run("nft", &["-f", "-"], &script) };
            let mut warm = net.warm.lock();
            warm.refilling.remove(&key);
            match result {
                Ok(()) => warm.ready.entry(key).or_default().extend(made),
                Err(e) => {
                    tracing::debug!(error = %e, "making sandbox links ready ahead");
                    drop(warm);
                    let mut slots = net.slots.lock();
                    for slot in made {
                        slots.remove(&slot);
                    }
                }
            }
        });
    }

    async fn attach_slot(
        &self,
        netns: Netns<'_>,
        slot: u32,
        rules: EgressPolicy,
    ) -> Result<(), NetError> {
        // The base chains drop whatever arrives on this daemon's links until the slot's chain is
        // in the verdict map, so the link may come up before its rules: both are made at once.
        // The script (a few thousand ranges at most) is written off the async workers too.
        let (table, log) = (self.table.clone(), self.log_prefix());
        let ifname = self.ifname(slot);
        let nft = tokio::task::spawn_blocking(move || {
            run("nft", &["-f", "-"], &slot_script(&table, &log, &ifname, slot, &rules))
        });
        let (nft, link) = tokio::join!(nft, self.link(netns, slot));
        nft.map_err(|e| NetError::Task(e.to_string()))??;
        link
    }

    /// The nftables part of a slot (see [`slot_script`]).
    fn slot_script(&self, slot: u32, rules: &EgressPolicy) -> String {
        slot_script(&self.table, &self.log_prefix(), &self.ifname(slot), slot, rules)
    }

    /// Replaces a slot's rules atomically: connections already open stay open; new ones follow
    /// the new rules. Blocks on `nft`: call it off the async workers.
    pub fn set_rules(&self, slot: u32, rules: &EgressPolicy) -> Result<(), NetError> {
        run("nft", &["-f", "-"], &self.slot_script(slot, rules))?;
        self.warm.lock().in_use.insert(slot, rules.clone());
        self.unguarded.lock().remove(&slot);
        Ok(())
    }

    /// Writes a restored slot's rules again (a slot [`Network::unguarded`] reports), failing
    /// closed: rules that cannot be written leave its chain refusing everything, or, failing
    /// that, its link out of the verdict map (the base chains drop what arrives on it). Returns
    /// where the slot ended up and the errors met on the way there; an error if no step took
    /// (nothing else can be done then: its chain is as [`Network::open`] left it, closed).
    /// Blocks on `nft`: call it off the async workers.
    pub fn restore_rules(
        &self,
        slot: u32,
        rules: &EgressPolicy,
    ) -> Result<(SlotOutcome, Vec<NetError>), NetError> {
        let script = self.slot_script(slot, rules);
        let ifname = self.ifname(slot);
        let (outcome, mut errors) =
            write_or_close(&self.table, &ifname, slot, script, |s| run("nft", &["-f", "-"], s));
        let Some(outcome) = outcome else {
            return Err(errors.pop().unwrap_or(NetError::Task("no nft step ran".into())));
        };
        let mut warm = self.warm.lock();
        match outcome {
            SlotOutcome::Ruled => {
                warm.in_use.insert(slot, rules.clone());
            }
            // Not pooled with rules it does not have.
            SlotOutcome::Closed | SlotOutcome::Unmapped => {
                warm.in_use.remove(&slot);
            }
        }
        self.unguarded.lock().remove(&slot);
        Ok((outcome, errors))
    }

    /// Removes a slot's link and rules (best effort: the link dies with the sandbox anyway).
    pub fn detach(&self, slot: u32) {
        let (t, ifname) = (&self.table, self.ifname(slot));
        let _ = run("ip", &["link", "del", &ifname], "");
        {
            // Back to the pool with its rules, if the pool wants one more for them.
            let mut warm = self.warm.lock();
            if let Some(key) = warm.in_use.remove(&slot) {
                if warm.give_back(key, slot) {
                    return;
                }
            }
        }
        let mut script = format!(
            "delete element inet {t} sandboxes {{ \"{ifname}\" }}\n\
             flush chain inet {t} s{slot}\n\
             delete chain inet {t} s{slot}\n"
        );
        for set in SLOT_SETS {
            // Made first, so a set the slot never had is no error.
            script += &format!("add set inet {t} {}{slot} {}\n", set.prefix, set.kind());
            script += &format!("delete set inet {t} {}{slot}\n", set.prefix);
        }
        if let Err(e) = run("nft", &["-f", "-"], &script) {
            tracing::debug!(slot, error = %e, "removing a sandbox's egress rules");
        }
        self.slots.lock().remove(&slot);
    }

    /// Host-side links of this daemon's slots that no sandbox holds (left by a sandbox whose
    /// removal failed half way, say).
    pub fn stray_links(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir("/sys/class/net") else { return Vec::new() };
        let names = entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned());
        // Held: by a live sandbox, one restored after a restart, or the warm pool (whose
        // slots have no link).
        let held = self.slots.lock();
        names.filter(|n| self.slot_of_ifname(n).is_some_and(|slot| !held.contains(&slot))).collect()
    }

    /// Deletes a link [`Network::stray_links`] listed.
    pub fn remove_stray_link(&self, ifname: &str) {
        if self.slot_of_ifname(ifname).is_some() {
            let _ = run("ip", &["link", "del", ifname], "");
        }
    }

    /// Removes the whole table (the daemon is going away with no networked sandboxes left).
    pub fn remove(&self) {
        let _ = run("nft", &["delete", "table", "inet", &self.table], "");
        let _ = std::fs::remove_dir_all(&self.claim);
    }
}

/// A sandbox's network namespace: a container's (by a process in it) or a named one (`ip
/// netns`, as a VM sandbox's).
#[derive(Debug, Clone, Copy)]
pub enum Netns<'a> {
    Pid(i32),
    Named(&'a str),
}

impl Netns<'_> {
    /// Its namespace file.
    fn path(&self) -> PathBuf {
        match self {
            Netns::Pid(pid) => PathBuf::from(format!("/proc/{pid}/ns/net")),
            Netns::Named(name) => Path::new("/run/netns").join(name),
        }
    }
}

/// The guest side of a VM sandbox's network: its address behind the tap, and the tap's.
pub const VM_GUEST_ADDR: &str = "172.16.0.2";
pub const VM_GATEWAY: &str = "172.16.0.1";
/// The tap's MAC, the same in every VM sandbox's namespace: a VM forked from another (whose
/// guest remembers its gateway's MAC) reaches its own tap at once.
pub const VM_GATEWAY_MAC: &str = "02:b7:16:00:00:01";
/// The tap a VM sandbox's virtio-net attaches to, in its network namespace.
pub const VM_TAP: &str = "tap0";

/// Makes the named network namespace of a VM sandbox: loopback up, the tap its VMM attaches
/// to ([`VM_TAP`], [`VM_GATEWAY`]/30, the guest at [`VM_GUEST_ADDR`]), forwarding on, and the
/// guest's traffic masqueraded out of `eth0`, the sandbox's link that [`Network::attach_in`]
/// adds (where the node's egress rules judge it, as a container's).
pub fn create_vm_netns(name: &str) -> Result<(), NetError> {
    let _ = run("ip", &["netns", "del", name], "");
    run("ip", &["netns", "add", name], "")?;
    let made = (|| {
        run(
            "ip",
            &["-n", name, "-batch", "-"],
            &format!(
                "link set lo up
                 tuntap add dev {VM_TAP} mode tap
                 link set {VM_TAP} address {VM_GATEWAY_MAC}
                 addr add {VM_GATEWAY}/30 dev {VM_TAP}
                 link set {VM_TAP} up
"
            ),
        )?;
        run(
            "ip",
            &["netns", "exec", name, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"],
            "",
        )?;
        run(
            "ip",
            &["netns", "exec", name, "nft", "-f", "-"],
            "add table ip brig_vm
             add chain ip brig_vm post { type nat hook postrouting priority 100; }
             add rule ip brig_vm post oifname \"eth0\" masquerade
",
        )
    })();
    if made.is_err() {
        remove_vm_netns(name);
    }
    made
}

/// Removes a VM sandbox's network namespace (its tap and link go with it).
pub fn remove_vm_netns(name: &str) {
    let _ = run("ip", &["netns", "del", name], "");
}

/// One new connection a sandbox tried, from the kernel log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressEvent {
    pub ifname: String,
    pub allowed: bool,
    /// `tcp`, `udp`, `icmp`, …
    pub proto: String,
    pub dst: String,
    pub port: Option<u16>,
}

/// Parses one kernel log record if it is one of this daemon's (`prefix` from
/// [`Network::log_prefix`]).
pub fn parse_log_record(record: &str, prefix: &str) -> Option<EgressEvent> {
    let text = &record[record.find(prefix)? + prefix.len()..];
    let allowed = if text.starts_with("allow ") {
        true
    } else if text.starts_with("deny ") {
        false
    } else {
        return None;
    };
    let field =
        |key: &str| text.split_whitespace().find_map(|w| w.strip_prefix(key)).map(str::to_string);
    Some(EgressEvent {
        ifname: field("IN=")?,
        allowed,
        proto: field("PROTO=").unwrap_or_default().to_ascii_lowercase(),
        dst: field("DST=")?,
        port: field("DPT=").and_then(|p| p.parse().ok()),
    })
}

/// Follows the kernel log from now on in a thread of its own, handing this daemon's egress
/// records to `on_event`. Needs `CAP_SYSLOG` (root).
pub fn watch_kernel_log(
    prefix: String,
    on_event: impl Fn(EgressEvent) + Send + 'static,
) -> Result<(), NetError> {
    use std::io::Seek;
    let path = Path::new("/dev/kmsg");
    let mut file = std::fs::File::open(path)
        .map_err(|source| NetError::Io { path: path.to_owned(), source })?;
    file.seek(std::io::SeekFrom::End(0))
        .map_err(|source| NetError::Io { path: path.to_owned(), source })?;
    std::thread::Builder::new()
        .name("brig-egress-log".into())
        .spawn(move || {
            // /dev/kmsg returns one record per read; a record longer than the buffer fails
            // with EINVAL and is skipped.
            let mut reader = std::io::BufReader::with_capacity(8192, file);
            let mut line = String::new();
            loop {
                line.clear();
                match reader.read_line(&mut line) {
                    Ok(0) => return,
                    Ok(_) => {
                        if let Some(event) = parse_log_record(&line, &prefix) {
                            on_event(event);
                        }
                    }
                    // EPIPE: records were overwritten before we read them; go on.
                    Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "kernel log unreadable: egress audit stops");
                        return;
                    }
                }
            }
        })
        .map_err(|source| NetError::Io { path: path.to_owned(), source })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use brig_core::Destination;

    #[test]
    fn pooled_slots_are_kept_per_rule_set_within_bounds() {
        let d = |port| Destination { addr: Ipv4Addr::new(10, 0, 0, 1), prefix: 32, port };
        let (a, b) = (
            EgressPolicy::allowing(vec![d(Some(80)), d(None), d(Some(80))]),
            EgressPolicy::allowing(vec![d(None), d(Some(80))]),
        );
        assert_eq!(a, b, "order and repeats do not make another rule set");
        let mut warm = WarmSlots::default();
        assert!(warm.wants(&a));
        warm.refilling.insert(a.clone());
        assert!(!warm.wants(&a), "one refill at a time");
        warm.refilling.clear();
        warm.ready.insert(a.clone(), vec![1, 2, 3]);
        assert!(!warm.wants(&a), "enough ready");
        assert_eq!(warm.take(&a), Some(3));
        assert_eq!(warm.take(&EgressPolicy::default()), None, "nothing ready for another rule set");
        assert!(warm.give_back(a.clone(), 7));
        assert!(warm.give_back(a.clone(), 8));
        assert_eq!(warm.ready[&a].len(), WARM_PER_RULES);
        assert!(!warm.give_back(a.clone(), 9), "a full pool frees the slot instead");
        let other = EgressPolicy::default();
        assert!(!warm.give_back(other, 10), "no pool for a rule set never made ready");
        for port in 0..WARM_RULE_SETS as u16 {
            warm.ready.insert(EgressPolicy::allowing(vec![d(Some(port))]), vec![]);
        }
        let unseen = EgressPolicy::allowing(vec![d(Some(999))]);
        assert!(!warm.wants(&unseen), "no more rule sets than the bound");
    }

    #[test]
    fn kernel_log_records_parse() {
        let rec = "4,1234,5678,-;brig-0a1b2c3d deny IN=b0a1b2c3d0003 OUT=eth0 \
                   SRC=10.128.0.14 DST=10.9.9.9 LEN=60 PROTO=TCP SPT=4242 DPT=80 SYN\n";
        let e = parse_log_record(rec, "brig-0a1b2c3d ").expect("test");
        assert_eq!(
            e,
            EgressEvent {
                ifname: "b0a1b2c3d0003".into(),
                allowed: false,
                proto: "tcp".into(),
                dst: "10.9.9.9".into(),
                port: Some(80),
            }
        );
        assert!(parse_log_record(rec, "brig-ffffffff ").is_none());
        assert!(parse_log_record("6,1,2,-;erofs: mounted\n", "brig-0a1b2c3d ").is_none());
    }
}
