"""The machine's measured ceilings (hardware.py): real measurements, so only their sanity is asserted."""
from __future__ import annotations

from variantlab.hardware import copy_bandwidth, read_bandwidth


def test_bandwidths_are_measured_and_plausible():
    read, copy = read_bandwidth(16 * 2**20, repeats=2), copy_bandwidth(16 * 2**20, repeats=2)
    assert 0.1 < read < 10_000 and 0.1 < copy < 10_000      # GB/s, whatever the machine
