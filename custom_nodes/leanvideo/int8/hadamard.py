"""Group-wise Hadamard rotation ("convrot"): spreads outliers across a group before quantizing.

ConvRot, as ComfyUI's kernel library comfy-kitchen defines it (and as a ``convrot`` layer entry means in
every file, ours from format version 2 on), uses the *regular* Hadamard matrix: Kronecker powers of
the symmetric 4 × 4 ``[[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]]``, normalised, so its
size is a power of 4. LeanVideo files of format version 1 used the Sylvester matrix (sizes a power of
two) and are still read with it. Both are symmetric and orthogonal, so ``H @ H == I``: rotating a
weight's input columns and the activations by the same ``H`` leaves ``x @ W.T`` unchanged, and
rotating twice restores the original.

Example::

    rotated = rotate_groups(weight, 256)
    torch.allclose(rotate_groups(rotated, 256), weight, atol=1e-5)  # True
"""

from __future__ import annotations

import functools
import math

import torch

from .spec import HADAMARD_KINDS, is_power_of_4

_REGULAR_4 = ((1, 1, 1, -1), (1, 1, -1, 1), (1, -1, 1, 1), (-1, 1, 1, 1))


def hadamard_matrix(
    size: int,
    *,
    kind: str = "regular",
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
) -> torch.Tensor:
    """The normalised ``size × size`` Hadamard matrix of ``kind`` (:data:`HADAMARD_KINDS`): regular
    (``size`` a power of 4) or Sylvester (``size`` a power of two)."""
    if kind == "regular":
        if not is_power_of_4(size):
            raise ValueError(f"a regular (ConvRot) Hadamard size must be a power of 4, not {size}")
        base = torch.tensor(_REGULAR_4, dtype=torch.float64)
        matrix = base
        while matrix.shape[0] < size:
            matrix = torch.kron(matrix, base)
    elif kind == "sylvester":
        if size < 1 or size & (size - 1):
            raise ValueError(f"Hadamard size must be a power of two, not {size}")
        matrix = torch.ones(1, 1, dtype=torch.float64)
        while matrix.shape[0] < size:
            matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
    else:
        raise ValueError(f"Hadamard kind must be one of {HADAMARD_KINDS}, not {kind!r}")
    return (matrix / math.sqrt(size)).to(dtype=dtype, device=device)


def rotate_groups(tensor: torch.Tensor, group: int, kind: str = "regular") -> torch.Tensor:
    """Multiply each consecutive group of ``group`` entries of the last dimension by ``H``.

    The last dimension must be a multiple of ``group``. The result is float32 (or ``tensor``'s
    dtype when that is float64); the rotation is its own inverse.
    """
    width = tensor.shape[-1]
    if width % group:
        raise ValueError(
            f"Last dimension {width} of shape {tuple(tensor.shape)} is not a multiple of {group}"
        )
    dtype = torch.float64 if tensor.dtype == torch.float64 else torch.float32
    if torch.compiler.is_compiling():  # a constant of the traced graph
        matrix = hadamard_matrix(group, kind=kind, dtype=dtype, device=tensor.device)
    else:  # eager, per call of a rotated layer: built once per device (on a GPU, no copy and sync a call)
        matrix = _cached_matrix(group, kind, dtype, tensor.device)
    grouped = tensor.to(dtype).reshape(*tensor.shape[:-1], width // group, group)
    return (grouped @ matrix).reshape(tensor.shape)


@functools.lru_cache(maxsize=64)
def _cached_matrix(size: int, kind: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # a plain tensor even when first made under ComfyUI's inference_mode: usable outside it later
    with torch.inference_mode(False):
        return hadamard_matrix(size, kind=kind, dtype=dtype, device=device)
