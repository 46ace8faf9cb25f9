//! Egress rules: where a sandbox may open connections to.
//!
//! A rule names a semantic service (`pypi`, `debian`, a mirror) that the node maps to
//! destinations from its configuration, or a destination directly: `10.1.2.3`, `10.0.0.0/8`,
//! `10.1.2.3:8080`, `10.0.0.0/8:443`, or a destination taken out with `!` (`!10.0.0.0/8`,
//! `!10.1.2.3:22`), which wins over every allowing rule but a service. No rule means no egress:
//! everything not allowed is dropped (loopback inside the sandbox always works).
//!
//! Whatever the rules say, a sandbox never reaches the node itself (its own addresses,
//! loopback), the node's other sandboxes, or link-local and metadata addresses
//! ([`PROTECTED_NETWORKS`]); only a service, whose destinations the node's operator
//! configured, may name such an address. A policy holds at most [`MAX_EGRESS_RULES`] rules,
//! and turning it into address ranges ([`AddressRanges`]) takes `O(n log n)`.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// One IPv4 network and, optionally, one port (TCP or UDP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Destination {
    pub addr: Ipv4Addr,
    pub prefix: u8,
    pub port: Option<u16>,
}

impl Destination {
    /// The network in CIDR form (`10.0.0.0/8`), host bits cleared.
    pub fn network(&self) -> String {
        let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(self.prefix)) };
        format!("{}/{}", Ipv4Addr::from(u32::from(self.addr) & mask), self.prefix)
    }
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.prefix == 32 {
            write!(f, "{}", self.addr)?;
        } else {
            write!(f, "{}", self.network())?;
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// Why an egress rule does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EgressRuleError {
    #[error("egress rule {0:?} is empty or not a service name, address, network or port")]
    Malformed(String),
    #[error("{count} egress rules: at most {MAX_EGRESS_RULES} are served per sandbox")]
    TooMany { count: usize },
}

/// The most rules one sandbox's egress policy may hold (each a service, an allowed or a
/// denied destination).
pub const MAX_EGRESS_RULES: usize = 4096;

/// Networks no rule but a service opens, beside the node's own addresses (which the node
/// matches by address type) and its sandboxes' subnet: "this network", loopback, link-local
/// (cloud metadata at 169.254.169.254 among them), Alibaba's metadata address, Azure's
/// WireServer (168.63.129.16: the VM agent's channel to the fabric, its configuration and
/// certificates), multicast and the limited broadcast address.
pub const PROTECTED_NETWORKS: &[&str] = &[
    "0.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "100.100.100.200/32",
    "168.63.129.16/32",
    "224.0.0.0/4",
    "255.255.255.255/32",
];

/// Checks a rule count against [`MAX_EGRESS_RULES`].
pub fn check_rule_count(count: usize) -> Result<(), EgressRuleError> {
    if count > MAX_EGRESS_RULES {
        return Err(EgressRuleError::TooMany { count });
    }
    Ok(())
}

impl std::str::FromStr for Destination {
    type Err = EgressRuleError;

    fn from_str(s: &str) -> Result<Destination, EgressRuleError> {
        let bad = || EgressRuleError::Malformed(s.to_string());
        let (net, port) = match s.rsplit_once(':') {
            Some((net, port)) => (net, Some(port.parse::<u16>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let (addr, prefix) = match net.split_once('/') {
            Some((addr, prefix)) => (addr, prefix.parse::<u8>().map_err(|_| bad())?),
            None => (net, 32),
        };
        if prefix > 32 || port == Some(0) {
            return Err(bad());
        }
        Ok(Destination { addr: addr.parse().map_err(|_| bad())?, prefix, port })
    }
}

/// One rule of a sandbox's egress policy.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EgressRule {
    /// A service the node's configuration maps to destinations.
    Service(String),
    Destination(Destination),
    /// A destination taken out of what the other rules (services excepted) allow.
    Deny(Destination),
}

impl std::str::FromStr for EgressRule {
    type Err = EgressRuleError;

    /// A destination when it starts with a digit, a denied one when it starts with `!`,
    /// otherwise a service name (letters, digits, `-`, `_`, `.`).
    fn from_str(s: &str) -> Result<EgressRule, EgressRuleError> {
        let s = s.trim();
        if let Some(denied) = s.strip_prefix('!') {
            return match denied.chars().next() {
                Some(c) if c.is_ascii_digit() => Ok(EgressRule::Deny(denied.parse()?)),
                _ => Err(EgressRuleError::Malformed(s.to_string())),
            };
        }
        match s.chars().next() {
            Some(c) if c.is_ascii_digit() => Ok(EgressRule::Destination(s.parse()?)),
            Some(_)
                if s.len() <= 64
                    && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) =>
            {
                Ok(EgressRule::Service(s.to_string()))
            }
            _ => Err(EgressRuleError::Malformed(s.to_string())),
        }
    }
}

impl std::fmt::Display for EgressRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EgressRule::Service(name) => f.write_str(name),
            EgressRule::Destination(d) => d.fmt(f),
            EgressRule::Deny(d) => write!(f, "!{d}"),
        }
    }
}

