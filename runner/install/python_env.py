"""The installer's python environment (standard library only, like ``install.py``): the venv, what an
interpreter has (one probe subprocess), pip, and the stamp that lets a rerun skip the pip steps.

Example::

    python = ensure_python(Path(".venv"))                       # made when missing
    stamp = setup_python(python, venv_dir=Path(".venv"), force=False, comfy=comfy, repo=repo,
                         pin_digest=pin["tree_digest"], old_stamp=None)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import venv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from runner.install.comfy import DISK_WITHOUT_TORCH, check_disk, requirement_names, run_command, say, warn
from runner.install.pin import InstallError

TORCH_SPECS = ("torch==2.14.1", "torchvision==0.29.1", "torchaudio==2.11.1")
PYTHON_MIN, PYTHON_MAX = (3, 10), (3, 13)
DISK_WITH_TORCH = 8 * 1024**3
STAMP_FORMAT = 1
# the files besides ComfyUI's requirements.txt that the pip steps read, relative to the repository
PIP_INPUTS = ("pyproject.toml", "requirements.txt", "tests/requirements.txt", "benchmarks/requirements.txt")
# One subprocess answers "which python, is torch there, is this project installed" (~4 s: torch import).
_PROBE = """
import json, sys, importlib.metadata as md
r = {"python": list(sys.version_info[:2]), "torch": None, "leanvideo": None, "missing": []}
for name in sys.argv[1:]:  # ComfyUI's requirements: one uninstalled since would stop the server
    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        r["missing"].append(name)
try:
    import torch, torchvision, torchaudio
    r["torch"] = torch.__version__
except Exception as exc:
    r["torch_error"] = repr(exc)
try:
    r["leanvideo"] = md.version("leanvideo")
except md.PackageNotFoundError:
    pass
