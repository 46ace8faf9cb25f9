//! The nftables text of the node's sandbox network (see [`crate::network`]): the table's guard
//! (what no sandbox rule opens) and each slot's chain and sets. Pure text, so it is tested
//! without a kernel; `network` runs it.

use std::net::Ipv4Addr;

use brig_core::egress::{AddressRange, AddressRanges, PROTECTED_NETWORKS};
use brig_core::{Destination, EgressPolicy};

/// The table's `refuse` chain (log a new connection, drop) and its `guard` chain, which
/// every slot's chain jumps to after its services: the node's own addresses (by address type),
/// this daemon's subnet (`base`/20), the protected networks and IPv6 are refused, and so is a
/// connection the host's own NAT rewrote (`ct status dnat`): a port the host forwards (Docker's
/// published ports, a Kubernetes node port), reached through one of the node's addresses, arrives
/// at this hook already sent on to another address, which none of the checks above name. Written
/// again on every start: a table an older daemon left has none of it.
pub(crate) fn guard_script(t: &str, log: &str, base: Ipv4Addr) -> String {
    let mut protected: Vec<Destination> =
        PROTECTED_NETWORKS.iter().filter_map(|n| n.parse().ok()).collect();
    protected.push(Destination { addr: base, prefix: 20, port: None });
    let elements = range_elements(&AddressRanges::of(&protected).any_port);
    format!(
        "add set inet {t} protected {{ type ipv4_addr; flags interval; }}\n\
         flush set inet {t} protected\n\
         add element inet {t} protected {{ {elements} }}\n\
         add chain inet {t} refuse\n\
         flush chain inet {t} refuse\n\
         add rule inet {t} refuse ct state new \
           limit rate 100/second burst 200 packets log prefix \"{log}deny \"\n\
         add rule inet {t} refuse drop\n\
         add chain inet {t} guard\n\
         flush chain inet {t} guard\n\
         add rule inet {t} guard meta nfproto ipv6 goto refuse\n\
         add rule inet {t} guard ct status dnat goto refuse\n\
         add rule inet {t} guard fib daddr type {{ local, broadcast, multicast, anycast }} \
           goto refuse\n\
         add rule inet {t} guard ip daddr @protected goto refuse\n"
    )
}

/// One of a slot's named sets: its name's prefix (the slot number follows), whether its
/// elements carry a port, and the verdict its rule gives.
pub(crate) struct SlotSet {
    pub(crate) prefix: &'static str,
    ported: bool,
    allow: bool,
}

impl SlotSet {
    pub(crate) fn kind(&self) -> &'static str {
        if self.ported {
            "{ type ipv4_addr . inet_service; flags interval; }"
        } else {
            "{ type ipv4_addr; flags interval; }"
        }
    }
}

/// A slot's sets in the order its chain checks them: services, (guard,) denied, allowed.
pub(crate) const SLOT_SETS: [SlotSet; 6] = [
    SlotSet { prefix: "sa", ported: true, allow: true },
    SlotSet { prefix: "sn", ported: false, allow: true },
    SlotSet { prefix: "da", ported: true, allow: false },
    SlotSet { prefix: "dn", ported: false, allow: false },
    SlotSet { prefix: "a", ported: true, allow: true },
    SlotSet { prefix: "n", ported: false, allow: true },
];

/// Ranges as nftables set elements (`a`, or `a-b`), comma-separated.
fn range_elements(ranges: &[AddressRange]) -> String {
    let mut out = String::with_capacity(ranges.len() * 32);
    for (i, (a, b)) in ranges.iter().enumerate() {
        if i > 0 {
            out += ", ";
        }
        out += &if a == b { a.to_string() } else { format!("{a}-{b}") };
    }
    out
}

/// Ported ranges as elements of an `ipv4_addr . inet_service` interval set.
fn ported_elements(ported: &[(u16, Vec<AddressRange>)]) -> String {
    let mut out = String::new();
    for (port, ranges) in ported {
        for (a, b) in ranges {
            if !out.is_empty() {
                out += ", ";
            }
            out += &if a == b { format!("{a} . {port}") } else { format!("{a}-{b} . {port}") };
        }
    }
    out
}

