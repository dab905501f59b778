"""Loading causal LMs, checking that a draft can serve a target, and making the draft cheap.

Thin on purpose: transformers does the loading; this module adds the three things the decoder needs.
- Weights are copied into ordinary memory after loading. safetensors maps the file; on these VMs the
  memory-reclaim daemon pages a mapping out and decoding slowed from 3.8 to 2.3 tok/s over ten minutes.
- A draft must share the target's tokenizer (same ids for the same text, same special ids), or its
  proposals mean nothing; we refuse a mismatched pair at load with the reason.
- The draft need not be exact (verification keeps the output exact), so it can be made cheaper: int4
  weights (quant.py) and a reduced-vocabulary head (FR-Spec: only the most frequent tokens, counted in real
  replies by vocab.py; a rarer token is then never proposed, only produced by the target).
- The draft's head may have other rows than the target's even with one tokenizer (models pad their heads to
  different multiples: Qwen 7B has 152,064 rows, 0.5B 151,936). ``align_draft_head`` maps the draft's logit
  columns onto the target's rows, dropping padding rows, or refuses the pair when real tokens are missing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("specvoice.llm")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(RuntimeError):
    """A model that could not be loaded, with the fix in the message."""


class IncompatibleDraftError(ValueError):
    """The draft does not share the target's tokenizer."""


def _source(location: str) -> tuple[str, str]:
    """(what from_pretrained gets, how to name it in an error)."""
    if location.startswith("hub:"):
        return location[4:], f"hub id {location[4:]!r}"
    if not Path(location).is_dir():
        raise ModelLoadError(
            f"model folder {location} does not exist; fix: run `specvoice models prepare` "
            "or point the config at a transformers model folder"
        )
    return location, f"folder {location}"


def _load_error(where: str, exc: Exception) -> ModelLoadError:
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    hint = (
        "this machine is offline (HF_HUB_OFFLINE=1); use a local folder or a registered model name"
        if offline
        else "check the id, your network, and that the folder holds config.json and weights"
    )
    return ModelLoadError(f"cannot load the LLM from {where}: {exc.__class__.__name__}: {exc}; fix: {hint}")


def load_tokenizer(location: str):
    from transformers import AutoTokenizer

    source, where = _source(location)
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:  # missing files, unknown or malformed hub ids
        raise _load_error(where, exc) from exc


def load_causal_lm(location: str, *, device: str = "cpu", dtype: str = "bfloat16", threads: int | None = None):
    """Load (model, tokenizer) from a local folder or "hub:<id>", in eval mode, weights in RAM."""
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}; fix: pick one of those")
    if threads:
        torch.set_num_threads(threads)
    source, where = _source(location)
    tokenizer = load_tokenizer(location)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype])
    except (OSError, ValueError) as exc:  # missing files, unknown or malformed hub ids
        raise _load_error(where, exc) from exc
    model.to(device)  # type: ignore[arg-type]  # transformers' decorator hides Module.to's signature
    model.eval()
    if device == "cpu":
        _copy_into_ram(model)
    log.info("llm loaded", extra={"location": location, "dtype": dtype, "params": _n_params(model)})
    return model, tokenizer


