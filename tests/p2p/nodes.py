"""Swarm "nodes" for the P2P tests and benchmark: each a real `bootseer p2p fetch` process with its own
node cache (XDG_CACHE_HOME), talking to the others over loopback (or inside a lab namespace)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
STARTED: list[subprocess.Popen[str]] = []  # killed after each test (tests/p2p/conftest.py)


def random_file(path: Path, size: int, seed: int = 0) -> Path:
    rnd = random.Random(seed)
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 1 << 20)
            f.write(rnd.randbytes(n))
            left -= n
    return path


def port_range(width: int = 40) -> str:
    base = random.randrange(20000, 60000 - width)
    return f"{base}-{base + width}"


def swarm_secret_file(base: Path) -> Path:
    """The job's swarm secret (one per test, shared by its nodes), 0600 as `[p2p] key_file` wants."""
    path = base / "swarm.secret"
    if not path.exists():
        base.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(32).hex().encode())
        os.close(fd)
    return path


def node_env(base: Path, name: str, store_uri: str, ports: str, host: str = "127.0.0.1", **p2p: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOTSEER_")}
    env.update(
        XDG_CACHE_HOME=str(base / name),
        BOOTSEER_STORE=store_uri,
        BOOTSEER_NODE=name,
        BOOTSEER_P2P_ENABLED="1",
        BOOTSEER_P2P_HOST=host,
        BOOTSEER_P2P_PORT=ports,
        BOOTSEER_P2P_KEY_FILE=str(swarm_secret_file(base)),
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]),  # this checkout's package, then tests
    )
    for key, value in p2p.items():
        env[f"BOOTSEER_P2P_{key.upper()}"] = str(value)
    return env


@dataclass
class Node:
    name: str
    proc: subprocess.Popen[str]
    started: float

    def result(self, timeout: float = 120) -> dict[str, Any]:
        out, err = self.proc.communicate(timeout=timeout)
        if self.proc.returncode != 0:
            raise AssertionError(f"node {self.name} exited {self.proc.returncode}: {err[-2000:]}")
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if not lines:
            raise AssertionError(f"node {self.name} printed no result: {out!r} {err[-2000:]}")
        doc = json.loads(lines[-1])
        doc["stderr"] = err
        return doc


def start_node(env: dict[str, str], digest: str, argv_prefix: list[str] | None = None) -> Node:
    argv = [*(argv_prefix or []), sys.executable, "-m", "bootseer_cli", "p2p", "fetch", digest, "--json"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    STARTED.append(proc)
    return Node(env["BOOTSEER_NODE"], proc, time.time())


def sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return h.hexdigest()
