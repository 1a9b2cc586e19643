"""The ``model_step`` workload: a training step or forward of an ``encoder_classifier`` of the case's attention."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from attn import Attention
from attn.cost import CostQuery
from bench.engine.measure import CallTimer, measure_memory
from bench.speed.cases import Case
from bench.speed.rows import path_columns
from models import create_model


def model_flops(case: Case, attention: Any) -> tuple[dict[str, int], str, float]:
    """FLOPs of the ``fwd`` and ``train_step`` passes: the attention's cost hook, projections and feed-forward."""
    sizes = dict(case.model)
    d, layers = sizes["d_model"], sizes["num_layers"]
    d_ff = sizes.get("d_ff", 4 * d)
    tokens = case.batch * case.seq_len
    dense_fwd = 2 * (4 * d * d + 2 * d * d_ff) * tokens * layers
    cost = attention.cost(CostQuery.self_attention(case.batch, case.heads, case.seq_len,
                                                   case.head_dim, case.causal))
    fwd = dense_fwd + layers * cost.fwd
    step = 3 * dense_fwd + layers * cost.fwd_bwd
    density = cost.pairs / case.seq_len**2 if cost.pairs is not None else 1.0
    return {"fwd": fwd, "train_step": step}, f"model_step (attention {cost.kind})", density


def build_model(case: Case) -> Any:
    """The classifier of a model-step case, on its device and dtype."""
    sizes = {"vocab_size": 256, "num_classes": 10, "d_ff": 4 * dict(case.model)["d_model"],
             **dict(case.model)}
    model = create_model("encoder_classifier", "mini", attention=case.variant,
                         attention_params=case.params_dict, attention_kernel=case.kernel,
                         max_len=case.seq_len + 8, pooling="mean", **sizes)
    return model.to(device=case.device, dtype=getattr(torch, case.dtype))


class ModelStepRunner:
    """The calls of one pass of a model-step case (same interface as the attention runner)."""

    def __init__(self, case: Case, model: Any, pass_name: str) -> None:
        self.case, self.model, self.pass_name = case, model, pass_name
        self.device = torch.device(case.device)
        gen = torch.Generator(device="cpu").manual_seed(0)
        sizes = dict(case.model)
        self.ids = torch.randint(0, sizes.get("vocab_size", 256), (case.batch, case.seq_len),
                                 generator=gen).to(self.device)  # (B, N)
        self.labels = torch.randint(0, sizes.get("num_classes", 10), (case.batch,),
                                    generator=gen).to(self.device)  # (B,)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.paths: list[Any] = []
        self.fn = self._step if pass_name == "train_step" else self._forward
        self.setup = None
        self.timer = CallTimer(self.fn, None, self.device)

    def _attention_paths(self) -> None:
        for module in self.model.modules():
            if isinstance(module, Attention):
                self.paths.append(module.last_path)
                return  # every layer runs the same attention: the first one speaks for all

    def _forward(self) -> None:
        with torch.no_grad():
            self.model(self.ids)
        self._attention_paths()

    def _step(self) -> None:
        loss = F.cross_entropy(self.model(self.ids), self.labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._attention_paths()

    def warm(self) -> dict[str, Any]:
        """The first call and the warm-up (as the attention runner)."""
        first = self.timer.time_once()
        for _ in range(self.case.warmup - 1):
            self.timer.time_once()
        return {"first_call_ms": first * 1e3}

    def prepare(self) -> dict[str, Any]:
        """One estimate call and the memory readings (as the attention runner)."""
        estimate = self.timer.time_once()
        memory = measure_memory(self.fn, None, self.device, call_s=estimate)
        return {"estimate_ms": estimate * 1e3,
                "peak_mem_bytes": memory.peak_bytes, "rss_peak_bytes": memory.rss_peak_bytes}

    def finish(self) -> dict[str, Any]:
        return path_columns(self.paths, self.case)
