"""A card builder's job for ``test_fleet_ahead.py``: the modules the builder has loaded.
It imports nothing itself, so that what it reports is what the builder's start loaded."""


def loaded(_paths) -> list[str]:
    import sys

    return sorted(sys.modules)
