"""Scenarios: load shapes that drive a backend and yield records — one module each, registered here.

A scenario is a tracker (measure/tracker.py) built from its suite entry: its spec (the pydantic
model the suite validates), its run (in the worker), its rows. The suite's `scenarios:` list is a
union of the specs registered below, so adding a scenario is one module and one line here.
"""
from __future__ import annotations

from .length_sweep import LengthSweep
from .offline import Offline
from .server import Server
from .single_stream import SingleStream

SCENARIOS = {cls.kind: cls for cls in (SingleStream, Offline, LengthSweep, Server)}
SCENARIO_SPECS = {kind: cls.spec_model for kind, cls in SCENARIOS.items()}


def scenario_tracker(spec, workload):
    """The tracker that runs a suite's scenario entry."""
    return SCENARIOS[spec.type](spec, workload)
