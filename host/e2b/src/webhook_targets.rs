//! Where webhooks may be delivered (`[e2b] webhook_targets`). A webhook's URL is a tenant's
//! choice and the gateway sends to it from the node, so an unchecked URL would let a key holder
//! make the node send requests into places only the node reaches: its own services on
//! loopback, a cloud's metadata service (link-local), the sandboxes' and the operator's private
//! networks. Every address a delivery connects to is checked: a literal address when the
//! webhook is registered and again when it is sent, a name's addresses as the name is resolved
//! for the connection itself (so a name that resolves elsewhere the second time gains nothing),
//! and redirects are not followed.
//!
//! - `public` (the default): globally routable addresses only;
//! - `private`: private networks too (RFC 1918, unique local, shared CGNAT space), never
//!   loopback, link-local, unspecified, multicast or broadcast;
//! - `any`: every address (a gateway whose keys are all the operator's own, or a test).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

/// Which addresses webhooks may be delivered to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebhookTargets {
    #[default]
    Public,
    Private,
    Any,
}

/// Why an address is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{addr} is {kind}, where webhooks are not delivered (`[e2b] webhook_targets = \"{policy}\"`)"
)]
pub struct Refused {
    pub addr: IpAddr,
    pub kind: &'static str,
    pub policy: &'static str,
}

/// Longest a registration waits to resolve a webhook's host name for its check.
const RESOLVE_AT_REGISTRATION: Duration = Duration::from_secs(2);

impl WebhookTargets {
    fn name(self) -> &'static str {
        match self {
            WebhookTargets::Public => "public",
            WebhookTargets::Private => "private",
            WebhookTargets::Any => "any",
        }
    }

    /// `Ok` if a delivery may connect to `addr`.
    pub fn check(self, addr: IpAddr) -> Result<(), Refused> {
        if self == WebhookTargets::Any {
            return Ok(());
        }
        let refuse = |kind| Err(Refused { addr, kind, policy: self.name() });
        match special(addr) {
            Some(Special::Host(kind)) => refuse(kind),
            Some(Special::Private(kind)) if self == WebhookTargets::Public => refuse(kind),
            _ => Ok(()),
        }
    }

    /// Checks a webhook's URL as it is registered: a literal address, or what its host name
    /// resolves to now (a name that does not resolve yet is checked at each delivery).
    pub async fn check_url(self, url: &str) -> Result<(), String> {
        if self == WebhookTargets::Any {
            return Ok(());
        }
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("url {url:?}: {e}"))?;
        let port = parsed.port_or_known_default().unwrap_or(80);
        match parsed.host() {
            Some(url::Host::Ipv4(ip)) => self.check(IpAddr::V4(ip)).map_err(|e| e.to_string()),
            Some(url::Host::Ipv6(ip)) => self.check(IpAddr::V6(ip)).map_err(|e| e.to_string()),
            Some(url::Host::Domain(name)) => {
                let lookup = tokio::net::lookup_host((name, port));
                let Ok(Ok(addrs)) = tokio::time::timeout(RESOLVE_AT_REGISTRATION, lookup).await
                else {
                    return Ok(());
                };
                for addr in addrs {
                    self.check(addr.ip()).map_err(|e| format!("{name} resolves to {e}"))?;
                }
                Ok(())
            }
            None => Err(format!("url {url:?} names no host")),
        }
    }

    /// An HTTP client for deliveries that connects only where this policy allows, follows no
    /// redirect, and gives up after `deadline`. On a host without a certificate store (a
    /// minimal VM) the client trusts no certificate: http receivers still get deliveries,
    /// https ones fail (and the node says why).
    pub fn client(self, deadline: Duration) -> reqwest::Result<reqwest::Client> {
        let builder = || {
            reqwest::Client::builder()
                .timeout(deadline)
                .redirect(reqwest::redirect::Policy::none())
                .dns_resolver(Arc::new(CheckedResolver(self)))
        };
        builder().build().or_else(|e| {
            tracing::warn!(error = %e, "no certificate store: webhooks go to http receivers only");
            builder().tls_certs_only(Vec::new()).build()
        })
    }
}

