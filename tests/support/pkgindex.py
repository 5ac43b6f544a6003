"""A loopback Python package index for tests and benchmarks: real wheels, and one sdist with a C extension.

- `wheelhouse(specs)` fills a directory with real wheels through `pip download` (this machine's own
  pip configuration, i.e. its local mirror; cached across runs under ~/.cache/bootseer-tests);
- `write_c_sdist(dest)` writes a tiny source distribution whose build compiles a C extension, so a
  test can show the case where a snapshot saves a compile;
- `PackageIndex(root).start()` serves the directory over HTTP on 127.0.0.1 as a PEP 503 simple
  index (`index_url`, for `--index-url`) and a flat page of links (`find_links_url`);
- `clean_env()` is the environment for an installer that must see only this index: no `PIP_*`,
  `PIP_CONFIG_FILE=/dev/null`, no `PYTHONDONTWRITEBYTECODE` (so pip compiles bytecode, its default).
"""

from __future__ import annotations

import hashlib
import html
import http.server
import io
import os
import re
import subprocess
import sys
import tarfile
import threading
import urllib.parse
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("BOOTSEER_TEST_WHEELS", Path.home() / ".cache" / "bootseer-tests" / "wheels"))

# Small real wheels for tests (pure Python, a few hundred kB together) and what builds the sdist.
SMALL_WHEELS = ["six==1.17.0", "idna==3.20", "iniconfig==2.3.0", "packaging==26.3"]
BUILD_WHEELS = ["setuptools"]
SDIST_NAME = "bsdemo-cext"
SDIST_VERSION = "1.0"

_C_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* FNV-1a over a bytes object: enough to prove the compiled module is the one that runs. */
static PyObject *fnv(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    unsigned long long h = 1469598103934665603ULL;
    const unsigned char *p = buf.buf;
    for (Py_ssize_t i = 0; i < buf.len; i++) { h ^= p[i]; h *= 1099511628211ULL; }
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef methods[] = {{"fnv", fnv, METH_VARARGS, "FNV-1a 64 of bytes."}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "bsdemo_cext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_bsdemo_cext(void) { return PyModule_Create(&module); }
"""

_SETUP_PY = """from setuptools import Extension, setup

setup(name="bsdemo-cext", version="{version}", ext_modules=[Extension("bsdemo_cext", ["bsdemo_cext.c"])])
"""

_PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
"""


def fnv(data: bytes) -> int:
    """What the C extension computes, to check it from the outside."""
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment minus the machine's pip settings and bytecode switch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["UV_NO_CONFIG"] = "1"
    env.update(extra or {})
    return env


def wheelhouse(dest: Path, specs: list[str], cache: Path = CACHE) -> list[Path]:
    """Copy (hardlink) the wheels for `specs` into `dest`, downloading each spec once into `cache`.

    Dependencies are included (`pip download` resolves them), binary wheels only.
    """
    dest.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    for spec in specs:
        tag = hashlib.sha256(f"{spec}|{sys.version_info[:2]}".encode()).hexdigest()[:16]
        d = cache / tag
        if not (d / ".complete").exists():
            d.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", str(d), spec],
                check=True,
                capture_output=True,
            )
            (d / ".complete").touch()
        for whl in d.glob("*.whl"):
            target = dest / whl.name
            if not target.exists():
                try:
                    os.link(whl, target)
                except OSError:
                    target.write_bytes(whl.read_bytes())
            out.append(target)
    return out


def write_c_sdist(dest: Path, version: str = SDIST_VERSION) -> Path:
    """`bsdemo-cext-<version>.tar.gz`: an sdist (PKG-INFO, setup.py, pyproject, C source)."""
    dest.mkdir(parents=True, exist_ok=True)
    top = f"bsdemo_cext-{version}"
    files = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {SDIST_NAME}\nVersion: {version}\n",
        "setup.py": _SETUP_PY.format(version=version),
        "pyproject.toml": _PYPROJECT,
        "bsdemo_cext.c": _C_SOURCE,
    }
    out = dest / f"bsdemo_cext-{version}.tar.gz"
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            info.mtime = 1_700_000_000
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out)
    return out


class _Handler(http.server.BaseHTTPRequestHandler):
    root: Path

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, body: bytes, ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:  # uv asks before it downloads
        self.do_GET()

    def _links(self, names: list[str], prefix: str) -> bytes:
        rows = []
        for n in sorted(names):
            digest = hashlib.sha256((self.root / n).read_bytes()).hexdigest()
            rows.append(f'<a href="{prefix}{html.escape(n)}#sha256={digest}">{html.escape(n)}</a><br>')
        return ("<!DOCTYPE html><html><body>\n" + "\n".join(rows) + "\n</body></html>\n").encode()

    def do_GET(self) -> None:
        path = urllib.parse.unquote(self.path.split("?", 1)[0])  # pip asks for "torch-2.13.0%2Bcpu-…"
        files = [p.name for p in self.root.iterdir() if p.suffix in (".whl", ".gz", ".zip")]
        if path.startswith("/files/") and len(path) > len("/files/"):
            name = path[len("/files/") :]
            f = self.root / name
            if "/" in name or not f.is_file():
                self.send_error(404)
                return
            self._send(f.read_bytes(), "application/octet-stream")
        elif path in ("/files/", "/files"):
            self._send(self._links(files, "/files/"), "text/html")
        elif path in ("/simple/", "/simple"):
            projects = sorted({normalize(_project(n)) for n in files})
            body = "".join(f'<a href="/simple/{p}/">{p}</a><br>\n' for p in projects)
            self._send(f"<!DOCTYPE html><html><body>\n{body}</body></html>\n".encode(), "text/html")
        elif path.startswith("/simple/"):
            project = normalize(path[len("/simple/") :].strip("/"))
            mine = [n for n in files if normalize(_project(n)) == project]
            if not mine:
                self.send_error(404)
                return
            self._send(self._links(mine, "/files/"), "text/html")
        else:
            self.send_error(404)


def _project(filename: str) -> str:
    """The project name of a wheel or sdist file name."""
    if filename.endswith(".whl"):
        return filename.split("-")[0]
    base = re.sub(r"\.(tar\.gz|zip)$", "", filename)
    return base.rsplit("-", 1)[0]


class PackageIndex:
    """A PEP 503 index over a directory of distributions, served by a thread on 127.0.0.1."""

    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        self.root = root
        self.host = host
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> PackageIndex:
        handler = type("Handler", (_Handler,), {"root": self.root})
        self._server = http.server.ThreadingHTTPServer((self.host, 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="pkgindex", daemon=True)
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.server_address[1])

    @property
    def index_url(self) -> str:
        return f"http://{self.host}:{self.port}/simple/"

    @property
    def find_links_url(self) -> str:
        return f"http://{self.host}:{self.port}/files/"

    def pip_env(self) -> dict[str, str]:
        """An installer environment that sees this index only, with no installer cache (a cold node)."""
        return clean_env(
            {
                "PIP_INDEX_URL": self.index_url,
                "UV_INDEX_URL": self.index_url,
                "PIP_NO_CACHE_DIR": "1",
                "UV_NO_CACHE": "1",
            }
        )

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> PackageIndex:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
