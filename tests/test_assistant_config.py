"""The Assistant builds its local engine from every key of the config's llm section (one mapping per engine,
its ``from_config``, chosen by ``llm.load.load_engine``), so a key such as ``llm.prefill_chunk`` or
``llm.context_limit`` is never dropped, on either engine."""

from __future__ import annotations

import pytest

from llm.engine import Engine
from llm.llamacpp_engine import LlamaCppEngine
from voice.assistant import Assistant


@pytest.mark.parametrize("engine", ["llama.cpp", "torch"])
async def test_the_local_engine_gets_every_llm_key(small_config, engine):
    config = small_config.model_copy(deep=True)
    config.llm.engine = engine
    config.llm.prefill_chunk = 48
    config.llm.context_limit = 1024
    config.llm.threads = 1
    assistant = Assistant.load_sync(config)
    try:
        assert assistant.engine.settings.prefill_chunk == 48
        assert assistant.engine.context_limit == 1024
        if engine == "torch":
            assert type(assistant.engine) is Engine
            assert assistant.engine.info["target_quantize"] == config.llm.target_quantize
        else:
            assert isinstance(assistant.engine, LlamaCppEngine)
            assert assistant.engine.info["threads"] == 1
            assert assistant.engine.info["target"].endswith("smollm2-135m-instruct.gguf/model.gguf")
    finally:
        await assistant.close()
