"""ClientWarnings: warnings about client input, rate-limited per client, with what was held back counted."""

from __future__ import annotations

import logging

from voice.logs import ClientWarnings


class FakeClock:
    """Time under the test's control (the clock is not what is tested)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_each_client_has_its_own_budget_and_learns_what_was_held_back(caplog):
    clock = FakeClock()
    warnings = ClientWarnings(logging.getLogger("specvoice.test"), burst=3, period_s=30.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="specvoice.test"):
        logged = [warnings.warn("10.0.0.1", f"bad input {i}") for i in range(10)]
        assert logged == [True] * 3 + [False] * 7
        assert warnings.warn("10.0.0.2", "another client is not held back")
        clock.t += 10.0  # one more warning's worth of budget (3 per 30 s)
        assert warnings.warn("10.0.0.1", "bad input again")
        assert not warnings.warn("10.0.0.1", "and again")
    records = [r for r in caplog.records if r.name == "specvoice.test"]
    assert [r.client for r in records] == ["10.0.0.1"] * 3 + ["10.0.0.2", "10.0.0.1"]
    assert records[-1].suppressed == 7  # the 7 held back, reported with the next one let through
    assert not any(r.exc_info for r in records)  # bad input never logs a traceback
    assert (warnings.logged, warnings.suppressed) == (5, 8)


def test_the_number_of_clients_remembered_is_bounded():
    warnings = ClientWarnings(logging.getLogger("specvoice.test"), burst=1, max_clients=100, clock=FakeClock())
    for i in range(1000):
        warnings.warn(f"client-{i}", "bad input")
    assert len(warnings._buckets) == 100
