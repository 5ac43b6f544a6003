"""Helpers for the report tests: a generator of realistic stage events, headless Chromium, a PNG reader.

The generator writes events the way exec and the agent do (`events.record` to a run's JSONL file,
then `events.upload` to the store as Parquet) and returns them as plain dicts, so the tests can
recompute every figure of the report independently of `bootseer_cli.report`.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bootseer_cli import events

if TYPE_CHECKING:
    from bootseer_cli.store.core import Store


def node_events(
    t: float,
    rng: random.Random,
    *,
    env_miss: bool = False,
    ckpt_s: float | None = None,
    local_ranks: int = 2,
    gpus: int | None = 8,
) -> list[tuple[str, float, float, str, dict[str, Any]]]:
    """(stage, start, end, outcome, fields) of one node's start, image → env → checkpoint → ready."""
    out = []
    t0 = t
    image = rng.uniform(0.5, 2.0)
    out.append(("image", t, t + image, "hit", {"cache": "hit", "bytes": 200 << 20, "bytes_from_store": 0}))
    t += image
    if env_miss:
        env = rng.uniform(30.0, 40.0)
        out.append(("env", t, t + env, "built", {"cache": "miss", "bytes": 0, "bytes_from_store": 0}))
    else:
        env = rng.uniform(3.0, 5.0)
        peers = rng.choice([0, 300 << 20])
        fields = {
            "cache": "hit",
            "bytes": 300 << 20,
            "bytes_from_store": (300 << 20) - peers,
            "bytes_from_peers": peers,
        }
        out.append(("env", t, t + env, "restored", fields))
    t += env
    ck = ckpt_s if ckpt_s is not None else rng.uniform(4.0, 6.0)
    out.append(("checkpoint", t, t + ck, "ok", {"bytes": 1 << 30, "bytes_from_store": 1 << 30}))
    t += ck + 0.05
    extra = {"gpus": gpus, "gpus_from": "command line"} if gpus else {}
    out.append(("bootseer", t0, t, "done", extra))
    for lr in range(local_ranks):
        out.append(("ready", t, t + rng.uniform(8.0, 12.0), "ok", {"local_rank": str(lr)}))
    return out


def write_run(store: Store, tmp: Path, job: str, node: str, rank: int, run: str, evs: list) -> list[dict[str, Any]]:
    """Record the events of one (node, run) to a JSONL file and upload them, as exec/agent do."""
    run_dir = tmp / "runs" / f"{node}-{run}"
    run_dir.mkdir(parents=True, exist_ok=True)
    info = events.RunInfo(job=job, node=node, rank=rank, run=run, run_dir=run_dir)
    rows = []
    for stage, start, end, outcome, fields in evs:
        kw = {k: v for k, v in fields.items() if k in ("cache", "bytes", "bytes_from_store", "bytes_from_peers")}
        extra = {k: v for k, v in fields.items() if k not in kw}
        rows.append(events.record(info, stage, start, end, outcome, **kw, **extra))
    events.upload(store, info)
    return rows


def chromium_screenshot(html: Path, png: Path, tmp: Path, size: str = "1400,900") -> None:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "Debian package chromium is required (apt-get install chromium)"
    profile = tmp / "chromium-profile"
    cmd = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--screenshot={png}",
        f"--window-size={size}",
        html.resolve().as_uri(),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=90, env={**os.environ, "HOME": str(tmp)})


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGBA/RGB bytes) of an 8-bit non-interlaced PNG, as Chromium writes them."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = bpp = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and ctype in (2, 6), (depth, ctype, interlace)
            bpp = 4 if ctype == 6 else 3
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif f == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
        elif f == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif f == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, [bytes(r) for r in rows]


def colour_stats(path: Path) -> tuple[int, float]:
    """(distinct colours, share of pixels that are not white) of a screenshot."""
    width, height, rows = png_pixels(path)
    bpp = len(rows[0]) // width
    colours: set[bytes] = set()
    non_white = 0
    for row in rows:
        for x in range(0, len(row), bpp):
            px = row[x : x + 3]
            colours.add(px)
            non_white += px != b"\xff\xff\xff"
    return len(colours), non_white / (width * height)


def in_process(capsys: Any, *args: str) -> subprocess.CompletedProcess[str]:
    """`bootseer report ARGS` through the CLI's own main(), without a new interpreter per call."""
    from bootseer_cli import cli

    saved = sys.argv
    sys.argv = ["bootseer", "report", *args]
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = saved
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)
