"""A second run of install.py on a workspace that changed since: a pinned file deleted or edited, a venv
moved to another place."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import runner.install.comfy as install_comfy
import runner.install.python_env as python_env
from tests.test_install import comfy_and_pin, inst  # noqa: F401 - fixtures


def test_a_rerun_finds_a_pinned_file_deleted_or_edited_since_the_install(
    inst: ModuleType,  # noqa: F811 - the fixture imported above
    comfy_and_pin: tuple[Path, dict[str, Any]],  # noqa: F811
) -> None:
    """The install record says the tree was verified; a second run checks it again all the same (a
    file deleted since made the server start without a node set, and nothing said so)."""
    tree, pin = comfy_and_pin
    old = {"comfyui": str(tree), "tree_digest": pin["tree_digest"], "verified": True, "source": "wheel"}
    python = Path(sys.executable)
    assert install_comfy.ensure_workspace_comfyui(tree, pin, "auto", python, old) == "wheel"
    (tree / "main.py").unlink()
    with pytest.raises(inst.InstallError, match=r"missing: main\.py.*Move .* away and run again"):
        install_comfy.ensure_workspace_comfyui(tree, pin, "auto", python, old)


def test_a_moved_venv_is_said_to_be_one(
    inst: ModuleType,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A venv cannot be moved: its scripts keep the old path. A run after the move says so and what to
    do, instead of leaving pip and pytest broken without a word."""
    venv_dir = tmp_path / "moved" / ".venv"
    (venv_dir / "bin").mkdir(parents=True)
    (venv_dir / "bin" / "python").symlink_to(sys.executable)
    (venv_dir / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).parent}\n")
    (venv_dir / "bin" / "pip").write_text("#!/old/place/.venv/bin/python\nimport pip\n")
    (venv_dir / "lib" / "python3" / "site-packages" / "pip").mkdir(parents=True)
    (venv_dir / "lib" / "python3" / "site-packages" / "pip" / "__init__.py").write_text("")
    assert python_env.venv_made_at(venv_dir) == Path("/old/place/.venv")
    assert python_env.ensure_python(venv_dir) == venv_dir / "bin" / "python"
    err = capsys.readouterr().err
    assert f"the venv {venv_dir} was made at /old/place/.venv and moved since" in " ".join(err.split())
    (venv_dir / "bin" / "pip").write_text(f"#!{venv_dir}/bin/python\nimport pip\n")  # where it was made
    python_env.ensure_python(venv_dir)
    assert "moved since" not in capsys.readouterr().err


def test_a_venv_cut_short_before_it_had_pip_gets_pip_on_the_next_run(
    inst: ModuleType,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ctrl-C while install.py created the venv left its python without pip; every later run failed in
    `pip download` ("No module named pip") with advice about the package index."""
    import subprocess
    import venv

    venv_dir = tmp_path / ".venv"
    venv.EnvBuilder(with_pip=False).create(venv_dir)
    python = python_env.ensure_python(venv_dir)
    assert "has no pip (its creation was cut short?): adding it" in capsys.readouterr().out
    assert subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True).returncode == 0
    python_env.ensure_python(venv_dir)
    assert "no pip" not in capsys.readouterr().out


def test_a_venv_that_lost_its_pyvenv_cfg_or_is_a_file_is_refused(
    inst: ModuleType,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    """Without pyvenv.cfg its python runs as the base interpreter: pip would install everything into
    the machine's own Python (seen: 121 packages, torch and CUDA wheels included)."""
    venv_dir = tmp_path / ".venv"
    (venv_dir / "bin").mkdir(parents=True)
    (venv_dir / "bin" / "python").symlink_to(sys.executable)
    with pytest.raises(inst.InstallError, match=rf"{venv_dir} is no longer a venv \(its pyvenv.cfg is gone"):
        python_env.ensure_python(venv_dir)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(inst.InstallError, match=rf"--venv {afile}: a file, not a folder"):
        python_env.ensure_python(afile)


def test_a_plain_rerun_keeps_the_users_comfyui_until_told_otherwise(
    inst: ModuleType,  # noqa: F811 - the fixture imported above
    comfy_and_pin: tuple[Path, dict[str, Any]],  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`git pull && python3 install.py` (the upgrade) went back to the workspace's ComfyUI without a
    word, leaving the user's own custom nodes and models behind."""
    tree, pin = comfy_and_pin
    (tree / "comfy").mkdir(exist_ok=True)
    (tree / "comfyui_version.py").write_text('__version__ = "0.3.75"\n')
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "install.json").write_text(f'{{"source": "existing", "comfyui": "{tree}"}}')
    monkeypatch.setattr(inst, "load_pin", lambda: pin)
    monkeypatch.setattr(inst, "register_pack", lambda comfy, pack: None)
    monkeypatch.setattr(inst, "ensure_python", lambda venv_dir: Path(sys.executable))
    monkeypatch.setattr(inst, "setup_python", lambda *args, **kwargs: "stamp")
    monkeypatch.setattr(inst, "ensure_workspace_comfyui", lambda *args: "wheel")
    record = inst.install(inst.Options(workspace, None, None, "auto", False))
    assert (record["comfyui"], record["source"]) == (str(tree), "existing")
    assert f"keeping your ComfyUI at {tree}" in capsys.readouterr().out
    record = inst.install(inst.Options(workspace, None, None, "auto", False, workspace_comfyui=True))
    assert (record["comfyui"], record["source"]) == (str(workspace / "ComfyUI"), "wheel")
    assert inst.install(inst.Options(workspace, None, None, "auto", False))["source"] == "wheel"  # stays
    (workspace / "install.json").write_text(f'{{"source": "existing", "comfyui": "{tmp_path / "gone"}"}}')
    with pytest.raises(inst.InstallError, match="that an earlier --comfyui gave is gone"):
        inst.install(inst.Options(workspace, None, None, "auto", False))


def test_requirement_names_are_read_as_pip_reads_them(tmp_path: Path) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text("# a comment\naiohttp>=3.11.8\n\nPillow\ntorch ; sys_platform != 'darwin'\n-r other.txt\n")
    assert install_comfy.requirement_names(req) == ["aiohttp", "Pillow", "torch"]
    assert install_comfy.requirement_names(tmp_path / "none.txt") == []


def test_the_workspace_comfyui_kept_with_comfyui_is_ours_again_with_workspace_comfyui(
    comfy_and_pin: tuple[Path, dict[str, Any]],  # noqa: F811
) -> None:
    """``--comfyui .workspace/ComfyUI`` (the damaged-tree message offers it) records the tree as the
    user's own ("existing": a changed file is only warned of); ``--workspace-comfyui`` then kept that
    source, so the tree was never checked strictly again."""
    tree, pin = comfy_and_pin
    kept = {"comfyui": str(tree), "tree_digest": pin["tree_digest"], "verified": True, "source": "existing"}
    assert install_comfy.ensure_workspace_comfyui(tree, pin, "auto", Path(sys.executable), kept) == "wheel"
