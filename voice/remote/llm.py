"""The backends the config puts on other machines, loaded for the Assistant: the LLM on an OpenAI-compatible
server (``llm.backend = "openai"``), speech on Wyoming servers (``stt.backend`` / ``tts.backend = "wyoming"``).

Nothing here waits for a server to be up: a front-end starts while its GPU server is still booting, says so in
the log, and its turns try the server again each time (llm/remote.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple

from voice.config import Config
from voice.ports import ChatEngine, SpeechRecognizer, SpeechSynthesizer

if TYPE_CHECKING:
    from llm.remote import RemoteSettings

log = logging.getLogger("specvoice.remote")


class RemoteBackends(NamedTuple):
    """A remote backend where the config asks for one, None where it stays local."""

    engine: ChatEngine | None
    stt: SpeechRecognizer | None
    tts: SpeechSynthesizer | None


def remote_backends(config: Config) -> RemoteBackends:
    """The backends the config puts on other machines (None: the assistant loads that one locally)."""
    engine = remote_llm(config) if config.llm.backend == "openai" else None
    stt: SpeechRecognizer | None = None
    tts: SpeechSynthesizer | None = None
    if config.stt.backend == "wyoming":
        from voice.remote.speech import RemoteSpeechToText

        stt = RemoteSpeechToText(config.stt)
    if config.tts.backend == "wyoming":
        from voice.remote.speech import RemoteTextToSpeech

        tts = RemoteTextToSpeech(config.tts)
    return RemoteBackends(engine, stt, tts)


def remote_llm(config: Config) -> ChatEngine:
    """A ``RemoteEngine`` for ``llm.base_url``; with ``llm.tokenizer`` the history is counted in real tokens."""
    from llm.remote import RemoteEngine, RemoteSettings

    llm = config.llm
    assert llm.base_url is not None, "the config checks that llm.backend = 'openai' has a base_url"
    tokenizer = None
    if llm.tokenizer:
        from llm.models import load_tokenizer
        from voice.models import resolve

        tokenizer = load_tokenizer(resolve(llm.tokenizer, "llm", config.models.cache_dir).location)
    remote = RemoteSettings(
        base_url=llm.base_url,
        api_key=llm.api_key,
        model=llm.remote_model,
        connect_timeout_s=llm.connect_timeout_s,
        first_token_timeout_s=llm.first_token_timeout_s,
        retries=llm.retries,
        metrics_url=llm.metrics_url,
    )
    _say_where(remote)
    return RemoteEngine(remote, tokenizer)  # turns pass their settings (Assistant.decode_settings)


def _say_where(remote: RemoteSettings) -> None:
    """Log what the server serves, or that it is not up yet (not an error: turns retry)."""
    from openai import OpenAI, OpenAIError, Timeout

    client = OpenAI(
        base_url=remote.base_url,
        api_key=remote.api_key or "unused",
        max_retries=0,
        timeout=Timeout(remote.first_token_timeout_s, connect=remote.connect_timeout_s),
    )
    try:
        models = [m.id for m in client.models.list().data]
    except OpenAIError as exc:
        log.warning(
            "LLM server not reachable yet; each turn will try again",
            extra={"base_url": remote.base_url, "error": f"{type(exc).__name__}: {exc}"},
        )
        return
    finally:
        client.close()
    if remote.model is not None and remote.model not in models:
        log.warning(
            "llm.remote_model is not among the server's models", extra={"model": remote.model, "served": models}
        )
    log.info("LLM server", extra={"base_url": remote.base_url, "served": models})
