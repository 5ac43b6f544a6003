"""Real FUSE mounts of real checkpoints (torch.save, safetensors shards, torch.distributed.checkpoint),
loaded back through the mount and compared tensor by tensor; faults give EIO, never wrong bytes."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootseer_cli.store.core import Store
from bootseer_cli.stripe import catalog
from bootseer_cli.stripe.mount import mount_detached, mount_info
from bootseer_cli.stripe.push import push
from bootseer_cli.stripe.reader import ReaderOptions, open_reader

from .conftest import CELL, file_store, run_cli, stripe_file, wait_until, write_random
from .proxy import Proxy

pytestmark = pytest.mark.integration


def make_torch_ckpt(d: Path) -> dict:
    """A torch.save file, two safetensors shards and a DCP directory; returns the tensors written."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    model = {
        "w": torch.randn(300, 200, generator=g),
        "b": torch.randn(200, generator=g),
        "emb": torch.randn(1000, 64, generator=g).half(),
        "ids": torch.randint(0, 1 << 30, (5000,), generator=g),
    }
    d.mkdir(parents=True)
    torch.save({"model": model, "step": 7}, d / "model.pt")
    shards = {
        "model-00001-of-00002.safetensors": {"a": torch.randn(256, 256, generator=g)},
        "model-00002-of-00002.safetensors": {"c": torch.randn(128, 33, generator=g).bfloat16(), "d": torch.arange(77)},
    }
    for name, tensors in shards.items():
        save_file(tensors, str(d / name))
    dcp_state = {"layer.weight": torch.randn(128, 300, generator=g), "layer.bias": torch.randn(128, generator=g)}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(dcp_state, checkpoint_id=str(d / "dcp"))
    return {"model": model, "shards": shards, "dcp": dcp_state}


def check_torch_ckpt(mp: Path, expected: dict) -> None:
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors import safe_open

    loaded = torch.load(mp / "model.pt", weights_only=True)
    assert loaded["step"] == 7
    for k, t in expected["model"].items():
        assert loaded["model"][k].dtype == t.dtype and torch.equal(loaded["model"][k], t), k
    for name, tensors in expected["shards"].items():
        with safe_open(str(mp / name), framework="pt") as f:
            assert set(f.keys()) == set(tensors)
            for k, t in tensors.items():
                assert torch.equal(f.get_tensor(k), t), (name, k)
    state = {k: torch.zeros_like(v) for k, v in expected["dcp"].items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(mp / "dcp"))
    for k, t in expected["dcp"].items():
        assert torch.equal(state[k], t), k


def test_torch_safetensors_dcp_load_through_the_mount(s3_factory, tmp_path: Path, mounts: Path) -> None:  # type: ignore[no-untyped-def]
    servers = [s3_factory() for _ in range(2)]
    expected = make_torch_ckpt(tmp_path / "ckpt")
    main_uri = servers[0].uri("main")
    targets = [servers[0].uri("stripes"), servers[1].uri("stripes")]
    args = ["--name", "llm", "--tag", "step7", "-k", "4", "--cell-size", "64KiB", "--store", main_uri]
    r = run_cli("ckpt", "push", str(tmp_path / "ckpt"), *args, *[a for t in targets for a in ("--target", t)])
    assert r.returncode == 0, r.stderr
    env = {"BOOTSEER_CHECKPOINT_TARGETS": ",".join(targets)}
    mp = mounts / "llm"
    r = run_cli("ckpt", "mount", "llm:latest", str(mp), "--store", main_uri, env=env)
    assert r.returncode == 0, r.stderr
    info = mount_info(mp)
    assert info is not None and info["fstype"] == "fuse.bootseer-ckpt"
    assert Path(f"/sys/class/bdi/{info['dev']}/read_ahead_kb").read_text().strip() == "16384"
    assert sorted(os.listdir(mp)) == sorted(["model.pt", "dcp", *expected["shards"]])
    for p in (tmp_path / "ckpt").rglob("*"):  # same names, sizes, kinds as the original directory
        q = mp / p.relative_to(tmp_path / "ckpt")
        assert q.is_dir() == p.is_dir() and (p.is_dir() or q.stat().st_size == p.stat().st_size), p
    check_torch_ckpt(mp, expected)
    with pytest.raises(OSError) as e, open(mp / "model.pt", "r+b"):
        pass
    assert e.value.errno in (errno.EROFS, errno.EACCES)
    r = run_cli("ckpt", "umount", str(mp))
    assert r.returncode == 0, r.stderr
    assert mount_info(mp) is None