/// A policy resolved to destinations: what the node's services name (checked first, the only
/// way to the node's own and other protected addresses), what is denied, then what is allowed.
/// Sorted and without repeats, so equal policies compare equal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct EgressPolicy {
    pub services: Vec<Destination>,
    pub deny: Vec<Destination>,
    pub allow: Vec<Destination>,
}

impl EgressPolicy {
    /// A policy from its three lists, put in canonical order.
    pub fn new(
        services: Vec<Destination>,
        deny: Vec<Destination>,
        allow: Vec<Destination>,
    ) -> EgressPolicy {
        let canonical = |mut list: Vec<Destination>| {
            list.sort_unstable_by_key(|d| (u32::from(d.addr), d.prefix, d.port));
            list.dedup();
            list
        };
        EgressPolicy {
            services: canonical(services),
            deny: canonical(deny),
            allow: canonical(allow),
        }
    }

    /// An allow-only policy (as a list of destinations used to be).
    pub fn allowing(allow: Vec<Destination>) -> EgressPolicy {
        EgressPolicy::new(Vec::new(), Vec::new(), allow)
    }

    /// How many destinations it holds.
    pub fn len(&self) -> usize {
        self.services.len() + self.deny.len() + self.allow.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An inclusive range of IPv4 addresses.
pub type AddressRange = (Ipv4Addr, Ipv4Addr);

/// Destinations as disjoint, sorted address ranges: for any port, and per port. Ranges that
/// overlap or touch are merged, so the result can be loaded into an interval set (which
/// refuses overlapping elements) as is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressRanges {
    pub any_port: Vec<AddressRange>,
    /// By port, ascending.
    pub ported: Vec<(u16, Vec<AddressRange>)>,
}

impl AddressRanges {
    /// Sorts, then merges in one pass: `O(n log n)` for `n` destinations.
    pub fn of(dests: &[Destination]) -> AddressRanges {
        let mut spans: Vec<(Option<u16>, u32, u32)> = dests
            .iter()
            .map(|d| {
                // The host bits: all of them for /0, none for /32.
                let size = u32::MAX.checked_shr(u32::from(d.prefix)).unwrap_or(0);
                let start = u32::from(d.addr) & !size;
                (d.port, start, start | size)
            })
            .collect();
        spans.sort_unstable();
        let mut out = AddressRanges::default();
        let mut current: Option<(Option<u16>, u32, u32)> = None;
        let mut flush = |(port, start, end): (Option<u16>, u32, u32)| {
            let range = (Ipv4Addr::from(start), Ipv4Addr::from(end));
            match port {
                None => out.any_port.push(range),
                Some(p) => match out.ported.last_mut() {
                    Some((last, ranges)) if *last == p => ranges.push(range),
                    _ => out.ported.push((p, vec![range])),
                },
            }
        };
        for (port, start, end) in spans {
            current = match current {
                // Same port, and it overlaps or touches the range being built.
                Some((p, s, e)) if p == port && u64::from(start) <= u64::from(e) + 1 => {
                    Some((p, s, e.max(end)))
                }
                Some(done) => {
                    flush(done);
                    Some((port, start, end))
                }
                None => Some((port, start, end)),
            };
        }
        if let Some(done) = current {
            flush(done);
        }
        out
    }

