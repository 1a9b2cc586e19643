"""Interior chunks of the banded core through torch's CPU flash kernel, the blocks as its batch (docs/kernels.md,
"Banded blocks through the CPU flash kernel")."""

from __future__ import annotations

import torch
from torch import Tensor

from attn.kernels.base import CPU_FLASH, CPU_FLASH_BACKWARD
from attn.kernels.blocked.chunk import Chunk

#: dtypes that match the generic path to rounding (half types keep the generic arithmetic)
FLASH_DTYPES = (torch.float32, torch.float64)


def band_takes_flash(q: Tensor, v: Tensor, has_score_bias: bool, has_global: bool) -> bool:
    """True when a band call's scores are ``q . k`` plus the edges alone, on a CPU torch with the flash
    kernel, in a dtype it runs, with ``D == Dv``."""
    return (CPU_FLASH is not None and CPU_FLASH_BACKWARD is not None and q.device.type == "cpu"
            and q.dtype in FLASH_DTYPES and q.shape[-1] == v.shape[-1]
            and not has_score_bias and not has_global)


def flash_applies(chunk: Chunk, q: Tensor, v: Tensor, has_score_bias: bool, has_global: bool) -> bool:
    """True when the call takes the flash kernel and the chunk is interior with no masked key."""
    return chunk.interior and chunk.key_bias is None and band_takes_flash(q, v, has_score_bias, has_global)


def flash_note(q: Tensor, v: Tensor, num_global: int, has_score_mod: bool) -> str:
    """The path text added when interior chunks can take the flash kernel (``""`` when none can)."""
    if not band_takes_flash(q, v, has_score_mod, num_global > 0):
        return ""
    return "; interior chunks without a masked key through the CPU flash kernel"


def _blocks(chunk: Chunk, rows: Tensor) -> Tensor:
    """A chunk's ``(c*S, X)`` rows as the flash kernel's ``(c, 1, S, X)``."""
    return rows.unflatten(0, (chunk.blocks, chunk.block)).unsqueeze(1)


def flash_forward_chunk(chunk: Chunk, edges: Tensor, scale: float, out_rows: Tensor, lse_rows: Tensor) -> None:
    """Attention of an interior chunk, written into the stream's output rows and log-sum-exp."""
    mask = edges.view(1, 1, *edges.shape)  # (1, 1, S, L), broadcast over the blocks
    out, lse = CPU_FLASH(_blocks(chunk, chunk.q), chunk.k.unsqueeze(1), chunk.v.unsqueeze(1), 0.0, False,
                      attn_mask=mask, scale=scale)  # (c, 1, S, Dv), (c, 1, S)
    out_rows[chunk.row_start : chunk.row_end] = out.flatten(0, 2)
    lse_rows[chunk.row_start : chunk.row_end] = lse.flatten()


def flash_backward_chunk(chunk: Chunk, edges: Tensor, scale: float, d_out: Tensor, out: Tensor, lse: Tensor,
                         d_q: Tensor) -> tuple[Tensor, Tensor]:
    """Gradients of an interior chunk: writes ``d_q (c*S, D)``, returns window ``d_k``, ``d_v``."""
    mask = edges.view(1, 1, *edges.shape)  # (1, 1, S, L)
    grad_q, grad_k, grad_v = CPU_FLASH_BACKWARD(
        _blocks(chunk, d_out), _blocks(chunk, chunk.q), chunk.k.unsqueeze(1), chunk.v.unsqueeze(1),
        _blocks(chunk, out), lse.view(chunk.blocks, 1, chunk.block), 0.0, False, attn_mask=mask, scale=scale,
    )  # (c, 1, S, D), (c, 1, L, D), (c, 1, L, Dv)
    d_q.copy_(grad_q.flatten(0, 2))
    return grad_k.squeeze(1), grad_v.squeeze(1)
