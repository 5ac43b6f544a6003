"""One way to print numbers (issue 29, item 9): the checkpoint push's hash phase counts each byte once.

The bar a user watches is the figure they compare with `du`: a 1.5 GB checkpoint must not hash "3.00G".
"""

from __future__ import annotations

import os
from pathlib import Path

from bootseer_cli.ckpt import phase_bars
from bootseer_cli.store.core import Store
from bootseer_cli.stripe.push import push


def test_hash_phase_totals_the_checkpoint_once(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    (ckpt / "optim").mkdir(parents=True)
    (ckpt / "model.bin").write_bytes(os.urandom(3 * 65536 + 123))
    (ckpt / "optim" / "state.bin").write_bytes(os.urandom(65536 - 1))
    size = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
    seen: dict[str, list[int]] = {}

    def progress(phase: str, total: int):  # type: ignore[no-untyped-def]
        seen[phase] = [total, 0]

        def advance(n: int) -> None:
            seen[phase][1] += n

        return advance

    push(Store((tmp_path / "store").as_uri()), ckpt, "m", "t1", stripes=3, cell_size=65536, progress=progress)
    assert seen["hash"] == [size, size], "the hash phase counts the checkpoint's bytes once"
    assert seen["upload"] == [size, size]

    with phase_bars("m", enabled=False) as bars:  # the command's bars take the same totals
        push(Store((tmp_path / "store").as_uri()), ckpt, "m", "t2", stripes=2, cell_size=65536, progress=bars)
