"""A node that carries one env restarts with another requirements file: it must get the new env whole,
never a mix that imports the old env's version (the old env's files are removed first), and what the
user put into the venv by hand stays. (The node runs the bootseer installed in the seed venv.)

The new env is the one the session's `changed` fixture built on its copy of the seed store (a node
with the changed requirements file started the job there; test_job asserts on that start)."""

from __future__ import annotations

import pytest

from tests.e2e.harness import DEPS_COMMAND, env_kind

pytestmark = pytest.mark.integration


def test_node_carrying_old_env_gets_new_env_whole(cluster, seed, changed):
    cluster.image = seed.image
    store = changed.store
    old = cluster.node("old", store, BOOTSEER_EXEC_SKIP="image,checkpoint")
    first = old.start(command=DEPS_COMMAND).wait()
    assert first.rc == 0 and env_kind(first) == "restored", first.output[-4000:]
    assert first.versions()["tabulate"] == "0.10.0"

    changed_reqs = (old.work / "requirements.txt").read_text().replace("tabulate==0.10.0", "tabulate==0.8.10")
    fresh, built = changed.node, changed.built
    assert (fresh.work / "requirements.txt").read_text() == changed_reqs
    assert built.rc == 0 and env_kind(built) == "built", built.output[-4000:]

    (old.work / "requirements.txt").write_text(changed_reqs)
    mine = old.site_packages / "my_helpers.py"  # the user's own module, written by hand
    mine.write_text("HELP = 1\n")
    again = old.start(command=DEPS_COMMAND).wait()
    assert again.rc == 0, again.output[-4000:]
    assert mine.read_text() == "HELP = 1\n", "a file the user wrote was removed"
    assert env_kind(again) == "restored"
    assert not (old.site_packages / "tabulate-0.10.0.dist-info").exists()
    assert not (old.site_packages / "tabulate").exists()  # the old version's package directory
    assert again.versions()["tabulate"] == "0.8.10"  # not the old env's tabulate package
    assert old.pip_freeze() == fresh.pip_freeze()
