"""comfy-kitchen's ``int8_linear`` as a torch custom op, so that torch.compile keeps it as one graph node.

Registered when this module is first imported (never while tracing); comfy-kitchen itself is imported
only when the op runs.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable

import torch

KITCHEN_MODULE = "comfy_kitchen"
KITCHEN_OP = "leanvideo::kitchen_int8_linear"


def _register_kitchen_op() -> Callable[..., torch.Tensor]:
    """comfy-kitchen's ``int8_linear`` as the custom op ``torch.ops.leanvideo.kitchen_int8_linear``, so
    that torch.compile keeps it as one node of the graph (traced as it is, comfy-kitchen's Python
    dispatch and native calls break the graph at every layer). Registered when this module is first
    imported (tracing must never register it); comfy-kitchen itself is imported only when it runs."""
    namespace, name = KITCHEN_OP.split("::")
    with contextlib.suppress(AttributeError, RuntimeError):
        return getattr(getattr(torch.ops, namespace), name)  # type: ignore[no-any-return]

    @torch.library.custom_op(KITCHEN_OP, mutates_args=())
    def kitchen_int8_linear(
        rows: torch.Tensor,
        qdata: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        convrot: bool,
        convrot_groupsize: int,
    ) -> torch.Tensor:
        kitchen = importlib.import_module(KITCHEN_MODULE)
        out: torch.Tensor = kitchen.int8_linear(
            rows,
            qdata,
            scale,
            bias,
            out_dtype=rows.dtype,
            convrot=convrot,
            convrot_groupsize=convrot_groupsize,
        )
        return out

    @kitchen_int8_linear.register_fake
    def _(
        rows: torch.Tensor,
        qdata: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        convrot: bool,
        convrot_groupsize: int,
    ) -> torch.Tensor:
        return rows.new_empty((rows.shape[0], qdata.shape[0]))

    return kitchen_int8_linear


kitchen_int8_linear_op = _register_kitchen_op()
