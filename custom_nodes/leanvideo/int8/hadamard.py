"""Group-wise Hadamard rotation ("convrot"): spreads outliers across a group before quantizing.

The normalised Sylvester matrix ``H`` of size ``n`` (a power of two) is symmetric and orthogonal, so
``H @ H == I``: rotating a weight's input columns and the activations by the same ``H`` leaves
``x @ W.T`` unchanged, and rotating twice restores the original.

Example::

    rotated = rotate_groups(weight, 256)
    torch.allclose(rotate_groups(rotated, 256), weight, atol=1e-5)  # True
"""

from __future__ import annotations

import math

import torch


def hadamard_matrix(
    size: int, *, dtype: torch.dtype = torch.float32, device: torch.device | None = None
) -> torch.Tensor:
    """The normalised ``size × size`` Sylvester-Hadamard matrix; ``size`` must be a power of two."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"Hadamard size must be a power of two, not {size}")
    matrix = torch.ones(1, 1, dtype=torch.float64)
    while matrix.shape[0] < size:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
    return (matrix / math.sqrt(size)).to(dtype=dtype, device=device)


def rotate_groups(tensor: torch.Tensor, group: int) -> torch.Tensor:
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
    matrix = hadamard_matrix(group, dtype=dtype, device=tensor.device)
    grouped = tensor.to(dtype).reshape(*tensor.shape[:-1], width // group, group)
    return (grouped @ matrix).reshape(tensor.shape)
