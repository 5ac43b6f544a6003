"""Sessions of one host that start at once all listen: a port lost between bind and listen is skipped.

Two sockets with SO_REUSEADDR may both bind a free port while neither listens; the first to `listen`
gets it and the other's `listen` fails with "address in use", after which libtorrent tries no other
port (it moves on only when `bind` fails). A node whose session lost that race never joined the swarm:
its fetch fell back to the store ("swarm not used: the swarm helper did not start: … [sock_listen]
[TCP] Address already in use"), and in tests/e2e/test_swarm.py the two peers never both announced.
"""

from __future__ import annotations

import errno
import multiprocessing
from typing import Any

import pytest

from bootseer_cli.p2p.swarm import Swarm
from tests.p2p.nodes import port_range

pytestmark = pytest.mark.integration


class _ListenFailed:
    """A `listen_failed_alert` for a TCP listener whose port another socket took."""

    def __init__(self, port: int) -> None:
        import libtorrent as lt

        self.port = port
        self.socket_type = lt.socket_type_t.tcp
        self.error = type("Error", (), {"value": staticmethod(lambda: errno.EADDRINUSE)})()

    def message(self) -> str:
        return f"listening on 127.0.0.1:{self.port} failed: [sock_listen] [TCP] Address already in use"


class _RacedSession:
    """libtorrent's session where `lost` ports are taken by another session between our bind and listen
    (which a real session shows as a listen_failed_alert, and then no listener)."""

    lost: frozenset[int] = frozenset()

    def __init__(self, settings: dict[str, Any]) -> None:
        self.alerts: list[_ListenFailed] = []
        self.listening = 0
        self.apply_settings(settings)

    def apply_settings(self, settings: dict[str, Any]) -> None:
        port = int(str(settings["listen_interfaces"]).rsplit(":", 1)[1])
        if port in self.lost:
            self.listening = 0
            self.alerts.append(_ListenFailed(port))
        else:
            self.listening = port

    def pop_alerts(self) -> list[_ListenFailed]:
        out, self.alerts = self.alerts, []
        return out

    def listen_port(self) -> int:
        return self.listening

    def is_listening(self) -> bool:
        return self.listening > 0

    def pause(self) -> None:
        pass


def test_a_port_taken_between_bind_and_listen_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    import libtorrent as lt

    monkeypatch.setattr(lt, "session", _RacedSession)
    monkeypatch.setattr(lt, "listen_failed_alert", _ListenFailed)
    monkeypatch.setattr(_RacedSession, "lost", frozenset({7001, 7002}))
    swarm = Swarm("127.0.0.1", "7001-7005")
    assert swarm.port == 7003
    assert "Address already in use" in swarm.errors[-1]


def test_a_range_whose_every_port_is_lost_is_an_oserror(monkeypatch: pytest.MonkeyPatch) -> None:
    import libtorrent as lt

    monkeypatch.setattr(lt, "session", _RacedSession)
    monkeypatch.setattr(lt, "listen_failed_alert", _ListenFailed)
    monkeypatch.setattr(_RacedSession, "lost", frozenset({7001, 7002}))
    with pytest.raises(OSError, match="could not listen on a port in 7001-7002"):
        Swarm("127.0.0.1", "7001-7002")


ROUNDS = 40
SESSIONS = 4


def _start_in_step(ports: str, barrier: Any, results: Any) -> None:
    """One process: ROUNDS times, start a session at the same moment as the others, report, close."""
    for i in range(ROUNDS):
        barrier.wait()
        try:
            swarm = Swarm("127.0.0.1", ports)
            results.put((i, swarm.port))
        except OSError as e:
            swarm = None
            results.put((i, str(e)))
        barrier.wait()  # every session of the round is up (or failed) before any closes
        if swarm is not None:
            swarm.close()


def test_sessions_started_at_once_all_listen() -> None:
    """Real sessions in separate processes, started in step on one range: each gets a port of its own.
    The race is real but not certain: before the fix, 2 of 3 runs of this test on a 2-core machine
    left a session with no port (the test above is the deterministic check)."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process whose other tests ran threads
    ports = port_range(width=2 * SESSIONS)
    barrier, results = ctx.Barrier(SESSIONS, timeout=60), ctx.Queue()
    procs = [ctx.Process(target=_start_in_step, args=(ports, barrier, results)) for _ in range(SESSIONS)]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=60) for _ in range(ROUNDS * SESSIONS)]
    finally:
        for p in procs:
            p.join(30)
            if p.exitcode is None:
                p.kill()
                p.join(5)
    failed = [why for _, why in got if isinstance(why, str)]
    assert not failed, failed[:3]
    for i in range(ROUNDS):
        ports_of_round = [port for r, port in got if r == i]
        assert len(set(ports_of_round)) == SESSIONS, (i, ports_of_round)
