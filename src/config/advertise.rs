//! Which address a server advertises: the one configured, its specific
//! listen address, or the host's one non-loopback address.

use std::net::SocketAddr;

use super::{ConfigError, ServerConfig};

impl ServerConfig {
    /// [`ServerConfig::advertise_addr`], or where neither `advertise` nor
    /// `listen` names an address, the host's one address of `listen`'s
    /// family among `host_ips` (its non-loopback, non-link-local ones), as
    /// Consul and k3s pick it. `Ok((addr, true))`: picked that way. With
    /// several the error names them.
    pub fn advertise_among(
        &self,
        host_ips: &[std::net::IpAddr],
    ) -> Result<(SocketAddr, bool), ConfigError> {
        let err = match self.advertise_addr() {
            Ok(addr) => return Ok((addr, false)),
            Err(e) => e,
        };
        let family: Vec<std::net::IpAddr> = host_ips
            .iter()
            .copied()
            .filter(|ip| ip.is_ipv4() == self.listen.is_ipv4() || self.listen.is_ipv6())
            .collect();
        // IPv4 first: with `[::]` a host's one IPv4 address is the one
        // people mean, not its global IPv6 ones as well.
        let v4: Vec<std::net::IpAddr> = family.iter().copied().filter(|ip| ip.is_ipv4()).collect();
        let pool = if v4.is_empty() { family } else { v4 };
        match pool.as_slice() {
            [] => Err(err),
            [one] => Ok((SocketAddr::new(*one, self.listen.port()), true)),
            many => {
                Err(ConfigError::Invalid {
                    key: "server.advertise".into(),
                    problem: format!(
                    "is not set, server.listen ({}) names no single address, and this host has \
                     several: {}; set advertise (--advertise or GPUQ_ADVERTISE) to the one the \
                     other servers and the agents dial, e.g. {}",
                    self.listen,
                    many.iter().map(|ip| ip.to_string()).collect::<Vec<_>>().join(", "),
                    SocketAddr::new(many[0], self.listen.port())
                ),
                })
            }
        }
    }

    /// The address peers and agents dial: `advertise`, else `listen` when it
    /// names a specific address.
    pub fn advertise_addr(&self) -> Result<SocketAddr, ConfigError> {
        match self.advertise {
            Some(addr) => Ok(addr),
            None if !self.listen.ip().is_unspecified() => Ok(self.listen),
            None => Err(ConfigError::Invalid {
                key: "server.advertise".into(),
                problem: format!(
                    "is not set and server.listen ({}) names no single address, so peers and agents cannot dial this server; set advertise (or GPUQ_ADVERTISE) to this host's reachable IP:PORT, e.g. 10.0.0.1:{}",
                    self.listen,
                    self.listen.port()
                ),
            }),
        }
    }
}