/// Addresses that are not the wide internet.
enum Special {
    /// The node itself, its link, or nobody: never a webhook's.
    Host(&'static str),
    /// A private network.
    Private(&'static str),
}

fn special(addr: IpAddr) -> Option<Special> {
    match addr {
        IpAddr::V4(ip) => special_v4(ip),
        IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
            Some(v4) => special_v4(v4),
            None => special_v6(ip),
        },
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<Special> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some(Special::Host("a loopback address"))
    } else if ip.is_unspecified() || a == 0 {
        Some(Special::Host("an unspecified address"))
    } else if ip.is_link_local() {
        Some(Special::Host("a link-local address (a cloud's metadata service lives there)"))
    } else if ip.is_multicast() || ip.is_broadcast() || a >= 240 {
        Some(Special::Host("a multicast, broadcast or reserved address"))
    } else if ip.is_private() {
        Some(Special::Private("a private address"))
    } else if a == 100 && (64..128).contains(&b) {
        Some(Special::Private("a shared (CGNAT) address"))
    } else if a == 198 && (b == 18 || b == 19) {
        Some(Special::Private("a benchmarking network's address"))
    } else {
        None
    }
}

fn special_v6(ip: Ipv6Addr) -> Option<Special> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some(Special::Host("a loopback address"))
    } else if ip.is_unspecified() {
        Some(Special::Host("an unspecified address"))
    } else if first & 0xffc0 == 0xfe80 {
        Some(Special::Host("a link-local address"))
    } else if ip.is_multicast() {
        Some(Special::Host("a multicast address"))
    } else if first & 0xfe00 == 0xfc00 {
        Some(Special::Private("a unique local (private) address"))
    } else {
        None
    }
}

/// Resolves a delivery's host name and keeps the addresses the policy allows; none left is a
/// failed connection (the delivery's attempts fail and are counted).
struct CheckedResolver(WebhookTargets);

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let allowed: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match policy.check(a.ip()) {
                    Ok(()) => true,
                    Err(e) => {
                        refused = Some(e);
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                let why = match refused {
                    Some(e) => format!("{host} resolves to {e}"),
                    None => format!("{host} resolves to no address"),
                };
                return Err(why.into());
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn the_node_and_private_networks_are_refused_as_the_policy_says() {
        let public = WebhookTargets::Public;
        for refused in [
            "127.0.0.1",
            "0.0.0.0",
            "169.254.169.254",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(public.check(ip(refused)).is_err(), "{refused} is refused");
        }
        for allowed in ["93.184.216.34", "2606:2800:220:1::1", "8.8.8.8"] {
            assert!(public.check(ip(allowed)).is_ok(), "{allowed} is allowed");
        }
        let private = WebhookTargets::Private;
        assert!(private.check(ip("10.1.2.3")).is_ok());
        assert!(private.check(ip("fd00::1")).is_ok());
        assert!(private.check(ip("127.0.0.1")).is_err());
        assert!(private.check(ip("169.254.169.254")).is_err());
        assert!(WebhookTargets::Any.check(ip("127.0.0.1")).is_ok());
        let e = public.check(ip("127.0.0.1")).expect_err("loopback");
        assert!(e.to_string().contains("webhook_targets"), "{e}");
    }

    #[tokio::test]
    async fn urls_are_checked_as_they_are_registered() {
        let public = WebhookTargets::Public;
        assert!(public.check_url("http://127.0.0.1:9/hook").await.is_err());
        assert!(public.check_url("http://[::1]/hook").await.is_err());
        assert!(public.check_url("http://localhost:9/hook").await.is_err(), "a name of the node");
        assert!(public.check_url("https://93.184.216.34/hook").await.is_ok());
        assert!(WebhookTargets::Any.check_url("http://127.0.0.1:9/").await.is_ok());
    }
}
