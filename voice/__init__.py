"""specvoice.voice: the assistant: pipeline, speech in and out, turn taking, latency, transports, CLI."""