/// The nftables part of a slot, written whole each time (one transaction: connections open
/// stay open, new ones follow the new rules): its chain, flushed and filled again, the sets
/// its rules need (sets it no longer needs are removed), then its verdict-map entry, so no
/// packet passes before the rules exist. Linear in the rules (after their `O(n log n)` merge).
pub(crate) fn slot_script(
    t: &str,
    log: &str,
    ifname: &str,
    slot: u32,
    rules: &EgressPolicy,
) -> String {
    let [services, deny, allow] =
        [&rules.services, &rules.deny, &rules.allow].map(|d| AddressRanges::of(d));
    let lists = [&services, &deny, &allow];
    let mut script = format!("add chain inet {t} s{slot}\nflush chain inet {t} s{slot}\n");
    let mut chain = format!("add rule inet {t} s{slot} ct state established,related accept\n");
    for (i, set) in SLOT_SETS.iter().enumerate() {
        let ranges = lists[i / 2];
        let elements = if set.ported {
            ported_elements(&ranges.ported)
        } else {
            range_elements(&ranges.any_port)
        };
        let name = format!("{}{slot}", set.prefix);
        script += &format!("add set inet {t} {name} {}\n", set.kind());
        if elements.is_empty() {
            script += &format!("delete set inet {t} {name}\n");
        } else {
            script += &format!(
                "flush set inet {t} {name}\nadd element inet {t} {name} {{ {elements} }}\n"
            );
            let matched = if set.ported {
                format!("meta l4proto {{ tcp, udp }} ip daddr . th dport @{name}")
            } else {
                format!("ip daddr @{name}")
            };
            chain += &if set.allow {
                format!(
                    "add rule inet {t} s{slot} {matched} ct state new log prefix \"{log}allow \" \
                     accept\n"
                )
            } else {
                format!("add rule inet {t} s{slot} {matched} goto refuse\n")
            };
        }
        if set.prefix == "sn" {
            chain += &format!("add rule inet {t} s{slot} jump guard\n");
        }
    }
    script += &chain;
    script += &format!("add element inet {t} sandboxes {{ \"{ifname}\" : jump s{slot} }}\n");
    script
}

/// A slot's chain left refusing everything, established connections included (its sets are
/// kept; no rule reads them): what a slot gets when its rules cannot be written and it must not
/// keep the ones it has.
pub(crate) fn closed_slot_script(t: &str, slot: u32) -> String {
    format!(
        "add chain inet {t} s{slot}\nflush chain inet {t} s{slot}\n\
         add rule inet {t} s{slot} goto refuse\n"
    )
}

/// A slot's link taken out of the verdict map: the base chains then log and drop whatever
/// arrives on it.
pub(crate) fn unmapped_slot_script(t: &str, ifname: &str) -> String {
    format!("delete element inet {t} sandboxes {{ \"{ifname}\" }}\n")
}

/// Where a slot whose rules had to be written again ended up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotOutcome {
    /// Its rules, behind the guard.
    Ruled,
    /// Its chain refuses everything ([`closed_slot_script`]).
    Closed,
    /// Its link is out of the verdict map ([`unmapped_slot_script`]).
    Unmapped,
}

/// Writes a slot's rules, failing closed: `rules_script` first; if `run` fails it, the slot's
/// chain is closed; if that fails too, its link leaves the verdict map. The outcome reached (none
/// if every step failed) and the errors of the steps that failed, in order.
pub(crate) fn write_or_close<E>(
    t: &str,
    ifname: &str,
    slot: u32,
    rules_script: String,
    mut run: impl FnMut(&str) -> Result<(), E>,
) -> (Option<SlotOutcome>, Vec<E>) {
    let steps = [
        (SlotOutcome::Ruled, rules_script),
        (SlotOutcome::Closed, closed_slot_script(t, slot)),
        (SlotOutcome::Unmapped, unmapped_slot_script(t, ifname)),
    ];
    let mut errors = Vec::new();
    for (outcome, script) in steps {
        match run(&script) {
            Ok(()) => return (Some(outcome), errors),
            Err(e) => errors.push(e),
        }
    }
    (None, errors)
}

