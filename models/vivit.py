"""ViViT (Arnab et al. 2021; docs/quality.md, "Video"): tubelets become ``N = T' * S`` frame-major tokens (the grid
of :mod:`attn.grid`), mean-pooled (no CLS, so every token stays on the grid). ``structure``: ``joint`` (model 1, or
4 with a ``factorised`` attention, which runs there only, ``positions_per_frame`` filled in as ``S``);
``factorised_encoder`` (model 2: a temporal encoder over the frames' mean tokens); ``factorised_self_attention``
(model 3: each block attends within frames, then across them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor, nn

import attn
from attn.validation import invalid, require_choice, require_int
from models.attention import MultiHeadAttention
from models.blocks import make_blocks
from models.config import ModelConfig
from models.embeddings import PositionEmbedding
from models.encoder import TransformerEncoder
from models.registration import register_model

STRUCTURES = ("joint", "factorised_encoder", "factorised_self_attention")
GRID_VARIANT = "factorised"


@dataclass(frozen=True)
class ViViTConfig(ModelConfig):
    """ViViT: tubelet embedding, space-time positions, one of ViViT's structures, a classifier."""

    frames: int = 8
    image_size: int = 16
    in_channels: int = 1
    tubelet_frames: int = 1
    patch_size: int = 4
    num_classes: int = 2
    structure: str = "joint"
    temporal_layers: int | None = None  # factorised_encoder: the temporal encoder's (None: num_layers)
    temporal_attention: str | None = None  # factorised structures (None: attention, attention_params)
    temporal_attention_params: dict[str, Any] = field(default_factory=dict)

    kind_sizes: ClassVar[dict[str, dict[str, Any]]] = {
        "mini": dict(frames=4, image_size=16, patch_size=4, max_len=64),
    }

    def __post_init__(self) -> None:
        object.__setattr__(self, "temporal_attention_params", dict(self.temporal_attention_params))
        for name in ("frames", "image_size", "in_channels", "tubelet_frames", "patch_size", "num_classes"):
            require_int(name, getattr(self, name), minimum=1)
        require_choice("structure", self.structure, STRUCTURES)
        if self.temporal_layers is not None:
            require_int("temporal_layers", self.temporal_layers, minimum=1)
        if self.frames % self.tubelet_frames:
            raise invalid("tubelet_frames", f"must divide frames={self.frames}; got {self.tubelet_frames}")
        if self.image_size % self.patch_size:
            raise invalid("patch_size", f"must divide image_size={self.image_size}; got {self.patch_size}")
        if self.temporal_attention is None and self.temporal_attention_params:
            raise invalid("temporal_attention_params", "given without temporal_attention (set both, or neither)")
        if self.attention == GRID_VARIANT:
            object.__setattr__(self, "attention_params", self._grid_params(dict(self.attention_params)))
        super().__post_init__()
        if self.position == "rope":
            raise invalid("position", "must be 'learned', 'sinusoidal', 'none' or 'auto' for vivit "
                                      "(space-time positions are added to the tokens); got 'rope'")
        if self.num_tokens > self.max_len and self.position == "learned":
            raise invalid("max_len", f"must be >= the {self.num_tokens} space-time tokens "
                                     f"({self.token_frames} frames x {self.positions} positions); "
                                     f"got {self.max_len}")
        name, params = self.temporal_self_attention
        if self.temporal_attention is not None:
            require_choice("temporal_attention", name, attn.list_attention())
            if name == GRID_VARIANT:
                raise invalid("temporal_attention", f"{GRID_VARIANT!r} attends on the grid of all "
                                                    "N tokens: use it as 'attention' with structure 'joint'")
            self._check_attention(name, params, "temporal_attention")

    def _grid_params(self, params: dict[str, Any]) -> dict[str, Any]:
        if self.structure != "joint":
            raise invalid("attention", f"{GRID_VARIANT!r} attends on the grid of all N tokens, so it "
                                       f"needs structure 'joint'; got structure={self.structure!r}")
        given = params.setdefault("positions_per_frame", self.positions)
        if given != self.positions:
            raise invalid("attention_params", f"positions_per_frame must be the {self.positions} tokens "
                                              f"of a frame ((image_size / patch_size)^2); got {given!r}")
        frames = params.get("frames")
        if frames is not None and frames != self.token_frames:
            raise invalid("attention_params", f"frames must be the {self.token_frames} token frames "
                                              f"(frames / tubelet_frames); got {frames!r}")
        return params

    def default_position(self) -> str:
        return "learned"

    @property
    def token_frames(self) -> int:  # T'
        return self.frames // self.tubelet_frames

    @property
    def positions(self) -> int:  # S
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_tokens(self) -> int:  # N = T' * S
        return self.token_frames * self.positions

    @property
    def temporal_self_attention(self) -> tuple[str, dict[str, Any]]:
        if self.temporal_attention is None:
            return self.attention, self.attention_params
        return self.temporal_attention, self.temporal_attention_params


