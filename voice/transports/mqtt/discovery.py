"""Home Assistant MQTT discovery: the entities the bridge announces, one retained config each.

Entities (``<node>`` = ``mqtt.node_id``, default: the host name; every one has ``origin``, the device with its
``sw_version``, and the bridge's availability topic):

    sensor  state        idle / listening / thinking / speaking (enum)
    sensor  transcript   the last transcript; the full text is the ``text`` attribute (a state holds 255 chars)
    sensor  reply        the last reply, likewise
    sensor  latency      ms of the last turn (diagnostic)
    sensor  acceptance   the speculative decoder's accepted/drafted share of the last reply (diagnostic)
    text    say, ask     type a sentence to speak, a question to answer
    notify  speak        ``notify.send_message`` speaks the message
    button  stop         stops the speech or reply in progress
    event   event        ``wake_word`` and ``turn_end``
"""

from __future__ import annotations

import json
from typing import Any

from voice.events import State
from voice.transports.mqtt.payloads import Outgoing, Priority, Topics

HA_STATE_MAX = 255  # Home Assistant sensor states and text entities hold at most 255 characters
EVENT_TYPES = ["wake_word", "turn_end"]


def discovery_messages(topics: Topics, node: str, discovery_prefix: str, version: str) -> list[Outgoing]:
    """The retained discovery configs, one per entity."""
    t = topics
    device = {
        "identifiers": [f"specvoice_{node}"],
        "name": f"specvoice {node}",
        "manufacturer": "specvoice",
        "model": "local voice assistant",
        "sw_version": version,
    }
    common = {
        "availability_topic": t.availability,
        "payload_available": "online",
        "payload_not_available": "offline",
        "device": device,
        "origin": {"name": "specvoice", "sw_version": version},
    }
    text_state = f"{{{{ value_json.text[:{HA_STATE_MAX}] }}}}"
    diagnostic = {"entity_category": "diagnostic", "state_class": "measurement"}
    entities: dict[tuple[str, str], dict[str, Any]] = {
        ("sensor", "state"): {
            "name": "State",
            "state_topic": t.state,
            "device_class": "enum",
            "options": [s.value for s in State],
            "icon": "mdi:account-voice",
        },
        ("sensor", "transcript"): {
            "name": "Last transcript",
            "state_topic": t.transcript,
            "value_template": text_state,
            "json_attributes_topic": t.transcript,
            "icon": "mdi:microphone-message",
        },
        ("sensor", "reply"): {
            "name": "Last reply",
            "state_topic": t.reply,
            "value_template": text_state,
            "json_attributes_topic": t.reply,
            "icon": "mdi:message-reply-text",
        },
        ("sensor", "latency"): {
            "name": "Response latency",
            "state_topic": t.latency,
            "value_template": "{{ value_json.ms }}",
            "json_attributes_topic": t.latency,
            "unit_of_measurement": "ms",
            "device_class": "duration",
            "icon": "mdi:timer-outline",
            **diagnostic,
        },
        ("sensor", "acceptance"): {
            "name": "Draft acceptance",
            "state_topic": t.latency,
            "value_template": "{{ value_json.acceptance_pct | default(none) }}",
            "unit_of_measurement": "%",
            "icon": "mdi:check-decagram-outline",
            **diagnostic,
        },
        ("text", "say"): {
            "name": "Say",
            "command_topic": t.say,
            "mode": "text",
            "max": HA_STATE_MAX,
            "icon": "mdi:bullhorn",
        },
        ("text", "ask"): {
            "name": "Ask",
            "command_topic": t.ask,
            "mode": "text",
            "max": HA_STATE_MAX,
            "icon": "mdi:chat-question",
        },
        ("notify", "speak"): {"name": "Speak", "command_topic": t.say, "icon": "mdi:account-voice"},
        ("button", "stop"): {"name": "Stop", "command_topic": t.cancel, "payload_press": "PRESS", "icon": "mdi:stop"},
        ("event", "event"): {
            "name": "Voice event",
            "state_topic": t.event,
            "event_types": EVENT_TYPES,
            "icon": "mdi:gesture-tap",
        },
    }
    out = []
    for (component, object_id), config in entities.items():
        body = {**config, **common, "unique_id": f"specvoice_{node}_{object_id}", "qos": 1}
        topic = f"{discovery_prefix}/{component}/{node}/{object_id}/config"
        out.append(Outgoing(topic, json.dumps(body), retain=True, priority=Priority.CONTROL))
    return out
