"""Server lifecycle against the real pinned ComfyUI: start, ready, stop, no orphans, clear errors."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import httpx
import psutil
import pytest

from runner.errors import PortInUseError, ServerCrashedError, ServerError, UsageError
from runner.fixtures import FixtureSet
from runner.local.background import find_running_servers, stop_background_server
from runner.local.ports import port_is_free
from runner.local.server import (
    ComfyServer,
    ServerConfig,
    build_command,
    frontend_installed,
    write_headless_page,
)
from runner.local.server_args import refuse_owned_flags
from runner.local.server_log import import_failures, read_log
from runner.local.workspace import NODE_PACK_DIR, Workspace

pytestmark = pytest.mark.integration


def _wait_gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.2)
    return False


def test_start_ready_stop_leaves_nothing_behind(server_config: ServerConfig) -> None:
    with ComfyServer(server_config) as server:
        pid = server.pid
        assert pid is not None
        stats = httpx.get(f"{server.url}/system_stats").json()
        assert stats["system"]["comfyui_version"] == "0.3.75"
        assert "--cpu" in stats["system"]["argv"]
        info = httpx.get(f"{server.url}/leanvideo/info").json()
        assert info["loaded_from"].endswith("custom_nodes/leanvideo")
        assert info["matches_pin"] is True
        assert (server_config.state_dir / "server.json").is_file()
        # a server with an owner (this block) is not for `leanvideo stop`, which stops background ones
        assert [r["port"] for r in find_running_servers(server_config.state_dir.parent)] == []
        owned = find_running_servers(server_config.state_dir.parent, owned=True)
        assert [r["port"] for r in owned] == [server_config.port]  # what `stop` names instead
    assert _wait_gone(pid)
    assert port_is_free(server_config.host, server_config.port)
    assert not (server_config.state_dir / "server.json").exists()
    assert server_config.log_path.stat().st_size > 0


def test_server_gets_its_own_folders_and_loopback(server_config: ServerConfig) -> None:
    command = build_command(server_config, cpu=True)
    assert command[command.index("--listen") + 1] == "127.0.0.1"
    for flag, expected in (
        ("--base-directory", server_config.state_dir / "base"),
        ("--output-directory", server_config.output_dir),
        ("--database-url", f"sqlite:///{server_config.state_dir / 'comfyui.db'}"),
    ):
        assert command[command.index(flag) + 1] == str(expected)


@pytest.mark.parametrize(
    ("extra", "instead"),
    [
        (("--port", "9000"), "use leanvideo's --port instead"),
        (("--listen",), "use `leanvideo serve --host ADDRESS` instead"),
        (
            ("--cpu", "--output-directory=/tmp/x"),
            "use the command's --out (demo, bench; a served server keeps them in its folder) instead",
        ),
        (("--base-directory", "b"), "it is not configurable"),
    ],
)
def test_flags_the_runner_sets_itself_are_refused_after_the_double_dash(
    server_config: ServerConfig, extra: tuple[str, ...], instead: str
) -> None:
    said = r"^ComfyUI flag '--[a-z-]+(=[^']*)?' after `--`: leanvideo passes --[a-z-]+ to ComfyUI itself"
    with pytest.raises(UsageError, match=said) as caught:
        replace(server_config, extra_args=extra)
    assert str(caught.value).endswith(instead)
    assert replace(server_config, extra_args=("--async-offload", "--reserve-vram", "2")).extra_args[0] == (
        "--async-offload"
    )


def test_without_the_frontend_package_the_server_gets_an_empty_page(
    server_config: ServerConfig, tmp_path: Path
) -> None:
    """The device kit leaves the frontend package out: ComfyUI then serves our page instead."""
    assert frontend_installed(server_config.python)  # the installed venv has it
    bare = tmp_path / "bare" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare.parents[1])], check=True)
    assert not frontend_installed(bare)
    root = write_headless_page(server_config)
    assert "headless" in (root / "index.html").read_text(encoding="utf-8")
    command = build_command(server_config, cpu=True, front_end_root=root)
    assert command[command.index("--front-end-root") + 1] == str(root)
    assert "--front-end-root" not in build_command(server_config, cpu=True)
    theirs = ServerConfig(**{**server_config.__dict__, "extra_args": ("--front-end-root", "/srv/ui")})
    assert build_command(theirs, cpu=True, front_end_root=root).count("--front-end-root") == 1


def test_port_in_use_is_a_clear_error(server_config: ServerConfig) -> None:
    with socket.socket() as squatter:
        squatter.bind((server_config.host, server_config.port))
        squatter.listen()
        with pytest.raises(PortInUseError, match=f"Port {server_config.port}.*already in use") as raised:
            ComfyServer(server_config).start()
    # a --port that cannot be used (exit 2, as in serve, demo and bench), and still a server error
    assert raised.value.exit_code == 2 and isinstance(raised.value, ServerError)


def test_a_start_that_loses_the_port_to_another_server_says_so_and_leaves_its_record(
    server_config: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two starts on one port at once (two `serve --background`): both find it free, one binds it. The
    other's readiness check is answered by the winner; it must not take that answer as its own, nor
    remove the winner's record on its way out."""
    import runner.local.server as server_module

    with ComfyServer(server_config) as winner:
        record = server_config.state_dir / "server.json"
        assert json.loads(record.read_text(encoding="utf-8"))["pid"] == winner.pid
        info = httpx.get(f"{winner.url}/leanvideo/info", timeout=30).json()
        assert info["pid"] == winner.pid
        monkeypatch.setattr(server_module, "bind_error", lambda host, port: None)  # as if it were free
        elsewhere = replace(server_config, state_dir=server_config.state_dir.with_name("another-workspace"))
        with pytest.raises(PortInUseError, match=f"taken by another ComfyUI \\(pid {winner.pid}\\)"):
            ComfyServer(elsewhere).start()
        assert json.loads(record.read_text(encoding="utf-8"))["pid"] == winner.pid
        assert httpx.get(f"{winner.url}/system_stats", timeout=30).status_code == 200

        # In its own state folder (two `serve` on one port of one workspace) it is refused before it
        # touches anything there: the winner's log stays where it is, whole.
        log_before = winner.log_path.read_bytes()
        said = f"ComfyUI (pid {winner.pid}) is already starting or running in {server_config.state_dir}"
        with pytest.raises(PortInUseError, match=re.escape(f"{said} (port {server_config.port})")):
            ComfyServer(server_config).start()
        assert winner.log_path.read_bytes().startswith(log_before)
        assert not winner.log_path.with_name("comfyui.log.1").exists()
        assert json.loads(record.read_text(encoding="utf-8"))["pid"] == winner.pid
    # the lock lasts as long as the server: stopped, its folder takes the next one
    with ComfyServer(server_config) as again:
        assert httpx.get(f"{again.url}/system_stats", timeout=30).status_code == 200


