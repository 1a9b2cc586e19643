"""Block masks read from a pattern's structure admit exactly the tiles ``create_block_mask``
finds by evaluating the mask_mod on every pair, mark no tile full that is not, and never call
the mask_mod."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from torch.nn.attention.flex_attention import _transpose_ordered, create_block_mask

from attn import create_attention
from attn.documents import Documents
from attn.kernels.block_masks import Structure, structured_block_mask
from attn.mods import and_masks, causal_mask_mod

BLOCK = 128
CPU = torch.device("cpu")
VARIANTS = [
    ("full", {}), ("causal", {}), ("sliding_window", {"window": 100}), ("sliding_window", {"window": 128}),
    ("dilated", {"window": 40, "dilation": 3}), ("dilated", {"window": 20, "dilation": [1, 2]}),
    ("global_tokens", {"window": 50, "num_global": 5}), ("global_tokens", {"window": 64, "num_global": 130}),
    ("factorised", {"positions_per_frame": 100}), ("factorised", {"positions_per_frame": 48, "axis": "temporal"}),
    ("factorised", {"positions_per_frame": 64, "axis": "split"}),
]
SHAPES = [(512, 512), (256, 768), (640, 640), (1, 512), (384, 200)]


def _tiles(block_mask, full: bool) -> torch.Tensor:
    """Bool (H, R, C) of the tiles a block mask lists as partial (``full=False``) or full."""
    counts = block_mask.full_kv_num_blocks if full else block_mask.kv_num_blocks
    indices = block_mask.full_kv_indices if full else block_mask.kv_indices
    out = torch.zeros(indices.shape[1:], dtype=torch.bool)
    for h, r in itertools.product(range(indices.shape[1]), range(indices.shape[2])):
        out[h, r, indices[0, h, r, :counts[0, h, r]].long()] = True
    return out


@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=lambda p: str(p))
@pytest.mark.parametrize("causal", [False, True])
def test_tiles_match_create_block_mask(name, params, causal):
    pattern = create_attention(name, num_heads=4, **params).pattern()
    structure = Structure.of(pattern)
    assert structure is not None
    causal = causal or pattern.always_causal
    base = and_masks(pattern.mask_mod, causal_mask_mod if causal else None)
    for q_len, k_len in SHAPES:
        offset = k_len - q_len

        def mask_mod(b, h, i, j, offset=offset):
            return i >= 0 if base is None else base(b, h, i + offset, j)

        expected = create_block_mask(mask_mod, None, 4 if pattern.per_head else None, q_len, k_len,
                                     device=CPU, BLOCK_SIZE=BLOCK)
        built = structured_block_mask(structure, mask_mod, causal=causal, q_len=q_len, k_len=k_len,
                                      q_pad=q_len, k_pad=k_len, heads=4, block=BLOCK, device=CPU,
                                      key_mask=False)
        any_built = _tiles(built, False) | _tiles(built, True)
        any_expected = (_tiles(expected, False) | _tiles(expected, True)).expand_as(any_built)
        assert torch.equal(any_built, any_expected), (q_len, k_len)
        assert not (_tiles(built, True) & ~_tiles(expected, True).expand_as(any_built)).any(), (q_len, k_len)
        q_num, q_idx = _transpose_ordered(built.kv_num_blocks, built.kv_indices)  # the backward's view
        assert torch.equal(q_num, built.q_num_blocks)
        for h, r in itertools.product(range(q_num.shape[1]), range(q_num.shape[2])):
            n = int(q_num[0, h, r])
            assert torch.equal(q_idx[0, h, r, :n], built.q_indices[0, h, r, :n])


def test_a_key_mask_leaves_no_tile_full_and_the_mask_mod_is_never_called():
    def never(*args):
        raise AssertionError("the mask_mod was evaluated")

    structure = Structure.of(create_attention("global_tokens", window=256, num_global=16).pattern())
    n = 1 << 16
    built = structured_block_mask(structure, never, causal=True, q_len=n, k_len=n, q_pad=n, k_pad=n,
                                  heads=8, block=BLOCK, device=CPU, key_mask=True)
    assert built.full_kv_num_blocks.sum() == 0
    assert built.kv_num_blocks.shape == (1, 1, n // BLOCK)
    assert int(built.kv_num_blocks[0, 0, -1]) == 1 + 3  # the global block and the band's three


def test_patterns_without_structure_are_left_to_create_block_mask():
    window = create_attention("sliding_window", window=8).pattern()
    assert Structure.of(window) is not None
    packed = window.packed(Documents.from_ids(torch.tensor([[0] * 10 + [1] * 6])))
    assert Structure.of(packed) is None  # its mods allow pairs within one document only
    plugin = dataclasses.replace(window, band=None)  # a mask_mod alone, as a plug-in may declare
    assert Structure.of(plugin) is None
