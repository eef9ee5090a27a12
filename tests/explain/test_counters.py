"""Hardware counters: perf's output parsed (unit), and the real machine either counts or says why not."""
from __future__ import annotations

from variantlab.explain.counters import parse_perf_csv, perf_stat


def test_counts_are_read():
    r = parse_perf_csv("12345,,instructions:u,1000,100.00,,\n678,,cache-misses:u,1000,100.00,,\n")
    assert r.available and r.counts == {"instructions:u": 12345.0, "cache-misses:u": 678.0}


def test_not_supported_is_unavailable_with_a_reason_never_zero():
    r = parse_perf_csv("<not supported>,,instructions:u,0,100.00,,\n<not supported>,,cache-misses:u,0,100.00,,\n")
    assert not r.available and "not supported" in r.reason and r.counts == {}


def test_not_counted_is_unavailable():
    r = parse_perf_csv("<not counted>,,instructions:u,0,0.00,,\n1,,cache-misses:u,1,100.00,,\n")
    assert not r.available and "not counted" in r.reason


def test_no_output_is_unavailable():
    r = parse_perf_csv("")
    assert not r.available and "no counts" in r.reason


def test_this_machine_counts_or_says_why():
    with perf_stat() as reading:
        sum(range(200_000))
    assert reading.available or reading.reason
    if reading.available:
        assert all(v >= 0 for v in reading.counts.values())
    else:
        assert reading.counts == {}


def test_no_perf_binary_says_so(monkeypatch):
    import shutil
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with perf_stat() as reading:
        pass
    assert not reading.available and "no perf binary" in reading.reason
