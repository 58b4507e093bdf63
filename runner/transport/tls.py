"""The certificates an HTTPS server (a proxy in front of ComfyUI) is checked against, one set for HTTP
requests and the websocket alike.

httpx checks against certifi's list, or against ``$SSL_CERT_FILE`` alone when it is set, and never reads
``$SSL_CERT_DIR``; the websocket library checks against the system's, as OpenSSL finds them (both
variables read). So a private CA given in ``$SSL_CERT_DIR`` on a machine that sets ``$SSL_CERT_FILE`` (a
container or Nix image) was trusted by the websocket and refused by every request. Here the set is all
of them: the system's, certifi's, and what the two variables name.

Example::

    context = trust_context()
    httpx.Client(verify=context)
    websocket.create_connection("wss://…", sslopt={"context": context})
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping

import certifi

from runner.errors import UsageError

__all__ = ["trust_context"]


def trust_context(environ: Mapping[str, str] | None = None) -> ssl.SSLContext:
    """A client context trusting the system's certificates, certifi's, and those ``$SSL_CERT_FILE`` (a
    PEM file) and ``$SSL_CERT_DIR`` (a hashed folder) name; a variable naming nothing there is a
    :class:`UsageError` (OpenSSL passed over it in silence)."""
    environ = os.environ if environ is None else environ
    context = ssl.create_default_context()  # the system's, as OpenSSL finds them
    context.load_verify_locations(cafile=certifi.where())
    for variable, kind in (("SSL_CERT_FILE", "cafile"), ("SSL_CERT_DIR", "capath")):
        if not (value := environ.get(variable)):
            continue
        wanted = os.path.isfile if kind == "cafile" else os.path.isdir
        if not wanted(value):
            what = "PEM file" if kind == "cafile" else "folder"
            raise UsageError(f"{variable}={value}: no such {what}; give the CA's {what}, or unset it")
        try:
            context.load_verify_locations(**{kind: value})
        except (ssl.SSLError, OSError) as exc:
            raise UsageError(f"{variable}={value}: its certificates cannot be read ({exc})") from None
    return context
