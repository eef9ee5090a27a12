"""Scenarios: load shapes that drive a backend and yield records — one module each, registered here.

A scenario is a tracker (measure/tracker.py) built from its suite entry: its spec (the pydantic
model the suite validates), its run (in the worker), its rows. The suite's `scenarios:` list is a
union of the specs registered below, so adding a scenario is one module and one line here (or one
`register_scenario(cls)` in a plugin of VARIANTLAB_PLUGINS, which variantlab imports before the suite's union
is made: variantlab/plugins.py).
"""
from __future__ import annotations

from .length_sweep import LengthSweep
from .offline import Offline
from .server import Server
from .single_stream import SingleStream

SCENARIOS: dict[str, type] = {}
SCENARIO_SPECS: dict[str, type] = {}


def register_scenario(cls: type) -> type:
    if cls.kind in SCENARIOS:
        raise ValueError(f"a scenario of type {cls.kind!r} is registered already")
    SCENARIOS[cls.kind] = cls
    SCENARIO_SPECS[cls.kind] = cls.spec_model
    return cls


for _cls in (SingleStream, Offline, LengthSweep, Server):
    register_scenario(_cls)


def scenario_tracker(spec, workload):
    """The tracker that runs a suite's scenario entry."""
    return SCENARIOS[spec.type](spec, workload)
