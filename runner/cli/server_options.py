"""Command-line options shared by the commands that talk to a running server (``run``, ``workflow``)."""

from __future__ import annotations

import argparse
import errno
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from runner.errors import UsageError, WorkflowError
from runner.graph.workflow import parse_override
from runner.install.pin import pin_mismatch
from runner.jobs.run import RunOptions
from runner.local.ports import bind_error
from runner.local.workspace import Workspace
from runner.transport.client import DEFAULT_SERVER
from runner.transport.retry import DEFAULT_RETRIES
from runner.transport.server_url import check_server_url, same_server


class UsageExit(SystemExit):
    """Exit 2 for arguments that cannot be used, said on stderr as argparse says it; ``message`` is kept
    so that ``--json`` can print it as the error object too."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors raise :class:`UsageExit` (its sub-parsers are of this class
    too)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise UsageExit(message)


def _usage_error(message: str) -> NoReturn:
    """Exit 2 the way argparse does for a bad argument."""
    sys.stderr.write(f"leanvideo: error: {message}\n")
    raise UsageExit(message)


def port_number(text: str) -> int:
    """A TCP port from the command line (1-65535), or argparse's usage error."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1-65535)")
    return port


def listen_host(text: str) -> str:
    """An address this machine can listen on (``--host``), or argparse's usage error naming it (an empty
    one too: binding to "" works, but ComfyUI then listens nowhere)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "an empty address (a variable that is not set?); give one, e.g. 127.0.0.1"
        )
    error = bind_error(text, 0)  # port 0: any free one, so only the address is tried
    if error is not None and error.errno != errno.EADDRINUSE:
        raise argparse.ArgumentTypeError(f"cannot listen on {text!r}: {error.strerror or error}")
    return text


N = TypeVar("N", int, float)


def number_type(kind: type[N], what: str, *, least: N, rule: str) -> Callable[[str], N]:
    """An argparse ``type``: a finite ``kind`` (``what`` it is, for the error) that is ``least`` or more,
    else argparse's usage error saying ``rule``."""

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
        if not math.isfinite(value) or value < least:
            raise argparse.ArgumentTypeError(f"{text}: must be {rule}")
        return value

    return parse


positive_seconds = number_type(float, "number of seconds", least=1e-9, rule="a positive number of seconds")


def server_url(text: str) -> str:
    """A ComfyUI server URL from the command line (``http(s)://HOST[:PORT]``), without a trailing ``/``
    (``…:8188/`` and ``…:8188`` are one server), or argparse's usage error."""
    try:
        trimmed = text.rstrip("/")
        return check_server_url(trimmed if "://" in trimmed else text)  # "http://" is said as given
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class AppendServer(argparse.Action):
    """``--server`` repeated: each URL once; one given twice is a usage error naming it (one server would
    get the jobs or runs of two)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        urls = list(getattr(namespace, self.dest, None) or [])
        earlier = next((url for url in urls if same_server(url, values)), None)
        if earlier is not None:  # the same URL, or localhost and 127.0.0.1, a default port written out, …
            one = f"{values} is" if earlier == values else f"{earlier} and {values} are one server,"
            raise argparse.ArgumentError(self, f"{one} given twice: list each server once")
        setattr(namespace, self.dest, [*urls, values])


class OneServer(argparse.Action):
    """``--server`` of a command that talks to one server: given twice is a usage error (the last one
    would win in silence, and a user listing two may think both are used)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given = f"_{self.dest}_given"
        if (earlier := getattr(namespace, given, None)) is not None:
            raise argparse.ArgumentError(
                self, f"given twice ({earlier}, then {values}): this command talks to one server"
            )
        setattr(namespace, given, values)
        setattr(namespace, self.dest, values)


