"""Backends on other machines: the LLM over an OpenAI-compatible API, STT and TTS over Wyoming."""
