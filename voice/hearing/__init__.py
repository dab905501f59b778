"""Hearing: the listener (VAD, wake word, echo), streaming Whisper, and the end-of-turn decision."""