def given_path(text: str) -> Path:
    """A path from the command line (``--out``); an empty one (``--out "$UNSET"``) is argparse's usage
    error, not the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (a variable that is not set?); give one")
    return Path(text)


def existing_folder(text: str) -> Path:
    """A folder that exists, from the command line (``--models``), or argparse's usage error (an empty
    one too: not the current folder)."""
    path = given_path(text)
    if not path.is_dir():
        problem = "a file, not a folder" if path.exists() else "no such folder"
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return path


def override_spec(text: str) -> str:
    """A ``--set NODE.input=VALUE`` of the right form (the node and input are checked later, against the
    workflow), or argparse's usage error."""
    try:
        parse_override(text)
    except WorkflowError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--set ")) from None
    return text


_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


# How a request is framed and routed: the HTTP client sets these for each request, a given one breaks it
_FRAMING_HEADERS = frozenset(
    {
        "content-length",
        "transfer-encoding",
        "connection",
        "host",
        "upgrade",
        "keep-alive",
        "te",
        "trailer",
        "expect",
    }
)


def header_value(text: str) -> str:
    """An extra HTTP header ``NAME: VALUE`` (ASCII), or argparse's usage error, which names the header
    but never says its value (a key or password would go into logs)."""
    name, colon, value = text.partition(":")
    if not colon or not name.strip():
        raise argparse.ArgumentTypeError(
            "expected 'NAME: VALUE' (what was given is not shown: it may be a secret)"
        )
    shown = f"header {name.strip()!r}" if name.strip().isascii() else "a header"
    if not text.isascii():
        raise argparse.ArgumentTypeError(f"{shown}: HTTP headers carry ASCII only")
    if not set(name.strip()) <= _TOKEN_CHARS:
        raise argparse.ArgumentTypeError(f"{shown}: a header name is letters, digits and !#$%&'*+-.^_`|~")
    if control := _control_character(value):
        raise argparse.ArgumentTypeError(f"{shown}: its value cannot hold {control}")
    if name.strip().lower() in _FRAMING_HEADERS:
        raise argparse.ArgumentTypeError(f"{shown} is set by the HTTP client for each request; leave it out")
    return text


def _control_character(text: str) -> str | None:
    """How the first control character of ``text`` is said (a line break would end the header), or None."""
    for char in text:
        if char != "\t" and (ord(char) < 0x20 or ord(char) == 0x7F):
            return {"\n": "a line break (\\n)", "\r": "a carriage return (\\r)"}.get(
                char, f"control character {char!r}"
            )
    return None


retry_count = number_type(int, "number of retries", least=0, rule="0 or more")


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        type=server_url,
        action=OneServer,
        default=os.environ.get("LEANVIDEO_SERVER", DEFAULT_SERVER),
        help=f"ComfyUI URL (default $LEANVIDEO_SERVER or {DEFAULT_SERVER})",
    )
    add_auth_arguments(parser)
    parser.add_argument(
        "--retries",
        type=retry_count,
        default=DEFAULT_RETRIES,
        metavar="N",
        help=f"repeat a request the network cut up to N times, with growing jittered waits "
        f"(default {DEFAULT_RETRIES}); a prompt is never submitted twice",
    )


def add_auth_arguments(parser: argparse.ArgumentParser, *, where: str = "") -> None:
    """``--token`` and ``--header``, for servers behind an authenticating proxy (``where``: which
    servers get them, said in the help); ``$LEANVIDEO_TOKEN`` is read by :func:`given_token`."""
    parser.add_argument(
        "--token",
        help=f"bearer token for a proxy{where}, sent as 'Authorization: Bearer TOKEN' (default "
        "$LEANVIDEO_TOKEN, unless --header gives an Authorization header)",
    )
    parser.add_argument(
        "--header",
        action="append",
        type=header_value,
        default=[],
        metavar="'NAME: VALUE'",
        help=f"extra HTTP header for a proxy{where} (repeatable)",
    )


