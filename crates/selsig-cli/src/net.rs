//! Host and port: `selsig serve`'s address as `--connect` names it (`HOST[:PORT]`), and as
//! messages show it. Refers to no other file.

use anyhow::{Result, bail};

/// The default TCP port (perftest's).
pub const DEFAULT_PORT: u16 = 18515;

/// `host[:port]` as the name to resolve and the port, the default port where none is
/// given: `host`, `host:port`, an IPv4 address, an IPv6 address bare (`fe80::1`, with
/// the default port) or in brackets (`[::1]`, `[::1]:9000`), with a scope name too
/// (`[fe80::1%eth0]:9000`, which the socket address parser does not take: the resolver
/// does).
pub(crate) fn host_and_port(host: &str) -> Result<(String, u16)> {
    let host = host.trim();
    // Digits only (`u16`'s parser takes a sign), and not 0 (no server listens there).
    let port = |p: &str| match p.parse::<u16>() {
        Ok(n) if n != 0 && p.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(anyhow::anyhow!("{p:?} is not a port (1 to 65535)")),
    };
    if let Some(rest) = host.strip_prefix('[') {
        let Some((name, after)) = rest.split_once(']') else {
            bail!("no ']' after the IPv6 address");
        };
        if name.is_empty() {
            bail!("no address between '[' and ']'");
        }
        return match after {
            "" => Ok((name.to_string(), DEFAULT_PORT)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((name.to_string(), port(p)?)),
                None => bail!("':PORT' or nothing may follow the ']'"),
            },
        };
    }
    match host.rsplit_once(':') {
        // Two colons or more: a bare IPv6 address.
        Some(("", _)) => bail!("no host before the ':PORT'"),
        Some((name, p)) if !name.contains(':') => Ok((name.to_string(), port(p)?)),
        _ => Ok((host.to_string(), DEFAULT_PORT)),
    }
}

/// `name:port` for messages, an IPv6 address in brackets.
pub(crate) fn show_address(name: &str, port: u16) -> String {
    if name.contains(':') {
        format!("[{name}]:{port}")
    } else {
        format!("{name}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::ToSocketAddrs;

    #[test]
    fn the_default_port_is_added_where_none_is_given() {
        let split = |host| {
            let (name, port) = host_and_port(host).unwrap();
            show_address(&name, port)
        };
        assert_eq!(split("target"), "target:18515");
        assert_eq!(split("target:9000"), "target:9000");
        assert_eq!(split("10.77.0.1"), "10.77.0.1:18515");
        assert_eq!(split("10.77.0.1:9000"), "10.77.0.1:9000");
        assert_eq!(split("::1"), "[::1]:18515");
        assert_eq!(split("[::1]"), "[::1]:18515");
        assert_eq!(split("[::1]:9000"), "[::1]:9000");
        assert_eq!(split("[fe80::1%eth0]:9000"), "[fe80::1%eth0]:9000");
        assert_eq!(split("[fe80::1%eth0]"), "[fe80::1%eth0]:18515");
        assert_eq!(split("fe80::1%eth0"), "[fe80::1%eth0]:18515");
        for (host, why) in [
            ("target:port", "\"port\" is not a port (1 to 65535)"),
            ("target:70000", "\"70000\" is not a port (1 to 65535)"),
            ("target:0", "\"0\" is not a port (1 to 65535)"),
            ("target:+80", "\"+80\" is not a port (1 to 65535)"),
            ("target:", "\"\" is not a port (1 to 65535)"),
            ("[::1]:x", "\"x\" is not a port (1 to 65535)"),
            ("[::1", "no ']' after the IPv6 address"),
            ("[::1]9000", "':PORT' or nothing may follow the ']'"),
            (":80", "no host before the ':PORT'"),
            ("[]", "no address between '[' and ']'"),
            ("[]:80", "no address between '[' and ']'"),
        ] {
            let err = host_and_port(host).expect_err(host).to_string();
            assert_eq!(err, why);
        }
    }

    /// A link-local address with a scope name (the loopback's, which every host has) and
    /// a port resolves: the socket address parser takes no scope name, the resolver does.
    #[test]
    fn a_scoped_link_local_address_with_a_port_resolves() {
        let (name, port) = host_and_port("[fe80::1%lo]:9000").unwrap();
        let addrs: Vec<_> = (name.as_str(), port).to_socket_addrs().unwrap().collect();
        assert!(
            matches!(addrs.as_slice(), [std::net::SocketAddr::V6(a)]
                if a.port() == 9000 && a.scope_id() != 0 && a.ip().segments()[0] == 0xfe80),
            "{addrs:?}"
        );
    }
}
