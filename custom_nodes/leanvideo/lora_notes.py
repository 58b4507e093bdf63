"""LoRA weights a prompt applied to nothing, noted in its telemetry.

ComfyUI applies what it can of a LoRA and logs the rest, one line per weight, in the server's log only:
a key no layer of the model has (``lora key not loaded: …``, a LoRA of another model) and factors that
do not fit their layer (``ERROR lora … is invalid for input of size …``, a LoRA of another size; the
INT8 side branch says ``… do not fit the layer's weight …``). The prompt succeeds with frames made
without those weights: a distill LoRA that did nothing looks like a bad model. :class:`UnappliedLoras`
is a logging handler that counts such lines into the running prompt's telemetry (event
``lora_not_applied``, one per reason, with the first line and how many), which the runner says after
the run, and tells the editor that queued the prompt (message ``leanvideo.lora_not_applied``: a
warning toast).

Example::

    logging.getLogger().addHandler(UnappliedLoras(telemetry))
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Protocol

__all__ = ["EVENT", "MESSAGE", "UnappliedLoras", "why_not_applied"]

EVENT = "lora_not_applied"
MESSAGE = "leanvideo.lora_not_applied"  # to the editor that queued the prompt
# ComfyUI's weight adapters log a failed patch as "ERROR <adapter> <key> <exception>"
_ADAPTER_ERROR = re.compile(r"^ERROR (lora|loha|lokr|glora|boft|oft) ")
_FIRST_LINE_CHARS = 300


class _Counts(Protocol):
    def count_event(self, kind: str, key: str, **data: object) -> int: ...

    def running(self) -> tuple[str | None, str | None]: ...


# Told the first weight of each reason a prompt leaves out: (prompt id, client id, reason, its line)
Tell = Callable[[str, "str | None", str, str], None]


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
    nothing is counted: ``count_event`` has no record then), and calls ``tell`` with the first of each
    reason (the editor shows it: ``leanvideo.lora_not_applied``)."""

    def __init__(self, telemetry: _Counts, tell: Tell | None = None) -> None:
        super().__init__(level=logging.WARNING)
        self.telemetry = telemetry
        self.tell = tell

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if (why := why_not_applied(message)) is None:
                return
            first = message[:_FIRST_LINE_CHARS]
            if self.telemetry.count_event(EVENT, why, first=first) == 1 and self.tell is not None:
                prompt_id, client_id = self.telemetry.running()
                if prompt_id is not None:
                    self.tell(prompt_id, client_id, why, first)
        except Exception:  # a note must never break the prompt that logged it
            self.handleError(record)