def _read_all(path: Path) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read()


def test_flipped_byte_and_missing_stripe_are_eio(tmp_path: Path, mounts: Path) -> None:
    store = file_store(tmp_path)
    src = tmp_path / "src"
    good = write_random(src / "good.bin", CELL // 2, 5)  # lives in cell 0 only (stripe 0)
    write_random(src / "big.bin", 12 * CELL, 6)
    m = push(store, src, "m", "v1", stripes=3, cell_size=CELL)
    stripe = stripe_file(Path(store.root), m.stripes[1].digest)
    data = bytearray(stripe.read_bytes())
    data[CELL + 7] ^= 0x80
    stripe.write_bytes(bytes(data))
    mount_detached(m, mounts / "a", store.uri, options={"retries": 0})
    assert _read_all(mounts / "a" / "good.bin") == good
    with pytest.raises(OSError) as e:
        _read_all(mounts / "a" / "big.bin")
    assert e.value.errno == errno.EIO
    with pytest.raises(OSError) as e:  # still EIO on a second try: nothing bad was cached
        _read_all(mounts / "a" / "big.bin")
    assert e.value.errno == errno.EIO
    stripe.unlink()
    mount_detached(m, mounts / "b", store.uri, options={"retries": 0})
    assert _read_all(mounts / "b" / "good.bin") == good
    with pytest.raises(OSError) as e:
        _read_all(mounts / "b" / "big.bin")
    assert e.value.errno == errno.EIO


def test_server_killed_mid_read_is_eio_never_wrong_bytes(s3_factory, tmp_path: Path, mounts: Path) -> None:  # type: ignore[no-untyped-def]
    meta, data_server = s3_factory(), s3_factory()
    src = tmp_path / "src"
    original = write_random(src / "big.bin", 8 << 20, 7)  # 7 MiB left after the kill: far more than memory
    main = Store(meta.uri("main"))
    m = push(main, src, "m", "v1", stripes=2, cell_size=CELL, targets=[Store(data_server.uri("s"))])
    opts = {"retries": 1, "backoff_s": 0.05, "memory": 1 << 20}
    mount_detached(m, mounts / "m", main.uri, targets=[data_server.uri("s")], options=opts)
    got = bytearray()
    with pytest.raises(OSError) as e, open(mounts / "m" / "big.bin", "rb", buffering=0) as f:
        got += f.read(1 << 20)
        data_server.stop()
        while chunk := f.read(1 << 20):
            got += chunk
    assert e.value.errno == errno.EIO
    assert len(got) < len(original)
    assert bytes(got) == original[: len(got)]


def test_server_killed_mid_pull_is_a_clear_error_and_leaves_nothing(s3_factory, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from bootseer_cli.errors import StoreError
    from bootseer_cli.stripe import pull as pull_mod
    from bootseer_cli.stripe.pull import pull

    monkeypatch.setattr(pull_mod, "WRITE_CHUNK", 256 << 10)  # small writes, so the kill lands mid-file

    server = s3_factory()
    src = tmp_path / "src"
    write_random(src / "big.bin", 8 << 20, 11)
    store = Store(server.uri("x"))
    m = push(store, src, "m", "v1", stripes=2, cell_size=CELL)
    seen = [0]

    def advance(n: int) -> None:
        seen[0] += n
        if seen[0] >= 1 << 20 and server.proc is not None:
            server.stop()  # the server dies with the pull half done

    opts = ReaderOptions(retries=1, backoff_s=0.05, memory=1 << 20)
    with pytest.raises(StoreError, match="stripe"):
        pull(m, catalog.Targets(store), tmp_path / "out", opts=opts, advance=advance)
    assert 1 << 20 <= seen[0] < m.total_size
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_reader_retries_across_a_link_cut(s3_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = s3_factory()
    proxy = Proxy(("127.0.0.1", server.port)).start()
    src = tmp_path / "src"
    original = write_random(src / "f.bin", 10 * CELL + 3, 8)
    uri = f"s3://{server.bucket}/x?endpoint_override=127.0.0.1:{proxy.port}&scheme=http&region=us-east-1"
    store = Store(uri)
    m = push(store, src, "m", "v1", stripes=2, cell_size=CELL)
    # one cell of read-ahead: what is read after the cut must cross the link (a deeper read-ahead could
    # have fetched it all before the cut, and the timing assertion would be a race)
    reader = open_reader(m, catalog.Targets(store), ReaderOptions(retries=6, backoff_s=0.3, readahead=CELL))
    try:
        assert reader.read(0, CELL) == original[:CELL]
        proxy.cut(2.5)  # every connection reset, new ones refused for 2.5 s
        t0 = time.time()
        assert reader.read(3 * CELL, m.total_size) == original[3 * CELL :]
        assert time.time() - t0 >= 2.0  # it did wait the cut out (S3 client retries, then the reader's)
    finally:
        reader.close()
        proxy.close()


def test_memory_bound_is_global_and_readahead_follows_sequential_readers(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    src = tmp_path / "src"
    files = {f"f{i}.bin": write_random(src / f"f{i}.bin", 40 * CELL, 10 + i) for i in range(4)}
    m = push(store, src, "m", "v1", stripes=4, cell_size=CELL)
    memory = 16 * CELL
    reader = open_reader(m, catalog.Targets(store), ReaderOptions(memory=memory))
    entries = {f.path: f for f in m.files}
    peak = 0
    try:
        got = {name: bytearray() for name in files}
        for step in range(40 * 4):  # four interleaved sequential readers, 16 KiB at a time
            for name in files:
                off = len(got[name])
                if off < entries[name].size:
                    got[name] += reader.pread(entries[name], off, CELL // 4 * (1 + step % 8), stream=name)
                with reader.lock:
                    peak = max(peak, reader.cached_bytes + reader.inflight_bytes)
        assert {k: bytes(v) for k, v in got.items()} == files
        assert peak <= memory + 2 * CELL  # the bound holds across streams (plus the demand reads in progress)
        assert reader.stats["prefetched"] > 0 and reader.stats["hits"] > 0
    finally:
        reader.close()


def test_stale_mount_is_cleaned_and_mount_dies_with_its_owner(tmp_path: Path, mounts: Path) -> None:
    store = file_store(tmp_path)
    src = tmp_path / "src"
    write_random(src / "f.bin", 3 * CELL, 9)
    m = push(store, src, "m", "v1", stripes=2, cell_size=CELL)
    pid = mount_detached(m, mounts / "stale", store.uri)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(OSError) as e:
        wait_until(lambda: not os.listdir(mounts / "stale"), timeout=5)
    assert e.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)  # the server is gone: a stale mount
    r = run_cli("ckpt", "umount", str(mounts / "stale"))
    assert r.returncode == 0, r.stderr
    assert mount_info(mounts / "stale") is None
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        server = mount_detached(m, mounts / "owned", store.uri, owner_pid=owner.pid)
        assert (mounts / "owned" / "f.bin").stat().st_size == 3 * CELL
    finally:
        owner.kill()
        owner.wait()
    assert wait_until(lambda: mount_info(mounts / "owned") is None, timeout=10)
    assert wait_until(lambda: not Path(f"/proc/{server}").exists() or _zombie(server), timeout=10)
    time.sleep(0.1)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_foreground_mount_serves_until_interrupted_and_logs_no_libfuse_noise(tmp_path: Path, mounts: Path) -> None:
    store = file_store(tmp_path)
    src = tmp_path / "src"
    data = write_random(src / "f.bin", 2 * CELL + 5, 12)
    push(store, src, "fg", "v1", stripes=2, cell_size=CELL)
    mp = mounts / "fg"
    argv = [sys.executable, "-m", "bootseer_cli", "ckpt", "mount", "fg", str(mp), "--foreground", "--store", store.uri]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: mount_info(mp) is not None, timeout=30), proc.stderr.read() if proc.poll() else ""
        assert (mp / "f.bin").read_bytes() == data
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert mount_info(mp) is None
    # libfuse 3.12-3.14.0 logs this on every mount unless max_idle_threads is given (issue 46 finding 8)
    assert "Ignoring invalid max threads value" not in err