def _copy_into_ram(model: torch.nn.Module) -> None:
    """Replace every (possibly memory-mapped) weight with a private copy; shared (tied) weights stay shared."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()
        for module in model.modules():
            for name, buf in list(module.named_buffers(recurse=False)):
                if buf is not None:
                    module._buffers[name] = buf.clone()


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def special_ids(tokenizer) -> dict[str, int | None]:
    return {name: getattr(tokenizer, f"{name}_token_id", None) for name in ("bos", "eos", "pad", "unk")}


def check_compatible(target_tokenizer, draft_tokenizer) -> None:
    """Raise IncompatibleDraftError unless both tokenizers map the same text to the same ids."""
    t_vocab, d_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if len(t_vocab) != len(d_vocab):
        raise IncompatibleDraftError(
            f"the draft's tokenizer has {len(d_vocab)} tokens but the target's has {len(t_vocab)}; "
            "fix: use a draft from the target's model family (same tokenizer), or llm.mode = 'ngram'"
        )
    if t_vocab != d_vocab:
        differ = sum(1 for tok, i in t_vocab.items() if d_vocab.get(tok) != i)
        raise IncompatibleDraftError(
            f"the draft's tokenizer maps {differ} tokens to other ids than the target's; "
            "fix: use a draft from the target's model family (same tokenizer), or llm.mode = 'ngram'"
        )
    t_special, d_special = special_ids(target_tokenizer), special_ids(draft_tokenizer)
    if t_special != d_special:
        raise IncompatibleDraftError(
            f"special token ids differ (target {t_special}, draft {d_special}); "
            "fix: use a draft from the target's model family, or llm.mode = 'ngram'"
        )


def align_draft_head(
    target_model: Any, draft_model: Any, tokenizer, out_ids: torch.Tensor | None
) -> torch.Tensor | None:
    """The draft's column -> token id map (None: column j is token j) under which the draft proposes only real
    tokens that the target's head has. Rows past the tokenizer's vocabulary are padding: when the two heads
    differ, the draft's head is cut to the real tokens (equal heads keep theirs; the padding columns are then
    masked, see CachedLM.real_vocab). Raises IncompatibleDraftError when either model lacks rows (input or
    output) for real tokens."""
    from llm.cache import head_rows

    real = len(tokenizer)
    t_rows, d_rows = head_rows(target_model), head_rows(draft_model)
    d_inputs = draft_model.get_input_embeddings().weight.shape[0]
    if min(t_rows, d_inputs) < real or (out_ids is None and d_rows < real):
        raise IncompatibleDraftError(
            f"the tokenizer has {real} tokens but the target's head has {t_rows} rows and the draft's head "
            f"{d_rows} (its embeddings {d_inputs}); fix: use a draft and target that cover the whole tokenizer"
        )
    if out_ids is not None:
        if int(out_ids.max()) >= real:
            raise IncompatibleDraftError(
                f"the draft's reduced head names token {int(out_ids.max())}, past the "
                f"tokenizer's {real} tokens; fix: rebuild the reduced head"
            )
        return out_ids
    if d_rows == t_rows:
        return None
    if not hasattr(draft_model.get_output_embeddings(), "weight"):
        raise ValueError(
            "the draft's head rows differ from the target's and it is already quantized; "
            "fix: align the head (Engine.load does) before quantizing"
        )
    keep = torch.arange(real)
    reduce_vocab_head(draft_model, keep)
    log.info("draft head aligned", extra={"draft_rows": d_rows, "target_rows": t_rows, "kept": real})
    return keep


def quantize_int8(model: Any) -> Any:
    """int8 weights for every Linear (torch dynamic quantization: int8 weights, fp32 activations).

    Converted one Linear at a time, so the float32 copy that quantization needs exists for one layer only
    (a whole fp32 copy of the 0.5B draft would add ~2 GiB to peak memory).
    """
    from torch.ao.quantization import quantize_dynamic

    for name, child in list(model.named_children()):
        if isinstance(child, torch.nn.Linear):
            wrapped = quantize_dynamic(torch.nn.Sequential(child.float()), {torch.nn.Linear}, dtype=torch.qint8)
            setattr(model, name, wrapped[0])
        else:
            quantize_int8(child)
    # what is left outside Linear layers (norms, embeddings) runs in float32, like the activations
    for p in model.parameters(recurse=False):
        p.data = p.data.float()
    for bname, buf in list(model.named_buffers(recurse=False)):
        if buf is not None and buf.is_floating_point():
            model._buffers[bname] = buf.float()
    return model


def reduce_vocab_head(model: Any, keep_ids: torch.Tensor) -> None:
    """Keep only the rows of the output head for ``keep_ids``: logits come out over that subset, in that order.

    Untied from the input embeddings (a copy of the kept rows), so the embeddings stay whole.
    """
    head = model.get_output_embeddings()
    weight = head.weight.data[keep_ids].clone()
    new_head = torch.nn.Linear(
        weight.shape[1], weight.shape[0], bias=head.bias is not None, dtype=weight.dtype, device=weight.device
    )
    new_head.weight.data = weight
    if head.bias is not None:
        new_head.bias.data = head.bias.data[keep_ids].clone()
    model.set_output_embeddings(new_head)
    model.config.tie_word_embeddings = False


def frequent_token_ids(tokenizer, n: int) -> torch.Tensor:
    """The n tokens a reduced draft head keeps when no token counts exist: ids ordered by BPE merge rank, plus
    every special token (a low id is a token merged early, i.e. frequent in the tokenizer's corpus; it covered
    93.8% of the tokens in real replies at 32k rows, against 99+% for counts from real replies: vocab.py).
    """
    vocab_size = len(tokenizer)
    special = [i for i in tokenizer.all_special_ids if i is not None and i < vocab_size]
    added = [i for i in tokenizer.get_added_vocab().values() if i < vocab_size]
    return torch.tensor(sorted(set(range(min(n, vocab_size))) | set(special) | set(added)), dtype=torch.long)
