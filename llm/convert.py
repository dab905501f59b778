"""Convert a GGUF checkpoint into a plain transformers safetensors folder, once.

transformers can read GGUF but dequantizes every tensor on every load (tens of seconds for 0.5B); the saved
folder loads in about a second. Weights are stored in bfloat16: they come from 4-bit quantized values, so
bf16 loses nothing that matters, and it halves disk and load time. Loading in float32 later upcasts exactly.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

log = logging.getLogger("specvoice.llm")


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    folder, name = str(gguf_path.parent), gguf_path.name
    log.info("converting gguf", extra={"file": str(gguf_path)})
    # a prepared GGUF folder holds the tokenizer saved beside it; read from there, because transformers drops the
    # GGUF's chat template when it reads the tokenizer from a GGUF whose folder also holds tokenizer files
    saved = (gguf_path.parent / "tokenizer_config.json").exists()
    tokenizer = AutoTokenizer.from_pretrained(folder, **({} if saved else {"gguf_file": name}))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=dtype, low_cpu_mem_usage=True)
    # save_pretrained refuses a model that still believes it is quantized
    setattr(model, "hf_quantizer", None)  # noqa: B010 - an attribute its type hints do not allow None for
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out_dir)
