"""The compile key: which published cache a node may restore.

A compiled artifact is only valid for the torch that wrote it and the device it was compiled for
(CPU kernels use the host's vector ISA; Triton kernels a GPU architecture, driver and CUDA). PyTorch
checks its own keys, so a foreign entry is harmless but useless: the key keeps foreign caches out
instead, so a restore never spends time on files that cannot hit. Every fact here is read without
importing torch (a start that wants no compile cache must not pay for torch's import), and torch's
version from the interpreter the launcher runs (`jobpython`), never from bootseer's own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..keys import FORMAT_VERSION, Key, make_key

if TYPE_CHECKING:
    from ..keys import Keys
    from .jobpython import JobTorch

# CPU features that change the code Inductor's C++ backend generates (its ISA levels) or that
# the compiled kernels need at run time.
_CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
    "sve2",
)
# The model family, not the marketing name: SKUs of one family and ISA share their compiled kernels.
_CPU_FIELDS = ("vendor_id", "cpu family", "model", "CPU implementer", "CPU architecture", "CPU part")


def cpu_kind(cpuinfo: str) -> dict[str, Any]:
    """The CPU model family and its relevant ISA flags, from the text of /proc/cpuinfo (first processor)."""
    first = cpuinfo.split("\n\n", 1)[0]
    fields: dict[str, str] = {}
    for line in first.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip()] = value.strip()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    kind: dict[str, Any] = {"kind": "cpu"}
    kind.update({k: fields[k] for k in _CPU_FIELDS if k in fields})
    kind["isa"] = sorted(f for f in _CPU_FLAGS if f in flags)
    return kind


def gpu_kind(
    proc_nvidia: Path = Path("/proc/driver/nvidia"), environ: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """GPU models and driver from the NVIDIA driver's /proc files (no nvidia-smi, no CUDA init);
    None on a node without an NVIDIA driver or with every GPU hidden (`CUDA_VISIBLE_DEVICES=""`)."""
    env = os.environ if environ is None else environ
    if env.get("CUDA_VISIBLE_DEVICES", None) == "" or not proc_nvidia.is_dir():
        return None
    try:
        driver_text = (proc_nvidia / "version").read_text()
        models = sorted(
            {
                m.group(1).strip()
                for info in (proc_nvidia / "gpus").glob("*/information")
                if (m := re.search(r"^Model:\s*(.+)$", info.read_text(), re.M))
            }
        )
    except OSError:
        return None
    if not models:
        return None
    driver = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]*)", driver_text)
    return {
        "kind": "gpu",
        "models": models,
        "driver": driver.group(1) if driver else driver_text.strip().splitlines()[0][:120],
        "cuda": env.get("CUDA_VERSION", ""),  # set by the CUDA base images; torch's own CUDA is in its version
    }


def device_kind(configured: str | None = None) -> dict[str, Any]:
    """The device the caches are compiled for: `[compile] device` if set, else the GPUs, else the CPU."""
    if configured:
        return {"kind": "configured", "device": configured}
    gpu = gpu_kind()
    if gpu is not None:
        return gpu
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    return cpu_kind(text)


def compile_key_doc(
    image_key: str, env_key: str, device: dict[str, Any], torch: str, triton: str | None = None
) -> dict[str, Any]:
    """What the compile key is the digest of (printed by `bootseer keys`). Triton's version is named
    when the job's env has Triton (its kernels and cache are its own); without it the doc is as before."""
    doc = {
        "v": FORMAT_VERSION,
        "kind": "compile",
        "image": image_key,
        "env": env_key,
        "device": device,
        "torch": torch,
    }
    if triton:
        doc["triton"] = triton
    return doc


def compile_key(keys: Keys, device: dict[str, Any], torch: str, triton: str | None = None) -> Key:
    """The key for `bootseer keys` and the store (`refs/compile/<digest>/…`)."""
    return make_key(compile_key_doc(keys.image.digest, keys.env.digest, device, torch, triton))


def current_compile_key(keys: Keys, job: JobTorch, configured_device: str | None = None) -> Key | None:
    """The key on this node for the job's interpreter (`jobpython.job_torch`), or None when it has no
    torch (then there is nothing to carry; `job.why_none()` says why)."""
    if job.torch is None:
        return None
    return compile_key(keys, device_kind(configured_device), job.torch, job.triton)
