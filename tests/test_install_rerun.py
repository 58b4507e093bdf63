"""A second run of install.py on a workspace that changed since: a pinned file deleted or edited, a venv
moved to another place."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import runner.install.comfy as install_comfy
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
    (venv_dir / "bin" / "pip").write_text("#!/old/place/.venv/bin/python\nimport pip\n")
    assert inst.venv_made_at(venv_dir) == Path("/old/place/.venv")
    opts = inst.Options(tmp_path, venv_dir, None, "auto", False)
    assert inst.ensure_python(opts) == venv_dir / "bin" / "python"
    err = capsys.readouterr().err
    assert f"the venv {venv_dir} was made at /old/place/.venv and moved since" in " ".join(err.split())
    (venv_dir / "bin" / "pip").write_text(f"#!{venv_dir}/bin/python\nimport pip\n")  # where it was made
    inst.ensure_python(opts)
    assert "moved since" not in capsys.readouterr().err
