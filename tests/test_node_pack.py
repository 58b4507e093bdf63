"""The node pack loads into the real pinned server both ways users install it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import FIXTURE_NODES_DIR, NODE_PACK_DIR, REPO_ROOT

pytestmark = pytest.mark.integration


def test_pack_info_route_reports_the_pin(comfy_server: ComfyServer) -> None:
    info = httpx.get(f"{comfy_server.url}/leanvideo/info").json()
    assert info["pack"] == "leanvideo"
    assert info["comfyui_version"] == "0.3.75"
    assert info["pinned_comfyui"]["commit"] == "f8b981ae9a5676311624bbafa636a1874db79459"
    assert info["version"] != "unknown (not installed as a package)"


def test_repository_cloned_into_custom_nodes_loads_as_a_pack(
    server_config: ServerConfig, tmp_path: Path
) -> None:
    """ComfyUI-Manager clones the whole repository into ComfyUI/custom_nodes/<name>."""
    custom_nodes = tmp_path / "manager-custom-nodes"
    custom_nodes.mkdir()
    (custom_nodes / "LeanVideo").symlink_to(REPO_ROOT, target_is_directory=True)
    config = ServerConfig(**{**server_config.__dict__, "custom_node_dirs": (custom_nodes,)})
    with ComfyServer(config) as server:
        info = httpx.get(f"{server.url}/leanvideo/info")
        assert info.status_code == 200, server.log_path.read_text()[-3000:]
        assert info.json()["loaded_from"] == str(REPO_ROOT / "custom_nodes" / "leanvideo")
    assert "IMPORT FAILED" not in config.log_path.read_text()


def test_tiny_workflow_runs_on_the_shared_server(
    comfy_server: ComfyServer, tiny_workflow: dict[str, Any]
) -> None:
    from runner.tracking.prompt import run_prompt
    from runner.tracking.result import output_files
    from runner.transport.client import ComfyClient

    client = ComfyClient(comfy_server.url)
    try:
        result = run_prompt(client, tiny_workflow, timeout=300)
    finally:
        client.close()
    assert result.status == "success"
    assert [item["filename"].endswith(".mp4") for _, item in output_files(result.outputs)] == [True]


def test_the_version_is_the_loaded_copys_and_never_comfyuis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from importlib import metadata

    from leanvideo import routes

    clone = tmp_path / "ComfyUI-LeanVideo"  # a Manager clone: the repository's pyproject beside the pack
    (clone / "custom_nodes" / "leanvideo").mkdir(parents=True)
    (clone / "pyproject.toml").write_text('[project]\nname = "leanvideo"\nversion = "9.9.1"\n')
    monkeypatch.setattr(routes, "PACK_DIR", clone / "custom_nodes" / "leanvideo")
    assert routes.pack_version() == f"9.9.1 (from {clone / 'pyproject.toml'})"
    comfy = tmp_path / "ComfyUI"  # the pack folder copied into ComfyUI/custom_nodes: ComfyUI's pyproject
    (comfy / "custom_nodes" / "leanvideo").mkdir(parents=True)
    (comfy / "pyproject.toml").write_text('[project]\nname = "ComfyUI"\nversion = "0.3.75"\n')
    monkeypatch.setattr(routes, "PACK_DIR", comfy / "custom_nodes" / "leanvideo")
    assert routes.pack_version() == metadata.version("leanvideo")


CLASH_PACK = """class Clash:
    CATEGORY = "other"
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    def run(self):
        return ()


NODE_CLASS_MAPPINGS = {%r: Clash}
"""


def test_node_ids_another_pack_registers_too_are_said_as_the_server_starts(
    server_config: ServerConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ComfyUI lets the pack loaded last take a node id without a word: a pack of the user's that
    registered `LeanVideoFreeVRAM` replaced ours in silence (workflows ran its node)."""
    before, after = tmp_path / "before", tmp_path / "after"
    for folder, node_id in ((before, "LeanVideoPatchAttention"), (after, "LeanVideoFreeVRAM")):
        (folder / "clash_pack").mkdir(parents=True)
        (folder / "clash_pack" / "__init__.py").write_text(CLASH_PACK % node_id, encoding="utf-8")
    dirs = (before, NODE_PACK_DIR, FIXTURE_NODES_DIR, after)  # loaded in that order
    config = ServerConfig(**{**server_config.__dict__, "custom_node_dirs": dirs})
    with caplog.at_level(logging.WARNING, logger="runner.local.server"), ComfyServer(config) as server:
        info = httpx.get(f"{server.url}/object_info", timeout=60).json()
    assert info["LeanVideoFreeVRAM"]["python_module"] == "custom_nodes.clash_pack"
    assert info["LeanVideoPatchAttention"]["python_module"] == "custom_nodes.leanvideo"
    said = [r.getMessage() for r in caplog.records if "LeanVideo: " in r.getMessage()]
    assert len(said) == 2, said
    taken, replaced = said  # as the packs load, then once all are loaded
    assert "take the place of nodes another custom node pack registered" in taken
    assert "LeanVideoPatchAttention (of custom_nodes.clash_pack)" in taken
    assert (
        "registers nodes under its ids and replaces them: LeanVideoFreeVRAM (now custom_nodes.clash_pack's)"
        in replaced
    )
    assert all(line.startswith(f"ComfyUI on port {config.port}: LeanVideo: ") for line in said)
