"""The compile stage reads torch from the job's env, never from bootseer's own (issue 44, item 1).

As the README installs it: bootseer in a venv of its own, without torch (`bootseer_venv`: the test venv's
packages less torch, linked where pip would put them), and the job's env another venv that has torch and
not bootseer (`job_venv`: torch imports from that venv's site-packages, checked below; its `torchrun` is
the console script pip writes, its shebang naming that venv's interpreter). The launcher is `torchrun`,
found on the job's PATH. Before the fix, every start said "no torch" and `bootseer keys` said
`compile_key none (torch is not installed)`; where bootseer's venv held another torch, the key named that
one. Each node has its own TMPDIR, HOME and bootseer cache (XDG_CACHE_HOME), as a fresh container has.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bootseer_cli.compilecache.index import read_index
from bootseer_cli.compilecache.tree import header_dir
from bootseer_cli.store.core import open_store

from .conftest import MODEL, bootseer_venv, job_venv, venv_with_torch_version

pytest.importorskip("torch")
TORCHRUN = ["torchrun", "--standalone", "--nproc-per-node", "1", str(MODEL)]


@dataclass
class Envs:
    root: Path
    job: Path  # the job venv's interpreter
    bootseer: Path  # bootseer's venv's interpreter
    torch: str  # the version `import torch` gives in the job venv
    config: Path

    def env(self, node: str, **extra: str) -> dict[str, str]:
        """A node's environment: the job venv's bin first on PATH, its own TMPDIR, HOME and bootseer cache."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BOOTSEER_", "TORCHINDUCTOR_", "TRITON_"))}
        env["PATH"] = f"{self.job.parent}{os.pathsep}{env.get('PATH', os.defpath)}"
        for var, name in (("TMPDIR", "tmp"), ("HOME", "home"), ("XDG_CACHE_HOME", "xdg")):
            env[var] = str(self.root / f"{name}-{node}")
            Path(env[var]).mkdir(exist_ok=True)
        return env | extra

    def bootseer_cli(
        self, args: list[str], env: dict[str, str], python: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(python or self.bootseer), "-m", "bootseer_cli", *args]
        return subprocess.run(argv, env=env, cwd=self.root, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> Envs:
    root = tmp_path_factory.mktemp("jobenv")
    job, ours = job_venv(root / "job"), bootseer_venv(root / "bootseer")
    probe = "import json, torch; print(json.dumps([torch.__version__, torch.__file__]))"
    version, where = json.loads(subprocess.check_output([str(job), "-c", probe], text=True, timeout=600))
    assert Path(where).is_relative_to(root / "job"), where  # torch imports from the job venv
    gone = subprocess.run([str(ours), "-c", "import torch"], capture_output=True, timeout=300)
    assert gone.returncode != 0  # and not from bootseer's
    config = root / "bootseer.toml"
    config.write_text(f'[store]\nuri = "{(root / "store").as_uri()}"\n[compile]\nenabled = true\n')
    return Envs(root, job, ours, version, config)


def _key(envs: Envs, env: dict[str, str], command: list[str], python: Path | None = None) -> dict[str, object]:
    r = envs.bootseer_cli(["keys", "--config", str(envs.config), "--json", "--", *command], env, python)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["compile"]


def _wait_agent(xdg: Path, runs_before: set[Path], timeout_s: float = 300.0) -> Path:
    """The run directory of the start, once its agent is done (it publishes when the launcher ends)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        new = [d for d in xdg.glob("bootseer/runs/*") if d not in runs_before]
        if new and (new[0] / "agent.log").exists() and "agent done" in (new[0] / "agent.log").read_text():
            return new[0]
        time.sleep(0.5)
    raise AssertionError(f"the agent under {xdg} did not finish within {timeout_s:g} s")


def _start(envs: Envs, env: dict[str, str]) -> tuple[dict[str, object], str, Path]:
    """`bootseer exec -- torchrun … model.py` on a node: (the model's counters, bootseer's stderr, its run dir)."""
    xdg = Path(env["XDG_CACHE_HOME"])
    before = set(xdg.glob("bootseer/runs/*"))
    r = envs.bootseer_cli(["exec", "--config", str(envs.config), "--", *TORCHRUN], env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    return doc, r.stderr, _wait_agent(xdg, before)


def test_the_stage_reads_torch_from_the_launchers_venv_and_a_fresh_node_restores(envs: Envs) -> None:
    env_a = envs.env("a")
    text = envs.bootseer_cli(["keys", "--config", str(envs.config), "--", *TORCHRUN], env_a)
    line = f"(torch {envs.torch} in {envs.job}, resolved from torchrun's shebang)"
    assert re.search(r"^compile_key [0-9a-f]{64}  " + re.escape(line) + "$", text.stdout, re.M), text.stdout
    key = _key(envs, env_a, TORCHRUN)
    assert key["doc"]["torch"] == envs.torch and key["python"]["python"] == str(envs.job), key  # type: ignore[index]

    # An earlier start on node A, when the stage never engaged: Inductor's header is in its TMPDIR already.
    subprocess.run([str(envs.job), str(MODEL)], env=env_a, check=True, capture_output=True, timeout=900)
    assert list(header_dir(env_a).glob("*.gch"))
    counters, err, _ = _start(envs, env_a)
    assert "no torch" not in err and "empty cache, publishing" in err, err
    assert counters["inductor"]["fxgraph_cache_miss"] >= 1, counters  # type: ignore[index]
    index = read_index(open_store((envs.root / "store").as_uri()), str(key["digest"]))
    headers = sorted(rel for rel in index.entries if rel.startswith("headers/"))
    assert any(rel.endswith(".gch") for rel in headers), sorted(index.entries)  # the header found in TMPDIR
    assert any(rel.startswith("inductor/") for rel in index.entries)

    env_b = envs.env("b")  # a fresh node: own TMPDIR, HOME, node cache
    counters, err, run_dir = _start(envs, env_b)
    assert f"restored {len(index.entries)} files" in err, err
    inductor = counters["inductor"]
    assert inductor.get("fxgraph_cache_hit", 0) > 0 and inductor.get("fxgraph_cache_miss", 0) == 0, counters  # type: ignore[union-attr]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (stage,) = [e for e in events if e["stage"] == "compile"]
    facts = json.loads(stage["extra"])
    assert facts["torch"] == envs.torch and facts["python"] == str(envs.job), stage
    built = [p for p in header_dir(env_b).glob("*.gch") if p.stat().st_mtime > stage["end"]]
    assert not built and {f"headers/{p.name}" for p in header_dir(env_b).iterdir() if p.is_file()} <= set(headers)


def test_the_key_names_the_jobs_torch_not_the_one_in_bootseers_venv(envs: Envs) -> None:
    """bootseer's own venv holds another torch (its metadata says 2.14.1; bootseer never imports it):
    the key names the job's, the version its `import torch` gives."""
    ours = venv_with_torch_version(envs.root / "bootseer-2.14", "2.14.1", bootseer=True)
    probe = "import importlib.metadata as m; print(m.version('torch'))"
    mine = subprocess.run([str(ours), "-c", probe], capture_output=True, text=True, timeout=300)
    assert mine.stdout.strip() == "2.14.1", mine.stderr
    key = _key(envs, envs.env("v"), TORCHRUN, python=ours)
    assert key["doc"]["torch"] == envs.torch != "2.14.1", key  # type: ignore[index]


def test_launchers_that_are_not_python_say_why_and_the_setting_overrides(envs: Envs, tmp_path: Path) -> None:
    """A shell wrapper names no interpreter: `keys` says which launcher was tried and how to fix it;
    `[compile] python` (here its variable) is the way out. A `#!/usr/bin/env python3` script is looked up
    on the launcher's PATH, and pip's two-line launcher for long paths is read too."""
    env = envs.env("w")
    key = _key(envs, env, ["sh", "-c", "exec torchrun train.py"])
    assert key["digest"] is None and "the launcher sh is a shell, not a Python program" in str(key["why"]), key
    assert "set [compile] python (BOOTSEER_COMPILE_PYTHON)" in str(key["why"])
    key = _key(envs, env | {"BOOTSEER_COMPILE_PYTHON": str(envs.job)}, ["sh", "-c", "exec torchrun train.py"])
    assert key["doc"]["torch"] == envs.torch and key["python"]["python_from"] == "set by [compile] python", key  # type: ignore[index]

    script = tmp_path / "train"
    script.write_text("#!/usr/bin/env python3\nprint('hi')\n")
    script.chmod(0o755)
    key = _key(envs, env, [str(script)])
    assert key["doc"]["torch"] == envs.torch and "python3 on PATH" in key["python"]["python_from"], key  # type: ignore[index]
    long = tmp_path / "pip-long"
    long.write_text(f"#!/bin/sh\n'''exec' \"{envs.job}\" \"$0\" \"$@\"\n' '''\nprint('hi')\n")
    long.chmod(0o755)
    key = _key(envs, env, [str(long)])
    assert key["python"]["python"] == str(envs.job) and key["doc"]["torch"] == envs.torch, key  # type: ignore[index]

    r = envs.bootseer_cli(["doctor", "--config", str(envs.config), "--", *TORCHRUN], env)
    assert f"ok    compile      torch {envs.torch} in {envs.job}, resolved from torchrun's shebang" in r.stdout, (
        r.stdout
    )
    r = envs.bootseer_cli(["doctor", "--config", str(envs.config), "--", "bash", "run.sh"], env)
    assert re.search(r"^warn  compile .*the launcher bash is a shell", r.stdout, re.M), r.stdout
