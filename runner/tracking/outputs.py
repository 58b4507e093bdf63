"""Download every file a prompt produced, check it, hash it, and probe videos with PyAV.

Files listed under ``images``, ``gifs``, ``videos`` and ``audio`` in a history entry are fetched through
``GET /view`` into one folder per run. Names are kept; a second file of the same name (another subfolder
on the server) gets a ``_1``, ``_2``… suffix, and nothing that exists is ever overwritten. A file listed
twice (the same type, subfolder and name) is downloaded once.

Example::

    files = download_outputs(client, result.outputs, Path("leanvideo-out/run-1"))
    for f in files:
        print(f.path, f.bytes, f.sha256, f.video)
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx

from runner.errors import OutputWriteError, ServerError
from runner.install.pin import sha256_file
from runner.transport.answers import GATEWAY_STATUSES, GatewayAnswer
from runner.transport.client import ComfyClient

logger = logging.getLogger(__name__)

OUTPUT_KEYS = ("images", "gifs", "videos", "audio")
VIDEO_SUFFIXES = {".mp4", ".webm", ".mkv", ".mov", ".avi", ".gif"}


@dataclass(frozen=True)
class VideoInfo:
    """What PyAV reads from a video file's first video stream."""

    frames: int
    width: int
    height: int
    fps: float | None
    codec: str
    duration_s: float | None


@dataclass(frozen=True)
class OutputFile:
    """One downloaded output file."""

    node_id: str
    kind: str
    server_name: str
    subfolder: str
    type: str
    path: Path
    bytes: int
    sha256: str
    video: VideoInfo | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["path"] = str(self.path)
        return data


