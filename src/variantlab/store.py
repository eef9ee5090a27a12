"""The results store: one SQLite file (WAL mode); a row per run, per record, per blob.

Every record a worker returns — a variant's build, or one measurement (variant × round) — is
committed in its own transaction the moment it arrives, so an interrupted or crashed run keeps
everything already measured. Blobs (teacher-forced log-probs) are content-addressed (sha256). A run
row carries the suite, the plan and the environment, a status (running | done | interrupted) and,
once analysed, its comparison. Default path: ./variantlab.sqlite (suite `output.store` or
`--store` override it).

Every stored JSON column is versioned. A record's JSON carries its own `version` (the wire's); a run row's
`formats_json` gives the format of each of its JSON columns (COLUMN_FORMATS), and a row of an earlier
format is upgraded as it is read (a plan of format 1: measure/plan_record.upgrade_plan), one of a later
format refused in one line. A store of schema 2 (before the formats column) is upgraded in place when it
is opened: its rows read as format 1.
"""
from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .environment import HostEnvironment
from .errors import StoreError
from .measure.plan_record import FORMAT as PLAN_FORMAT
from .measure.plan_record import PlanRecord, upgrade_plan

DEFAULT_STORE = "variantlab.sqlite"
SCHEMA_VERSION = 3
UPGRADABLE_SCHEMAS = (2,)      # opened, a store of these schemas is upgraded to SCHEMA_VERSION

