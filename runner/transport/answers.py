"""What an answer or a failure between the runner and a ComfyUI server means, in words: ComfyUI's
refusal of a workflow (a 400 naming nodes and inputs), and what is not ComfyUI's own: a proxy's
refusal (401/403), its redirect, its gateway error (502/503/504), a certificate the runner does not
trust, a forward proxy named by the environment, a timeout.

Example::

    describe_answer(response, credentials=False)
    # '401 Unauthorized: refused without credentials (a proxy in front of ComfyUI?): give --token, or
    #  --header "NAME: VALUE" (or $LEANVIDEO_TOKEN)'
"""

from __future__ import annotations

import ssl
import urllib.request
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import httpx

from runner.errors import LeanVideoError, ServerError, WorkflowError

__all__ = [
    "GATEWAY_STATUSES",
    "GatewayAnswer",
    "body_text",
    "describe_answer",
    "describe_rejection",
    "failure_text",
    "forward_proxy",
    "rejection",
    "status_reason",
    "tls_problem",
]

# A proxy's answer for a ComfyUI behind it that does not answer (yet), whatever its body (some gateways
# answer JSON): repeated as a cut connection is. ComfyUI itself answers none of them.
GATEWAY_STATUSES = frozenset({502, 503, 504})


class GatewayAnswer(Exception):
    """A proxy in front of ComfyUI answered 502, 503 or 504 for it: the request is repeated as after a
    cut connection (a restart of ComfyUI behind a proxy is seen so, not as a cut)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"answered {response.status_code} {response.reason_phrase}".rstrip())
        self.response = response


def describe_answer(response: httpx.Response, *, credentials: bool, server: str | None = None) -> str:
    """``response``'s status and what it means, for an answer the caller did not expect: who refused
    and what to give (``credentials``: whether a token or header went with the request), where a
    redirect points (as a URL to give instead of ``server``), a gateway's answer, or the start of the
    body."""
    status = f"{response.status_code} {response.reason_phrase}".rstrip()
    code = response.status_code
    if code in (401, 403, 407):
        if credentials:
            return (
                f"{status}: the token or headers given were refused (a proxy in front of ComfyUI?): "
                "check --token / --header (or $LEANVIDEO_TOKEN)"
            )
        return (
            f"{status}: refused without credentials (a proxy in front of ComfyUI?): give --token, or "
            "--header 'NAME: VALUE' (or $LEANVIDEO_TOKEN)"
        )
    if 300 <= code < 400 and (location := response.headers.get("location")):
        target = _server_of(str(response.request.url), str(response.url.join(location)), server)
        return (
            f"{status}: it redirects to {target}: give that as the server URL (requests are not "
            "redirected, so that no token goes where it was not given)"
        )
    if code in GATEWAY_STATUSES:
        return (
            f"{status} from a proxy in front of ComfyUI: ComfyUI behind it does not answer (down, "
            "starting or restarting?)"
        )
    return f"{status}: {body_text(response)}" if response.content else status


def _server_of(asked: str, location: str, server: str | None) -> str:
    """The server URL a redirect of request ``asked`` to ``location`` stands for: the location less the
    path the request added to the server URL ``server`` (``/object_info``), when it ends so."""
    asked_path = urlsplit(asked).path
    base_path = urlsplit(server).path.rstrip("/") if server else ""
    added = asked_path[len(base_path) :] if asked_path.startswith(base_path) else asked_path
    target = urlsplit(location)
    if added and target.path.endswith(added):
        return f"{target.scheme}://{target.netloc}{target.path[: -len(added)]}"
    return location


def tls_problem(error: BaseException, url: str) -> str | None:
    """What to say when ``error`` (or what caused it) is a TLS failure that asking again does not
    change: a certificate the runner does not trust for ``url``, or a server that answers plain HTTP to
    an ``https://`` URL; None for any other error."""
    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and all(cause is not seen for seen in chain):
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any("WRONG_VERSION_NUMBER" in str(c) for c in chain):  # TLS spoken to a plain HTTP server
        plain = "http://" + url.partition("://")[2]
        return f"it answers plain HTTP, not HTTPS: give {plain}"
    verified = [c for c in chain if isinstance(c, ssl.SSLCertVerificationError)]
    if not verified and not any("CERTIFICATE_VERIFY_FAILED" in str(c) for c in chain):
        return None
    why = (getattr(verified[0], "verify_message", None) if verified else None) or "certificate verify failed"
    host = urlsplit(url).netloc.rpartition("@")[2]
    return (
        f"the certificate of {host} is not trusted ({why}): give the CA that signed it as a PEM file with "
        "SSL_CERT_FILE=/path/to/ca.pem (or a hashed folder with SSL_CERT_DIR)"
    )


def forward_proxy(url: str) -> str | None:
    """The forward proxy the environment (``$https_proxy``, ``$http_proxy``, ``$all_proxy``) sends
    requests to ``url`` through, unless ``$no_proxy`` exempts its host; None when there is none."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    exempt = urllib.request.proxy_bypass_environment(parts.hostname or "")  # type: ignore[attr-defined]
    if not proxy or exempt:
        return None
    shown = urlsplit(proxy)
    return shown._replace(netloc=shown.netloc.rpartition("@")[2]).geturl()  # never its password


def rejection(response: httpx.Response) -> LeanVideoError:
    """The error a 400 answer of ``POST /prompt`` stands for: ComfyUI's report of the workflow's faults,
    or, when the answer is something else (a proxy's or firewall's page), the server error it is."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return WorkflowError(describe_rejection(body))
    return ServerError(
        f"POST /prompt answered 400 without ComfyUI's report of the workflow (a proxy in between?): "
        f"{body_text(response)}"
    )


def describe_rejection(body: dict[str, Any]) -> str:
    """One readable message from a 400 answer of ``POST /prompt``, naming nodes and inputs."""
    error = body.get("error", {})
    lines = [f"server rejected the workflow: {error.get('message', 'unknown error')}"]
    if error.get("details"):
        lines[0] += f" ({error['details']})"
    for node_id, node in body.get("node_errors", {}).items():
        for item in node.get("errors", []):
            name = item.get("extra_info", {}).get("input_name", "")
            where = f"node {node_id} ({node.get('class_type', '?')})" + (f" input {name!r}" if name else "")
            lines.append(f"  {where}: {item.get('message', '')} {item.get('details', '')}".rstrip())
    return "\n".join(lines)


def status_reason(code: int) -> str:
    try:
        return f" {HTTPStatus(code).phrase}"
    except ValueError:
        return ""


def body_text(response: httpx.Response) -> str:
    """The start of an unexpected answer, or what it is when it is a web page rather than ComfyUI's."""
    if "html" in response.headers.get("content-type", ""):
        return "a web page, not ComfyUI's API (is this URL a ComfyUI server?)"
    return response.text[:200]


def failure_text(error: Exception) -> str:
    """What a failed request met, in words; a timeout says how long was waited and what it suggests."""
    if not isinstance(error, httpx.TimeoutException):
        return str(error)
    try:
        waited = error.request.extensions.get("timeout", {}).get("read")
    except RuntimeError:  # an exception raised without its request
        waited = None
    within = f" within {waited:.3g} s" if isinstance(waited, (int, float)) else ""  # 9.97, not 9.97081
    if isinstance(error, httpx.ConnectTimeout):
        return f"the connection was not taken{within} (a wrong address, or a firewall dropping it?)"
    return f"it took the connection but did not answer{within} (a hung or paused server?)"
