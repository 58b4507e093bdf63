"""LoRA weights a prompt applied to nothing, noted in its telemetry.

ComfyUI applies what it can of a LoRA and logs the rest, one line per weight, in the server's log only:
a key no layer of the model has (``lora key not loaded: …``, a LoRA of another model) and factors that
do not fit their layer (``ERROR lora … is invalid for input of size …``, a LoRA of another size; the
INT8 side branch says ``… do not fit the layer's weight …``). The prompt succeeds with frames made
without those weights: a distill LoRA that did nothing looks like a bad model. :class:`UnappliedLoras`
is a logging handler that counts such lines into the running prompt's telemetry (event
``lora_not_applied``, one per reason, with the first line and how many), which the runner says after
the run.

Example::

    logging.getLogger().addHandler(UnappliedLoras(telemetry))
"""

from __future__ import annotations

import logging
import re
from typing import Protocol

__all__ = ["EVENT", "UnappliedLoras", "why_not_applied"]

EVENT = "lora_not_applied"
# ComfyUI's weight adapters log a failed patch as "ERROR <adapter> <key> <exception>"
_ADAPTER_ERROR = re.compile(r"^ERROR (lora|loha|lokr|glora|boft|oft) ")
_FIRST_LINE_CHARS = 300


class _Counts(Protocol):
    def count_event(self, kind: str, key: str, **data: object) -> None: ...


def why_not_applied(message: str) -> str | None:
    """The reason a LoRA weight was left out, from a log line of ComfyUI's (or the INT8 side branch's),
    or None when the line says nothing of the kind."""
    if message.startswith("lora key not loaded: "):
        return "no layer of the model has its key (a LoRA of another model?)"
    if _ADAPTER_ERROR.match(message) or message.startswith("WARNING SHAPE MISMATCH "):
        return "its factors do not fit their layer (a LoRA of another model or size?)"
    if message.startswith("Calculate Weight Failed: "):
        return "its weight could not be computed"
    return None


class UnappliedLoras(logging.Handler):
    """Counts the LoRA weights the running prompt applies to nothing into ``telemetry`` (outside a prompt
    nothing is counted: ``count_event`` has no record then)."""

    def __init__(self, telemetry: _Counts) -> None:
        super().__init__(level=logging.WARNING)
        self.telemetry = telemetry

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if (why := why_not_applied(message)) is not None:
                self.telemetry.count_event(EVENT, why, first=message[:_FIRST_LINE_CHARS])
        except Exception:  # a note must never break the prompt that logged it
            self.handleError(record)
