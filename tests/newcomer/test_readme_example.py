"""The README's torchrun example runs as written (issue 29 item 10): it failed at its setup, since
`bsexample-fnv` is on no package index. The README's shell block is run as is, in a copy of the
example, in a fresh venv over this interpreter's packages (torch from the "image"); the one edit is
the store (a local file:// store for s3://my-bucket), and pip gets its wheels from a local directory
as a cluster's index would serve them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support import pkgindex
from tests.support.s3server import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WHEELS = ["einops==0.8.2", "tabulate==0.10.0", "msgpack==1.2.3", "setuptools", "wheel"]


def readme_block() -> str:
    """The shell block of the README's "A real torchrun job, start to finish" section."""
    text = (REPO / "README.md").read_text()
    section = text.split("## A real torchrun job, start to finish", 1)[1]
    m = re.search(r"```sh\n(.*?)```", section, re.S)
    assert m, "the section has no ```sh block"
    return m.group(1)


def _venv(root: Path) -> Path:
    """A bare venv that sees this interpreter's packages (torch), with `bootseer` and `torchrun` in its bin."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "_base.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    for name, imp in {"bootseer": "bootseer_cli.cli", "torchrun": "torch.distributed.run"}.items():
        script = venv / "bin" / name
        script.write_text(f"#!{py}\nimport sys\nfrom {imp} import main\nsys.exit(main())\n")
        script.chmod(0o755)
    return venv


def test_the_readme_torchrun_example_runs_as_written(tmp_path: Path) -> None:
    block = readme_block()
    assert "cd examples/torchrun-job" in block and "bootseer exec -- torchrun" in block, block
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "examples" / "torchrun-job", checkout / "examples" / "torchrun-job")
    venv = _venv(tmp_path)
    wheels = tmp_path / "wheels"
    pkgindex.wheelhouse(wheels, WHEELS)
    store = (tmp_path / "store").as_uri()
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIP_", "BOOTSEER_", "VIRTUAL_ENV", "PYTEST_", "TORCHELASTIC_", "PET_"))
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR")
    }
    env.update(
        {
            "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "VIRTUAL_ENV": str(venv),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "XDG_RUNTIME_DIR": str(xdg),
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_NO_INDEX": "1",  # the cluster's index: a local directory of wheels
            "PIP_FIND_LINKS": str(wheels),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PET_MASTER_PORT": str(free_port()),  # torchrun's --master-port, by its environment variable
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    script = "set -e\n" + block.replace("s3://my-bucket/bootseer", store)
    r = subprocess.run(["sh", "-c", script], cwd=checkout, env=env, capture_output=True, text=True, timeout=540)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert "train: deps einops=0.8.2 tabulate=0.10.0 msgpack=1.2.3 fnv=0.1.0" in r.stdout, out[-4000:]
    assert re.search(r"^train: step step=\d+ loss=", r.stdout, re.M), out[-4000:]
    assert "train: pushed name=torchrun-example" in r.stdout, out[-4000:]
    assert "job my-run-1" in r.stdout, out[-4000:]  # bootseer report --last
    assert "Traceback" not in out
