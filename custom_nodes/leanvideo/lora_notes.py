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

import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["EVENT", "MESSAGE", "UnappliedLoras", "why_not_applied"]

EVENT = "lora_not_applied"
MESSAGE = "leanvideo.lora_not_applied"  # to the editor that queued the prompt
# ComfyUI's weight adapters log a failed patch as "ERROR <adapter> <key> <exception>"
_ADAPTER_ERROR = re.compile(r"^ERROR (lora|loha|lokr|glora|boft|oft) ")
_FIRST_LINE_CHARS = 300
_REMEMBERED = 64  # sets of LoRA loaders whose notes are kept for later prompts


class _Counts(Protocol):
    def count_event(self, kind: str, key: str, n: int = 1, **data: object) -> int: ...

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
    reason (the editor shows it: ``leanvideo.lora_not_applied``).

    ComfyUI says it only as it loads and patches the LoRA: a later prompt served the same LoRA from its
    cache (another seed) is silent. So what a prompt's LoRA loaders (their inputs and what feeds them)
    were found to leave out is remembered, and a later prompt with the same LoRA loaders is told the same
    as it starts (:meth:`prompt_started`)."""

    def __init__(self, telemetry: _Counts, tell: Tell | None = None) -> None:
        super().__init__(level=logging.WARNING)
        self.telemetry = telemetry
        self.tell = tell
        self._known: OrderedDict[frozenset[str], dict[str, tuple[str, int]]] = OrderedDict()
        self._loaders: frozenset[str] = frozenset()  # the running prompt's LoRA loaders
        self._reminded: set[str] = set()  # reasons the running prompt was told of as it started

    def prompt_started(self, prompt_id: str, prompt: dict[str, Any]) -> None:
        """Note ``prompt``'s LoRA loaders; tell it what the same loaders were found to leave out before."""
        self._loaders, self._reminded = lora_loaders(prompt), set()
        for why, (first, calls) in self._known.get(self._loaders, {}).items() if self._loaders else ():
            self.telemetry.count_event(EVENT, why, n=calls, first=first)
            self._reminded.add(why)
            self._tell(why, first)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if (why := why_not_applied(message)) is None or why in self._reminded:
                return
            first = message[:_FIRST_LINE_CHARS]
            calls = self.telemetry.count_event(EVENT, why, first=first)
            if calls and self._loaders:
                self._remember(self._loaders, why, first, calls)
            if calls == 1:
                self._tell(why, first)
        except Exception:  # a note must never break the prompt that logged it
            self.handleError(record)

    def _remember(self, loaders: frozenset[str], why: str, first: str, calls: int) -> None:
        known = self._known.setdefault(loaders, {})
        known[why] = (known.get(why, (first, 0))[0], calls)
        self._known.move_to_end(loaders)
        while len(self._known) > _REMEMBERED:
            self._known.popitem(last=False)

    def _tell(self, why: str, first: str) -> None:
        prompt_id, client_id = self.telemetry.running()
        if prompt_id is not None and self.tell is not None:
            self.tell(prompt_id, client_id, why, first)


def lora_loaders(prompt: dict[str, Any]) -> frozenset[str]:
    """What identifies ``prompt``'s LoRA loaders (nodes with a ``lora_name`` input) as ComfyUI's cache
    would serve them again: each one's class and inputs, and the class and inputs of each node linked
    into it."""

    def described(node_id: Any) -> str:
        node = prompt.get(str(node_id))
        if not isinstance(node, dict) or not isinstance(node.get("inputs"), dict):
            return "?"
        inputs = node["inputs"]
        values = {k: v for k, v in inputs.items() if not _is_link(v)}
        return json.dumps([node.get("class_type"), values], sort_keys=True, default=str)

    found = []
    for node_id, node in prompt.items():
        inputs = node.get("inputs") if isinstance(node, dict) else None
        if isinstance(inputs, dict) and "lora_name" in inputs:
            fed = sorted(described(v[0]) for v in inputs.values() if _is_link(v))
            found.append(json.dumps([described(node_id), fed]))
    return frozenset(found)


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[1], int)
