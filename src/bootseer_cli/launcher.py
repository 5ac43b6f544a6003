"""The launcher's command line: the executable it resolves to, and what it says about this node.

`resolve_command` finds the executable as a shell would (127 not found, 126 not runnable).
`gpus_hint` and `node_rank_hint` read how many GPUs the launcher will use, and the node's rank.
`bootseer exec` runs before torchrun sets LOCAL_WORLD_SIZE for its workers, so the count is read from
what the launcher is about to be told: `--nproc-per-node N` (torchrun), `--num_gpus N` (deepspeed),
`--num_processes N` (accelerate, per machine when `--num_machines` is given), then the scheduler's
and the container's environment. The report uses it for "GPU time wasted". `job_id_hint` reads the
job's identity the same way: what every node of one job shares and no other job has.
`launcher_base_environ` is what the launcher inherits (without the store's write credentials), which
the compile stage's probe of the job's Python inherits too. Import-free on purpose: it runs on the
`exec` fast path.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .errors import BootseerError

if TYPE_CHECKING:
    from .settings import Settings

# command-line options whose value is the number of processes (one per GPU) on this node
_PER_NODE_FLAGS = ("--nproc-per-node", "--nproc_per_node", "--num_gpus", "--num-gpus")
_TOTAL_FLAGS = ("--num_processes", "--num-processes")
_MACHINES_FLAGS = ("--num_machines", "--num-machines")
# environment variables, most specific first
_ENV_COUNTS = ("LOCAL_WORLD_SIZE", "SLURM_GPUS_ON_NODE", "SLURM_NTASKS_PER_NODE", "PET_NPROC_PER_NODE")
_ENV_LISTS = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def _option(command: Sequence[str], names: tuple[str, ...]) -> str | None:
    for i, arg in enumerate(command):
        for name in names:
            if arg == name and i + 1 < len(command):
                return command[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _positive(text: str | None) -> int | None:
    try:
        n = int(str(text).strip().split("(")[0])  # SLURM writes "8(x2)" for repeated counts
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def node_rank_hint(command: Sequence[str]) -> int | None:
    """The node's rank when only the launcher's command line says it (`torchrun --node-rank K`)."""
    text = _option(command, ("--node-rank", "--node_rank", "--machine_rank", "--machine-rank"))
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def gpus_hint(command: Sequence[str], environ: Mapping[str, str]) -> tuple[int, str] | None:
    """(GPUs per node, where that came from), or None when nothing says."""
    value = _positive(_option(command, _PER_NODE_FLAGS))
    if value:
        return value, "command line"
    total = _positive(_option(command, _TOTAL_FLAGS))
    if total:
        machines = _positive(_option(command, _MACHINES_FLAGS)) or 1
        return max(1, total // machines), "command line"
    for name in _ENV_COUNTS:
        value = _positive(environ.get(name))
        if value:
            return value, f"${name}"
    for name in _ENV_LISTS:
        devices = environ.get(name, "").strip()
        if devices and devices.lower() not in ("none", "void", "all", "-1"):
            return len([d for d in devices.split(",") if d.strip()]), f"${name}"
    return None


# torchrun (and `python -m torch.distributed.run`, and launchers that forward its options) names the job
_RDZV_ID_FLAGS = ("--rdzv-id", "--rdzv_id")
# set by hand or by a template; torchrun's own options as environment variables; the schedulers' job ids.
# deepspeed and accelerate have no job-id option of their own: under a scheduler its variable names the job.
_JOB_ENV = (
    "BOOTSEER_JOB_ID",
    "PET_RDZV_ID",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "LSB_JOBID",
    "PBS_JOBID",
    "FLUX_JOB_ID",
)


def job_id_hint(command: Sequence[str], environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(job id, where it came from): $BOOTSEER_JOB_ID, else the launcher's `--rdzv-id`, else a scheduler's
    variable; None when nothing names the job. torchrun's default rendezvous id, "none", names nothing."""
    explicit = environ.get("BOOTSEER_JOB_ID", "").strip()
    if explicit and explicit != "none":
        return explicit, "$BOOTSEER_JOB_ID"
    rdzv = (_option(command, _RDZV_ID_FLAGS) or "").strip()
    if rdzv and rdzv != "none":
        return rdzv, "command line"
    for name in _JOB_ENV[1:]:
        value = environ.get(name, "").strip()
        if value and value != "none":
            return value, f"${name}"
    return None


def check_command(command: Sequence[str]) -> None:
    """An empty command is a usage error, found before any stage runs (exit 2)."""
    if not command:
        raise BootseerError("no command given: bootseer exec [OPTIONS] -- COMMAND [ARGS]…", 2)


def resolve_command(command: Sequence[str], environ: Mapping[str, str] | None = None) -> str:
    """The executable the launcher resolves to, or a shell-like error (127 not found, 126 not runnable).

    Called after the stages, with the launcher's own environment: the env stage may create the
    launcher (`/opt/venv/bin/torchrun`) or, some day, change PATH. A name not found says the PATH
    searched, since "command not found" alone does not tell a user which PATH the launcher had.
    """
    check_command(command)
    exe = command[0]
    if os.sep in exe:
        if not os.path.exists(exe):
            raise BootseerError(f"{exe}: No such file or directory", 127)
        if not os.access(exe, os.X_OK) or os.path.isdir(exe):
            raise BootseerError(f"{exe}: Permission denied", 126)
        return exe
    path = (os.environ if environ is None else environ).get("PATH", os.defpath)
    found = shutil.which(exe, path=path)
    if found is None:
        raise BootseerError(f"{exe}: command not found (PATH={path})", 127)
    return found


# Where a store's client reads its credentials from, by scheme (pyarrow's S3, GCS and HDFS clients): keys,
# and every way to a key (a credentials or config file, a profile in one, a web identity, the container
# credentials endpoint), since a file or a role the launcher can name is as good as the key it yields.
_CREDENTIALS = {
    "s3": (
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
        "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    ),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS",),
    "hdfs": ("HADOOP_TOKEN_FILE_LOCATION", "KRB5CCNAME"),
}  # fmt: skip
# Never the launcher's, whatever the store: the key that signs in the domain's name.
_SIGNING = ("BOOTSEER_TRUST_SIGNING_KEY",)
WITHHELD = "BOOTSEER_STORE_WITHHELD"


def launcher_base_environ(settings: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """What the launcher inherits: this environment less the store's write credentials and the signing key.

    A training job runs code that any of its dependencies brought; with the store's credentials it
    could rewrite what every other job restores, and with the key sign it. They reach the launcher only
    when the job pushes checkpoints itself (`[exec] pass_store_credentials`: its manifests need both);
    `BOOTSEER_STORE_WITHHELD=1` tells a `bootseer ckpt push` inside the job why it cannot write.
    """
    from .redact import redact

    env = dict(environ)
    if settings.exec.pass_store_credentials:
        return env
    uri = settings.store.uri or ""
    scheme = uri.split("://", 1)[0] if "://" in uri else "file"
    gone = list(_CREDENTIALS.get(scheme, ()))
    store_var = env.get("BOOTSEER_STORE", "")
    if redact(store_var) != store_var:  # a URI with a secret in it; a plain location is no credential
        gone.append("BOOTSEER_STORE")
    withheld = [n for n in gone if n in env]
    for name in (*withheld, *_SIGNING):
        env.pop(name, None)
    if withheld or scheme not in ("file", ""):
        env[WITHHELD] = "1"
    return env