# the format each JSON column of a run row is written in today; a row without formats_json is format 1
COLUMN_FORMATS = {"suite_json": 1, "plan_json": PLAN_FORMAT, "environment_json": 1, "comparison_json": 1}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created TEXT NOT NULL,
    suite_name TEXT NOT NULL,
    suite_path TEXT,
    suite_json TEXT NOT NULL,
    plan_json TEXT NOT NULL,
    environment_json TEXT NOT NULL,
    output_dir TEXT,
    status TEXT NOT NULL,           -- running | done | interrupted
    comparison_json TEXT,
    finished TEXT,
    formats_json TEXT               -- column → its format (COLUMN_FORMATS); NULL: all format 1 (schema 2)
);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    variant TEXT NOT NULL,
    kind TEXT NOT NULL,             -- build | measure
    round INTEGER NOT NULL,         -- 0 for a build
    status TEXT NOT NULL,           -- ok | failed | unsupported
    reason TEXT,
    record_json TEXT NOT NULL,
    created TEXT NOT NULL,
    UNIQUE (run_id, variant, kind, round)
);
CREATE TABLE IF NOT EXISTS blobs (sha256 TEXT PRIMARY KEY, data BLOB NOT NULL);
"""

RUNNING, DONE, INTERRUPTED = "running", "done", "interrupted"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class RunRow:
    run_id: str
    created: str
    suite_name: str
    suite_path: str | None
    status: str
    output_dir: str | None
    variants: tuple[tuple[str, str], ...]   # (name, status of its measurements: ok if any round was)
    suite: dict                     # the suite as given (measure/stored_suite parses it)
    plan: PlanRecord
    environment: HostEnvironment
    comparison: dict | None         # the Comparison's JSON (measure/runs.stored_comparison reads it)


class Store:
    def __init__(self, path: str | Path = DEFAULT_STORE):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=30)
            problem = self._not_ours()
            if problem is not None:   # refused before anything is written: the file stays as it was
                self._db.close()
                raise StoreError(problem, file=str(self.path),
                                 accepted="a results store written by this version of variantlab (move the file "
                                          "away or pass --store NEW.sqlite)")
            self._initialise()
        except (sqlite3.DatabaseError, OSError) as e:
            raise StoreError(f"cannot open results store: {e}", file=str(self.path),
                             accepted="a writable SQLite file path (--store PATH)") from None

    def _initialise(self, attempts: int = 100) -> None:
        """WAL mode and the tables. Two processes creating one new file at once can find it locked
        while the other switches its journal mode (SQLite answers that without waiting): retry."""
        for attempt in range(attempts):
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                # one transaction: another process never sees some tables and no schema version
                self._db.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} INSERT OR IGNORE INTO meta VALUES "
                                       f"('schema_version', '{SCHEMA_VERSION}'); COMMIT;")
                self._upgrade()
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or attempt == attempts - 1:
                    raise
                self._db.rollback()
                time.sleep(0.05)

    def _upgrade(self) -> None:
        """Bring a store of an upgradable schema to SCHEMA_VERSION, in one transaction that re-reads the version
        (two processes opening one old store: the second finds it upgraded). 2 → 3: the formats column."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            version = int(self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])
            if version == SCHEMA_VERSION:
                return
            if "formats_json" not in {r[1] for r in self._db.execute("PRAGMA table_info(runs)")}:
                self._db.execute("ALTER TABLE runs ADD COLUMN formats_json TEXT")
            self._db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))

    def _not_ours(self) -> str | None:
        """Why this SQLite file is not a store this variantlab may write (None: it is ours, or new and empty).
        Reading sqlite_master also raises DatabaseError for a file that is not SQLite at all."""
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            return None
        if "meta" not in tables:
            return (f"this SQLite file is not a variantlab results store (its tables: "
                    f"{', '.join(sorted(tables)[:5])})")
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        version = int(row[0]) if row and str(row[0]).isdigit() else None
        if version == SCHEMA_VERSION or version in UPGRADABLE_SCHEMAS:
            return None
        if version is not None and version > SCHEMA_VERSION:
            return (f"this results store was written by a newer variantlab (schema {version}; this one reads "
                    f"schema {SCHEMA_VERSION}): upgrade variantlab to read it")
        return f"this results store has schema {row[0] if row else 'none'}; this variantlab writes schema {SCHEMA_VERSION}"

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- writing

    def create_run(self, run_id: str, suite: dict, suite_path: str | None, plan: dict, environment: dict,
                   output_dir: str | None) -> None:
        with self._writing():
            self._db.execute(
                "INSERT INTO runs (run_id, created, suite_name, suite_path, suite_json, plan_json, environment_json,"
                " output_dir, status, formats_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, _now(), suite.get("name", "suite"), suite_path, json.dumps(suite), json.dumps(plan),
                 json.dumps(environment), output_dir, RUNNING, json.dumps(COLUMN_FORMATS)))

    @contextlib.contextmanager
    def _writing(self):
        """One transaction; a database error (locked past the timeout, disk full) is a StoreError."""
        try:
            with self._db:
                yield
        except sqlite3.Error as e:
            raise StoreError(f"cannot write the results store: {e}", file=str(self.path),
                             accepted="a writable SQLite file on a disk with room") from None

    def put_record(self, run_id: str, record, blobs: dict[str, bytes] | None = None) -> None:
        """Insert or replace one build or measurement record (and its blobs) in one transaction."""
        rnd = getattr(record, "round", 0)
        with self._writing():
            for sha, data in (blobs or {}).items():
                self._db.execute("INSERT OR IGNORE INTO blobs VALUES (?, ?)", (sha, data))
            self._db.execute(
                "INSERT INTO records (run_id, variant, kind, round, status, reason, record_json, created)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(run_id, variant, kind, round) DO UPDATE SET"
                " status=excluded.status, reason=excluded.reason, record_json=excluded.record_json",
                (run_id, record.variant, record.kind, rnd, record.status, record.reason,
                 record.model_dump_json(), _now()))

    def reopen_run(self, run_id: str) -> None:
        """A run being resumed is `running` again until it finishes."""
        with self._writing():
            self._db.execute("UPDATE runs SET status=?, finished=NULL WHERE run_id=?", (RUNNING, run_id))

    def finish_run(self, run_id: str, comparison: dict | None, status: str = DONE) -> None:
        with self._writing():
            self._db.execute("UPDATE runs SET status=?, comparison_json=?, finished=? WHERE run_id=?",
                             (status, json.dumps(comparison) if comparison is not None else None, _now(), run_id))

    # ---------------------------------------------------------------- reading

    def records(self, run_id: str, kind: str | None = None) -> list:
        """The run's records (wire.BuildRecord / MeasurementRecord), in the order they arrived."""
        from .measure.wire import BuildRecord, MeasurementRecord
        sql = "SELECT kind, record_json FROM records WHERE run_id=?" + (" AND kind=?" if kind else "") + " ORDER BY id"
        rows = self._db.execute(sql, (run_id, kind) if kind else (run_id,)).fetchall()
        try:
            return [(BuildRecord if k == "build" else MeasurementRecord).model_validate_json(j) for k, j in rows]
        except ValueError as e:   # pydantic's ValidationError: written by another version of variantlab
            raise StoreError(f"run {run_id} holds a record this variantlab cannot read ({str(e).splitlines()[0]})",
                             file=str(self.path), accepted="a run written by this version") from None

    def blob(self, sha: str) -> bytes:
        row = self._db.execute("SELECT data FROM blobs WHERE sha256=?", (sha,)).fetchone()
        if row is None:
            raise StoreError(f"blob {sha[:12]} is not in the store", file=str(self.path))
        return bytes(row[0])

    def runs(self, limit: int = 50) -> list[RunRow]:
        cur = self._db.execute("SELECT run_id FROM runs ORDER BY created DESC, rowid DESC LIMIT ?", (limit,))
        return [self.run(r) for (r,) in cur.fetchall()]

    def run(self, run_id: str) -> RunRow:
        row = self._db.execute(
            "SELECT run_id, created, suite_name, suite_path, status, output_dir, suite_json, plan_json,"
            " environment_json, comparison_json, formats_json FROM runs WHERE substr(run_id, 1, length(?)) = ? ORDER BY created DESC",
            (run_id, run_id)).fetchall()
        exact = [r for r in row if r[0] == run_id]
        row = exact or row
        if len(row) != 1:
            known = [r for (r,) in self._db.execute("SELECT run_id FROM runs ORDER BY created DESC LIMIT 5")]
            why = f"no run matches '{run_id}'" if not row else f"{len(row)} runs match '{run_id}'"
            raise StoreError(why, file=str(self.path), field="RUN",
                             accepted=", ".join(known) or "none stored yet; run `variantlab bench` first")
        rid, created, name, spath, status, odir, sj, pj, ej, cj, fj = row[0]
        formats = self._formats(rid, fj)
        # a variant's status: ok when some round measured it, else its build's or its rounds' failure
        variants = tuple(self._db.execute(
            "SELECT variant, CASE WHEN SUM(kind='measure' AND status='ok') > 0 THEN 'ok'"
            " WHEN SUM(status != 'ok') > 0 THEN MIN(CASE WHEN status != 'ok' THEN status END) ELSE 'pending' END"
            " FROM records WHERE run_id=? GROUP BY variant ORDER BY MIN(id)", (rid,)).fetchall())
        try:
            plan = PlanRecord.model_validate(upgrade_plan(json.loads(pj), formats["plan_json"]))
            environment = HostEnvironment.model_validate(json.loads(ej))
        except ValueError as e:   # pydantic's ValidationError: a column another version wrote differently
            raise StoreError(f"run {rid} holds a plan or environment this variantlab cannot read "
                             f"({str(e).splitlines()[0]})", file=str(self.path),
                             accepted="a run written by this version") from None
        return RunRow(rid, created, name, spath, status, odir, variants, json.loads(sj), plan, environment,
                      json.loads(cj) if cj else None)

    def _formats(self, run_id: str, stored: str | None) -> dict[str, int]:
        """Each JSON column's format in this row; a StoreError for one written by a newer variantlab."""
        formats = {c: 1 for c in COLUMN_FORMATS} | (json.loads(stored) if stored else {})
        newer = [f"{c} (format {v}; this one reads {COLUMN_FORMATS[c]})" for c, v in formats.items()
                 if c in COLUMN_FORMATS and v > COLUMN_FORMATS[c]]
        if newer:
            raise StoreError(f"run {run_id} was written by a newer variantlab: {', '.join(newer)}",
                             file=str(self.path), accepted="upgrade variantlab to read it")
        return formats
