"""The results store (store.py): measurements are committed as they arrive, runs are listed newest
first, ids resolve by unique prefix, and every problem is a one-line StoreError."""
from __future__ import annotations

import pytest

from variantlab.errors import StoreError
from variantlab.store import Store

SUITE = {"name": "demo", "variants": [{"name": "fp32"}, {"name": "bf16"}]}
ENV = {"cpu": "test", "threads": 1}


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "results.sqlite") as s:
        yield s


def test_measurement_is_visible_to_another_connection_before_the_run_ends(store):
    store.create_run("run-1", SUITE, "suite.yaml", ENV, "runs/run-1")
    store.put_measurement("run-1", "fp32", {"status": "ok", "value": 1.5})
    with Store(store.path) as other:
        row = other.run("run-1")
        assert row.status == "running" and row.comparison is None
        assert row.variants == (("fp32", "ok"),)
        assert other.measurements("run-1") == {"fp32": {"status": "ok", "value": 1.5}}
        assert (row.suite, row.environment) == (SUITE, ENV)
        assert (row.suite_name, row.suite_path, row.output_dir) == ("demo", "suite.yaml", "runs/run-1")


def test_put_measurement_twice_replaces_the_first(store):
    store.create_run("run-1", SUITE, None, ENV, None)
    store.put_measurement("run-1", "fp32", {"status": "ok", "value": 1})
    store.put_measurement("run-1", "bf16", {"status": "failed", "reason": "boom"})
    store.put_measurement("run-1", "fp32", {"status": "failed", "reason": "second try"})
    assert store.measurements("run-1") == {"fp32": {"status": "failed", "reason": "second try"},
                                           "bf16": {"status": "failed", "reason": "boom"}}
    assert store.run("run-1").variants == (("fp32", "failed"), ("bf16", "failed"))


def test_a_result_without_status_is_stored_as_failed(store):
    store.create_run("run-1", SUITE, None, ENV, None)
    store.put_measurement("run-1", "fp32", {})
    assert store.run("run-1").variants == (("fp32", "failed"),)


def test_finish_run_stores_the_comparison(store):
    store.create_run("run-1", SUITE, None, ENV, None)
    comparison = {"baseline": "fp32", "rows": [{"key": "e2el_p50", "cells": {"fp32": None}}]}
    store.finish_run("run-1", comparison)
    with Store(store.path) as other:
        row = other.run("run-1")
    assert row.status == "done" and row.comparison == comparison


def test_runs_are_listed_newest_first(store):
    for rid in ("run-a", "run-c", "run-b"):
        store.create_run(rid, SUITE, None, ENV, None)
    assert [r.run_id for r in store.runs()] == ["run-b", "run-c", "run-a"]
    assert [r.run_id for r in store.runs(limit=2)] == ["run-b", "run-c"]


def test_empty_store_has_no_runs(store):
    assert store.runs() == []


def test_run_resolves_a_unique_prefix(store):
    store.create_run("20250101-120000-abcd", SUITE, None, ENV, None)
    store.create_run("20250101-130000-ef01", SUITE, None, ENV, None)
    assert store.run("20250101-12").run_id == "20250101-120000-abcd"
    assert store.run("20250101-130000-ef01").run_id == "20250101-130000-ef01"


def test_ambiguous_prefix_is_an_error(store):
    store.create_run("20250101-120000-abcd", SUITE, None, ENV, None)
    store.create_run("20250101-130000-ef01", SUITE, None, ENV, None)
    with pytest.raises(StoreError, match=r"2 runs match(es)? '2025'"):
        store.run("2025")


def test_unknown_run_id_lists_the_known_ids(store):
    store.create_run("run-a", SUITE, None, ENV, None)
    store.create_run("run-b", SUITE, None, ENV, None)
    with pytest.raises(StoreError) as info:
        store.run("zzz")
    text = str(info.value)
    assert "\n" not in text and str(store.path) in text and "'zzz'" in text
    assert "run-a" in info.value.accepted and "run-b" in info.value.accepted


def test_unknown_run_id_in_an_empty_store_says_how_to_make_one(store):
    with pytest.raises(StoreError, match="variantlab bench"):
        store.run("zzz")


def test_a_directory_is_not_a_store(tmp_path):
    with pytest.raises(StoreError) as info:
        Store(tmp_path)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{tmp_path}: ") and "--store" in text


def test_a_file_that_is_not_sqlite_is_not_a_store(tmp_path):
    path = tmp_path / "notes.sqlite"
    path.write_text("not a database\n" * 200)
    with pytest.raises(StoreError, match="cannot open results store"):
        Store(path)


def test_store_creates_missing_parent_folders(tmp_path):
    with Store(tmp_path / "a" / "b" / "results.sqlite") as s:
        s.create_run("run-1", SUITE, None, ENV, None)
    assert (tmp_path / "a" / "b" / "results.sqlite").is_file()
