"""A small lab network for tests and benchmarks: hosts in network namespaces on one bridge.

    lab = Lab("bsbench")            # creates namespace bsbench-sw holding bridge br0
    a = lab.add_host(rate_mbit=400)  # namespace bsbench-h1, address 10.201.0.1, its egress capped (tbf)
    me = lab.attach_root()           # the root namespace joins as 10.201.0.254 (for a client here)
    a.popen(["rclone", "serve", …])  # runs inside the host's namespace
    lab.destroy()                    # removes every namespace and veth it made

Every address lives inside namespaces this module creates (10.201.0.0/24 by default), so no traffic
leaves the machine. `Lab` is a context manager and also registers an atexit cleanup, so an
interrupted benchmark does not leave namespaces behind; `destroy_stale(prefix)` clears leftovers.
"""

from __future__ import annotations

import atexit
import contextlib
import subprocess
from dataclasses import dataclass
from typing import Any


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def available() -> bool:
    """Root with iproute2 and tc: what the lab needs."""
    try:
        sh("ip", "netns", "list")
        sh("tc", "-V")
    except (OSError, subprocess.CalledProcessError):
        return False
    return True


def destroy_stale(prefix: str) -> None:
    out = sh("ip", "netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(prefix + "-"):
            sh("ip", "netns", "del", name, check=False)
    links = sh("ip", "-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        parts = line.split(":")
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if name.startswith(prefix[:6] + "r"):
                sh("ip", "link", "del", name, check=False)


@dataclass
class Host:
    lab: Lab
    name: str  # namespace name ("" for the root namespace)
    ip: str
    index: int

    def cmd(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv] if self.name else list(argv)

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(self.cmd(argv), **kwargs)

    def run(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        return subprocess.run(self.cmd(argv), **kwargs)


class Lab:
    def __init__(self, prefix: str, subnet: str = "10.201.0") -> None:
        if len(prefix) > 6:
            raise ValueError("prefix: at most 6 characters (interface names are short)")
        self.prefix = prefix
        self.subnet = subnet
        self.switch = f"{prefix}-sw"
        self.hosts: list[Host] = []
        self._root_link: str | None = None
        destroy_stale(prefix)
        sh("ip", "netns", "add", self.switch)
        self._ns(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self._ns(self.switch, "ip", "link", "set", "br0", "up")
        self._ns(self.switch, "ip", "link", "set", "lo", "up")
        atexit.register(self.destroy)

    def _ns(self, ns: str, *argv: str) -> None:
        sh("ip", "netns", "exec", ns, *argv)

    def _veth(
        self,
        index: int,
        ns: str | None,
        ip: str,
        rate_mbit: float | None,
        delay_ms: float | None,
        queue_ms: float = 400.0,
    ) -> str:
        inner, outer = f"{self.prefix}h{index}", f"{self.prefix}s{index}"
        sh("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
        sh("ip", "link", "set", outer, "netns", self.switch)
        self._ns(self.switch, "ip", "link", "set", outer, "master", "br0")
        self._ns(self.switch, "ip", "link", "set", outer, "up")
        if ns:
            sh("ip", "link", "set", inner, "netns", ns)
        run = (lambda *a: self._ns(ns, *a)) if ns else (lambda *a: sh(*a))
        run("ip", "addr", "add", f"{ip}/24", "dev", inner)
        run("ip", "link", "set", inner, "up")
        if ns:
            run("ip", "link", "set", "lo", "up")
        if delay_ms:
            # sch_netem is not in this kernel (tc answers "Specified qdisc kind is unknown"): add
            # latency in user space instead (e.g. a delaying FUSE filesystem or proxy).
            raise RuntimeError("netem delay is not available on this machine's kernel; only tbf rate caps")
        if rate_mbit:
            run(
                "tc",
                "qdisc",
                "add",
                "dev",
                inner,
                "root",
                "tbf",
                "rate",
                f"{rate_mbit}mbit",
                "burst",
                "256kb",
                "latency",
                f"{queue_ms:g}ms",
            )
        return inner

    def add_host(self, rate_mbit: float | None = None, delay_ms: float | None = None, queue_ms: float = 400.0) -> Host:
        """A new namespace on the bridge; its *egress* (what it sends) is capped/delayed as given.

        `queue_ms`: how long a packet may wait in the cap's queue (tbf `latency`); 400 ms at 400 mbit
        holds 20 MB, which a bulk transfer fills and every small response then waits behind."""
        index = len(self.hosts) + 1
        name = f"{self.prefix}-h{index}"
        sh("ip", "netns", "add", name)
        ip = f"{self.subnet}.{index}"
        self._veth(index, name, ip, rate_mbit, delay_ms, queue_ms)
        host = Host(self, name, ip, index)
        self.hosts.append(host)
        return host

    def attach_root(self, rate_mbit: float | None = None) -> Host:
        """Put the root namespace on the bridge too (address .254), for a client that runs here."""
        ip = f"{self.subnet}.254"
        self._root_link = self._veth(254, None, ip, rate_mbit, None)
        return Host(self, "", ip, 254)

    def destroy(self) -> None:
        for host in self.hosts:
            pids = sh("ip", "netns", "pids", host.name, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(Exception):
                    sh("kill", "-9", pid, check=False)
            sh("ip", "netns", "del", host.name, check=False)
        if self._root_link:
            sh("ip", "link", "del", self._root_link, check=False)
            self._root_link = None
        sh("ip", "netns", "del", self.switch, check=False)
        self.hosts = []

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
