"""The node pack loads into the real pinned server both ways users install it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import REPO_ROOT

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
