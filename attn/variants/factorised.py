"""``factorised``: attention on a token grid of frames x positions (Arnab et al. 2021, ViViT); ``frames`` (optional)
fixes the grid's length (other key counts raise ``ValueError``), else a trailing partial frame is allowed."""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor

from attn.base import ExactAttention, require_num_heads
from attn.cost import Cost, CostQuery, head_pairs_cost, pairs_cost
from attn.grid import Grid, grid_mod
from attn.mods import MaskMod
from attn.registration import register_attention
from attn.validation import Param, invalid

#: ``axis`` -> the axis of each head group
AXIS_GROUPS: dict[str, tuple[str, ...]] = {
    "spatial": ("spatial",), "temporal": ("temporal",), "split": ("spatial", "temporal"),
}


@register_attention("factorised")
class FactorisedAttention(ExactAttention):
    """Attention on a grid of frames x positions_per_frame tokens: axis='spatial' (same frame), 'temporal' (same
    position), or 'split' (half the heads each: ViViT's factorised dot-product attention; needs num_heads)."""

    example_params = (
        {"axis": "spatial", "positions_per_frame": 4},
        {"axis": "temporal", "positions_per_frame": 5},
        {"axis": "split", "positions_per_frame": 4},
        {"axis": "temporal", "positions_per_frame": 3, "position_bias": "learned"},
    )
    preferred_kernels = ("factorised",)
    param_rules: ClassVar[dict[str, Param]] = {
        "axis": Param(choices=tuple(AXIS_GROUPS)),
        "positions_per_frame": Param(minimum=1),
        "frames": Param(minimum=1, optional=True),
    }

    def __init__(self, axis: str = "spatial", positions_per_frame: int = 16,
                 frames: int | None = None, **common: Any) -> None:
        self.check_params(axis=axis, positions_per_frame=positions_per_frame, frames=frames,
                          num_heads=common.get("num_heads"))
        super().__init__(**common)
        self.axis = axis
        self.positions_per_frame = positions_per_frame
        self.frames = frames

    @classmethod
    def check_together(cls, params: dict[str, Any]) -> None:
        if params.get("axis") == "split" and "num_heads" in params:
            heads = params["num_heads"]
            require_num_heads(cls.name, params, "axis='split'", "half the heads attend within frames, half across them")
            if heads % 2:
                raise invalid(f"{cls.name}: parameter 'num_heads'",
                              f"must be even with axis='split' (half the heads per axis); got {heads}")
        super().check_together(params)

    def grid(self) -> Grid:
        return Grid(self.positions_per_frame, AXIS_GROUPS[self.axis])

    def mask_depends_on_head(self) -> bool:
        return self.axis == "split"

    def mask_mod(self) -> MaskMod:
        return grid_mod(self.grid(), self.num_heads)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False,
                key_mask: Tensor | None = None, document_ids: Tensor | None = None) -> Tensor:
        """As :meth:`attn.Attention.forward`; with ``frames`` set, keys must fill the grid."""
        if self.frames is not None and isinstance(k, Tensor) and k.dim() == 4:
            tokens = self.frames * self.positions_per_frame
            if k.shape[2] != tokens:
                raise ValueError(
                    f"{self.name}: argument 'k' has {k.shape[2]} keys but the grid is frames={self.frames} "
                    f"x positions_per_frame={self.positions_per_frame} = {tokens} tokens"
                )
        return super().forward(q, k, v, causal=causal, key_mask=key_mask, document_ids=document_ids)

    def cost(self, query: CostQuery) -> Cost:
        """Useful FLOPs in closed form for self-attention (:meth:`Grid.pairs`); counted from the mask otherwise."""
        if query.q_len != query.k_len:
            return super().cost(query)
        grid = self.grid()
        counts = grid.pairs(query.q_len, query.causal)
        if not grid.per_head:
            return pairs_cost(counts[0], query)
        per_head = tuple(counts[grid.axes.index(axis)] for h0, h1, axis in grid.head_groups(query.heads)
                         for _ in range(h0, h1))
        return head_pairs_cost(per_head, query)

    def extra_repr(self) -> str:
        frames = "" if self.frames is None else f", frames={self.frames}"
        return f"axis={self.axis!r}, positions_per_frame={self.positions_per_frame}{frames}, {super().extra_repr()}"