class TubeletEmbedding(nn.Module):
    """Videos ``(B, T, C, H, W)`` -> tubelet tokens ``(B, T' * S, D)``, frame-major (a strided 3-D conv)."""

    def __init__(self, config: ViViTConfig) -> None:
        super().__init__()
        self.expected = (config.frames, config.in_channels, config.image_size, config.image_size)
        size = (config.tubelet_frames, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(config.in_channels, config.d_model, kernel_size=size, stride=size)

    def forward(self, videos: Tensor) -> Tensor:
        if videos.dim() != 5 or tuple(videos.shape[1:]) != self.expected:
            raise ValueError(f"videos: expected shape (B, {', '.join(map(str, self.expected))}); "
                             f"got {tuple(videos.shape)}")
        x = self.proj(videos.transpose(1, 2))  # (B, D, T', H/p, W/p)
        return x.flatten(2).transpose(1, 2)  # (B, T' * S, D)


class FactorisedSelfAttention(nn.Module):
    """ViViT's model 3 encoder, ``(B, T', S, D) -> (B, T', S, D)``: within frames, then across them and the FFN."""

    def __init__(self, config: ViViTConfig) -> None:
        super().__init__()
        heads, d = config.num_heads, config.d_model
        self.pre_norm = config.norm == "pre"
        self.spatial = nn.ModuleList(
            MultiHeadAttention(d, heads, config.attention, config.attention_params, config.attention_kernel)
            for _ in range(config.num_layers))
        self.spatial_norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(config.num_layers))
        name, params = config.temporal_self_attention
        self.temporal = make_blocks(config, config.num_layers, name, params, causal=False)
        self.drop = nn.Dropout(config.dropout)
        self.norm = nn.LayerNorm(d) if self.pre_norm else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        batch, frames, positions, d = x.shape
        for attend, norm, block in zip(self.spatial, self.spatial_norms, self.temporal):
            xs = x.reshape(batch * frames, positions, d)  # (B*T', S, D): one sequence per frame
            out = attend(norm(xs) if self.pre_norm else xs)  # (B*T', S, D)
            xs = xs + self.drop(out) if self.pre_norm else norm(xs + self.drop(out))
            xt = xs.reshape(batch, frames, positions, d).transpose(1, 2).reshape(batch * positions, frames, d)
            xt = block(xt)  # (B*S, T', D): one sequence per position, then the FFN
            x = xt.reshape(batch, positions, frames, d).transpose(1, 2)  # (B, T', S, D)
        return self.norm(x)


@register_model("vivit", ViViTConfig)
class ViViT(nn.Module):
    """``model(videos (B, T, C, H, W)) -> logits (B, num_classes)`` (see the module docstring)."""

    def __init__(self, config: ViViTConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = TubeletEmbedding(config)
        self.pos_emb = PositionEmbedding(config.position, config.d_model, max(config.max_len, config.num_tokens))
        self.drop = nn.Dropout(config.dropout)
        if config.structure == "joint":
            self.encoder: nn.Module = TransformerEncoder(config)
        elif config.structure == "factorised_encoder":
            self.encoder = TransformerEncoder(config)  # spatial: within each frame
            name, params = config.temporal_self_attention
            layers = config.temporal_layers or config.num_layers
            self.frame_pos = PositionEmbedding(config.position, config.d_model,
                                               max(config.max_len, config.token_frames))
            self.temporal = TransformerEncoder(config, layers, name, params)
        else:
            self.encoder = FactorisedSelfAttention(config)
        self.head = nn.Linear(config.d_model, config.num_classes)

    def forward(self, videos: Tensor) -> Tensor:
        c = self.config
        x = self.drop(self.pos_emb(self.embed(videos)))  # (B, N, D)
        batch, d = x.shape[0], x.shape[-1]
        if c.structure == "joint":
            pooled = self.encoder(x).mean(dim=1)  # (B, D)
        elif c.structure == "factorised_encoder":
            frames = self.encoder(x.reshape(batch * c.token_frames, c.positions, d))  # (B*T', S, D)
            frames = frames.mean(dim=1).reshape(batch, c.token_frames, d)  # (B, T', D)
            pooled = self.temporal(self.frame_pos(frames)).mean(dim=1)  # (B, D)
        else:
            grid = self.encoder(x.reshape(batch, c.token_frames, c.positions, d))  # (B, T', S, D)
            pooled = grid.mean(dim=(1, 2))  # (B, D)
        return self.head(pooled)  # (B, C)


__all__ = ["STRUCTURES", "FactorisedSelfAttention", "TubeletEmbedding", "ViViT", "ViViTConfig"]
