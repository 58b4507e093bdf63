"""How the transport retries a request that the network cut: bounded exponential backoff with jitter.

Only requests that are safe to repeat are retried: every GET (``/history``, ``/queue``, ``/view``,
``/object_info``, ``/system_stats``, the node pack's ``/leanvideo/*``) and the POSTs whose repetition
changes nothing (``/free``, ``/interrupt``, ``/queue`` deletes). ``POST /prompt`` is made safe by the
client (:meth:`runner.transport.client.ComfyClient.submit`): before sending it again it asks the server
whether the prompt id it chose is already queued or finished.

A retry waits a "full jitter" delay: uniform between 0 and ``min(max_delay_s, base_delay_s · 2^n)``,
so that many clients cut at once by one proxy do not come back in step; no retry starts after the
deadline.

Example::

    policy = RetryPolicy(retries=5)
    [round(policy.ceiling(n), 2) for n in range(5)]   # [0.1, 0.2, 0.4, 0.8, 1.6]
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from runner.errors import UsageError

__all__ = ["DEFAULT_RETRIES", "RetryPolicy"]

DEFAULT_RETRIES = 5


@dataclass(frozen=True)
class RetryPolicy:
    """At most ``retries`` more attempts after the first, each after a jittered, growing delay."""

    retries: int = DEFAULT_RETRIES
    base_delay_s: float = 0.1
    max_delay_s: float = 2.0

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise UsageError(f"retries must be ≥ 0, got {self.retries}")
        if self.base_delay_s <= 0 or self.max_delay_s < self.base_delay_s:
            raise UsageError(
                f"need 0 < base_delay_s ≤ max_delay_s, got {self.base_delay_s:g} and {self.max_delay_s:g}"
            )

    def ceiling(self, attempt: int) -> float:
        """The longest wait before retry number ``attempt`` (0 for the first retry)."""
        return float(min(self.max_delay_s, self.base_delay_s * 2**attempt))

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The wait before retry number ``attempt``: uniform in ``[0, ceiling(attempt)]``."""
        return rng.uniform(0.0, self.ceiling(attempt))
