"""Weight-only quantization: int4 (groups of 32 along the input dimension) and int8 (per output channel).

Why weight-only: batch-1 decoding reads every weight once per token, so its time is memory traffic; 4-bit
weights read a quarter of bf16's bytes. The activations stay in bfloat16, which keeps the draft's acceptance
at the bf16 level (torch's dynamic int8 quantizes the activations too, and lowered alpha from 0.74 to 0.61).

Why a searched step: the embedded models come from Q4_K GGUF files, whose weights already lie on a 4-bit grid
per block of 32 (w = step * q + offset, q in 0..15). Plain min/max quantization recovers that grid only when
a block uses both q = 0 and q = 15; trying the steps (max - min) / j for j = 15..12 and keeping the one with the
smallest error recovers it (measured on the 1.5B: every Q4_K block spans 14 or 15 steps, and the error drops
from 0.08 to 0.01 of a step, i.e. to bf16 rounding), so the int4 model computes with the GGUF's own values.
Tensors the GGUF kept at 6 bits (Q6_K: the output head, some down and value projections) lie on no 4-bit
grid; ``quantize_weights`` can give those more bits (``off_grid_bits``).

The kernels are torch's CPU ones (``_weight_int4pack_mm_for_cpu``, ``_weight_int8pack_mm``); elsewhere
(CUDA) the same module falls back to a dequantize-and-matmul so the code stays device-agnostic.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("specvoice.llm")

GROUP = 32


STEPS = (15, 14, 13, 12)  # grid spans tried: Q4_K blocks of the embedded models span 14 or 15 steps
ROWS = 4096  # rows quantized at a time: bounds the float32 temporaries for a 150k-row head


def _group_stats(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """(q [N, K] int32 in 0..15, step [N, K/group], low [N, K/group], error) with w ~ q * step + low.

    error: the root-mean-square error in units of the plain min/max step (about 0.29 for weights on no grid,
    about 0.01 for weights that lie on a 4-bit grid up to bf16 rounding).
    """
    qs, steps, lows, sq_err = [], [], [], 0.0
    for rows in w.split(ROWS):
        g = rows.float().reshape(rows.shape[0], -1, group)
        low, span = g.amin(-1), (g.amax(-1) - g.amin(-1)).clamp(min=1e-12)
        best_err = torch.full_like(low, float("inf"))
        best_step = span / 15
        for j in STEPS:
            step = span / j
            q = ((g - low[..., None]) / step[..., None]).round_().clamp_(0, j)
            err = (q.mul_(step[..., None]).add_(low[..., None]).sub_(g)).square_().sum(-1)
            better = err < best_err * (1 - 1e-3)  # a smaller span must be clearly better (ties keep 15)
            best_err = torch.where(better, err, best_err)
            best_step = torch.where(better, step, best_step)
        q = ((g - low[..., None]) / best_step[..., None]).round_().clamp_(0, 15).to(torch.int32)
        qs.append(q.reshape(rows.shape[0], -1))
        steps.append(best_step)
        lows.append(low)
        sq_err += float((best_err / (span / 15) ** 2).sum()) / group
    n_groups = w.numel() // group
    return torch.cat(qs), torch.cat(steps), torch.cat(lows), (sq_err / max(n_groups, 1)) ** 0.5


class Int4Linear(torch.nn.Module):
    """A Linear with int4 weights (asymmetric, one bf16 step and offset per group of 32 inputs)."""

    packed: torch.Tensor  # buffers, declared for type checkers
    scales: torch.Tensor

    def __init__(self, linear: torch.nn.Linear, group: int = GROUP):
        super().__init__()
        n, k = linear.weight.shape
        if k % group:
            raise ValueError(f"int4 needs in_features divisible by {group}, got {k}")
        self.in_features, self.out_features, self.group = k, n, group
        weight = linear.weight.data
        if n % 16:  # the packed layout needs rows in multiples of 16: pad with zero rows, sliced off in forward
            weight = torch.cat([weight, weight.new_zeros(16 - n % 16, k)])
        q, step, low, self.error = _group_stats(weight, group)
        # the kernel computes (q - 8) * step + zero, so zero = low + 8 * step; layout [K/group, N, 2]
        scales = torch.stack([step, low + 8 * step], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
        self.register_buffer("scales", scales)
        device = linear.weight.device
        if device.type == "cpu":
            self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
        else:  # no CPU kernel there: keep the codes, dequantize in forward (correct, not fast)
            self.register_buffer("packed", q.to(torch.uint8))
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.data.clone(), requires_grad=False)

    def dequantized(self) -> torch.Tensor:
        """The weight the kernel computes with, [N, K] float32 (for tests and non-CPU devices)."""
        if self.packed.device.type == "cpu":
            eye = torch.eye(self.in_features, dtype=torch.bfloat16)
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, self.group, self.scales)
            return out.float().t()[: self.out_features]
        q = self.packed.float().reshape(self.packed.shape[0], -1, self.group)
        s = self.scales.float()
        step, zero = s[..., 0].t()[..., None], s[..., 1].t()[..., None]
        return ((q - 8) * step + zero).reshape(-1, self.in_features)[: self.out_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if self.packed.device.type == "cpu":
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group, self.scales)
        else:
            out = flat @ self.dequantized().to(torch.bfloat16).t()
        if out.shape[-1] != self.out_features:
            out = out[:, : self.out_features]
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={self.group}"


class Int8Linear(torch.nn.Module):
    """A Linear with int8 weights, one bf16 scale per output channel (symmetric); activations stay bf16."""

    weight: torch.Tensor
    scales: torch.Tensor

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        w = linear.weight.data.float()
        scale = (w.abs().amax(1) / 127).clamp(min=1e-12)
        self.in_features, self.out_features = w.shape[1], w.shape[0]
        self.register_buffer("weight", (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(torch.bfloat16))
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.data.clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if flat.device.type == "cpu":
            out = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales)
        else:
            out = (flat @ self.weight.to(torch.bfloat16).t()) * self.scales
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


OFF_GRID = 0.15  # error (in steps) above which a tensor is taken to lie on no 4-bit grid


def quantize_weights(model: Any, bits: int = 4, group: int = GROUP, off_grid_bits: int | None = None) -> dict[str, int]:
    """Replace every Linear by its weight-only quantized form, in place, one layer at a time (peak memory: one
    layer's float32 copy). bits: 4 or 8; off_grid_bits (4, 8 or 16; default: bits): for int4, the precision of
    tensors that lie on no 4-bit grid. A Linear whose input width does not divide into groups stays as it is.
    Returns how many Linears got each precision."""
    counts: dict[str, int] = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, torch.nn.Linear):
                continue
            new: torch.nn.Module = child
            if bits == 8:
                new = Int8Linear(child)
            elif child.in_features % group == 0:
                new = Int4Linear(child, group)
                if off_grid_bits not in (None, 4) and new.error > OFF_GRID:
                    new = Int8Linear(child) if off_grid_bits == 8 else child
            kind = {Int4Linear: "int4", Int8Linear: "int8"}.get(type(new), "bf16")
            counts[kind] = counts.get(kind, 0) + 1
            setattr(parent, name, new)
    if getattr(model, "config", None) is not None and getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False  # the head is its own (quantized) copy now
    return counts


# --- a cache of quantized layers next to the weights: quantizing the 1.5B takes minutes, loading it seconds ----


def _shell(kind: type[torch.nn.Module], spec: dict[str, Any]) -> torch.nn.Module:
    module: Any = kind.__new__(kind)
    torch.nn.Module.__init__(module)
    module.in_features, module.out_features = spec["in"], spec["out"]
    if kind is Int4Linear:
        module.group, module.error = spec["group"], spec["error"]
    for name, tensor in spec["buffers"].items():
        module.register_buffer(name, tensor)
    module.bias = None if spec["bias"] is None else torch.nn.Parameter(spec["bias"], requires_grad=False)
    return module


def save_quantized(model: Any, path: Path) -> None:
    """Write the model's quantized layers (not the rest: that stays in the model's own weights file)."""
    layers = {}
    for name, m in model.named_modules():
        if isinstance(m, (Int4Linear, Int8Linear)):
            layers[name] = {
                "kind": type(m).__name__,
                "in": m.in_features,
                "out": m.out_features,
                "group": getattr(m, "group", 0),
                "error": getattr(m, "error", 0.0),
                "buffers": dict(m._buffers),
                "bias": None if m.bias is None else m.bias.data,
            }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save({"torch": str(torch.__version__), "layers": layers}, tmp)
    tmp.replace(path)


def load_quantized(model: Any, path: Path) -> dict[str, int] | None:
    """Swap in the quantized layers saved by ``save_quantized``; None (and nothing changed) if unusable."""
    try:
        data = torch.load(path, weights_only=True)
    except Exception as exc:  # torch.load of a damaged file raises many kinds; any of them means: rebuild
        log.warning("unreadable quantized cache, rebuilding", extra={"path": str(path), "error": str(exc)})
        return None
    modules = dict(model.named_modules())
    layers = data.get("layers", {})
    if data.get("torch") != str(torch.__version__) or not all(name in modules for name in layers):
        return None
    counts: dict[str, int] = {}
    for name, spec in layers.items():
        kind = {"Int4Linear": Int4Linear, "Int8Linear": Int8Linear}[spec["kind"]]
        parent_name, _, attr = name.rpartition(".")
        setattr(modules[parent_name] if parent_name else model, attr, _shell(kind, spec))
        key = "int4" if kind is Int4Linear else "int8"
        counts[key] = counts.get(key, 0) + 1
    if getattr(model, "config", None) is not None:
        model.config.tie_word_embeddings = False
    return counts


def quantize_cached(
    model: Any, folder: str, bits: int = 4, off_grid_bits: int | None = None, variant: str = ""
) -> dict[str, int]:
    """``quantize_weights``, through a cache file in the model's folder (keyed by the recipe, ``variant`` e.g.
    a reduced head's ids, and the torch version). A folder that cannot be written to just gets no cache."""
    key = hashlib.sha1(f"{bits}/{off_grid_bits}/{GROUP}/{variant}/{torch.__version__}".encode()).hexdigest()[:12]
    path = Path(folder) / f"specvoice-quant-int{bits}-{key}.pt"
    if path.exists():
        counts = load_quantized(model, path)
        if counts is not None:
            return counts
    counts = quantize_weights(model, bits, off_grid_bits=off_grid_bits)
    try:
        save_quantized(model, path)
    except OSError as exc:
        log.info("quantized layers not cached", extra={"path": str(path), "error": str(exc)})
    return counts
