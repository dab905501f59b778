"""Home Assistant's Wyoming protocol: asr, tts and handle services over TCP."""
