"""The results store: one SQLite file; a row per run and a row per measurement.

A measurement row is written (and committed) as soon as its variant finishes, so an interrupted
run keeps everything already measured; the run row gets its comparison when the run ends.
Default path: ./variantlab.sqlite (suite `output.store` or `--store` override it).
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .errors import StoreError

DEFAULT_STORE = "variantlab.sqlite"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created TEXT NOT NULL,
    suite_name TEXT NOT NULL,
    suite_path TEXT,
    suite_json TEXT NOT NULL,
    environment_json TEXT NOT NULL,
    output_dir TEXT,
    status TEXT NOT NULL,           -- running | done
    comparison_json TEXT,
    finished TEXT
);
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    variant TEXT NOT NULL,
    status TEXT NOT NULL,           -- ok | failed | unsupported
    reason TEXT,
    result_json TEXT NOT NULL,
    created TEXT NOT NULL,
    UNIQUE (run_id, variant)
);
"""


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
    variants: tuple[tuple[str, str], ...]   # (name, status)
    suite: dict
    environment: dict
    comparison: dict | None


class Store:
    def __init__(self, path: str | Path = DEFAULT_STORE):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path)
            self._db.executescript(_SCHEMA)
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            self._db.commit()
        except (sqlite3.DatabaseError, OSError) as e:
            raise StoreError(f"cannot open results store: {e}", file=str(self.path),
                             accepted="a writable SQLite file path (--store PATH)") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create_run(self, run_id: str, suite: dict, suite_path: str | None, environment: dict,
                   output_dir: str | None) -> None:
        with self._db:
            self._db.execute(
                "INSERT INTO runs (run_id, created, suite_name, suite_path, suite_json, environment_json, output_dir,"
                " status) VALUES (?, ?, ?, ?, ?, ?, ?, 'running')",
                (run_id, _now(), suite.get("name", "suite"), suite_path, json.dumps(suite), json.dumps(environment),
                 output_dir))

    def put_measurement(self, run_id: str, variant: str, result: dict) -> None:
        """Insert or replace one variant's result; committed at once."""
        with self._db:
            self._db.execute(
                "INSERT INTO measurements (run_id, variant, status, reason, result_json, created)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(run_id, variant) DO UPDATE SET"
                " status=excluded.status, reason=excluded.reason, result_json=excluded.result_json",
                (run_id, variant, result.get("status", "failed"), result.get("reason"), json.dumps(result), _now()))

    def finish_run(self, run_id: str, comparison: dict) -> None:
        with self._db:
            self._db.execute("UPDATE runs SET status='done', comparison_json=?, finished=? WHERE run_id=?",
                             (json.dumps(comparison), _now(), run_id))

    def measurements(self, run_id: str) -> dict[str, dict]:
        cur = self._db.execute("SELECT variant, result_json FROM measurements WHERE run_id=? ORDER BY id", (run_id,))
        return {v: json.loads(r) for v, r in cur}

    def runs(self, limit: int = 50) -> list[RunRow]:
        cur = self._db.execute("SELECT run_id FROM runs ORDER BY created DESC, rowid DESC LIMIT ?", (limit,))
        return [self.run(r) for (r,) in cur.fetchall()]

    def run(self, run_id: str) -> RunRow:
        row = self._db.execute(
            "SELECT run_id, created, suite_name, suite_path, status, output_dir, suite_json, environment_json,"
            " comparison_json FROM runs WHERE run_id=? OR run_id LIKE ? ORDER BY created DESC",
            (run_id, run_id + "%")).fetchall()
        if len(row) != 1:
            known = [r for (r,) in self._db.execute("SELECT run_id FROM runs ORDER BY created DESC LIMIT 5")]
            why = f"no run matches '{run_id}'" if not row else f"{len(row)} runs match '{run_id}'"
            raise StoreError(why, file=str(self.path), field="RUN",
                             accepted=", ".join(known) or "none stored yet; run `variantlab bench` first")
        rid, created, name, spath, status, odir, sj, ej, cj = row[0]
        variants = tuple(self._db.execute("SELECT variant, status FROM measurements WHERE run_id=? ORDER BY id",
                                          (rid,)).fetchall())
        return RunRow(rid, created, name, spath, status, odir, variants, json.loads(sj), json.loads(ej),
                      json.loads(cj) if cj else None)
