"""specvoice.audio: capture, playback, VAD, resampling and WAV files. Never imports voice."""
