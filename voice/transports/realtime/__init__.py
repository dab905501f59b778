"""The OpenAI Realtime API over websockets: wire, events, sessions, items, the server."""