/// The slots whose chain (`chain s<slot> { … }` in `nft list table`) has no jump to the guard:
/// written by a daemon from before the guard.
pub(crate) fn unguarded_slots(listing: &str) -> std::collections::HashSet<u32> {
    let mut found = std::collections::HashSet::new();
    let mut current: Option<(u32, bool)> = None;
    for line in listing.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("chain s").and_then(|r| r.strip_suffix(" {")) {
            current = rest.parse().ok().map(|slot| (slot, false));
        } else if line == "}" {
            if let Some((slot, false)) = current.take() {
                found.insert(slot);
            }
        } else if line == "jump guard" {
            if let Some((_, guarded)) = current.as_mut() {
                *guarded = true;
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_rules_check_services_then_the_guard_then_denials_then_allowances() {
        let p = |texts: &[&str]| -> Vec<Destination> {
            texts.iter().map(|t| t.parse().expect("test")).collect()
        };
        let policy = EgressPolicy::new(
            p(&["10.240.0.2:8080"]),
            p(&["10.0.0.0/8", "10.1.2.3", "1.1.1.1:53"]),
            p(&["0.0.0.0/0"]),
        );
        let script = slot_script("brig_t", "brig-t ", "bt0001", 1, &policy);
        let rules: Vec<&str> = script.lines().filter(|l| l.starts_with("add rule")).collect();
        let at = |needle: &str| {
            rules.iter().position(|r| r.contains(needle)).unwrap_or_else(|| panic!("{needle}"))
        };
        assert!(rules[0].contains("established,related accept"));
        assert!(at("@sa1") < at("jump guard"), "services come before the guard");
        assert!(at("jump guard") < at("@da1") && at("@da1") < at("@dn1"), "{script}");
        assert!(at("@dn1") < at("@n1"), "denials come before allowances");
        assert!(rules[at("@dn1")].ends_with("goto refuse"));
        assert!(!script.contains("@sn1") && !script.contains("@a1 "), "no rule for an empty set");
        assert!(script.contains("delete set inet brig_t sn1"), "unused sets go");
        assert!(script.contains("add element inet brig_t dn1 { 10.0.0.0-10.255.255.255 }"));
        assert!(script.contains("add element inet brig_t sa1 { 10.240.0.2 . 8080 }"));
        assert!(script.trim_end().ends_with("{ \"bt0001\" : jump s1 }"), "the map entry last");
        // An empty policy still passes the guard, then nothing is allowed.
        let closed = slot_script("brig_t", "brig-t ", "bt0001", 1, &EgressPolicy::default());
        assert!(closed.contains("jump guard"));
        assert_eq!(closed.matches(" accept").count(), 1, "only established traffic: {closed}");
    }

    #[test]
    fn the_guard_refuses_the_node_its_subnet_and_link_local() {
        let script = guard_script("brig_t", "brig-t ", Ipv4Addr::new(10, 128, 16, 0));
        assert!(script.contains("fib daddr type { local, broadcast, multicast, anycast }"));
        assert!(script.contains("meta nfproto ipv6 goto refuse"));
        assert!(script.contains("add rule inet brig_t guard ct status dnat goto refuse"));
        let protected = script.lines().find(|l| l.starts_with("add element")).expect("elements");
        assert!(protected.contains(" 168.63.129.16,"), "Azure's WireServer alone: {protected}");
        for range in [
            "10.128.16.0-10.128.31.255",
            "127.0.0.0-127.255.255.255",
            "169.254.0.0-169.254.255.255",
            "100.100.100.200",
            "168.63.129.16",
        ] {
            assert!(script.contains(range), "{range} not protected: {script}");
        }
    }

    #[test]
    fn chains_without_the_guard_are_found() {
        let listing = "table inet brig_t {\n\tchain s1 {\n\t\tct state established,related accept\n\
                       \t\tip daddr @n1 ct state new log prefix \"x allow \" accept\n\t}\n\
                       \tchain s2 {\n\t\tct state established,related accept\n\t\tjump guard\n\t}\n\
                       \tchain guard {\n\t\tmeta nfproto ipv6 goto refuse\n\t}\n\
                       \tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n\t}\n}\n";
        assert_eq!(unguarded_slots(listing), [1].into_iter().collect());
    }

    #[test]
    fn a_slot_whose_rules_cannot_be_written_is_closed() {
        let rules = slot_script("brig_t", "brig-t ", "bt0001", 1, &EgressPolicy::default());
        // `run` failing its first `fails` scripts: the outcome, the errors, the scripts tried.
        let attempt = |fails: usize| {
            let mut tried: Vec<String> = Vec::new();
            let (done, errors) = write_or_close("brig_t", "bt0001", 1, rules.clone(), |script| {
                tried.push(script.to_string());
                if tried.len() <= fails {
                    Err(tried.len())
                } else {
                    Ok(())
                }
            });
            (done, errors, tried)
        };
        let (done, errors, tried) = attempt(0);
        assert_eq!((done, errors), (Some(SlotOutcome::Ruled), vec![]));
        assert_eq!(tried, vec![rules.clone()], "the rules first, and alone when they are written");
        let (done, errors, tried) = attempt(1);
        assert_eq!((done, errors), (Some(SlotOutcome::Closed), vec![1]));
        // Closed: the chain flushed down to the refusal, nothing accepted, the link still mapped.
        assert_eq!(
            tried[1],
            "add chain inet brig_t s1\nflush chain inet brig_t s1\n\
             add rule inet brig_t s1 goto refuse\n"
        );
        let (done, errors, tried) = attempt(2);
        assert_eq!((done, errors), (Some(SlotOutcome::Unmapped), vec![1, 2]));
        assert_eq!(tried[2], "delete element inet brig_t sandboxes { \"bt0001\" }\n");
        let (done, errors, _) = attempt(3);
        assert_eq!((done, errors), (None, vec![1, 2, 3]), "every step failed: the caller is told");
    }
}