def test_crash_during_start_reports_the_log_tail(server_config: ServerConfig) -> None:
    bad = ServerConfig(**{**server_config.__dict__, "extra_args": ("--no-such-comfyui-flag",)})
    with pytest.raises(ServerCrashedError) as caught:
        ComfyServer(bad).start()
    message = str(caught.value)
    assert "exited with code 2" in message
    assert "unrecognized arguments: --no-such-comfyui-flag" in message
    assert port_is_free(bad.host, bad.port)
    # started again in the same folder: the crashed one's log is kept as comfyui.log.1
    with pytest.raises(ServerCrashedError):
        ComfyServer(bad).start()
    previous = bad.log_path.with_name("comfyui.log.1").read_text(encoding="utf-8", errors="replace")
    assert "unrecognized arguments: --no-such-comfyui-flag" in previous


def test_a_package_missing_from_the_venv_is_said_with_the_fix(
    server_config: ServerConfig, tmp_path: Path
) -> None:
    """A package uninstalled since install.py ran: ComfyUI's traceback ends in ModuleNotFoundError."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import leanvideo_no_such_package' \"$@\"\n")
    python.chmod(0o755)
    with pytest.raises(ServerCrashedError) as caught:
        ComfyServer(replace(server_config, python=python)).start()
    message = str(caught.value)
    assert "ModuleNotFoundError: No module named 'leanvideo_no_such_package'" in message
    assert message.endswith(f"missing from {python}: run `python3 install.py` (it installs what is missing)")


def test_server_dies_with_its_parent(server_config: ServerConfig, tmp_path: Path) -> None:
    """A parent killed with SIGKILL (no cleanup code runs) must not leave ComfyUI orphaned."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from runner.local.server import ComfyServer, ServerConfig
        server = ComfyServer(ServerConfig(
            comfyui_dir=Path({str(server_config.comfyui_dir)!r}),
            state_dir=Path({str(tmp_path / "orphan")!r}),
            models_dir=Path({str(server_config.models_dir)!r}),
            python=Path({str(server_config.python)!r}),
            port={server_config.port}, cpu=True))
        server.start()
        print(server.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    parent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert parent.returncode == -9, parent.stderr[-2000:]
    child = int(parent.stdout.strip())
    assert _wait_gone(child), f"ComfyUI pid {child} outlived its parent"


def test_background_servers_are_found_by_command_line_and_stopped(tmp_path: Path) -> None:
    """A record counts while its pid runs ``main.py`` with its port; stale records are removed."""
    port = 48_123
    # Stands in for a detached ComfyUI: its own process group, "main.py" and the port on its command line.
    fake = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "main.py", "--port", str(port)],
        start_new_session=True,
    )
    try:
        records = {"live": (fake.pid, port), "other-port": (fake.pid, port + 1), "gone": (2**22 + 1, port)}
        for name, (pid, record_port) in records.items():
            (tmp_path / name).mkdir()
            (tmp_path / name / "server.json").write_text(json.dumps({"pid": pid, "port": record_port}))
        found = find_running_servers(tmp_path)
        assert [(r["pid"], r["port"]) for r in found] == [(fake.pid, port)]
        assert sorted(p.parent.name for p in tmp_path.glob("*/server.json")) == ["live"]
        stop_background_server(found[0], timeout=5.0)
        assert fake.wait(timeout=5.0) == -15  # SIGTERM; until reaped here it was a zombie, taken as gone
        assert find_running_servers(tmp_path) == [] and not (tmp_path / "live" / "server.json").exists()
    finally:
        fake.kill()
        fake.wait()


