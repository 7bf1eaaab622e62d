//! Reaching the network or host services: TCP, UDP, DNS, raw packets, Unix sockets, netlink.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixListener};

use super::{attack, Attack, Baseline::*, Group::*, Threat::*};
use crate::bait::{tcp_listener, udp_listener, Inbox};
use crate::plan::{Outcome, Plan};
use crate::scene::Scene;

#[rustfmt::skip]
pub(super) fn attacks() -> Vec<Attack> {
    vec![
        attack("tcp_to_host_listener", (B, Network, Tier0),
            "host TCP listener on 127.0.0.1 got the marker",
            "seccomp (only AF_UNIX sockets), network namespace, Landlock TCP",
            tcp_to_host_listener),
        attack("udp_to_host_listener", (B, Network, Tier0),
            "host UDP listener got the marker",
            "seccomp, network namespace",
            udp_to_host_listener),
        attack("dns_exfiltration", (B, Network, Tier0),
            "host \"name server\" (UDP+TCP) got a query carrying the marker",
            "seccomp, network namespace, no resolv.conf",
            dns_exfiltration),
        attack("raw_socket_forgery", (B, Network, Bare),
            "host UDP listener got a forged raw packet",
            "seccomp, capabilities, network namespace",
            raw_socket_forgery),
        attack("host_unix_path_socket", (B, Ipc, Tier0),
            "host Unix socket (mode 0777) got the marker",
            "rootfs, Landlock fs",
            host_unix_path_socket),
        attack("host_unix_abstract_socket", (B, Ipc, Tier0),
            "host abstract socket got the marker",
            "network namespace; Landlock abstract-socket scope (alone, with `--network host`: EPERM)",
            host_unix_abstract_socket),
        attack("netlink_host_interfaces", (B, Network, Tier0),
            "program listed a host interface (eth0…)",
            "seccomp (AF_NETLINK refused), network namespace",
            netlink_host_interfaces),
    ]
}

/// `PROGRAM 127.0.0.1 PORT MARKER`, judged by what `inbox` received.
fn send_to_loopback(s: &Scene, program: &str, port: u16, inbox: &Inbox) -> Plan {
    Plan::new(
        s.python(
            program,
            ["127.0.0.1".into(), port.to_string(), s.marker.clone()],
        ),
        inbox.evidence(&s.marker),
    )
}

fn tcp_to_host_listener(s: &mut Scene) -> Result<Plan, String> {
    let (port, inbox) = tcp_listener(0)?;
    Ok(send_to_loopback(s, "tcp_connect.py", port, &inbox))
}

fn udp_to_host_listener(s: &mut Scene) -> Result<Plan, String> {
    let (port, inbox) = udp_listener(0)?;
    Ok(send_to_loopback(s, "udp_send.py", port, &inbox))
}

fn dns_exfiltration(s: &mut Scene) -> Result<Plan, String> {
    let (port, tcp_inbox) = tcp_listener(0)?;
    let (_, udp_inbox) = udp_listener(port)?;
    let marker = s.marker.clone();
    let evidence = move |o: &Outcome| {
        tcp_inbox.evidence(&marker)(o).or_else(|| udp_inbox.evidence(&marker)(o))
    };
    Ok(Plan::new(
        s.python(
            "dns_exfil.py",
            ["127.0.0.1".into(), port.to_string(), s.marker.clone()],
        ),
        evidence,
    ))
}

fn raw_socket_forgery(s: &mut Scene) -> Result<Plan, String> {
    let (port, inbox) = udp_listener(0)?;
    Ok(send_to_loopback(s, "raw_socket.py", port, &inbox))
}

fn host_unix_path_socket(s: &mut Scene) -> Result<Plan, String> {
    let path = s.dir.join("host-service.sock");
    let listener =
        UnixListener::bind(&path).map_err(|e| format!("cannot bind {}: {e}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
        .map_err(|e| e.to_string())?;
    let inbox = Inbox::serve_unix(listener);
    Ok(Plan::new(
        s.python(
            "unix_connect.py",
            [path.display().to_string(), s.marker.clone()],
        ),
        inbox.evidence(&s.marker),
    ))
}

fn host_unix_abstract_socket(s: &mut Scene) -> Result<Plan, String> {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("airlock-attack-{}", s.marker);
    let address = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| e.to_string())?;
    let listener =
        UnixListener::bind_addr(&address).map_err(|e| format!("cannot bind @{name}: {e}"))?;
    let inbox = Inbox::serve_unix(listener);
    Ok(Plan::new(
        s.python("unix_connect.py", [format!("@{name}"), s.marker.clone()]),
        inbox.evidence(&s.marker),
    ))
}

fn netlink_host_interfaces(s: &mut Scene) -> Result<Plan, String> {
    let host_only: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name != "lo")
        .collect();
    if host_only.is_empty() {
        return Err("the host has no network interface besides lo".into());
    }
    let evidence = move |o: &Outcome| {
        let line = o
            .text
            .lines()
            .find(|l| l.starts_with("ESCAPED interfaces:"))?;
        let seen: Vec<&String> = host_only
            .iter()
            .filter(|name| line.split_whitespace().any(|w| w == name.as_str()))
            .collect();
        (!seen.is_empty()).then(|| format!("host interfaces listed: {seen:?}"))
    };
    Ok(Plan::new(
        s.python("netlink_route.py", Vec::<String>::new()),
        evidence,
    ))
}
