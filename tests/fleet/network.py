"""A fleet's network: one network namespace per host, wired to a switch namespace by veth pairs.

Hosts (``db``, ``broker``, ``w1``...) each get a namespace ``<prefix>-<host>`` with one interface,
``eth0``, at ``10.88.0.<n>/24``; the other end of its veth pair is a port of the bridge ``br0`` in
the switch namespace ``<prefix>-sw``. The bridge, the veths and every iptables rule live inside
these namespaces: the machine's own interfaces, routes and firewall are never touched, and deleting
the namespaces removes everything (:meth:`Network.destroy`, run even when a test fails, and at
interpreter exit). The prefix is unique per run (``tf`` and six hex digits), so two runs on one
machine never meet, and :func:`remove_stale` clears namespaces a killed run left behind.

The test process itself stays in the machine's namespace and reaches the services through Unix
sockets (a socket file is no network namespace's), so the machine needs no interface of ours.

Faults are iptables rules in a host's namespace (:meth:`Network.cut`, :meth:`Network.lose`),
removed by :meth:`Network.heal`. Latency comes from :mod:`tests.fleet.delay_proxy` (this kernel
has no ``netem``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

SUBNET = "10.88.0"

__all__ = ["SUBNET", "Network", "namespaces_problem", "remove_stale"]


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def namespaces_problem() -> str | None:
    """None when this process can make network namespaces and iptables rules in them, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the fleet tests as root)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install iproute2 iptables)"
    probe = f"tfprobe{uuid.uuid4().hex[:6]}"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    try:
        rule = _run(
            ["ip", "netns", "exec", probe, "iptables", "-A", "OUTPUT", "-d", "10.0.0.1", "-j", "DROP"], check=False
        )
        if rule.returncode != 0:
            return f"iptables does not work in a network namespace here: {rule.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", probe], check=False)
    return None


def remove_stale(older_than_s: float = 1800.0) -> None:
    """Delete namespaces a killed fleet run left behind: ``tf<hex>-*`` with no process in them,
    made more than ``older_than_s`` ago (a run being set up right now has none yet either)."""
    listed = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ", 1)[0]
        if not (name.startswith("tf") and "-" in name and len(name.split("-", 1)[0]) == 8):
            continue
        try:
            age = time.time() - os.stat(f"/run/netns/{name}").st_mtime
        except OSError:
            continue
        pids = _run(["ip", "netns", "pids", name], check=False).stdout.split()
        if not pids and age > older_than_s:
            _run(["ip", "netns", "del", name], check=False)


@dataclass
class Network:
    """The namespaces of one fleet; :meth:`create` them, :meth:`destroy` them."""

    hosts: Sequence[str]
    prefix: str = field(default_factory=lambda: f"tf{uuid.uuid4().hex[:6]}")
    addresses: dict[str, str] = field(default_factory=dict)
    rules: list[tuple[str, list[str]]] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def address_of(self, host: str) -> str:
        """``host``'s address (known before :meth:`create`)."""
        return f"{SUBNET}.{list(self.hosts).index(host) + 2}"

    def exec_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def in_host(self, host: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(self.exec_argv(host, argv), check=check)

    def create(self) -> Network:
        atexit.register(self.destroy)
        _run(["ip", "netns", "add", self.switch])
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for index, host in enumerate(self.hosts):
            ns = self.ns(host)
            port = f"p{index}"
            _run(["ip", "netns", "add", ns])
            # Made inside the switch's namespace with its peer placed in the host's: no end of
            # the pair ever exists in the machine's namespace.
            _run(["ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "-n", self.switch, "link", "set", port, "master", "br0", "up"])
            address = self.address_of(host)
            self.addresses[host] = address
            _run(["ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            # A cut-off connection gives up after a few retransmissions (about 6 s), not the
            # default 15 minutes: the faults below are held past it. Per namespace.
            self.in_host(host, "sysctl", "-qw", "net.ipv4.tcp_retries2=5")
        return self

    def destroy(self) -> None:
        for host in self.hosts:
            _run(["ip", "netns", "del", self.ns(host)], check=False)
        _run(["ip", "netns", "del", self.switch], check=False)
        self.rules.clear()

    # -- faults ---------------------------------------------------------------------------------

    def _rule(self, host: str, rule: list[str]) -> None:
        self.in_host(host, "iptables", "-I", *rule)
        self.rules.append((host, rule))

    def cut(self, host: str, peer: str, *, inbound: bool = True, outbound: bool = True) -> None:
        """Drop ``host``'s packets to ``peer`` (outbound) and from it (inbound): a partition, or
        one way of one when only one side is given."""
        address = self.addresses[peer]
        if outbound:
            self._rule(host, ["OUTPUT", "-d", address, "-j", "DROP"])
        if inbound:
            self._rule(host, ["INPUT", "-s", address, "-j", "DROP"])

    def isolate(self, host: str) -> None:
        """Cut ``host`` from every other host."""
        self._rule(host, ["OUTPUT", "-o", "eth0", "-j", "DROP"])
        self._rule(host, ["INPUT", "-i", "eth0", "-j", "DROP"])

    def lose(self, host: str, probability: float) -> None:
        """Drop each packet in and out of ``host``'s link with ``probability`` (iptables' statistic match)."""
        for chain, flag in (("OUTPUT", "-o"), ("INPUT", "-i")):
            rule = [chain, flag, "eth0", "-m", "statistic", "--mode", "random", "--probability", f"{probability}"]
            self._rule(host, [*rule, "-j", "DROP"])

    def heal(self) -> None:
        """Remove every fault rule."""
        while self.rules:
            host, rule = self.rules.pop()
            self.in_host(host, "iptables", "-D", *rule, check=False)