def test_a_users_own_comfyui_brings_its_models_and_nodes(
    workspace: Workspace, tiny_models: FixtureSet, tmp_path: Path
) -> None:
    """``install.py --comfyui ~/ComfyUI``: the servers we start (each with a base folder of its own) still
    see that ComfyUI's models and custom nodes, and load the pack that install.py linked there once."""
    user = tmp_path / "ComfyUI"
    user.mkdir()
    for entry in workspace.comfyui_dir.iterdir():
        if entry.name not in ("models", "custom_nodes"):
            (user / entry.name).symlink_to(entry)
    (user / "models" / "loras").mkdir(parents=True)
    shutil.copy(tiny_models.lora, user / "models" / "loras" / "users-own-lora.safetensors")
    (user / "models" / "clip_vision").mkdir()  # a kind LeanVideo's own folders do not list
    shutil.copy(tiny_models.lora, user / "models" / "clip_vision" / "users-clip-vision.safetensors")
    (user / "custom_nodes").mkdir()
    (user / "custom_nodes" / "leanvideo").symlink_to(NODE_PACK_DIR / "leanvideo")  # as install.py links it
    (user / "custom_nodes" / "users_node.py").write_text(
        textwrap.dedent(
            """
            class UsersOwnNode:
                RETURN_TYPES = ()
                FUNCTION = "run"
                CATEGORY = "tests"

                @classmethod
                def INPUT_TYPES(cls):
                    return {"required": {}}

            NODE_CLASS_MAPPINGS = {"UsersOwnNode": UsersOwnNode}
            """
        )
    )
    users = Workspace(root=workspace.root, comfyui_dir=user, python=workspace.python)
    assert users.user_comfyui and users.user_models_dir == user / "models"
    assert users.node_dirs() == (user / "custom_nodes",)  # the pack comes through its link there
    config = ServerConfig.in_workspace(users, tmp_path / "state", cpu=True)
    with ComfyServer(config) as server:
        info = httpx.get(f"{server.url}/object_info", timeout=60).json()
    loras = info["LoraLoaderModelOnly"]["input"]["required"]["lora_name"][0]
    assert "users-own-lora.safetensors" in loras  # the user's models folder
    assert tiny_models.lora.name in loras  # and the workspace's (the tiny models)
    assert "UsersOwnNode" in info and "LeanVideoFreeVRAM" in info
    assert "users-clip-vision.safetensors" in info["CLIPVisionLoader"]["input"]["required"]["clip_name"][0]
    log = config.log_path.read_text(encoding="utf-8", errors="replace")
    assert "IMPORT FAILED" not in log and "Traceback" not in log, log[-3000:]


