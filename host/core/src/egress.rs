//! Egress rules: where a sandbox may open connections to.
//!
//! A rule names a semantic service (`pypi`, `debian`, a mirror) that the node maps to
//! destinations from its configuration, or a destination directly: `10.1.2.3`, `10.0.0.0/8`,
//! `10.1.2.3:8080`, `10.0.0.0/8:443`. No rule means no egress: everything not allowed is
//! dropped (loopback inside the sandbox always works).

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
}

impl std::str::FromStr for EgressRule {
    type Err = EgressRuleError;

    /// A destination when it starts with a digit, otherwise a service name (letters, digits,
    /// `-`, `_`, `.`).
    fn from_str(s: &str) -> Result<EgressRule, EgressRuleError> {
        let s = s.trim();
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
        }
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
    }
}
