"""One prepared GPU benchmark: the speculative decoder on a CUDA device, with what a GPU wants.

    python -m llm.bench_gpu --target DIR --draft DIR [--device cuda] [--rounds 2] [--out bench-results/llm-gpu.json]

On a GPU the per-step overhead (Python, kernel launches), not the bytes read, dominates a 1.5B model, so plain
speculation can even lose (a 1.7B target with a 135M draft ran 30% slower in vLLM, vllm issue 15025).
Hence, against the same target alone each time:
- eager: dynamic cache, no compilation (the CPU path, as is);
- compiled: a static cache and ``torch.compile(mode="reduce-overhead")`` (CUDA graphs) for the decode steps
  of both models, target alone compiled the same way;
- wider trees (eager): token trees of depth 2-4 and width 2-4 (a GPU verifies 16+ tokens for about the
  cost of one, unlike a 2-core CPU).
bf16 weights for both models (the int4 kernels are CPU ones here). Greedy, chat template, interleaved rounds.
Untested on a GPU so far (no GPU was lent); ``--device cpu --tiny`` runs the same code on this machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from llm.bench import BASE, PROMPTS, Result, _print_table, _run_one
from llm.engine import DecodeSettings, Engine
from llm.prompts import SYSTEM


def _engines(args) -> dict[str, Engine]:
    eager = Engine.load(  # the draft's own weights: the compile comparison is of bf16 kernels, not int4 ones
        args.target,
        args.draft,
        device=args.device,
        dtype="bfloat16",
        mode="draft",
        draft_quantize="none",
        context_limit=args.static_cache,
    )
    compiled = Engine(
        eager.target_model,
        eager.tokenizer,
        eager.draft_model,
        mode="draft",
        context_limit=args.static_cache,
        draft_out_ids=eager.draft_out_ids,
        compile="both",
        compile_mode=args.compile_mode,
        static_cache=args.static_cache,
    )
    return {"eager": eager, "compiled": compiled}


def _methods(args) -> list[tuple[str, str, DecodeSettings]]:
    n = args.max_new_tokens
    chain = [
        ("eager", f"ours draft k={k}", DecodeSettings(mode="draft", draft_length=k, max_new_tokens=n))
        for k in (2, 3, 4)
    ]
    chain.append(
        (
            "eager",
            "ours draft confidence",
            DecodeSettings(mode="draft", draft_length="confidence", max_draft_length=8, max_new_tokens=n),
        )
    )
    compiled = [("compiled", "compiled: target alone", DecodeSettings(mode="target", max_new_tokens=n))]
    compiled += [
        ("compiled", f"compiled: ours draft k={k}", DecodeSettings(mode="draft", draft_length=k, max_new_tokens=n))
        for k in (2, 3, 4)
    ]
    trees = [
        (
            "eager",
            f"ours draft tree k={k} w={w}",
            DecodeSettings(mode="draft", draft_length=k, tree=True, tree_width=w, tree_nodes=k * w, max_new_tokens=n),
        )
        for k in (2, 3, 4)
        for w in (2, 3, 4)
    ]
    return [("eager", BASE, DecodeSettings(mode="target", max_new_tokens=n))] + chain + compiled + trees


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llm.bench_gpu", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--prompts", type=int, default=len(PROMPTS))
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--static-cache", type=int, default=1024, help="positions of the static caches")
    p.add_argument("--compile-mode", default="reduce-overhead")
    p.add_argument("--tiny", action="store_true", help="a quick check of the code path: 2 prompts, 8 tokens, 1 round")
    p.add_argument("--out", default="bench-results/llm-gpu.json")
    args = p.parse_args(argv)
    if args.tiny:
        args.prompts, args.max_new_tokens, args.rounds = 2, 8, 1
    started = time.time()
    engines = _engines(args)
    kept = {"compiled": engines["compiled"].new_caches()}  # CUDA graphs capture the static caches: reuse them
    conv = engines["eager"].conversation(SYSTEM)
    prompts = [conv.prompt_ids(conv.messages + [{"role": "user", "content": t}]) for t in PROMPTS[: args.prompts]]
    methods = _methods(args)
    results = {name: Result(name) for _, name, _ in methods}
    for which, _, settings in methods:  # compile and capture every shape once, off the clock
        engines[which].decode(
            prompts[0], settings.but(max_new_tokens=min(8, args.max_new_tokens)), caches=kept.get(which)
        )
    with tqdm(total=args.rounds * len(prompts) * len(methods), desc="bench gpu", unit="run") as bar:
        for rnd in range(args.rounds):
            for i, prompt in enumerate(prompts):
                shift = (rnd * len(prompts) + i) % len(methods)
                for which, name, settings in methods[shift:] + methods[:shift]:
                    _run_one(engines[which], settings, prompt, args.max_new_tokens, results[name], kept.get(which))
                    bar.update(1)
    reference = results[BASE].tokens
    for res in results.values():
        res.identical = [a == b for a, b in zip(res.tokens, reference, strict=False)]
    rows = []
    for which, name, _ in methods:  # each speedup against the target alone run the same way
        base = results[BASE if which == "eager" else "compiled: target alone"].decode_tokens_per_s
        rows.append(results[name].row(base, None))
    _print_table(rows)
    out: dict[str, Any] = {
        "results": rows,
        "meta": {
            "target": args.target,
            "draft": args.draft,
            "device": args.device,
            "compile_mode": args.compile_mode,
            "static_cache": args.static_cache,
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "wall_s": round(time.time() - started, 1),
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
