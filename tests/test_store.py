"""The results store (store.py, schema 3): every record committed in its own transaction the moment it
arrives, upserted by (run, variant, kind, round); blobs content-addressed; WAL so that readers and
two writers never lose anything; ids resolve by unique prefix; every problem is a one-line StoreError; every
JSON column versioned, and a schema 2 store (a previous version's) upgraded in place when opened."""
from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from variantlab.errors import StoreError
from variantlab.measure.wire import BuildRecord, MeasurementRecord, TrackerResult
from variantlab.environment import HostEnvironment
from variantlab.measure.plan_record import PlanRecord
from variantlab.store import COLUMN_FORMATS, DONE, INTERRUPTED, RUNNING, SCHEMA_VERSION, Store

SUITE = {"name": "demo", "variants": [{"name": "fp32"}, {"name": "bf16"}]}
PLAN = {"baseline": "fp32", "rounds": 2, "variants": [{"name": "fp32"}, {"name": "bf16"}]}
ENV = {"cpu": "test", "threads": 1}
BLOB = b"log-probs" * 100
SHA = hashlib.sha256(BLOB).hexdigest()


def build(variant: str, status: str = "ok", reason: str | None = None) -> BuildRecord:
    return BuildRecord(variant=variant, status=status, reason=reason, artifact_dir=f"/a/{variant}")


def measured(variant: str, rnd: int, status: str = "ok", reason: str | None = None, blobs=()) -> MeasurementRecord:
    return MeasurementRecord(variant=variant, round=rnd, status=status, reason=reason, device="cpu",
                             outputs=(TrackerResult(kind="memory", name="memory", data={"peak": rnd}),),
                             blobs={hashlib.sha256(b).hexdigest(): len(b) for b in blobs})


def blob_map(*blobs: bytes) -> dict[str, bytes]:
    return {hashlib.sha256(b).hexdigest(): b for b in blobs}


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "results.sqlite") as s:
        yield s


def new_run(store: Store, run_id: str = "run-1", **kw) -> str:
    args = dict(suite=SUITE, suite_path="suite.yaml", plan=PLAN, environment=ENV, output_dir=f"runs/{run_id}") | kw
    store.create_run(run_id, **args)
    return run_id


def count(path, sql: str, *args) -> int:
    with sqlite3.connect(path) as db:
        return db.execute(sql, args).fetchone()[0]


# ---------------------------------------------------------------- the file

def test_a_new_store_is_schema_3_in_wal_mode(store):
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    assert SCHEMA_VERSION == 3


# schema 2, as the previous version of store.py created it (before the formats column)
SCHEMA_2 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (run_id TEXT PRIMARY KEY, created TEXT NOT NULL, suite_name TEXT NOT NULL, suite_path TEXT,
    suite_json TEXT NOT NULL, plan_json TEXT NOT NULL, environment_json TEXT NOT NULL, output_dir TEXT,
    status TEXT NOT NULL, comparison_json TEXT, finished TEXT);
CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES runs(run_id),
    variant TEXT NOT NULL, kind TEXT NOT NULL, round INTEGER NOT NULL, status TEXT NOT NULL, reason TEXT,
    record_json TEXT NOT NULL, created TEXT NOT NULL, UNIQUE (run_id, variant, kind, round));