def test_the_fixtures_know_comfyuis_other_folders_for_their_models() -> None:
    from runner.fixtures import ALIAS_FOLDERS
    from runner.local.server import MODEL_FOLDERS

    for folder, aliases in ALIAS_FOLDERS.items():
        assert sorted(MODEL_FOLDERS[folder]) == sorted((folder, *aliases))


def test_each_kinds_models_folders_are_searched_in_comfyuis_order(workspace: Workspace) -> None:
    """A file under one name in models/unet and models/diffusion_models: the pinned ComfyUI loads the
    one in unet (its folder_paths lists unet first), and so must the servers' and the models check's
    search (MODEL_FOLDERS listed diffusion_models first)."""
    from runner.local.server import MODEL_FOLDERS

    source = (workspace.comfyui_dir / "folder_paths.py").read_text(encoding="utf-8")
    theirs = {
        kind: tuple(re.findall(r'os\.path\.join\(models_dir, "([^"]+)"\)', paths))
        for kind, paths in re.findall(r'^folder_names_and_paths\["(\w+)"\] = \(\[(.*?)\]', source, re.M)
    }
    assert theirs["diffusion_models"] == ("unet", "diffusion_models")  # the reading itself
    compared = [kind for kind in MODEL_FOLDERS if kind in theirs]
    assert {"diffusion_models", "text_encoders", "controlnet"} <= set(compared)
    assert {kind: MODEL_FOLDERS[kind] for kind in compared} == {kind: theirs[kind] for kind in compared}


def test_nodes_that_did_not_import_are_read_from_the_log(tmp_path: Path) -> None:
    """What ComfyUI logs when a built-in node file fails (a damaged tree: it still starts)."""
    log = tmp_path / "comfyui.log"
    log.write_text(
        "WARNING: some comfy_extras/ nodes did not import correctly.\n"
        "IMPORT FAILED: nodes_lt.py\nIMPORT FAILED: nodes_wan.py\n\nThis issue might be caused by …\n",
        encoding="utf-8",
    )
    assert import_failures(log.read_text()) == ["nodes_lt.py", "nodes_wan.py"]
    assert import_failures(read_log(tmp_path / "none.log")) == []


def test_custom_node_packs_that_did_not_import_are_said_with_the_python_that_runs_the_server(
    tmp_path: Path,
) -> None:
    """A pack of the user's ComfyUI whose package is only in that ComfyUI's own venv: the server
    started without its nodes, and `serve` said only "ready" (ComfyUI logs it, the runner hid it)."""
    from runner.local.server_log import custom_node_failures, custom_nodes_warning

    nodes = tmp_path / "ComfyUI" / "custom_nodes"
    for pack in ("user_node", "gguf", "no_requirements"):
        (nodes / pack).mkdir(parents=True)
    for pack in ("user_node", "gguf"):
        (nodes / pack / "requirements.txt").write_text("tabulate\n", encoding="utf-8")
    log = tmp_path / "comfyui.log"
    log.write_text(
        "Traceback (most recent call last):\n  ...\nModuleNotFoundError: No module named 'tabulate'\n\n"
        f"Cannot import {nodes}/user_node module for custom nodes: No module named "
        "'tabulate'\nCannot import /r/custom_nodes/.mypy_cache module for custom nodes: [Errno 2] No "
        "such file\n"
        "\nImport times for custom nodes:\n   0.0 seconds (IMPORT FAILED): "
        f"{nodes}/user_node\n",
        encoding="utf-8",
    )
    assert custom_node_failures(log.read_text()) == {f"{nodes}/user_node": "No module named 'tabulate'"}
    assert import_failures(log.read_text()) == []  # the built-in nodes' own marker is another line
    assert custom_nodes_warning(log.read_text(), Path("/venv/bin/python")) == (
        "started without the custom nodes that did not import: user_node (No module named 'tabulate'). "
        "It runs under /venv/bin/python: install what they need into that Python "
        f"(`/venv/bin/python -m pip install -r {nodes}/user_node/requirements.txt`)"
    )
    # each pack that lists its requirements, and none that lists none: that pip said "Could not open
    # requirements file", and a second pack's file was not named
    with log.open("a", encoding="utf-8") as more:
        for pack in ("no_requirements", "gguf"):
            more.write(f"Cannot import {nodes}/{pack} module for custom nodes: No module named 'x'\n")
    said = custom_nodes_warning(log.read_text(), Path("/venv/bin/python")) or ""
    assert f"-r {nodes}/user_node/requirements.txt -r {nodes}/gguf/requirements.txt`)" in said
    assert "no_requirements (No module named 'x')" in said and "no_requirements/req" not in said
    (nodes / "user_node" / "requirements.txt").unlink()
    (nodes / "gguf" / "requirements.txt").unlink()
    assert (custom_nodes_warning(log.read_text(), Path("/venv/bin/python")) or "").endswith(
        "into that Python"
    )
    assert custom_nodes_warning(read_log(tmp_path / "none.log"), Path("/venv/bin/python")) is None


