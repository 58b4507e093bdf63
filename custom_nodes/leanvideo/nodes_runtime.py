"""Runtime nodes: VRAM release and attention patching (declarations only).

The work happens in ``memory_ops`` (releasing models) and ``attention_ops`` (the attention override).
"""

from __future__ import annotations

from typing import Any

from comfy_api.latest import io

from .attention_ops import AUTO, available_modes, patch_attention
from .memory_ops import FreeMode, release_models
from .node_checks import choice_problem, require_linked_input


def _server() -> Any:
    from server import PromptServer

    return PromptServer.instance


class LeanVideoFreeVRAM(io.ComfyNode):
    """Unload models and free the memory they held; pass the connected value through unchanged."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LeanVideoFreeVRAM",
            display_name="Free VRAM",
            category="utils",
            description=(
                "Unloads models from the GPU and frees the memory they held (unload, garbage-collect, empty "
                "the CUDA cache, IPC collect), then passes its input through. Put it between stages, e.g. "
                "after sampling and before VAE Decode. Alone (nothing on value) it runs first in a prompt, "
                "freeing what the previous one left; fed the prompt's last result, it frees at the end. A "
                "model a later node still needs is loaded again when that node runs. Reports memory before "
                "and after."
            ),
            inputs=[
                io.AnyType.Input(
                    "value",
                    optional=True,
                    tooltip="Anything (latent, image, model…), passed on unchanged once memory is freed.",
                ),
                io.Combo.Input(
                    "mode",
                    options=[m.value for m in FreeMode],
                    default=FreeMode.ALL.value,
                    tooltip=(
                        "Which loaded models to release. 'all but the connected model' keeps the MODEL, CLIP "
                        "or VAE connected to 'value' loaded."
                    ),
                ),
                io.Boolean.Input(
                    "free_ram",
                    default=False,
                    tooltip=(
                        "Also give freed RAM back to the OS and drop ComfyUI's node cache when this prompt "
                        "ends, so the next prompt loads the models from disk again."
                    ),
                ),
            ],
            outputs=[io.AnyType.Output(display_name="value", tooltip="The input, unchanged.")],
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],  # to tell an unlinked value that is passed on
            is_output_node=True,
        )

    @classmethod
    def fingerprint_inputs(cls, **inputs: Any) -> Any:
        # With nothing on value it runs on every prompt, first (ComfyUI starts with the output nodes that
        # are ready): it frees what the previous prompt left. Connected, it is cached like any node, and
        # so are the nodes after it (a NaN here would make every one of them run again on every prompt).
        return float("nan") if "value" not in inputs else None

    @classmethod
    def validate_inputs(cls, mode: str | None = None) -> bool | str:
        return choice_problem(cls, named=False, mode=mode)

    @classmethod
    def execute(cls, mode: str, free_ram: bool, value: Any = None) -> io.NodeOutput:
        hidden = cls.hidden
        require_linked_input(
            getattr(hidden, "prompt", None), getattr(hidden, "unique_id", None), "value", "Free VRAM"
        )  # before anything is freed
        server = _server()
        report = release_models(
            FreeMode(mode),
            keep=value,
            free_ram=free_ram,
            request_cache_drop=lambda: server.prompt_queue.set_flag("free_memory", True),
        )
        data = report.as_dict()
        telemetry = getattr(server, "leanvideo_telemetry", None)
        if telemetry is not None:
            telemetry.note_event("free_vram", data)
        return io.NodeOutput(value, ui={"text": [report.summary()], "leanvideo_memory": [data]})


class LeanVideoPatchAttention(io.ComfyNode):
    """Clone the model and route its attention through a faster kernel, with a per-call fallback."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LeanVideoPatchAttention",
            display_name="Patch Attention",
            category="advanced/model_patches",
            description=(
                "Routes the model's attention through PyTorch SDPA or SageAttention. Calls the kernel cannot "
                "take (no CUDA, head size, dtype, a mask) use the model's original attention; each reason is "
                "logged once. Works with LTXV, Wan and HunyuanVideo."
            ),
            inputs=[
                io.Model.Input(
                    "model", tooltip="The diffusion model to patch; it is cloned, never modified."
                ),
                io.Combo.Input(
                    "mode",
                    options=available_modes(),
                    default=AUTO,
                    tooltip=(
                        "auto: SageAttention on CUDA when installed, else PyTorch SDPA. sdpa: PyTorch. "
                        "sage and its variants: the sageattention package (CUDA + Triton); one this "
                        "machine lacks leaves the attention unchanged, and the report says why."
                    ),
                ),
            ],
            outputs=[io.Model.Output(tooltip="A clone of the model with the attention override set.")],
        )

    @classmethod
    def validate_inputs(cls, mode: str | None = None) -> bool | str:
        # every mode there is, installed here or not (the menu lists them all): a workflow saved where a
        # SageAttention variant is installed runs elsewhere with the attention left unchanged
        return choice_problem(cls, named=False, mode=mode)

    @classmethod
    def execute(cls, model: Any, mode: str) -> io.NodeOutput:
        telemetry = getattr(_server(), "leanvideo_telemetry", None)

        def on_call(key: str, fell_back: bool) -> None:  # per prompt: "ran" / "fell back" / "not patched"
            telemetry.count_event("attention", key, outcome="fell back" if fell_back else "ran")

        patched, plan = patch_attention(model, mode, None if telemetry is None else on_call)
        if telemetry is not None and plan.backend == "original":  # no override: nothing else tells of it
            telemetry.count_event("attention", f"not patched: {plan.reason}", outcome="not patched")
        return io.NodeOutput(patched, ui={"text": [plan.summary()]})


NODES: list[type[io.ComfyNode]] = [LeanVideoFreeVRAM, LeanVideoPatchAttention]