def list_output_items(outputs: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(node_id, kind, item)`` for every file under the output keys, each file once."""
    seen: set[tuple[str, str, str]] = set()
    found: list[tuple[str, str, dict[str, Any]]] = []
    for node_id, output in outputs.items():
        if not isinstance(output, dict):
            continue
        for kind in OUTPUT_KEYS:
            for item in output.get(kind) or []:
                if not isinstance(item, dict) or not isinstance(item.get("filename"), str):
                    continue
                key = (str(item.get("type", "output")), str(item.get("subfolder", "")), item["filename"])
                if key not in seen:
                    seen.add(key)
                    found.append((str(node_id), kind, item))
    return found


def free_path(folder: Path, name: str) -> Path:
    """``folder/name``, or ``folder/stem_N.suffix`` with the first N that does not exist yet."""
    candidate = folder / name
    stem, suffix = Path(name).stem, Path(name).suffix
    number = 1
    while candidate.exists():
        candidate = folder / f"{stem}_{number}{suffix}"
        number += 1
    return candidate


def download_to(client: ComfyClient, item: dict[str, Any], target: Path) -> int:
    """Stream one output file to ``target`` (created exclusively); returns its size in bytes.

    A download the network cuts (before or in the middle of the body, or short of ``Content-Length``)
    is started again from the first byte as the client's retry policy allows.

    Raises:
        FileExistsError: ``target`` exists (it is never overwritten).
        ServerError: ``/view`` answered an error, or the download failed after every retry.
    """
    name = item["filename"]

    def fail(error: Exception, attempts: int) -> ServerError:
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        if isinstance(error, GatewayAnswer):
            said = client.describe(error.response)
            return ServerError(
                f"GET {client.base_url}/view for {name!r}{tries} answered {said}",
                status=error.response.status_code,
            )
        return ServerError(f"download of {name!r} from {client.base_url} failed{tries}: {error}")

    return client.retrying(
        f"GET /view {name!r}",
        lambda: _stream_to(client, item, target),
        (httpx.TransportError, _ShortRead, GatewayAnswer),
        fail,
        retry_timeouts=True,  # a stalled download (a paused server) comes back: the prompt's work is done
    )


class _ShortRead(Exception):
    """The body ended before ``Content-Length`` bytes (a cut the server did not report)."""


def _stream_to(client: ComfyClient, item: dict[str, Any], target: Path) -> int:
    """One attempt; a cut or short body, or a file that cannot be written, removes what it wrote."""
    try:
        return _stream_once(client, item, target)
    except (httpx.TransportError, _ShortRead, GatewayAnswer):
        target.unlink(missing_ok=True)
        raise
    except FileExistsError:  # the name was taken meanwhile: nothing of ours to remove
        raise
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM mid-download: no cut-off file under the output's name
        target.unlink(missing_ok=True)
        raise
    except OSError as exc:  # the disk filled up, the folder turned read-only
        target.unlink(missing_ok=True)
        where = f"{item.get('subfolder')}/" if item.get("subfolder") else ""
        raise OutputWriteError(
            f"cannot write {target} ({exc.strerror or type(exc).__name__}); the file is still in the "
            f"server's {item.get('type', 'output')} folder as {where}{item['filename']}"
        ) from exc


# What httpx decodes as it is installed here (brotli and zstandard are not)
DECODABLE = frozenset({"", "identity", "gzip", "deflate"})


def _stream_once(client: ComfyClient, item: dict[str, Any], target: Path) -> int:
    size = 0
    with client.open_view(item) as response:
        if response.status_code in GATEWAY_STATUSES:
            raise GatewayAnswer(response)  # a proxy's: ComfyUI behind it may answer again
        if response.status_code != 200:
            said = client.describe(response)
            raise ServerError(f"GET {client.base_url}/view for {item['filename']!r} answered {said}")
        expected = response.headers.get("content-length")
        # a proxy may compress the file although asked not to: then it is decoded, and the length it
        # announced is the compressed one's
        encoding = response.headers.get("content-encoding", "identity").lower()
        encoded = encoding not in ("", "identity")
        if unknown := [e.strip() for e in encoding.split(",") if e.strip() not in DECODABLE]:
            raise ServerError(  # httpx would hand the compressed bytes on as the file
                f"GET {client.base_url}/view for {item['filename']!r} came compressed with "
                f"{', '.join(unknown)} although asked for the file as it is (Accept-Encoding: identity), "
                "which cannot be decoded here: turn the proxy's compression off for /view"
            )
        with target.open("xb") as handle:
            for chunk in response.iter_bytes(1 << 20) if encoded else response.iter_raw(1 << 20):
                handle.write(chunk)
                size += len(chunk)
    if expected is not None and not encoded and int(expected) != size:
        raise _ShortRead(f"{item['filename']}: received {size} bytes, the server announced {expected}")
    return size


def download_file(
    client: ComfyClient, item: dict[str, Any], dest_dir: Path, *, name: str | None = None
) -> Path:
    """Fetch one output file into ``dest_dir`` under its own name (or ``name``); never overwrites."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / Path(name or item["filename"]).name
    download_to(client, item, target)
    return target


def download_outputs(
    client: ComfyClient,
    outputs: dict[str, Any],
    run_dir: Path,
    *,
    prefix: str = "",
    done: list[OutputFile] | None = None,
) -> list[OutputFile]:
    """Download, size-check, hash and (for videos) probe every output file into ``run_dir``, each under
    its server name (``prefix`` before it); a name taken gets ``_1``, ``_2`` …: nothing is overwritten.

    ``done`` (when given) gets each file as it is downloaded: what a download that fails later leaves.

    Raises:
        ServerError: a download failed or came back short.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    files: list[OutputFile] = [] if done is None else done
    for node_id, kind, item in list_output_items(outputs):
        item = {"type": "output", **item}
        name = prefix + Path(item["filename"]).name
        for _attempt in range(100):
            target = free_path(run_dir, name)
            try:
                size = download_to(client, item, target)
                break
            except FileExistsError:  # appeared between the check and the open: take the next name
                continue
        else:
            raise ServerError(f"no free file name for {name} in {run_dir}")
        files.append(describe_file(node_id, kind, item, target, size))
    return files


def describe_file(
    node_id: str, kind: str, item: dict[str, Any], path: Path, size: int | None = None
) -> OutputFile:
    """The record entry of a file already on disk (hash, size, video probe)."""
    on_disk = path.stat().st_size
    if size is not None and size != on_disk:
        raise ServerError(f"{path}: wrote {size} bytes but {on_disk} are on disk")
    video = probe_video(path) if path.suffix.lower() in VIDEO_SUFFIXES or item.get("animated") else None
    return OutputFile(
        node_id=node_id,
        kind=kind,
        server_name=str(item.get("filename", path.name)),
        subfolder=str(item.get("subfolder", "")),
        type=str(item.get("type", "output")),
        path=path,
        bytes=on_disk,
        sha256=sha256_file(path),
        video=video,
    )


def probe_video(path: Path) -> VideoInfo | None:
    """Frames, size, fps and codec of the first video stream; ``None`` when PyAV cannot read one."""
    import av  # imported here: PyAV is heavy and only needed for videos

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                return None
            stream = container.streams.video[0]
            frames = int(stream.frames or 0)
            if frames == 0:  # not in the header: count packets (demux only, no decoding)
                frames = sum(1 for packet in container.demux(stream) if packet.size)
            rate = stream.average_rate or stream.guessed_rate
            duration = (
                float(stream.duration * stream.time_base)
                if stream.duration is not None and stream.time_base is not None
                else None
            )
            return VideoInfo(
                frames=frames,
                width=int(stream.codec_context.width),
                height=int(stream.codec_context.height),
                fps=round(float(Fraction(rate)), 6) if rate else None,
                codec=str(stream.codec_context.name),
                duration_s=round(duration, 6) if duration is not None else None,
            )
    except (av.error.FFmpegError, OSError) as exc:
        logger.warning("cannot probe %s as a video: %s", path, exc)
        return None
