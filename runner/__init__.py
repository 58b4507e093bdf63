"""LeanVideo runner: start pinned ComfyUI servers, submit workflows, record what happened."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