CREATE TABLE blobs (sha256 TEXT PRIMARY KEY, data BLOB NOT NULL);
INSERT INTO meta VALUES ('schema_version', '2');
"""
OLD_PLAN = {"baseline": "fp32", "rounds": 2, "variants": [
    {"name": "fp32", "recipe": "fp32", "endpoint": None, "source": "m"},
    {"name": "served", "recipe": "fp32", "endpoint": {"base_url": "http://127.0.0.1:9/v1"}, "source": "m"}]}


def schema_2_store(path, plan=OLD_PLAN, environment=ENV) -> None:
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA_2)
        db.execute("INSERT INTO runs VALUES ('old-1', '2026-11-01T00:00:00+00:00', 'demo', 'suite.yaml', ?, ?, ?,"
                   " 'runs/old-1', 'done', NULL, NULL)", (json.dumps(SUITE), json.dumps(plan), json.dumps(environment)))
        db.execute("INSERT INTO records (run_id, variant, kind, round, status, record_json, created) VALUES"
                   " ('old-1', 'fp32', 'build', 0, 'ok', ?, '2026-11-01')", (build("fp32").model_dump_json(),))


def test_a_schema_2_store_is_upgraded_when_opened_and_its_runs_read_in_todays_shape(tmp_path):
    path = tmp_path / "old.sqlite"
    schema_2_store(path)
    with Store(path) as s:
        row = s.run("old-1")
        new_run(s, "new-1")
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("3",)
        formats = dict(db.execute("SELECT run_id, formats_json FROM runs").fetchall())
    assert formats["old-1"] is None and json.loads(formats["new-1"]) == COLUMN_FORMATS
    # the plan of format 1 (an endpoint variant named its server `endpoint`) reads as format 2
    assert isinstance(row.plan, PlanRecord) and row.plan.rounds == 2 and row.plan.baseline == "fp32"
    local, served = row.plan.variants
    assert "endpoint" not in local and (local["backend"], local["backend_config"]) == ("torch", {})
    assert (served["backend"], served["backend_config"]) == ("openai", {"base_url": "http://127.0.0.1:9/v1"})
    assert isinstance(row.environment, HostEnvironment) and row.environment == ENV
    with Store(path) as s:   # opened again: schema 3 as it is, the old run still there
        assert [r.run_id for r in s.runs()] == ["new-1", "old-1"] and s.records("old-1")[0].variant == "fp32"


def test_a_run_row_of_a_newer_format_is_refused_in_one_line(store):
    new_run(store)
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE runs SET formats_json = ?", (json.dumps(COLUMN_FORMATS | {"plan_json": 99}),))
    with pytest.raises(StoreError) as info:
        store.run("run-1")
    text = str(info.value)
    assert "\n" not in text and "newer variantlab" in text and "plan_json (format 99" in text


def test_reopening_a_schema_3_store_keeps_its_runs(tmp_path):
    with Store(tmp_path / "s.sqlite") as s:
        new_run(s)
    with Store(tmp_path / "s.sqlite") as s:
        assert [r.run_id for r in s.runs()] == ["run-1"]


def test_a_schema_1_store_is_refused_with_one_line_naming_the_file(tmp_path):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        db.execute("CREATE TABLE measurements (id INTEGER PRIMARY KEY, run_id TEXT, variant TEXT)")
    with pytest.raises(StoreError) as info:
        Store(path)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{path}: ")
    assert "schema 1" in text and "--store" in text
    with sqlite3.connect(path) as db:   # left as it was: no schema 3 tables added
        tables = {r for (r,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables == {"meta", "measurements"}
        assert db.execute("SELECT value FROM meta").fetchall() == [("1",)]


def test_a_directory_is_not_a_store(tmp_path):
    with pytest.raises(StoreError) as info:
        Store(tmp_path)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{tmp_path}: ") and "--store" in text


def files_of(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_file_that_is_not_sqlite_is_not_a_store_and_is_left_untouched(tmp_path):
    path = tmp_path / "notes.sqlite"
    path.write_text("not a database\n" * 200)
    before = files_of(tmp_path)
    with pytest.raises(StoreError, match="cannot open results store") as info:
        Store(path)
    assert "\n" not in str(info.value)
    assert files_of(tmp_path) == before      # no byte changed, no -wal or -shm beside it


def test_a_store_of_a_newer_schema_says_so_and_is_left_untouched(tmp_path):
    path = tmp_path / "new.sqlite"
    with Store(path):
        pass
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    db.execute("PRAGMA journal_mode=DELETE")     # one plain file, to compare byte for byte
    db.close()
    assert sorted(files_of(tmp_path)) == ["new.sqlite"]
    before = files_of(tmp_path)
    with pytest.raises(StoreError) as info:
        Store(path)
    text = str(info.value)
    assert "\n" not in text and f"newer variantlab (schema {SCHEMA_VERSION + 1}" in text and "upgrade" in text
    assert files_of(tmp_path) == before


def test_another_programs_sqlite_file_is_not_a_store_and_gets_no_tables(tmp_path):
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    before = files_of(tmp_path)
    with pytest.raises(StoreError, match="not a variantlab results store \\(its tables: users\\)"):
        Store(path)
    assert files_of(tmp_path) == before


def test_a_resumed_run_is_running_again_until_it_finishes(store):
    run = new_run(store)
    store.finish_run(run, None, INTERRUPTED)
    store.reopen_run(run)
    assert store.run(run).status == RUNNING
    store.finish_run(run, {"x": 1})
    assert store.run(run).status == DONE


def test_store_creates_missing_parent_folders(tmp_path):
    with Store(tmp_path / "a" / "b" / "results.sqlite") as s:
        new_run(s)
    assert (tmp_path / "a" / "b" / "results.sqlite").is_file()


# ---------------------------------------------------------------- runs

def test_a_run_row_carries_suite_plan_and_environment(store):
    new_run(store)
    row = store.run("run-1")
    assert (row.suite, row.plan, row.environment) == (SUITE, PLAN, ENV)
    assert row.plan.rounds == 2 and row.plan.to_json() == PLAN and row.environment.to_json() == ENV
    assert (row.suite_name, row.suite_path, row.output_dir) == ("demo", "suite.yaml", "runs/run-1")
    assert row.status == RUNNING and row.comparison is None and row.variants == ()


def test_records_are_visible_to_another_connection_before_the_run_ends(store):
    new_run(store)
    store.put_record("run-1", build("fp32"))
    store.put_record("run-1", measured("fp32", 0))
    with Store(store.path) as other:
        row = other.run("run-1")
        assert row.status == RUNNING and row.comparison is None
        assert row.variants == (("fp32", "ok"),)
        assert other.records("run-1") == [build("fp32"), measured("fp32", 0)]


@pytest.mark.parametrize("status, comparison", [(DONE, {"baseline": "fp32", "rows": []}), (INTERRUPTED, None)])
def test_finish_run_sets_the_status_and_the_comparison(store, status, comparison):
    new_run(store)
    store.finish_run("run-1", comparison, status)
    with Store(store.path) as other:
        row = other.run("run-1")
    assert row.status == status and row.comparison == comparison


def test_finish_run_is_done_by_default(store):
    new_run(store)
    store.finish_run("run-1", {"rows": []})
    assert store.run("run-1").status == "done"


def test_a_variant_is_ok_when_any_of_its_rounds_was(store):
    new_run(store)
    store.put_record("run-1", measured("fp32", 0, "failed", "boom"))
    store.put_record("run-1", measured("fp32", 1))
    store.put_record("run-1", measured("bf16", 0, "unsupported", "no kernel"))
    store.put_record("run-1", measured("bf16", 1, "failed", "boom"))
    assert store.run("run-1").variants == (("fp32", "ok"), ("bf16", "failed"))


def test_runs_are_listed_newest_first(store):
    for rid in ("run-a", "run-c", "run-b"):
        new_run(store, rid)
    assert [r.run_id for r in store.runs()] == ["run-b", "run-c", "run-a"]
    assert [r.run_id for r in store.runs(limit=2)] == ["run-b", "run-c"]


def test_empty_store_has_no_runs(store):
    assert store.runs() == []


def test_run_resolves_a_unique_prefix(store):
    new_run(store, "20250101-120000-abcd")
    new_run(store, "20250101-130000-ef01")
    assert store.run("20250101-12").run_id == "20250101-120000-abcd"
    assert store.run("20250101-130000-ef01").run_id == "20250101-130000-ef01"


def test_an_exact_id_wins_over_longer_ids_it_prefixes(store):
    new_run(store, "run-1")
    new_run(store, "run-10")
    assert store.run("run-1").run_id == "run-1"


def test_ambiguous_prefix_is_an_error(store):
    new_run(store, "20250101-120000-abcd")
    new_run(store, "20250101-130000-ef01")
    with pytest.raises(StoreError, match=r"2 runs match '2025'"):
        store.run("2025")


def test_unknown_run_id_lists_the_known_ids(store):
    new_run(store, "run-a")
    new_run(store, "run-b")
    with pytest.raises(StoreError) as info:
        store.run("zzz")
    text = str(info.value)
    assert "\n" not in text and str(store.path) in text and "'zzz'" in text
    assert "run-a" in info.value.accepted and "run-b" in info.value.accepted


def test_unknown_run_id_in_an_empty_store_says_how_to_make_one(store):
    with pytest.raises(StoreError, match="variantlab bench"):
        store.run("zzz")


# ---------------------------------------------------------------- records

def test_records_come_back_as_validated_objects_in_arrival_order(store):
    new_run(store)
    new_run(store, "run-2")
    arrived = [build("fp32"), build("bf16", "failed", "no memory"), measured("bf16", 0), measured("fp32", 0),
               measured("fp32", 1, "failed", "timed out")]
    for r in arrived:
        store.put_record("run-1", r)
    store.put_record("run-2", measured("fp32", 0))
    got = store.records("run-1")
    assert got == arrived
    assert [type(r) for r in got] == [BuildRecord, BuildRecord, MeasurementRecord, MeasurementRecord,
                                      MeasurementRecord]
    assert store.records("run-1", "build") == arrived[:2]
    assert store.records("run-1", "measure") == arrived[2:]
    assert store.records("run-2") == [measured("fp32", 0)]
    assert store.records("nope") == []


def test_put_record_upserts_by_run_variant_kind_and_round(store):
    new_run(store)
    store.put_record("run-1", measured("fp32", 0, "failed", "first try"))
    store.put_record("run-1", measured("fp32", 1))
    store.put_record("run-1", build("fp32"))                       # kind build, round 0: its own row
    store.put_record("run-1", measured("fp32", 0))                 # replaces round 0's measurement
    assert store.records("run-1", "measure") == [measured("fp32", 0), measured("fp32", 1)]
    assert store.records("run-1", "build") == [build("fp32")]
    assert count(store.path, "SELECT COUNT(*) FROM records") == 3
    assert count(store.path, "SELECT COUNT(*) FROM records WHERE status='failed'") == 0
    assert count(store.path, "SELECT COUNT(*) FROM records WHERE reason='first try'") == 0


def test_blobs_are_content_addressed_and_stored_once(store):
    new_run(store)
    other = b"\x00" * 10
    store.put_record("run-1", measured("fp32", 0, blobs=[BLOB]), blob_map(BLOB))
    store.put_record("run-1", measured("bf16", 0, blobs=[BLOB, other]), blob_map(BLOB, other))
    store.put_record("run-1", measured("fp32", 0, blobs=[BLOB]), blob_map(BLOB))   # the same again
    assert count(store.path, "SELECT COUNT(*) FROM blobs") == 2
    assert store.blob(SHA) == BLOB
    assert store.blob(hashlib.sha256(other).hexdigest()) == other


def test_an_unknown_blob_is_a_store_error(store):
    with pytest.raises(StoreError, match=f"blob {SHA[:12]} is not in the store"):
        store.blob(SHA)


class _Unstorable:
    """A record the records table refuses (variant NULL), to fail the insert after the blobs."""

    variant, kind, round, status, reason = None, "measure", 0, "ok", None

    def model_dump_json(self) -> str:
        return "{}"


def test_a_record_is_one_transaction_with_its_blobs(store):
    new_run(store)
    with pytest.raises(StoreError, match="NOT NULL constraint failed"):   # a database error is one line
        store.put_record("run-1", _Unstorable(), blob_map(BLOB))
    assert count(store.path, "SELECT COUNT(*) FROM blobs") == 0     # rolled back together
    store.put_record("run-1", measured("fp32", 0, blobs=[BLOB]), blob_map(BLOB))
    assert count(store.path, "SELECT COUNT(*) FROM blobs") == 1      # and the store still writes


# ---------------------------------------------------------------- two writers

def test_two_writers_in_two_threads_lose_nothing(tmp_path):
    path = tmp_path / "s.sqlite"
    with Store(path) as s:
        new_run(s)
    errors: list[BaseException] = []

    def write(variant: str) -> None:
        try:
            with Store(path) as s:
                for r in range(40):
                    s.put_record("run-1", measured(variant, r, blobs=[variant.encode() * (r + 1)]),
                                 blob_map(variant.encode() * (r + 1)))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=write, args=(v,)) for v in ("fp32", "bf16")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with Store(path) as s:
        records = s.records("run-1")
        assert sorted((r.variant, r.round) for r in records) == sorted(
            (v, r) for v in ("fp32", "bf16") for r in range(40))
    assert count(path, "SELECT COUNT(*) FROM blobs") == 80


_WRITER = """
import hashlib, sys
from variantlab.measure.wire import MeasurementRecord
from variantlab.store import Store
path, variant, go = sys.argv[1:]
import os, time
open(go + "." + variant, "w").close()      # imported and ready
while not os.path.exists(go):
    time.sleep(0.005)
