"""Home commands while the broker goes away (voice/transports/mqtt/home_commands.py): a real mosquitto stopped
and started around a command, the small models' assistant, the home device's session told aloud. A command is
published once, or never and reported as not done; it is never sent late and never sent twice."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from voice.assistant import Assistant
from voice.config_servers import HomeDeviceConfig
from voice.events import ActionRequested, TurnDone
from voice.transports.mqtt.bridge import MqttBridge
from voice.transports.mqtt.home_commands import CommandDelivery, HomeCommand, NotDone
from voice.transports.mqtt.outbox import Outbox
from voice.transports.mqtt.payloads import Outgoing, Priority

from broker import Broker, Home
from test_mqtt_bridge import bridge_config, running
from test_pipeline import Recorder

LIGHT = "home/kitchen/light/set"


@pytest.fixture(scope="module")
def assistant(small_config):
    return Assistant.load_sync(small_config)


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "broker") as running_broker:
        yield running_broker


@contextlib.asynccontextmanager
async def command_while_the_broker_is_away(assistant, broker: Broker, payload: str, timeout_s: float):
    """The home device's session on a running bridge; the broker stops, then the device's turn asks for the
    kitchen light (the event a turn on "turn on the kitchen light" emits). Yields the bridge, a home client that
    reconnects, the device's events, and the mark before it all."""
    kitchen = HomeDeviceConfig(name="kitchen light", topic=LIGHT, payloads=["ON", "OFF"], area="kitchen")
    config = bridge_config(
        assistant,
        broker,
        allowed_actions={LIGHT: ["ON", "OFF"]},
        devices=[kitchen],
        command_timeout_s=timeout_s,
        reconnect_max_s=0.5,
    )
    bridge = MqttBridge(config, assistant)
    async with running(bridge):
        home = await Home(broker, ("home/#", "specvoice/#")).connect()
        rec = Recorder()
        device = assistant.session(rec, name="device")
        bridge.add_local(device)
        try:
            mark = home.mark()
            broker.stop()
            async with asyncio.timeout(15):
                while bridge.connected.is_set():
                    await asyncio.sleep(0.05)
            device.emit(ActionRequested(LIGHT, payload, True))
            yield bridge, home, rec, mark
        finally:
            await device.close()
            await home.close()


async def test_a_command_the_broker_cannot_take_in_time_is_never_sent_and_the_user_is_told(assistant, broker):
    """The broker is away when the turn asks for the light: the command waits its deadline, is withdrawn, and the
    home device says so. When the broker is back, the light is not switched after all (a late surprise), and the
    error topic names the command that was not done."""
    async with command_while_the_broker_is_away(assistant, broker, "ON", timeout_s=1.0) as (bridge, home, rec, mark):
        told = await rec.wait_for(lambda e: isinstance(e, TurnDone) and "not switched" in e.reply, timeout=60)
        assert told.reply == "I lost the connection to the home: the kitchen light was not switched."
        broker.start()
        await home.reconnect()
        async with asyncio.timeout(30):
            await bridge.connected.wait()
        error = await home.wait_for("specvoice/error", since=mark, timeout=30)
        await asyncio.sleep(1.0)  # a late publish would land by now
        assert (error["kind"], error["topic"], error["payload"], error["session"]) == ("action", LIGHT, "ON", "device")
        assert "will not be sent later" in error["error"]
        assert home.texts(LIGHT, mark) == [] and home.texts("specvoice/action", mark) == []
        assert len(bridge.outbox) == 0


async def test_a_command_during_a_short_outage_is_published_once(assistant, broker):
    """The broker restarts while a command waits: it goes out once the bridge is back, within its deadline,
    exactly once, with one action notice and no error; the user is told nothing, as nothing went wrong."""
    async with command_while_the_broker_is_away(assistant, broker, "OFF", timeout_s=20.0) as (_, home, rec, mark):
        await asyncio.sleep(0.5)
        broker.start()
        await home.reconnect()
        await home.wait_for(LIGHT, since=mark, timeout=30)
        await home.wait_for("specvoice/action", since=mark, timeout=30)
        await asyncio.sleep(1.0)  # a second copy would land by now
        assert home.texts(LIGHT, mark) == ["OFF"]
        assert [json.loads(t) for t in home.texts("specvoice/action", mark)] == [
            {"topic": LIGHT, "payload": "OFF", "session": "device"}
        ]
        assert home.texts("specvoice/error", mark) == [] and not rec.of(TurnDone)


async def test_commands_go_first_are_never_dropped_and_one_lost_in_flight_is_not_sent_again():
    """The outbox's bound drops results and telemetry, never a command; a command goes out ahead of everything;
    one in flight when the connection dropped leaves the outbox (not sent twice) and is reported as maybe not
    done, and its deadline no longer fires."""
    outbox, failed = Outbox(limit=2), []
    delivery = CommandDelivery(outbox, timeout_s=0.2, not_done=failed.append)
    for n in range(3):
        outbox.put(Outgoing(f"specvoice/reply/{n}", "r", priority=Priority.RESULT))
    delivery.send(LIGHT, "ON", "device")
    delivery.send(LIGHT, "OFF", "device")
    assert len(outbox) == 4 and outbox.waiting(Priority.COMMAND) == 2  # a result dropped, no command
    first = outbox.head()
    assert isinstance(first, HomeCommand) and (first.topic, first.payload) == (LIGHT, "ON")
    delivery.sending(first)
    delivery.lost(first)
    assert failed == [NotDone(first, sure=False)] and outbox.waiting(Priority.COMMAND) == 1
    await asyncio.sleep(0.4)  # the deadlines: the lost one is not reported again, the waiting one expires
    second = failed[-1].command
    assert [f.sure for f in failed] == [False, True] and second.payload == "OFF"
    assert outbox.waiting(Priority.COMMAND) == 0 and len(outbox) == 2


async def test_a_command_while_the_broker_is_away_is_not_confirmed_first(small_config, broker):
    """The bridge knows the broker is away when the person asks for the light: the reply is the truth at once
    ("... not switched"), never "Done." followed by the correction, and no command is requested. With the broker
    back, the same words switch the light."""
    kitchen = HomeDeviceConfig(name="kitchen light", topic=LIGHT, payloads=["ON", "OFF"], area="kitchen")
    config = small_config.model_copy(deep=True)
    config.mqtt.devices = [kitchen]
    with_light = Assistant.load_sync(config)
    bridge = MqttBridge(bridge_config(with_light, broker, devices=[kitchen], reconnect_max_s=0.5), with_light)
    try:
        async with running(bridge):
            rec = Recorder()
            device = with_light.session(rec, name="device")
            bridge.add_local(device)
            broker.stop()
            async with asyncio.timeout(15):
                while bridge.connected.is_set():
                    await asyncio.sleep(0.05)
            done = await device.ask("Turn on the kitchen light.", speak=False)
            assert done.reply.strip() == "I lost the connection to the home: the kitchen light was not switched."
            assert not [e for e in rec.of(ActionRequested) if e.allowed]
            broker.start()
            async with asyncio.timeout(30):
                await bridge.connected.wait()
            done = await device.ask("Turn on the kitchen light.", speak=False)
            assert "connection" not in done.reply
            assert [(e.topic, e.payload) for e in rec.of(ActionRequested) if e.allowed] == [(LIGHT, "ON")]
            await device.close()
    finally:
        await with_light.close()
