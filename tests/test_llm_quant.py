"""Weight-only quantization (llm/quant.py): the int4 kernel computes x @ W^T with the dequantized weight, the
grid search recovers weights that already lie on a 4-bit grid (as the GGUF's Q4_K blocks do), and int8 too."""

from __future__ import annotations

import pytest
import torch

from llm.quant import OFF_GRID, Int4Linear, Int8Linear, _group_stats, quantize_weights


def grid_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """A weight on a 4-bit grid per block of 32, like a Q4_K tensor: step * q + offset, some blocks not using
    the whole 0..15 range (so plain min/max quantization would miss their grid)."""
    g = torch.Generator().manual_seed(seed)
    step = torch.rand(n, k // 32, 1, generator=g) * 0.01 + 0.001
    offset = -torch.rand(n, k // 32, 1, generator=g) * 0.08
    top = torch.randint(12, 16, (n, k // 32, 1), generator=g)  # spans of 12..15 steps
    q = (torch.rand(n, k // 32, 32, generator=g) * (top + 1)).floor().clamp(max=top)
    q[..., 0], q[..., 1] = 0, top[..., 0]  # every block reaches both ends of its span
    return (q * step + offset).reshape(n, k)


@pytest.mark.parametrize("n,k,bias", [(64, 128, False), (40, 96, True), (16, 32, False)])
def test_int4_matmul_equals_the_dequantized_reference(n, k, bias):
    torch.manual_seed(n)
    linear = torch.nn.Linear(k, n, bias=bias)
    q = Int4Linear(linear)
    w = q.dequantized()
    assert w.shape == (n, k)
    # the stored weight is close to the original (4 bits per weight: within half a step of its group)
    assert (w - linear.weight.float()).abs().max() < (linear.weight.max() - linear.weight.min()) / 15
    for rows in (1, 3, 17):
        x = torch.randn(2, rows, k, dtype=torch.bfloat16)
        ref = x.float() @ w.t() + (linear.bias.float() if bias else 0)
        out = q(x)
        assert out.shape == (2, rows, n) and out.dtype == torch.bfloat16
        torch.testing.assert_close(out.float(), ref, atol=0.05 * ref.abs().max().item(), rtol=0.02)
    assert q(torch.randn(4, k)).dtype == torch.float32  # a float32 model gets float32 back


def test_grid_search_recovers_a_4bit_grid_exactly():
    w = grid_weight(32, 256)
    q, step, low, error = _group_stats(w, 32)
    rebuilt = (q.reshape(32, 8, 32).float() * step[..., None] + low[..., None]).reshape(32, 256)
    torch.testing.assert_close(rebuilt, w, atol=1e-6, rtol=1e-5)
    assert error < 0.01
    # plain min/max (span / 15 always) would be off by up to half a step on the blocks spanning 12-14 steps
    lo, hi = w.reshape(32, 8, 32).amin(-1, keepdim=True), w.reshape(32, 8, 32).amax(-1, keepdim=True)
    plain_step = (hi - lo) / 15
    plain = (((w.reshape(32, 8, 32) - lo) / plain_step).round() * plain_step + lo).reshape(32, 256)
    assert (plain - w).abs().max() > 100 * (rebuilt - w).abs().max()


def test_off_grid_weights_are_told_apart():
    _, _, _, on = _group_stats(grid_weight(16, 128), 32)
    _, _, _, off = _group_stats(torch.randn(16, 128), 32)
    assert on < 0.05 < OFF_GRID < off < 0.35  # ~0.29 step: uniform rounding error


def test_int8_matches_its_reference():
    linear = torch.nn.Linear(64, 48)
    q = Int8Linear(linear)
    w = q.weight.float() * q.scales.float()[:, None]
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    ref = x.float() @ w.t() + linear.bias.float()
    torch.testing.assert_close(q(x).float(), ref, atol=0.05 * ref.abs().max().item(), rtol=0.02)


def test_quantize_weights_replaces_every_linear_and_the_model_still_runs():
    from conftest_llm import tiny_model

    model = tiny_model(seed=1, vocab=48)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    before = model(input_ids=ids).logits
    counts = quantize_weights(model, 4)
    assert counts == {"int4": 2 * 7 + 1}  # 7 Linears per layer, 2 layers, and the head
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    after = model(input_ids=ids).logits
    assert after.shape == before.shape
    assert torch.corrcoef(torch.stack([before.flatten(), after.flatten()]))[0, 1] > 0.9


def test_quantized_layers_are_cached_next_to_the_weights(tmp_path):
    from llm.quant import quantize_cached

    from conftest_llm import tiny_model

    ids = torch.tensor([[3, 1, 4, 1, 5]])
    first = tiny_model(seed=2, vocab=48)
    counts = quantize_cached(first, str(tmp_path), 4, variant="head-a")
    files = list(tmp_path.glob("specvoice-quant-int4-*.pt"))
    assert len(files) == 1 and counts == {"int4": 15}
    second = tiny_model(seed=2, vocab=48)
    files[0].touch()
    assert quantize_cached(second, str(tmp_path), 4, variant="head-a") == counts  # loaded, not recomputed
    assert torch.equal(first(input_ids=ids).logits, second(input_ids=ids).logits)
    quantize_cached(tiny_model(seed=2, vocab=48), str(tmp_path), 4, variant="head-b")  # another head: another file
    assert len(list(tmp_path.glob("specvoice-quant-int4-*.pt"))) == 2
    files[0].write_bytes(b"broken")
    third = tiny_model(seed=2, vocab=48)
    assert quantize_cached(third, str(tmp_path), 4, variant="head-a") == counts  # rebuilt
    assert torch.equal(first(input_ids=ids).logits, third(input_ids=ids).logits)
