"""ComfyUI server URLs: whether one can address a server, and whether two address the same one.

Example::

    check_server_url("http://127.0.0.1:8188")  # returned as given; a typo is a UsageError
    same_server("http://localhost:8188", "http://127.0.0.1:8188/")  # True: one server, said twice
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from runner.errors import UsageError

__all__ = ["check_server_url", "same_server", "server_key"]

DEFAULT_PORTS = {"http": 80, "https": 443}
# localhost, 127.0.0.1 and ::1: this machine as a server on it is reached (127.0.0.2 is another
# address; a server bound to 127.0.0.1 does not answer there)
LOOPBACK = "loopback"
LOOPBACK_ADDRESSES = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


def check_server_url(url: str) -> str:
    """``url`` when it can address a ComfyUI server (``http(s)://HOST[:PORT]``), else :class:`UsageError`
    saying what is wrong with it (a typo must not cost the retries of an unreachable server). A password
    in it is never said back."""
    shown = _without_password(url)
    if "@" in url.partition("://")[2].partition("/")[0]:  # a user (and password) before the host
        raise UsageError(
            f"server URL {shown!r} holds a user name and password, which would be printed with it and not "
            "reach the websocket: give them as --header 'Authorization: Basic …' (the base64 of "
            "USER:PASSWORD) and the URL without them"
        )
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port out of range or not a number
    except ValueError as exc:
        raise UsageError(f"server URL {shown!r}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise UsageError(f"server must be an http:// or https:// URL, got {shown!r}")
    if not parts.hostname:
        raise UsageError(f"server URL {shown!r} names no host")
    if port == 0:
        raise UsageError(f"server URL {shown!r}: port 0 is no port")
    if parts.query or parts.fragment or url.endswith(("?", "#")):  # every path would be put after it
        raise UsageError(f"server URL {shown!r} has a query or fragment; give http(s)://HOST[:PORT][/PATH]")
    return url


def _without_password(url: str) -> str:
    """``url`` with what stands before an ``@`` in its authority said as ``***`` (a user name may be a
    token; read as text: the URL may not parse)."""
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url
    authority, slash, path = rest.partition("/")
    _user, at, host = authority.rpartition("@")
    if not at:
        return url
    return f"{scheme}://***@{host}{slash}{path}"


def server_key(url: str) -> tuple[str, str, int, str]:
    """What names the server ``url`` (checked by :func:`check_server_url`) addresses, as far as the URL
    tells: scheme, host (``localhost``, ``127.0.0.1`` and ``::1`` taken as one; letter case and IPv6
    spelling ignored; names are not looked up), port (the scheme's default when none is given) and
    path (servers behind one proxy differ by it)."""
    parts = urlsplit(check_server_url(url))
    host = (parts.hostname or "").lower().rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        loopback = host == "localhost"
    else:
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        address = mapped or address
        loopback = address in LOOPBACK_ADDRESSES
        host = str(address)
    port = parts.port or DEFAULT_PORTS[parts.scheme]
    return parts.scheme, LOOPBACK if loopback else host, port, parts.path.rstrip("/")


def same_server(first: str, second: str) -> bool:
    """Whether two server URLs address one server (:func:`server_key`): ``http://localhost:8188`` and
    ``http://127.0.0.1:8188/`` do; names that resolve alike are not looked up."""
    return server_key(first) == server_key(second)
