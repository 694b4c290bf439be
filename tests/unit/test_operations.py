"""[ops] The operators' pure core: recent failures from the store's time buckets."""

from __future__ import annotations

from importer.domain.operations import FIVE_MINUTES_MS, HOUR_MS, recent_failures

NOW = 1_780_000_000_000


def test_recent_failures_count_the_last_twelve_five_minute_buckets_and_the_last_day_of_hours() -> None:
    five, hour = NOW // FIVE_MINUTES_MS, NOW // HOUR_MS
    recent = {
        f"m{five}:import.stalled": 2, f"m{five - 11}:import.stalled": 1, f"m{five - 12}:import.stalled": 7,
        f"m{five}:csv.bad_sku": 1,
        f"h{hour}:import.stalled": 3, f"h{hour - 23}:import.stalled": 4, f"h{hour - 24}:import.stalled": 9,
        f"h{hour}:csv.bad_sku": 1, "hour": 5, f"x{five}:odd": 1, f"m{five}:": 1, "mnope:code": 1,
    }
    last_hour, last_day = recent_failures(recent, NOW)
    assert last_hour == {"csv.bad_sku": 1, "import.stalled": 3}
    assert last_day == {"csv.bad_sku": 1, "import.stalled": 7}
    assert recent_failures({}, NOW) == ({}, {})