def _checked_headers(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """``--header``'s (name, value) pairs (each checked by :func:`header_value`)."""
    headers: list[tuple[str, str]] = []
    for value in args.header:  # checked by header_value
        name, _, content = value.partition(":")
        if any(name.strip().lower() == given.lower() for given, _ in headers):  # names know no case
            _usage_error(f"--header {name.strip()!r} is given twice: give it once")
        headers.append((name.strip(), content.strip()))
    return tuple(headers)


def request_headers(args: argparse.Namespace) -> dict[str, str]:
    """The headers of every request to the command's servers: ``--header``'s, and ``--token`` (or
    ``$LEANVIDEO_TOKEN`` when no Authorization header is given: :func:`given_token`) as
    ``Authorization: Bearer``, as :class:`ComfyClient` sends its ``token``; a header or token that
    cannot be sent is a usage error (2).

    Example::

        request_headers(parser.parse_args(["--token", "t", "--header", "X-Api-Key: k"]))
        # {"X-Api-Key": "k", "Authorization": "Bearer t"}
    """
    headers = _checked_headers(args)
    token = given_token(args.token, headers, os.environ)
    return dict(headers) | ({"Authorization": f"Bearer {token}"} if token else {})


def run_options(args: argparse.Namespace, **settings: Any) -> RunOptions:
    """RunOptions from the shared server arguments; a bad URL, header or timeout is a usage error (2)."""
    headers = tuple(request_headers(args).items())  # the token among them, as Authorization
    try:
        return RunOptions(server=args.server, headers=headers, retries=args.retries, **settings)
    except ValueError as exc:
        _usage_error(str(exc))


TOKEN_VARIABLE = "LEANVIDEO_TOKEN"


def given_token(
    token: str | None, headers: Sequence[tuple[str, str]], environ: Mapping[str, str]
) -> str | None:
    """The bearer token to send: ``--token``, else ``$LEANVIDEO_TOKEN`` unless an Authorization header
    is given (the header given on the command line wins over the environment's default); a usage error
    (exit 2) for ``--token`` beside an Authorization header, or a token that cannot be a header value."""
    authorization = any(name.lower() == "authorization" for name, _ in headers)
    if token is not None and authorization:
        _usage_error("--token and --header 'Authorization: …' both set the Authorization header: give one")
    where = "--token"
    if token is None and not authorization and environ.get(TOKEN_VARIABLE):
        token, where = environ[TOKEN_VARIABLE], f"${TOKEN_VARIABLE}"
    if token is not None and not token.isascii():
        _usage_error(f"{where}: HTTP headers carry ASCII only")
    if token is not None and (control := _control_character(token)):
        _usage_error(f"{where} holds {control}: give the token alone")
    return token


# What LEANVIDEO_INT8_KERNEL may hold: the INT8 loaders' path choices (leanvideo.int8.linear.MATMUL_ROUTES,
# which imports torch; a test keeps the two alike)
INT8_KERNEL_VARIABLE = "LEANVIDEO_INT8_KERNEL"
INT8_KERNEL_CHOICES = ("auto", "w8a16", "int_mm", "int_mm_fused", "kitchen", "onednn", "w8a8")


def check_int8_kernel_variable(environ: Mapping[str, str]) -> None:
    """Refuse to start servers under a ``LEANVIDEO_INT8_KERNEL`` that names no kernel: every INT8 loader
    with ``path=auto`` would refuse to load, each prompt blamed on a node whose inputs are fine."""
    value = environ.get(INT8_KERNEL_VARIABLE, "").strip()
    if value and value not in INT8_KERNEL_CHOICES:
        raise UsageError(
            f"{INT8_KERNEL_VARIABLE}={value!r} is not one of {', '.join(INT8_KERNEL_CHOICES)}: the servers' "
            "INT8 loaders would refuse to load; unset it, or give one of those"
        )


def warn_if_not_pinned(workspace: Workspace) -> None:
    """Say, as a server of it starts, that the user's own ComfyUI is not the pinned version (the
    workspace's own is checked by install.py on every run)."""
    if workspace.user_comfyui and (mismatch := pin_mismatch(workspace.comfyui_dir)) is not None:
        logging.getLogger(__name__).warning("%s", mismatch)