    /// How many ranges it holds.
    pub fn len(&self) -> usize {
        self.any_port.len() + self.ported.iter().map(|(_, r)| r.len()).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_print_back() {
        for text in ["pypi", "10.1.2.3", "10.0.0.0/8", "10.1.2.3:8080", "192.168.0.0/16:443"] {
            let rule: EgressRule = text.parse().expect("test");
            assert_eq!(rule.to_string(), text);
        }
        let d: Destination = "10.1.2.3/8:80".parse().expect("test");
        assert_eq!(d.network(), "10.0.0.0/8");
        for bad in ["", "10.1.2.3/33", "10.1.2.3:0", "10.1.2:80", "py pi", "10.1.2.3:x", "a;b"] {
            assert!(bad.parse::<EgressRule>().is_err(), "{bad:?} parsed");
        }
        for text in ["!10.1.2.3", "!10.0.0.0/8", "!10.1.2.3:22"] {
            let rule: EgressRule = text.parse().expect("test");
            assert!(matches!(rule, EgressRule::Deny(_)), "{text}");
            assert_eq!(rule.to_string(), text);
        }
        for bad in ["!", "!pypi", "!!10.1.2.3", "!10.1.2.3/40"] {
            assert!(bad.parse::<EgressRule>().is_err(), "{bad:?} parsed");
        }
        assert!(check_rule_count(MAX_EGRESS_RULES).is_ok());
        assert_eq!(
            check_rule_count(MAX_EGRESS_RULES + 1),
            Err(EgressRuleError::TooMany { count: MAX_EGRESS_RULES + 1 })
        );
    }

    fn range(a: &str, b: &str) -> AddressRange {
        (a.parse().expect("test"), b.parse().expect("test"))
    }

    #[test]
    fn destinations_merge_into_disjoint_ranges() {
        let dests: Vec<Destination> = [
            "10.0.0.0/8",
            "10.1.0.0/16",
            "11.0.0.0/8",
            "192.168.1.7",
            "192.168.1.8/31",
            "192.168.1.3",
            "1.2.3.4:80",
            "1.2.3.0/24:80",
            "1.2.3.4:443",
            "1.2.4.0/24:80",
        ]
        .iter()
        .map(|t| t.parse().expect("test"))
        .collect();
        let r = AddressRanges::of(&dests);
        assert_eq!(
            r.any_port,
            vec![
                range("10.0.0.0", "11.255.255.255"),
                range("192.168.1.3", "192.168.1.3"),
                range("192.168.1.7", "192.168.1.9"),
            ]
        );
        assert_eq!(
            r.ported,
            vec![
                (80, vec![range("1.2.3.0", "1.2.4.255")]),
                (443, vec![range("1.2.3.4", "1.2.3.4")]),
            ]
        );
        let all: Vec<Destination> = ["0.0.0.0/0", "255.255.255.255", "0.0.0.0/1"]
            .iter()
            .map(|t| t.parse().expect("t"))
            .collect();
        assert_eq!(AddressRanges::of(&all).any_port, vec![range("0.0.0.0", "255.255.255.255")]);
        assert!(AddressRanges::of(&[]).is_empty());
    }

    /// 100,000 destinations (a denial list as E2B clients send them) become ranges in well under
    /// a second even unoptimized: the computation is a sort and one pass, not a search per rule
    /// (the quadratic complement it replaced took 17-26 s). The bound is absolute and generous, not
    /// a ratio of millisecond timings, so a noisy machine does not fail it.
    #[test]
    fn a_large_rule_list_is_computed_in_linear_time() {
        let dests: Vec<Destination> = (0..100_000u32)
            .map(|i| Destination {
                addr: Ipv4Addr::from(0x0b00_0000 + i.wrapping_mul(2_654_435_761) % 0x00ff_ffff),
                prefix: 32,
                port: if i % 3 == 0 { Some(443) } else { None },
            })
            .collect();
        let small = AddressRanges::of(&dests[..10_000]);
        let started = std::time::Instant::now();
        let big = AddressRanges::of(&dests);
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(3), "100,000 destinations took {took:?}");
        // Disjoint and sorted, per port: what an interval set loads as is.
        let disjoint = |ranges: &[AddressRange]| {
            ranges.iter().all(|(a, b)| a <= b)
                && ranges
                    .windows(2)
                    .all(|w| u64::from(u32::from(w[0].1)) + 1 < u64::from(u32::from(w[1].0)))
        };
        assert!(disjoint(&big.any_port) && big.ported.iter().all(|(_, r)| disjoint(r)));
        assert!(big.len() >= small.len() && big.len() <= dests.len());
        let policy = EgressPolicy::new(vec![], dests.clone(), dests);
        assert!(policy.deny.len() <= 100_000 && policy.deny.windows(2).all(|w| w[0] != w[1]));
    }
}
