"""``leanvideo serve`` and ``leanvideo stop``: the pinned ComfyUI with the node pack, in the foreground
or in the background, and stopping the background ones.

Example::

    leanvideo serve --port 8188 --background -- --async-offload
    leanvideo stop --port 8188
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import Any

from rich.console import Console

from runner.cli.server_options import (
    check_int8_kernel_variable,
    existing_folder,
    listen_host,
    port_number,
    positive_seconds,
    warn_if_not_pinned,
)
from runner.local.background import find_running_servers, stop_background_server
from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import default_workspace_root, find_workspace

DEFAULT_PORT = 8188


def add_serve_parsers(sub: Any) -> None:
    """The ``serve`` and ``stop`` sub-commands."""
    serve = sub.add_parser(
        "serve",
        help="start the pinned ComfyUI with the LeanVideo node pack",
        description="Start ComfyUI with the node pack. ComfyUI flags after `--` pass through unchanged, "
        "e.g. `leanvideo serve -- --async-offload`.",
        epilog="exit codes: 0 ready (--background) or stopped with Ctrl-C/SIGTERM, 2 usage (also a --port "
        "in use), 3 not installed, 4 the server did not start, or exited with an error, 130 interrupted "
        "while it started",
    )
    serve.add_argument(
        "--port", type=port_number, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})"
    )
    serve.add_argument(
        "--host", type=listen_host, default="127.0.0.1", help="address to listen on (default loopback only)"
    )
    serve.add_argument(
        "--background", action="store_true", help="return once ready; stop with `leanvideo stop`"
    )
    serve.add_argument(
        "--models",
        type=existing_folder,
        help="models folder: checkpoints/, loras/, … (default <workspace>/models)",
    )
    serve.add_argument(
        "--fixture-nodes",
        action="store_true",
        help="also load the tiny-model helper nodes (for tiny workflows)",
    )
    serve.add_argument(
        "--ready-timeout", type=positive_seconds, default=120.0, help="seconds to wait for readiness"
    )

    stop = sub.add_parser(
        "stop",
        help="stop servers started with `serve --background`",
        description="Stop servers started with `serve --background` (not those a running command owns).",
        epilog="exit codes: 0 stopped (or none running); it needs only the servers' records, not ComfyUI",
    )
    stop.add_argument("--port", type=port_number, help="only the server on this port (default: all of them)")


def run_serve_command(args: argparse.Namespace, passthrough: tuple[str, ...], console: Console) -> int:
    """``leanvideo serve``: start ComfyUI (``passthrough``: its own flags) and wait for it unless
    ``--background``; returns the exit code."""
    check_int8_kernel_variable(os.environ)
    ws = find_workspace()
    warn_if_not_pinned(ws)
    config = replace(
        ServerConfig.in_workspace(
            ws,
            ws.servers_dir / str(args.port),
            port=args.port,
            fixture_nodes=args.fixture_nodes,
            extra_args=passthrough,
        ),
        models_dir=(args.models or ws.models_dir).resolve(),
        host=args.host,
        ready_timeout=args.ready_timeout,
    )
    server = ComfyServer(config, detach=args.background)
    server.start()
    console.print(f"ComfyUI ready at {server.url} (pid {server.pid}, log {server.log_path})", highlight=False)
    if args.background:
        console.print(f"stop it with: leanvideo stop --port {args.port}")
        return 0

    try:  # Ctrl-C and SIGTERM (stop_signals) both stop it
        code = server.wait()
    except KeyboardInterrupt:
        console.print("stopping…")
        server.stop()
        return 0
    console.print(f"ComfyUI exited with code {code}; see {server.log_path}")
    return 0 if code == 0 else 4


def run_stop_command(args: argparse.Namespace, console: Console) -> int:
    """``leanvideo stop``: stop the ``serve --background`` servers (of ``--port``); returns the exit code.
    It needs only their records: a ComfyUI folder gone or moved since they started does not keep them
    running (``find_workspace`` would refuse, exit 3)."""
    servers_dir = default_workspace_root() / "servers"
    records = [r for r in find_running_servers(servers_dir) if args.port in (None, r["port"])]
    if not records:
        where = f" on port {args.port}" if args.port else ""
        console.print(f"no server started with `serve --background` runs{where}", highlight=False)
        for owned in find_running_servers(servers_dir, owned=True):
            if args.port in (None, owned["port"]):
                console.print(
                    f"ComfyUI on port {owned['port']} belongs to a running command (serve in the foreground, "
                    "demo, bench or a script) and stops with it",
                    highlight=False,
                )
        return 0
    for record in records:
        stop_background_server(record)
        console.print(f"stopped ComfyUI on port {record['port']} (pid {record['pid']})")
    return 0