with Store(path) as s:
    try:
        s.create_run("run-1", {"name": "demo"}, None, {}, {}, None)
    except Exception:
        pass  # the other process created it first
    for r in range(30):
        data = (variant * (r + 1)).encode()
        sha = hashlib.sha256(data).hexdigest()
        s.put_record("run-1", MeasurementRecord(variant=variant, round=r, status="ok", blobs={sha: len(data)}),
                     {sha: data})
print("ok")
"""


def test_two_writer_processes_on_a_new_file_lose_nothing(tmp_path):
    path, go = tmp_path / "new.sqlite", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), v, str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for v in ("a", "b")]
    for _ in range(6000):   # both imported, then both start at once (racing to create the file, too)
        if all((tmp_path / f"go.{v}").exists() for v in ("a", "b")) or any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    with Store(path) as s:
        assert sorted((r.variant, r.round) for r in s.records("run-1")) == sorted(
            (v, r) for v in ("a", "b") for r in range(30))
        assert s.run("run-1").variants == (("a", "ok"), ("b", "ok")) or \
            s.run("run-1").variants == (("b", "ok"), ("a", "ok"))
    assert count(path, "SELECT COUNT(*) FROM blobs") == 60


def test_a_run_whose_plan_does_not_read_is_one_line_naming_the_store(store):
    new_run(store, plan={"rounds": "several"})
    with pytest.raises(StoreError) as info:
        store.run("run-1")
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{store.path}: run run-1 holds a plan or environment")
