"""A peer that serves corrupt data: it joins a blob's swarm as a verified seed, then overwrites its copy.

libtorrent checks the file when the torrent is added (all pieces good: it becomes a seed) and later
serves whatever the file holds, so every piece it uploads after that fails the downloader's hash
check. It is a member gone bad, not an outsider: it holds the job's swarm secret (SECRET_FILE), without
which it could not join the swarm at all (test_secret.py).
Run: python -m tests.p2p.badpeer STORE_URI DIGEST WORKDIR PORTS SECRET_FILE; prints "ready", serves until killed.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main(store_uri: str, digest: str, work: Path, ports: str, secret_file: Path) -> None:
    from bootseer_cli.p2p.discovery import Announcer
    from bootseer_cli.p2p.secret import read_secret_file, swarm_torrent
    from bootseer_cli.p2p.swarm import Swarm
    from bootseer_cli.store.core import Store

    store = Store(store_uri)
    work.mkdir(parents=True, exist_ok=True)
    store.fetch_blob(digest, work / digest)
    torrent = store.get_blob_bytes(store.read_ref("torrent", digest)["torrent"])
    torrent = swarm_torrent(torrent, digest, read_secret_file(secret_file))
    swarm = Swarm("127.0.0.1", ports)
    handle = swarm.add(torrent, work)
    deadline = time.time() + 30
    while not handle.status().is_seeding:
        if time.time() > deadline:
            raise SystemExit("badpeer: never became a seed")
        time.sleep(0.05)
    size = (work / digest).stat().st_size
    with open(work / digest, "r+b") as f:  # in place: libtorrent keeps serving this very file
        f.write(os.urandom(size))
    Announcer(store, digest, "127.0.0.1", swarm.port).write("seed")
    print("ready", flush=True)
    while True:
        swarm.pump()
        time.sleep(0.2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], Path(sys.argv[5]))