print(json.dumps(r))
"""


def check_python(
    version: tuple[int, int] | None = None,
    which: Callable[[str], Any] = shutil.which,
    runs: Callable[[str], bool] | None = None,
) -> None:
    """Raise InstallError unless the interpreter is within PYTHON_MIN..PYTHON_MAX; the hint names a
    supported python on PATH that ``runs``."""
    runs = runs or _runs
    got = version or (sys.version_info[0], sys.version_info[1])
    if PYTHON_MIN <= got <= PYTHON_MAX:
        return
    pythons = [f"python3.{m}" for m in range(PYTHON_MAX[1], PYTHON_MIN[1] - 1, -1)]
    found = next((p for p in pythons if (path := which(p)) and runs(str(path))), None)
    hint = f"run `{found} install.py`" if found else "install one (e.g. from python.org or your distribution)"
    raise InstallError(
        f"Python {got[0]}.{got[1]} is not supported; LeanVideo needs Python "
        f"{PYTHON_MIN[0]}.{PYTHON_MIN[1]}–{PYTHON_MAX[0]}.{PYTHON_MAX[1]}: {hint}"
    )


def _runs(python: str) -> bool:
    """Whether ``python`` starts (a pyenv shim for a version it lacks is on PATH but does not)."""
    try:
        return subprocess.run([python, "-c", ""], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def venv_python(venv_dir: Path) -> Path:
    return venv_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def probe_python(python: Path, requirements: Sequence[str] = ()) -> dict[str, Any]:
    """What ``python`` has: its version, torch, this project, and which of ``requirements`` (names of
    distributions) are missing."""
    try:
        r = run_command([str(python), "-c", _PROBE, *requirements], capture_output=True, timeout=300)
    except OSError as exc:  # a zero-byte or foreign file where the interpreter should be
        raise InstallError(
            f"{python} does not run ({exc.strerror or exc}); delete its venv, run again"
        ) from exc
    try:
        result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise InstallError(
            f"{python} does not run ({r.stderr.strip()[-300:]}); delete its venv, run again"
        ) from None
    return result


def pip_install(python: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "install", "-q", *args]
    if run_command(cmd).returncode != 0:
        raise InstallError(f"pip failed: {' '.join(cmd)} (see its output above); check package-index access")


def input_stamp(files: Sequence[Path], pin_digest: str, python: Path) -> str:
    """Hash of everything the pip steps depend on; equal stamps mean there is nothing to install."""
    h = hashlib.sha256(f"{STAMP_FORMAT}\0{pin_digest}\0{python}\0{' '.join(TORCH_SPECS)}\n".encode())
    for f in files:
        h.update(f"{f}\0".encode() + (f.read_bytes() if f.is_file() else b"<missing>") + b"\n")
    return h.hexdigest()


def ensure_python(venv_dir: Path | None) -> Path:
    """The interpreter to install into: ``venv_dir``'s (created here if missing) or, for None
    (``--no-venv``), this one."""
    if venv_dir is None:
        return Path(sys.executable)
    if venv_dir.exists() and not venv_dir.is_dir():
        raise InstallError(f"--venv {venv_dir}: a file, not a folder")
    python = venv_python(venv_dir)
    if python.exists() and not (venv_dir / "pyvenv.cfg").is_file():
        # without it, its python is the base interpreter itself: pip would install into that one
        raise InstallError(
            f"{venv_dir} is no longer a venv (its pyvenv.cfg is gone, so {python} runs as the base "
            f"Python and would install there, for every user of it): remove {venv_dir} and run again"
        )
    if not python.exists():
        check_disk(venv_dir, DISK_WITH_TORCH, "a new venv with torch")
        say(f"creating the venv {venv_dir}…")
        venv.EnvBuilder(with_pip=True).create(venv_dir)
        return python
    if os.name != "nt" and not any(venv_dir.glob("lib*/python*/site-packages/pip/__init__.py")):
        # a venv whose creation was cut short (Ctrl-C) has its python and no pip: every later step failed
        say(f"the venv {venv_dir} has no pip (its creation was cut short?): adding it")
        if run_command([str(python), "-m", "ensurepip", "--default-pip"], capture_output=True).returncode:
            raise InstallError(f"{venv_dir} has no pip and ensurepip failed: remove {venv_dir} and run again")
    if (made_at := venv_made_at(venv_dir)) is not None and made_at.resolve() != venv_dir.resolve():
        warn(
            f"the venv {venv_dir} was made at {made_at} and moved since: its scripts (pip, pytest, "
            f"activate) still point there; `leanvideo` is made again now, for the rest remove {venv_dir} "
            "and run install.py again (a venv cannot be moved)"
        )
    return python


def venv_made_at(venv_dir: Path) -> Path | None:
    """Where ``venv_dir`` was created, read from its pip script's interpreter line (None: unknown)."""
    try:
        first = (venv_dir / "bin" / "pip").read_text(encoding="utf-8", errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    if not first.startswith("#!") or not first.rstrip().endswith("/bin/python"):
        return None  # a wrapper (a path with spaces gets `#!/bin/sh` and an exec line): not read here
    return Path(first[2:].strip()).parent.parent


def setup_python(
    python: Path,
    *,
    venv_dir: Path | None,
    force: bool,
    comfy: Path,
    repo: Path,
    pin_digest: str,
    old_stamp: str | None,
) -> str:
    """pip-install torch, ComfyUI's requirements and ``repo`` (editable, with its dev extras) into
    ``python`` unless the stamp is ``old_stamp`` and nothing is missing (or with ``force``); return the
    stamp."""
    stamp = input_stamp([*(repo / f for f in PIP_INPUTS), comfy / "requirements.txt"], pin_digest, python)
    probe = probe_python(python, requirement_names(comfy / "requirements.txt"))
    check_python((probe["python"][0], probe["python"][1]))
    if probe["missing"]:
        if old_stamp is not None:  # installed before: something went missing since (a first install
            # misses everything, and the steps below say what they install)
            say(
                f"missing from {python}: {', '.join(probe['missing'])} (ComfyUI needs them); installing again"
            )
    elif not force and old_stamp == stamp and probe["torch"] and probe["leanvideo"]:
        say(f"python environment up to date (stamp matches; torch {probe['torch']})")
        return stamp
    need_torch = probe["torch"] is None
    what = "torch and ComfyUI's requirements" if need_torch else "ComfyUI's requirements"
    check_disk(venv_dir or Path(sys.prefix), DISK_WITH_TORCH if need_torch else DISK_WITHOUT_TORCH, what)
    t0 = time.monotonic()
    if need_torch:
        say(f"installing {' '.join(TORCH_SPECS)} into {python} (about a minute)…")
        pip_install(python, *TORCH_SPECS)
    else:
        say(f"torch {probe['torch']} already there; keeping it")
    say(f"installing ComfyUI's requirements and LeanVideo (editable, [dev]) into {python}…")
    pip_install(python, "-r", str(comfy / "requirements.txt"))
    pip_install(python, "-e", f"{repo}[dev]")
    say(f"pip steps done in {time.monotonic() - t0:.0f} s")
    return stamp
