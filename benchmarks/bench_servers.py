"""Where a bench's servers come from: one it starts per set of launch flags (the tiny models written
first when the matrix uses them), each with its state folder under ``OUT/servers`` (its output folder
emptied once it stopped: the runs' files are in ``OUT/runs``), or the running servers given with
``--server``: each set of launch flags goes to the given servers launched with those flags and none of
the other variants' (read from their ``/system_stats`` argv), first given first.

Example::

    placed = place_groups([(), ("--async-offload",)], given_server_flags(settings.servers))
    with open_server(matrix, settings, ("--async-offload",), out, print, placed) as (url, why_not):
        ...  # url None: why_not says why there is no server for these flags
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.matrix import Matrix, Variant, variant_slug
from runner.errors import WorkspaceError
from runner.fixtures import write_fixtures
from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import find_workspace
from runner.transport.client import ComfyClient

if TYPE_CHECKING:
    from benchmarks.harness import BenchSettings


def server_state_dir(out: Path, server_args: tuple[str, ...]) -> Path:
    """Where the bench's server for ``server_args`` keeps its files (``comfyui.log`` among them)."""
    return out / "servers" / (variant_slug(" ".join(server_args)) if server_args else "default")


def server_groups(variants: Sequence[Variant]) -> Iterator[tuple[tuple[str, ...], list[Variant]]]:
    """Variants per launch-flag set, sets in order of first appearance: one server start per set."""
    groups: dict[tuple[str, ...], list[Variant]] = {}
    for variant in variants:
        groups.setdefault(variant.server_args, []).append(variant)
    yield from groups.items()


# Each launch-flag set's given servers (first given first), or why none of them fits
Placement = Mapping[tuple[str, ...], "tuple[str, ...] | str"]


def given_server_flags(
    servers: Sequence[str], headers: Mapping[str, str] | None = None
) -> dict[str, tuple[str, ...]]:
    """The launch flags of each server given with ``--server``: its ``/system_stats`` argv, less the
    script (``main.py``); ``headers`` go with the requests."""
    flags: dict[str, tuple[str, ...]] = {}
    for url in servers:
        with ComfyClient(url, headers=headers) as client:
            stats = client.get_json("/system_stats")
        system = stats.get("system") if isinstance(stats, dict) else None
        argv = system.get("argv") if isinstance(system, dict) else None  # a proxy's odd answer: no flags
        flags[url] = tuple(str(arg) for arg in argv[1:]) if isinstance(argv, list) else ()
    return flags


def place_groups(
    groups: Sequence[tuple[str, ...]], given: Mapping[str, tuple[str, ...]], known: Collection[str] = ()
) -> Placement:
    """For each variants' launch-flag set of ``groups``, the servers of ``given`` (url -> launch flags)
    launched with those flags and with no other flag of ``groups`` (a baseline timed on a server with
    ``--async-offload`` is no baseline), or why there is none. ``known``: ComfyUI's long flags
    (:func:`comfy_flags`), to read an abbreviated one as its argparse does."""
    relevant = set().union(*(_flag_names(group) for group in groups))
    launched = {url: _unabbreviated(_split(flags), set(known)) for url, flags in given.items()}
    placed: dict[tuple[str, ...], tuple[str, ...] | str] = {}
    for group in groups:
        wanted = _split(group)
        placed[group] = tuple(
            url
            for url, flags in launched.items()
            if _flag_names(flags) & relevant == _flag_names(group) and _holds(flags, wanted)
        ) or _none_fits(group, relevant)
    return placed


def comfy_flags() -> frozenset[str]:
    """The long flags of the pinned ComfyUI's command line (its ``comfy/cli_args.py``); none where it
    cannot be read (then no flag is taken as an abbreviation)."""
    try:
        text = (find_workspace().comfyui_dir / "comfy" / "cli_args.py").read_text(encoding="utf-8")
    except (OSError, WorkspaceError):
        return frozenset()
    return frozenset(re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', text))


def _unabbreviated(args: tuple[str, ...], known: set[str]) -> tuple[str, ...]:
    """``args`` with a flag abbreviated as argparse takes it (``--async-off``) written out: one that is
    no flag of ``known`` and starts exactly one (ComfyUI refuses an ambiguous one)."""

    def whole(arg: str) -> str:
        name, equals, value = arg.partition("=")
        if not name.startswith("--") or name in known:
            return arg
        matches = [flag for flag in known if flag.startswith(name)]
        return f"{matches[0]}{equals}{value}" if len(matches) == 1 else arg

    return tuple(whole(arg) for arg in args)


def _none_fits(group: tuple[str, ...], relevant: set[str]) -> str:
    """Why no given server runs the variants launched with ``group``."""
    if group:
        return f"needs server flags {' '.join(group)} (no --server was launched with them)"
    return f"needs a server launched without {', '.join(sorted(relevant))} (every --server has one)"


def _split(args: Sequence[str]) -> tuple[str, ...]:
    """``--a=b`` as ``--a b``, as argparse reads them."""
    return tuple(part for arg in args for part in (arg.split("=", 1) if arg.startswith("--") else [arg]))


def _flag_names(args: Sequence[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}


def _holds(args: tuple[str, ...], wanted: tuple[str, ...]) -> bool:
    """Whether ``wanted`` (a flag and its values) is a run of ``args`` not followed by a value of its
    own (``--async-offload 1`` is one stream, not ``--async-offload``'s two)."""
    n = len(wanted)
    return any(
        args[i : i + n] == wanted and (i + n == len(args) or args[i + n].startswith("-"))
        for i in range(len(args) - n + 1)
    )


@contextlib.contextmanager
def open_server(
    matrix: Matrix,
    settings: BenchSettings,
    server_args: tuple[str, ...],
    out: Path,
    say: Callable[[str], None],
    placed: Placement,
) -> Iterator[tuple[str | None, str]]:
    """``(url, "")`` of a server for ``server_args``, or ``(None, reason)`` when there can be none;
    with ``--server``, the first of ``placed``'s servers for them."""
    if settings.servers:
        fits = placed.get(server_args) or _none_fits(server_args, set())
        yield (None, fits) if isinstance(fits, str) else (fits[0], "")
        return
    workspace = find_workspace()
    if matrix.fixtures:
        write_fixtures(
            workspace.models_dir,
            workspace.comfyui_dir,
            python=workspace.python,
            searched_first=workspace.user_models_dir,  # a model of yours there: it would run instead
            searched_extra=workspace.extra_model_folders,
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
