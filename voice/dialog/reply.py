"""What a reply produced and how much of it the listener heard.

Piper has no word timings, so "heard" is measured in audio: each fragment's position in the reply's audio is
known, and a partly played fragment counts its words in proportion to its played samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpokenFragment:
    text: str
    start_sample: int  # position of its first sample in the reply's audio (at the voice's rate)
    n_samples: int = 0
    done: bool = False  # all of its audio was handed on


@dataclass
class ReplyOutcome:
    """What a reply produced so far, and where each fragment sits in its audio."""

    raw: str = ""  # everything the decoder produced, action markers included (what the model said)
    text: str = ""  # the speakable part (what clients see and the speaker says)
    fragments: list[SpokenFragment] = field(default_factory=list)
    samples_out: int = 0  # audio samples (voice rate) handed to the sink

    def heard_text(self, heard_samples: int) -> str:
        """The reply as far as the listener heard it: whole fragments, plus the words of a partly heard one in
        proportion to its heard audio (piper has no word timings; words are close to uniform in time)."""
        words: list[str] = []
        for frag in self.fragments:
            if frag.n_samples == 0:
                break
            heard = min(max(heard_samples - frag.start_sample, 0), frag.n_samples)
            frag_words = frag.text.split()
            if heard >= frag.n_samples and frag.done:
                words.extend(frag_words)
                continue
            words.extend(frag_words[: int(len(frag_words) * heard / frag.n_samples)])
            break
        return " ".join(words)


class StageError(RuntimeError):
    """A failure inside one stage of the reply ("llm", "tts" or "timeout"), so the turn can say where it broke."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
        super().__init__(detail)
        self.stage = stage
