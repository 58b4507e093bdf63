"""The mid LTXV DiT end to end: stock ComfyUI's loader on the bf16 file against LeanVideo's INT8 loader on
its INT8 copy, paired runs on one real pinned server.

Run: ``.venv/bin/python -m benchmarks.int8_e2e_bench [--pairs N] [--json FILE]
[--kernel auto|w8a16|int_mm|int_mm_fused|onednn] [--layers L --dim D] [--out-dir DIR]``.

It writes (once; later runs reuse them) the DiT of :mod:`benchmarks.mid_dit` (default 8 blocks ×
width 1024: 144.1 M parameters, bf16) and its INT8 copy, and the tiny models (:mod:`runner.fixtures`),
then starts one pinned ComfyUI with the node pack and the fixture nodes and runs the tiny LTXV
workflow in two configurations that differ only in the DiT loader:

- **stock**: ``UNETLoader`` on the bf16 file;
- **int8**: "Load Diffusion Model (INT8)" on the INT8 file with ``path`` = ``--kernel``.

Everything else is the same node for node: CLIP-L, the tiny checkpoint's VAE (``CheckpointLoaderSimple``),
512×384×9 frames (384 latent tokens: the LTXV VAE divides space by 32 and time by 8), 8 steps, cfg 3,
one seed. Each configuration runs once as a warmup (discarded; auto measures its kernels there, into
the server's fresh user directory), then ``--pairs`` pairs, stock then int8. Before every prompt
``POST /free`` unloads the models and resets the node cache (:func:`benchmarks.protocol.defeat_cache`),
so each prompt loads and runs everything afresh and starts from the same memory.

Reported per configuration: the DiT file's bytes, the sampler node's time (from the event stream),
the DiT's bytes in memory (ComfyUI's loaded-model list, through the pack's telemetry), the server's peak
RSS during the prompt (the pack's telemetry: CLIP-L, the VAE and this DiT, loaded and run; not an
isolated figure: on one server the allocator keeps some memory the previous prompts freed, so it
depends on the run order — ``leanvideo demo`` gives each configuration its own server), whether the
frames of every run are identical; and the paired median
of int8 / stock sampling time with its spread, the frame PSNR of int8 against stock (lossless PNG
frames) and the kernels the INT8 loader reported (its UI text; the choices, from its telemetry
event, in the record). A versioned JSON record (``--json``)
holds it all, with the environment; the table goes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.int8_e2e_report import build_record, print_table, write_json
from benchmarks.mid_dit import MidDitConfig, write_mid_dit
from benchmarks.protocol import defeat_cache
from runner.fixtures import write_fixtures
from runner.graph.workflow import Workflow, load_workflow
from runner.jobs.demo import DEMO_WORKFLOW, add_frame_output
from runner.jobs.frames import psnr_db, read_frames
from runner.jobs.run import collect_environment
from runner.local.server import ComfyServer, ServerConfig
from runner.local.workspace import Workspace, find_workspace
from runner.tracking.outputs import download_outputs
from runner.tracking.prompt import run_prompt
from runner.transport.client import ComfyClient

logger = logging.getLogger(__name__)

KERNEL_CHOICES = ("auto", "w8a16", "int_mm", "int_mm_fused", "onednn")
LOADER_NODE = "100"  # the DiT loader each configuration adds; the sampler takes its model from it
STOCK, INT8 = "stock", "int8"


@dataclass(frozen=True)
class BenchSettings:
    """What one benchmark run does; the defaults are the reference measurement."""

    pairs: int = 5
    kernel: str = "auto"
    dit: MidDitConfig = field(default_factory=MidDitConfig)
    width: int = 512
    height: int = 384
    length: int = 9
    steps: int = 8
    seed: int = 42
    timeout: float = 1800.0  # per prompt

    def __post_init__(self) -> None:
        if self.pairs < 1:
            raise ValueError(f"pairs must be at least 1, got {self.pairs}")
        if self.kernel not in KERNEL_CHOICES:
            raise ValueError(f"kernel must be one of {KERNEL_CHOICES}, not {self.kernel!r}")

    @property
    def tokens(self) -> int:
        """Latent tokens the DiT sees: LTXV's VAE makes one per 32×32 pixels per 8 frames."""
        return (self.width // 32) * (self.height // 32) * ((self.length - 1) // 8 + 1)


@dataclass(frozen=True)
class Run:
    """One prompt of one configuration; ``pair`` is ``None`` for the warmup."""

    configuration: str
    pair: int | None
    prompt_id: str
    sampling_s: float
    prompt_s: float
    peak_rss_bytes: int | None
    dit_loaded_bytes: int | None  # the DiT as ComfyUI's model manager holds it after the prompt
    frames_digest: str
    frames: tuple[Path, ...]
    loader_text: str  # the DiT loader's UI text (the INT8 loader's kernel report)
    kernels: list[dict[str, Any]]  # the INT8 loader's kernel choices (telemetry), for this model's load
    choices_made: int  # shape classes the INT8 dispatcher decided during this prompt (measured, forced)


def build_workflow(settings: BenchSettings, configuration: str, unet_name: str) -> tuple[Workflow, str]:
    """The tiny LTXV workflow with the DiT loaded by ``configuration``'s loader from ``unet_name``, its
    frames saved as PNGs instead of a video; returns it and the id of its ``SaveImage`` node."""
    workflow = load_workflow(DEMO_WORKFLOW)
    for node_id in [
        key for key, node in workflow.items() if node["class_type"] in ("CreateVideo", "SaveVideo")
    ]:
        del workflow[node_id]
    by_class = {node["class_type"]: node for node in workflow.values()}
    by_class["EmptyLTXVLatentVideo"]["inputs"].update(
        width=settings.width, height=settings.height, length=settings.length
    )
    by_class["LTXVScheduler"]["inputs"]["steps"] = settings.steps
    by_class["SamplerCustom"]["inputs"].update(model=[LOADER_NODE, 0], noise_seed=settings.seed)
    if configuration == STOCK:
        loader = {"class_type": "UNETLoader", "inputs": {"unet_name": unet_name, "weight_dtype": "default"}}
    else:
        loader = {
            "class_type": "LeanVideoDiffusionModelLoaderINT8",
            "inputs": {
                "unet_name": unet_name,
                "compute_dtype": "default",
                "path": settings.kernel,
                "quantize_on_load": True,
                "convrot": False,
                "lora_mode": "merge",
            },
        }
    workflow[LOADER_NODE] = {**loader, "_meta": {"title": f"DiT loader ({configuration})"}}
    return add_frame_output(workflow, prefix=f"leanvideo/int8_e2e/{configuration}")


def kernel_choices(telemetry: dict[str, Any]) -> list[dict[str, Any]]:
    """The kernel choices of the INT8 loader in a prompt's telemetry record, one dict per shape class
    (weight shape, activation rows bucket, dtype, layout, the kernel, why: ``measured``, ``forced`` or
    ``fallback``, each timed kernel's time over w8a16's, rejections): those its report listed at load
    (the ``int8_kernels`` event: a measured table read from disk) and those made while the prompt ran
    (``int8_kernel`` events: a measurement, or a forced kernel's first use)."""
    by_key: dict[str, dict[str, Any]] = {}
    for event in telemetry.get("events") or []:
        if event.get("kind") == "int8_kernels":
            by_key.update(event.get("choices") or {})
        elif event.get("kind") == "int8_kernel":
            by_key[event["shape"]] = event
    choices = []
    for key, choice in sorted(by_key.items()):
        _, dtype, shape, rows, layout = key.rsplit("|", 4)
        seconds = choice.get("seconds") or {}
        base = seconds.get("w8a16")
        choices.append(
            {
                "shape": shape,
                "rows": int(rows.removeprefix("rows<=")),
                "dtype": dtype,
                "layout": layout,
                "kernel": choice["kernel"],
                "source": choice["source"],
                "over_w8a16": {k: v / base for k, v in seconds.items()} if base else {},
                "rejected": choice.get("rejected") or {},
            }
        )
    return choices


def _choices_made(telemetry: dict[str, Any]) -> int:
    """How many shape classes the dispatcher decided during the prompt (measured, or forced)."""
    return sum(event.get("kind") == "int8_kernel" for event in telemetry.get("events") or [])


def run_bench(settings: BenchSettings, workspace: Workspace, out_dir: Path) -> dict[str, Any]:
    """Write the models, run warmups and pairs on one fresh server, and return the JSON record."""
    began = time.monotonic()
    files = write_mid_dit(workspace.models_dir, workspace.comfyui_dir, settings.dit, python=workspace.python)
    write_fixtures(workspace.models_dir, workspace.comfyui_dir, python=workspace.python)
    paths = {STOCK: files.float_path, INT8: files.int8_path}
    workflows = {key: build_workflow(settings, key, path.name) for key, path in paths.items()}
    workspace.servers_dir.mkdir(parents=True, exist_ok=True)
    state_dir = Path(tempfile.mkdtemp(prefix="int8-e2e-", dir=workspace.servers_dir))
    # state_dir holds its user directory too: auto measures afresh in the warmup
    config = ServerConfig.in_workspace(workspace, state_dir)
    runs: list[Run] = []
    try:
        with ComfyServer(config) as server, ComfyClient(server.url) as client:
            environment = collect_environment(client)
            schedule: list[tuple[str, int | None]] = [(key, None) for key in (STOCK, INT8)]
            schedule += [(key, pair) for pair in range(settings.pairs) for key in (STOCK, INT8)]
            for key, pair in schedule:
                workflow, frames_node = workflows[key]
                runs.append(_run_once(client, key, pair, workflow, frames_node, out_dir, settings.timeout))
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    psnrs = _pair_psnrs(runs)
    return build_record(
        settings=settings,
        files=files,
        runs=runs,
        psnrs=psnrs,
        kernels=_last(runs, INT8).kernels,
        environment=environment,
        seconds=time.monotonic() - began,
    )


def _run_once(
    client: ComfyClient,
    configuration: str,
    pair: int | None,
    workflow: Workflow,
    frames_node: str,
    out_dir: Path,
    timeout: float,
) -> Run:
    defeat_cache(client, "cold")
    result = run_prompt(client, workflow, timeout=timeout)
    sampling = result.phases["sampling"]
    if sampling <= 0:
        raise RuntimeError(f"prompt {result.prompt_id} ({configuration}) did not sample: it was cached")
    telemetry = client.read_telemetry(result.prompt_id)
    peak = telemetry.get("peak_rss_bytes")
    snapshot = client.get_json("/leanvideo/telemetry", missing_ok=True) or {}
    name = f"{configuration}-{'warmup' if pair is None else f'pair{pair + 1}'}"
    frame_files = download_outputs(client, {frames_node: result.outputs.get(frames_node, {})}, out_dir / name)
    frames = tuple(sorted(f.path for f in frame_files if f.path.suffix == ".png"))
    if not frames:
        raise RuntimeError(f"prompt {result.prompt_id} ({configuration}) saved no PNG frames")
    text = "\n".join(result.outputs.get(LOADER_NODE, {}).get("text", []))
    logger.info("%s: sampling %.2f s (prompt %.2f s)", name, sampling, result.wall_seconds)
    if not telemetry.get("available"):
        logger.warning("no telemetry for prompt %s: %s", result.prompt_id, telemetry.get("reason"))
    return Run(
        configuration=configuration,
        pair=pair,
        prompt_id=result.prompt_id,
        sampling_s=sampling,
        prompt_s=result.wall_seconds,
        peak_rss_bytes=peak if isinstance(peak, int) else None,
        dit_loaded_bytes=_dit_loaded_bytes(snapshot),
        frames_digest=hashlib.sha256(read_frames(frames).tobytes()).hexdigest(),
        frames=frames,
        loader_text=text,
        kernels=kernel_choices(telemetry),
        choices_made=_choices_made(telemetry),
    )


def _dit_loaded_bytes(snapshot: dict[str, Any]) -> int | None:
    """Bytes of the diffusion model(s) ComfyUI holds loaded, from the pack's telemetry snapshot."""
    models = (snapshot.get("comfy") or {}).get("loaded_models")
    if models is None:
        return None
    return sum(int(m["loaded_bytes"]) for m in models if m.get("kind") == "diffusion_model")


def _last(runs: Sequence[Run], configuration: str) -> Run:
    return [run for run in runs if run.configuration == configuration][-1]


def _pair_psnrs(runs: Sequence[Run]) -> list[float]:
    """Frame PSNR of int8 against stock in each measured pair."""
    by_pair: dict[int, dict[str, Run]] = {}
    for run in runs:
        if run.pair is not None:
            by_pair.setdefault(run.pair, {})[run.configuration] = run
    return [
        psnr_db(read_frames(pair[STOCK].frames), read_frames(pair[INT8].frames))
        for _, pair in sorted(by_pair.items())
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="measured stock/int8 pairs (default 5)")
    parser.add_argument("--json", type=Path, help="also write the JSON record here")
    parser.add_argument(
        "--kernel", choices=KERNEL_CHOICES, default="auto", help="the INT8 loader's path input (default auto)"
    )
    parser.add_argument("--layers", type=int, default=8, help="DiT blocks (default 8)")
    parser.add_argument("--dim", type=int, default=1024, help="DiT width, a multiple of 64 (default 1024)")
    parser.add_argument("--out-dir", type=Path, help="keep the frames here (default: a temporary folder)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the progress
    try:
        settings = BenchSettings(
            pairs=args.pairs, kernel=args.kernel, dit=MidDitConfig(args.layers, args.dim)
        )
    except ValueError as error:
        parser.error(str(error))
    with contextlib.ExitStack() as stack:
        out_dir = args.out_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="int8-e2e-")))
        record = run_bench(settings, find_workspace(), out_dir)
    if args.json:
        write_json(record, args.json)
    print_table(record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
