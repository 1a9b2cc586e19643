"""Vision Transformer: patches + learned 1D positions + CLS token, any attention."""

from __future__ import annotations

from torch import Tensor, nn

from models.config import ViTConfig
from models.embeddings import PatchEmbedding, PositionEmbedding, PrefixTokens
from models.encoder import TransformerEncoder, pool
from models.registration import register_model


@register_model("vit", ViTConfig)
class ViT(nn.Module):
    """``model(images (B, C, S, S)) -> logits (B, num_classes)`` over ``[CLS?][extra global tokens][patches]``."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_emb = PatchEmbedding(
            config.image_size, config.patch_size, config.in_channels, config.d_model
        )
        self.prefix = PrefixTokens(config.d_model, config.pooling == "cls", config.num_extra_global)
        self.pos_emb = PositionEmbedding(config.position, config.d_model, config.max_len)
        self.drop = nn.Dropout(config.dropout)
        self.encoder = TransformerEncoder(config)
        self.head = nn.Linear(config.d_model, config.num_classes)

    def forward(self, images: Tensor) -> Tensor:
        x = self.patch_emb(images)  # (B, P, D)
        x, _ = self.prefix(x, None)  # (B, G + P, D)
        h = self.encoder(self.drop(self.pos_emb(x)))  # (B, G + P, D)
        return self.head(pool(h, self.config.pooling, self.prefix.count, None))  # (B, C)
