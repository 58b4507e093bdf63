"""Refuse and record every network access off the loopback interface, in the process that imports it.

tests/test_comfy_cli.py puts this folder on ``PYTHONPATH`` for the comfy-cli processes it starts, so
Python imports this module at start-up (``site``) and a test can assert that comfy-cli never phoned
home: each refused host name or address is appended, one per line, to the file named by
``$LEANVIDEO_OFFLINE_LOG``. Audit hooks see every ``socket.connect`` and ``socket.getaddrinfo``, whichever
HTTP library makes them; native code that opens sockets without Python would go unseen.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from typing import Any

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def _is_loopback(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _refuse(log_path: str, host: object) -> None:
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"{host}\n")
    raise ConnectionRefusedError(f"offline guard: refused a network access to {host!r}")


def _make_hook(log_path: str) -> Any:
    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "socket.getaddrinfo" and args[0] is not None and not _is_loopback(args[0]):
            _refuse(log_path, args[0])
        elif event == "socket.connect":
            sock, address = args
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
                _refuse(log_path, address[0])

    return hook


if os.environ.get("LEANVIDEO_OFFLINE_LOG"):
    sys.addaudithook(_make_hook(os.environ["LEANVIDEO_OFFLINE_LOG"]))