def test_start_warnings_say_each_kind_from_one_reading_of_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A started server's warnings (built-in nodes, custom packs, the pack's own lines) come from one
    reading of its log, each line naming the server; a server with no log says nothing."""
    from runner.local import server_log

    log = tmp_path / "comfyui.log"
    log.write_text(
        "IMPORT FAILED: nodes_lt.py\n"
        f"Cannot import {tmp_path}/custom_nodes/pack module for custom nodes: No module named 'x'\n"
        "[custom nodes] LeanVideo: node id LeanVideoFreeVRAM is registered by another pack too\n",
        encoding="utf-8",
    )
    read: list[Path] = []
    real = server_log.read_log
    monkeypatch.setattr(server_log, "read_log", lambda path: read.append(path) or real(path))
    said = server_log.start_warnings(log, Path("/venv/bin/python"), "ComfyUI on port 8190")
    assert read == [log]
    assert [line.split(" (")[0].split(":")[0] for line in said] == [
        "ComfyUI on port 8190 started without its nodes from nodes_lt.py",
        "ComfyUI on port 8190 started without the custom nodes that did not import",
        "ComfyUI on port 8190",
    ]
    assert (
        said[2]
        == "ComfyUI on port 8190: LeanVideo: node id LeanVideoFreeVRAM is registered by another pack too"
    )
    assert server_log.start_warnings(tmp_path / "none.log", Path("/venv/bin/python"), "ComfyUI") == []


@pytest.mark.parametrize(
    ("given", "owned"),
    [("--por", "--port"), ("--output-dir=/x", "--output-directory"), ("--temp-dir", "--temp-directory")],
)
def test_a_shortened_runner_flag_after_the_double_dash_is_refused_as_the_whole_one(
    given: str, owned: str
) -> None:
    """ComfyUI's argparse takes a unique start of a long option: ``--output-dir`` put the outputs where
    the run does not collect them, ``--por`` made ComfyUI listen where the runner did not look."""
    with pytest.raises(UsageError, match=f"leanvideo passes {owned} to ComfyUI itself"):
        refuse_owned_flags((given, "1"))
    refuse_owned_flags(("--preview-method", "auto", "--p"))  # another flag, and one too short to tell


def test_stop_needs_only_the_records_not_comfyui(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ComfyUI a background server was started from, moved or gone since (``install.py --comfyui``
    on a folder then renamed): ``stop`` said "not installed" (exit 3) and the server ran on."""
    from runner.cli.main import main

    port = 48_125
    fake = subprocess.Popen(  # a detached ComfyUI, as the records see one
        [sys.executable, "-c", "import time; time.sleep(60)", "main.py", "--port", str(port)],
        start_new_session=True,
    )
    try:
        (tmp_path / "servers" / str(port)).mkdir(parents=True)
        record = {"pid": fake.pid, "port": port, "background": True}
        (tmp_path / "servers" / str(port) / "server.json").write_text(json.dumps(record))
        monkeypatch.setenv("LEANVIDEO_WORKSPACE", str(tmp_path))
        monkeypatch.setenv("LEANVIDEO_COMFYUI", str(tmp_path / "moved-away"))
        assert main(["stop", "--port", str(port)]) == 0
        assert fake.wait(timeout=15) == -15
    finally:
        fake.kill()
