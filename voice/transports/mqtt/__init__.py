"""MQTT with Home Assistant's conventions: triggers in; transcripts, replies, state, actions out."""
