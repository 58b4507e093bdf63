"""Where a bench's servers come from: one it starts per set of launch flags (the tiny models written
first when the matrix uses them), each with its state folder under ``OUT/servers`` (its output folder
emptied once it stopped: the runs' files are in ``OUT/runs``), or the running servers given with
``--server``.

Example::

    with open_server(matrix, settings, ("--async-offload",), out, print) as (url, why_not):
        ...  # url None: why_not says why there is no server for these flags
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.matrix import Matrix, variant_slug
from runner.fixtures import write_fixtures
from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import find_workspace

if TYPE_CHECKING:
    from benchmarks.harness import BenchSettings


def server_state_dir(out: Path, server_args: tuple[str, ...]) -> Path:
    """Where the bench's server for ``server_args`` keeps its files (``comfyui.log`` among them)."""
    return out / "servers" / (variant_slug(" ".join(server_args)) if server_args else "default")


def not_with_server(server_args: tuple[str, ...]) -> str:
    """Why a group of variants needing server flags does not run on servers given with ``--server``."""
    return f"needs server flags {' '.join(server_args)} (not with --server)"


@contextlib.contextmanager
def open_server(
    matrix: Matrix,
    settings: BenchSettings,
    server_args: tuple[str, ...],
    out: Path,
    say: Callable[[str], None],
) -> Iterator[tuple[str | None, str]]:
    """``(url, "")`` of a server for ``server_args``, or ``(None, reason)`` when there can be none."""
    if settings.servers:
        if server_args:
            yield None, not_with_server(server_args)
        else:
            yield settings.servers[0], ""
        return
    workspace = find_workspace()
    if matrix.fixtures:
        write_fixtures(
            workspace.models_dir,
            workspace.comfyui_dir,
            python=workspace.python,
            searched_first=workspace.user_models_dir,  # a model of yours there: it would run instead
        )
    config = ServerConfig.in_workspace(
        workspace,
        server_state_dir(out, server_args),
        port=settings.port,
        fixture_nodes=matrix.fixtures,
        extra_args=server_args,
    )
    say(f"starting ComfyUI{' with ' + ' '.join(server_args) if server_args else ''} on port {config.port}")
    try:
        with ComfyServer(config) as server:
            yield server.url, ""
    finally:  # its runs' files are in OUT/runs: not a second copy of each
        shutil.rmtree(config.output_dir, ignore_errors=True)
