"""The example job on several nodes sharing one store: a cold start, a restart, a changed requirements
file, and two jobs with different requirements on one store.

Each node runs `bootseer exec -- torchrun --nproc-per-node 2 … train.py` in its own mount namespace,
with its own cache and venv (at the same absolute path on every node).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bootseer_cli.store.core import open_store
from tests.e2e.harness import DEPS_COMMAND, EXAMPLE, NEW_TABULATE, OLD_TABULATE, Run, env_kind, wait_all

pytestmark = pytest.mark.integration


def assert_ok(run: Run) -> None:
    assert run.rc == 0, run.output[-5000:]
    assert not run.leftover, f"processes left running after the job: {run.leftover}"


def exit_marks(where: Path) -> dict[str, str]:
    """The environment of a start whose torchrun workers leave a mark in `where` as they end: `atexit-<local
    rank>` from an atexit handler, `teardown-<local rank>` from an object freed by the interpreter's
    teardown (a sitecustomize that only records)."""
    where.mkdir()
    (where / "sitecustomize.py").write_text(
        "import atexit, os\n"
        "_rank = os.environ.get('LOCAL_RANK')\n"
        "if _rank is not None:\n"
        f"    _at = {str(where)!r} + '/'\n"
        "    atexit.register(lambda: open(_at + 'atexit-' + _rank, 'w').close())\n"
        "    class _Teardown:\n"
        "        def __del__(self, _path=_at + 'teardown-' + _rank, _open=open):\n"
        "            _open(_path, 'w').close()\n"
        "    _kept = _Teardown()\n"
    )
    return {"PYTHONPATH": str(where)}


def ran_setup(run: Run) -> bool:
    """pip's own words: the setup ran on this node."""
    return "Successfully installed" in run.output


def test_cold_start_then_restart(cold):
    """The cold start is the session's `cold` fixture (the store it leaves is the other scenarios' seed)."""
    store_uri, n1, n2 = cold.store_uri, cold.n1, cold.n2
    cold = cold.runs  # the two nodes' cold starts, as the assertions below name them

    # Cold start: both nodes at once; one builds the env, the other waits for it and restores it.
    for r in cold:
        assert_ok(r)
    # both logs in the message: a second "built" is a lease or capture story only they tell
    logs = "\n----\n".join(r.output[-3000:] for r in cold)
    assert sorted(env_kind(r) for r in cold) == ["built", "restored"], logs
    assert sum(ran_setup(r) for r in cold) == 1
    freeze = n1.pip_freeze()
    assert "bsexample-fnv @ file://<work>/fnv" in freeze and OLD_TABULATE in freeze
    assert [r.versions()["fnv"] for r in cold] == ["0.1.0", "0.1.0"]
    assert n2.pip_freeze() == freeze
    assert open_store(store_uri).list_refs("hot"), "no hot-block record was published"

    # The same training as without bootseer: an uninterrupted plain torchrun of 5 steps.
    marks = n2.root / "exit-marks"
    plain = n2.run_job(steps=5, bootseer=False, train_args=["--no-push", "--save-dir", "plain"], env=exit_marks(marks))
    assert_ok(plain)
    # Each worker ran its atexit handlers and then ended without the interpreter's teardown, where a
    # gloo thread still dropping a collective's tensors aborted a finished job (train.py's `leave`).
    assert sorted(p.name for p in marks.iterdir() if p.name.startswith(("atexit-", "teardown-"))) == [
        "atexit-0",
        "atexit-1",
    ]
    expected = plain.losses()
    for r in cold:
        assert r.losses() == {s: expected[s] for s in (1, 2, 3)}

    # Restart: every stage a hit; both resume at the saved step with the saved weights.
    saved = cold[0].one("saved")
    warm = wait_all([n.start(steps=2, train_args=["--no-push"]) for n in (n1, n2)])
    # The hot-block record is replayed. Only on nodes whose files carry the recorded mtimes, though:
    # a snapshot restores mtimes to the second, the builder's own files keep nanoseconds, so the
    # record made on one kind of node reads as stale on the other (reported; assert what holds).
    assert "hit" in [r.stage("image")["outcome"] for r in warm]
    for r in warm:
        assert_ok(r)
        assert env_kind(r) == "hit"
        assert r.stage("checkpoint")["outcome"] == "mounted"
        assert not ran_setup(r)
        resumed = r.one("resumed")
        assert int(resumed["step"]) == int(saved["step"]) == 3
        assert resumed["weights"] == saved["weights"]
        assert r.losses() == {s: expected[s] for s in (4, 5)}


def test_changed_requirements_is_a_miss_and_a_rebuild(changed, seed):
    """A new requirements file is a new env key: a miss and a rebuild, never the old env restored.

    The start is the session's `changed` fixture (test_env_switch switches a node to the env it built)."""
    store, fresh, built = changed.store, changed.node, changed.built
    assert (fresh.work / "requirements.txt").read_text() != (EXAMPLE / "requirements.txt").read_text()
    assert_ok(built)
    assert env_kind(built) == "built" and ran_setup(built)
    assert built.versions()["tabulate"] == "0.8.10"
    freeze = fresh.pip_freeze()
    assert NEW_TABULATE in freeze and OLD_TABULATE not in freeze
    assert int(built.one("resumed")["step"]) == seed.saved_step  # the checkpoint is not keyed on the env
    assert len(open_store(store).list_refs("env")) == 2  # the old env stays for jobs that still use it


def test_two_jobs_with_different_requirements_share_one_store(cluster, tmp_path):
    """Two jobs at once on one store: each gets its own env, restored on its own second node."""
    store_uri = (tmp_path / "store").as_uri()
    a1 = cluster.node("a1", store_uri, job_id="job-a", BOOTSEER_EXEC_SKIP="image,checkpoint")
    changed = (a1.work / "requirements.txt").read_text().replace(OLD_TABULATE, NEW_TABULATE)
    b1 = cluster.node("b1", store_uri, job_id="job-b", requirements=changed, BOOTSEER_EXEC_SKIP="image,checkpoint")
    firsts = wait_all([a1.start(steps=1, train_args=["--no-push"]), b1.start(steps=1, train_args=["--no-push"])])
    for r in firsts:
        assert_ok(r)
        assert env_kind(r) == "built"
    a2 = cluster.node("a2", store_uri, job_id="job-a", BOOTSEER_EXEC_SKIP="image,checkpoint")
    b2 = cluster.node("b2", store_uri, job_id="job-b", requirements=changed, BOOTSEER_EXEC_SKIP="image,checkpoint")
    seconds = wait_all([a2.start(command=DEPS_COMMAND), b2.start(command=DEPS_COMMAND)])
    for r in seconds:
        assert_ok(r)
        assert env_kind(r) == "restored" and not ran_setup(r)
    assert [r.versions()["tabulate"] for r in (*firsts, *seconds)] == ["0.10.0", "0.8.10", "0.10.0", "0.8.10"]
    assert a2.pip_freeze() == a1.pip_freeze() != b2.pip_freeze() == b1.pip_freeze()
    assert len(open_store(store_uri).list_refs("env")) == 2
