//! [`Cidr`]: an IPv4 or IPv6 network (`10.0.0.0/8`, `2001:db8::/32`, or one address), as
//! `[proxy] trusted` lists them, and whether an address is in it.
//!
//! An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) is the IPv4 address it maps, on both sides:
//! a dual-stack listener reports IPv4 peers that way. This file must not know what the
//! networks are for.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// A network: an address whose bits past `prefix` are zero, and the prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is in this network (an IPv4-mapped `ip` as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => mask(u32::from(ip).into(), 32, self.prefix) == u32::from(net).into(),
            (IpAddr::V6(net), IpAddr::V6(ip)) => mask(u128::from(ip), 128, self.prefix) == u128::from(net),
            _ => false,
        }
    }
}

/// `bits` (an address of `width` bits) with every bit past `prefix` cleared.
fn mask(bits: u128, width: u8, prefix: u8) -> u128 {
    match width - prefix {
        0 => bits,
        host if host >= 128 => 0,
        host => bits >> host << host,
    }
}

/// Why a string is not a network (for the configuration's one-line message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadCidr;

impl FromStr for Cidr {
    type Err = BadCidr;

    /// `addr/prefix` or a bare address (a single host: `/32` or `/128`). Host bits past the
    /// prefix are dropped (`10.1.2.3/8` is `10.0.0.0/8`), as nginx's `set_real_ip_from` does;
    /// an IPv4-mapped network (`::ffff:10.0.0.0/104`) is its IPv4 network.
    fn from_str(s: &str) -> Result<Cidr, BadCidr> {
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| BadCidr)?;
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => width,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().ok().filter(|p| *p <= width).ok_or(BadCidr)?
            }
            Some(_) => return Err(BadCidr),
        };
        Ok(match addr {
            IpAddr::V4(a) => {
                Cidr { addr: IpAddr::from((mask(u32::from(a).into(), 32, prefix) as u32).to_be_bytes()), prefix }
            }
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) if prefix >= 96 => {
                    let prefix = prefix - 96;
                    Cidr { addr: IpAddr::from((mask(u32::from(v4).into(), 32, prefix) as u32).to_be_bytes()), prefix }
                }
                _ => Cidr { addr: IpAddr::from(mask(u128::from(a), 128, prefix).to_be_bytes()), prefix },
            },
        })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Cidr {
        s.parse().unwrap_or_else(|_| panic!("{s} is a network"))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|_| panic!("{s} is an address"))
    }

    #[test]
    fn networks_contain_their_addresses_and_no_other() {
        let net = cidr("10.0.0.0/8");
        assert!(net.contains(ip("10.0.0.1")) && net.contains(ip("10.255.255.255")));
        assert!(!net.contains(ip("11.0.0.0")) && !net.contains(ip("9.255.255.255")));
        assert!(net.contains(ip("::ffff:10.1.2.3")), "an IPv4-mapped peer is its IPv4 address");
        assert!(!net.contains(ip("::a00:1")), "an IPv6 address is not in an IPv4 network");
        let host = cidr("127.0.0.1");
        assert!(host.contains(ip("127.0.0.1")) && !host.contains(ip("127.0.0.2")));
        let v6 = cidr("2001:db8::/32");
        assert!(v6.contains(ip("2001:db8:ffff::1")) && !v6.contains(ip("2001:db9::1")));
        assert!(cidr("::1/128").contains(ip("::1")) && !cidr("::1/128").contains(ip("127.0.0.1")));
        assert!(cidr("0.0.0.0/0").contains(ip("203.0.113.9")) && !cidr("0.0.0.0/0").contains(ip("::2")));
        assert!(cidr("::/0").contains(ip("2001:db8::1")));
        let mapped = cidr("::ffff:10.0.0.0/104");
        assert_eq!(mapped.to_string(), "10.0.0.0/8");
        assert!(mapped.contains(ip("10.9.9.9")));
    }

    #[test]
    fn host_bits_are_dropped_and_bad_networks_refused() {
        assert_eq!(cidr("10.1.2.3/8").to_string(), "10.0.0.0/8");
        assert_eq!(cidr("2001:db8::1/32").to_string(), "2001:db8::/32");
        assert_eq!(cidr("::1").to_string(), "::1/128");
        for bad in ["", "10.0.0.0/33", "::/129", "10.0.0.0/", "10.0.0.0/+8", "10.0.0/8", "a.example/8", "10.0.0.0/8/8"]
        {
            assert_eq!(bad.parse::<Cidr>(), Err(BadCidr), "{bad:?}");
        }
    }
}
