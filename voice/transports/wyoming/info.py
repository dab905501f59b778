"""What the Wyoming server says it is (the ``info`` answer to ``describe``): asr, tts and handle services.

Every streaming flag is True because each service streams: transcript chunks while audio arrives, speech per
fragment while text arrives, handled chunks while the reply is generated.
"""

from __future__ import annotations

from typing import Any

from wyoming.info import AsrModel, AsrProgram, Attribution, HandleModel, HandleProgram, Info, TtsProgram, TtsVoice

from voice.transports.common import package_version


def describe(config: Any, assistant: Any) -> Info:
    ver = package_version()
    language = config.stt.language or "en"
    me = Attribution(name="specvoice", url="https://github.com/specvoice/specvoice")
    asr = AsrProgram(
        name="specvoice-stt",
        attribution=me,
        installed=True,
        version=ver,
        description="faster-whisper with streaming partial transcripts",
        models=[
            AsrModel(
                name=config.models.stt,
                languages=[language],
                installed=True,
                version=None,
                description=f"Whisper ({config.models.stt})",
                attribution=Attribution("OpenAI", "https://github.com/openai/whisper"),
            )
        ],
        supports_transcript_streaming=True,
    )
    tts = TtsProgram(
        name="specvoice-tts",
        attribution=me,
        installed=True,
        version=ver,
        description="piper, one clause at a time",
        voices=[
            TtsVoice(
                name=config.models.tts,
                languages=[assistant.tts.language],
                installed=True,
                version=None,
                description=f"Piper voice {config.models.tts}",
                attribution=Attribution("rhasspy", "https://github.com/rhasspy/piper"),
            )
        ],
        supports_synthesize_streaming=True,
    )
    handle = HandleProgram(
        name="specvoice-assistant",
        attribution=me,
        installed=True,
        version=ver,
        description="local LLM conversation with a speculative decoder",
        models=[
            HandleModel(
                name=config.models.target,
                languages=[language],
                installed=True,
                version=None,
                description=f"LLM {config.models.target}",
                attribution=me,
            )
        ],
        supports_handled_streaming=True,
    )
    return Info(asr=[asr], tts=[tts], handle=[handle])
