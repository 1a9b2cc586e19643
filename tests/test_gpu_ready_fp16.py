"""fp16 training: a model_step sweep's ``train_step`` would train float16 weights with no
loss scaling, so it is refused in one line naming the key and the allowed values; the
inference pass alone may still run in float16 (see docs/gpu.md). Quality training has no
dtype option: it keeps float32 weights and uses bf16 autocast on CUDA."""

from __future__ import annotations

import pytest

from bench.engine.config import ConfigError
from bench.speed.config import parse_config

MODEL = {"d_model": 32, "num_heads": 2, "num_layers": 2, "d_ff": 64}
BASE = {"name": "m", "workload": "model_step", "model": MODEL, "seq_len": [64],
        "variants": [{"name": "full"}]}


def test_float16_training_steps_are_refused_naming_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError) as err:
        parse_config({**BASE, "dtype": "float16"})
    message = str(err.value)
    assert "\n" not in message
    assert "'dtype'" in message and "float32" in message and "bfloat16" in message
    assert "'float16'" not in message.split("allowed values are")[1]


def test_float16_inference_and_other_dtypes_still_parse():
    assert parse_config({**BASE, "dtype": "float16", "passes": ["fwd"]}).dtype == "float16"
    assert parse_config({**BASE, "dtype": "bfloat16"}).passes == ("fwd", "train_step")
    attention = {"name": "a", "seq_len": [64], "dtype": "float16", "variants": [{"name": "full"}]}
    assert parse_config(attention).dtype == "float16"  # attention sweeps: fwd_bwd is no training
