"""The runs read-model: how a stored run is read back — its comparison (as saved, or analysed afresh from
its records), every row's samples by round, its measurement records — and the results schema's version.
explain, recommend, compare and the reports read stored runs through here, never through the runner, which
only carries runs out (docs/architecture.md).
"""
from __future__ import annotations

from ..errors import StoreError
from ..store import DONE, Store
from .analysis import Comparison, analyse

RESULTS_SCHEMA = "variantlab.results/1"
"""The version of results.json (and of `bench --json`, `show --format json`); report/results.schema.json
describes it. A change that breaks a reader bumps the number."""


def stored_comparison(store: Store, run_id: str) -> tuple[Comparison, object]:
    """A stored run's comparison: as saved when it finished, else analysed now from its records
    (an interrupted or running run shows what it measured)."""
    row = store.run(run_id)
    if row.comparison:
        return Comparison.from_json(row.comparison), row
    return reanalyse(store, row)[0], row


def reanalyse(store: Store, row) -> tuple[Comparison, dict, list]:
    """A stored run (store.run's row) analysed afresh from its records: its comparison, every row's
    samples by round per variant (analysis.round_samples) and its measurement records. A run that did not
    end (interrupted, or still `running`: its bench was killed) says of the variants it has no record of
    that they were not measured because of it (analysis.NOT_MEASURED_INTERRUPTED)."""
    from .analysis import round_samples
    from .trackers import tracker_from_config
    plan = row.plan
    try:
        trackers = [tracker_from_config(t["kind"], t["config"]) for t in plan["trackers"]]
        names = [v["name"] for v in plan["variants"]]
        builds, records = store.records(row.run_id, "build"), store.records(row.run_id, "measure")
        comparison = analyse(trackers, names, plan["baseline"], builds, records, store.blob,
                             interrupted=row.status != DONE)
        samples = round_samples(trackers, names, builds, records)
    except (KeyError, TypeError, ValueError) as e:   # a plan or record of another variantlab version
        raise StoreError(f"run {row.run_id} was written by another version of variantlab and cannot be "
                         f"analysed here ({type(e).__name__}: {e})", file=str(store.path),
                         accepted="a run written by this version") from None
    return comparison, samples, records
