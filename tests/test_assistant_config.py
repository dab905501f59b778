"""The Assistant builds its local engine from every key of the config's llm section (one mapping,
``Engine.from_config``), so a key such as ``llm.prefill_chunk`` or ``llm.context_limit`` is never dropped."""

from __future__ import annotations

from voice.assistant import Assistant


async def test_the_local_engine_gets_every_llm_key(small_config):
    config = small_config.model_copy(deep=True)
    config.llm.prefill_chunk = 48
    config.llm.context_limit = 1024
    assistant = Assistant.load_sync(config)
    try:
        assert assistant.engine.settings.prefill_chunk == 48
        assert assistant.engine.context_limit == 1024
        assert assistant.engine.info["target_quantize"] == config.llm.target_quantize
    finally:
        await assistant.close()
