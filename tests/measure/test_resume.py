"""Nothing lost (issue 13): a bench killed with SIGKILL mid-sweep leaves no worker behind and is finished by
`variantlab bench --resume RUN` without touching what it had measured; two benches write one store at once;
the Ray executor carries out the same plan in the same order as the local one."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

import variantlab
from variantlab.errors import VariantlabError
from variantlab.measure.plan import plan_suite_file
from variantlab.measure.reference import open_reference
from variantlab.measure.run_lock import lock_path, run_lock
from variantlab.measure.runner import replan
from variantlab.store import Store

WORKLOAD = {"dataset": {"generator": "structured", "n": 6, "seed": 0}, "max_new_tokens": 4,
            "scenarios": [{"type": "single-stream", "requests": 2, "warmup": 1}], "accuracy": {"samples": 2}}


TWO_VARIANTS = ({"name": "base"}, {"name": "half", "recipe": "bf16"})


def write_suite(tmp_path: Path, name: str = "suite", rounds: int = 3, store: str = "store.sqlite",
                variants=TWO_VARIANTS) -> Path:
    suite = {"name": "t", "model": "builtin:tiny-structured", "threads": 1, "rounds": rounds,
             "variants": list(variants), "workload": WORKLOAD,
             "output": {"dir": str(tmp_path / "runs"), "store": str(tmp_path / store)}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(suite))
    return path


def cli(*args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "variantlab.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ | {"COLUMNS": "100"}, **kw)


def rows(store: Path) -> list[tuple]:
    with sqlite3.connect(store) as db:
        return db.execute("SELECT id, variant, kind, round, status, record_json, created FROM records "
                          "ORDER BY id").fetchall()


def measured(store: Path) -> int:
    try:
        with sqlite3.connect(store) as db:
            return db.execute("SELECT COUNT(*) FROM records WHERE kind='measure'").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def workers_under(folder: Path) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if "variantlab.measure.worker" in " ".join(p.info["cmdline"] or ()) and str(folder) in
            " ".join(p.info["cmdline"] or ())]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_run_killed_with_sigkill_leaves_no_worker_and_resume_finishes_it_keeping_every_record(tmp_path):
    suite, store = write_suite(tmp_path, rounds=2), tmp_path / "store.sqlite"
    proc = cli("bench", suite, cwd=tmp_path)
    deadline = time.monotonic() + 400
    while measured(store) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1]
    worker = []                                              # the worker measuring the next job, once it started
    while not worker and time.monotonic() < deadline and proc.poll() is None:
        worker = psutil.Process(proc.pid).children()         # (between two jobs the bench has none for a moment)
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert worker and all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
                          for p in psutil.wait_procs(worker, timeout=10)[0] + worker)
    assert not workers_under(tmp_path)                       # died with its parent: no orphan
    before = rows(store)
    with Store(store) as s:
        (run,) = s.runs()
    assert run.status == "running" and 2 <= sum(r[2] == "measure" for r in before) < 4
    reference = tmp_path / "runs" / run.run_id / "reference"
    made = open_reference(reference).id                      # the baseline's, made before the rounds (issue 49)

    resumed = cli("bench", "--resume", run.run_id, "--store", store, cwd=tmp_path)
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    assert "base · reference" not in out + err and not reference.exists()   # kept, used, then given back
    with Store(store) as s:
        scored = [m.output("scoring").data for m in s.records(run.run_id, "measure") if m.ran_once]
    assert [d["reference"] for d in scored] == [made, made] and all(d["kld_mean"] is not None for d in scored)
    after = rows(store)
    assert after[:len(before)] == before                      # every record kept, unchanged (same id, same bytes)
    assert sorted((r[1], r[3]) for r in after if r[2] == "measure") == [("base", 0), ("base", 1), ("half", 0),
                                                                          ("half", 1)]
    assert all(r[4] == "ok" for r in after)
    with Store(store) as s:
        assert s.run(run.run_id).status == "done"
        once = [m.variant for m in s.records(run.run_id, "measure") if m.ran_once]
    assert sorted(once) == ["base", "half"]                   # once-per-variant trackers ran once each
    assert "resumed: " in out + err

    again = cli("bench", "--resume", run.run_id, "--store", store, cwd=tmp_path)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 2 and "finished; there is nothing to resume" in err and "Traceback" not in err


@pytest.mark.e2e
@pytest.mark.slow
def test_a_live_run_cannot_be_resumed_from_another_working_folder_and_the_refusal_changes_nothing(tmp_path):
    """Issue 22: a bench in folder A (its store and run folder relative to A); a resume started in folder B naming
    A's store through a symlinked folder is refused while A lives (A held still with SIGSTOP, so that the store
    cannot move under the comparison), and A then finishes every record of its own."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (b / "link").symlink_to(a)
    suite = yaml.safe_load(write_suite(tmp_path, rounds=1).read_text())
    del suite["output"]                                   # ./variantlab.sqlite and ./runs: relative to A
    (a / "suite.yaml").write_text(yaml.safe_dump(suite))
    store = a / "variantlab.sqlite"
    first = cli("bench", "suite.yaml", cwd=a)
    deadline = time.monotonic() + 400
    while measured(store) < 1 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.2)
    assert first.poll() is None, first.communicate()[1]
    first.send_signal(signal.SIGSTOP)
    try:
        before = rows(store)
        with Store(store) as s:
            (run,) = s.runs()
        assert run.status == "running"
        second = cli("bench", "--resume", run.run_id, "--store", "link/variantlab.sqlite", cwd=b)
        _, err = second.communicate(timeout=600)
        assert second.returncode == 2 and "Traceback" not in err, err
        assert f"run {run.run_id} is being carried out by a live process (pid {first.pid})" in err
        assert rows(store) == before                           # no record written, none replaced
        with Store(store) as s:
            assert s.run(run.run_id).status == "running"       # not reopened, not marked interrupted
        assert not (b / "runs").exists()
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    after = rows(store)
    assert after[:len(before)] == before
    assert [r[0] for r in after] == list(range(1, len(after) + 1))   # no record id went missing
    assert sorted((r[1], r[3]) for r in after if r[2] == "measure") == [("base", 0), ("half", 0)]
    with Store(store) as s:
        assert s.run(run.run_id).status == "done"


@pytest.mark.e2e
@pytest.mark.slow
def test_two_benches_writing_one_store_at_once_lose_nothing(tmp_path):
    one = [{"name": "base"}]              # a variant each: the two benches' records interleave all the same
    a, b = write_suite(tmp_path, "a", rounds=1, variants=one), write_suite(tmp_path, "b", rounds=1, variants=one)
    procs = [cli("bench", a, cwd=tmp_path), cli("bench", b, cwd=tmp_path)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    with Store(tmp_path / "store.sqlite") as s:
        runs = s.runs()
        assert len(runs) == 2 and {r.status for r in runs} == {"done"}
        for r in runs:
            assert len(s.records(r.run_id, "build")) == 1 and len(s.records(r.run_id, "measure")) == 1


@pytest.mark.e2e
@pytest.mark.slow
def test_the_ray_executor_carries_out_the_local_plan_in_its_order(ray_cluster, tmp_path):
    from variantlab.measure.ray_executor import RayExecutor
    suite = write_suite(tmp_path, rounds=2)
    result = variantlab.bench(suite, executor=RayExecutor())
    assert result.comparison.status == {"base": "ok", "half": "ok"}, result.comparison.reasons
    plan = plan_suite_file(suite).for_run(result.run_id)
    with Store(result.store_path) as s:
        row = s.run(result.run_id)
        order = [(m.variant, m.round) for m in s.records(result.run_id, "measure")]
    assert row.plan == plan.to_json()                            # the same plan as the local executor's
    # 2 CPUs and 1-thread jobs: two run at once, so within a round they may land in either order, but a
    # round's measurements all finish after the previous round's started
    assert [r for _, r in order] in ([0, 0, 1, 1], [0, 1, 0, 1])
    assert sorted(order) == [("base", 0), ("base", 1), ("half", 0), ("half", 1)]


# ---------------------------------------------------------------- resuming: the checks, in process

def test_a_run_held_by_a_live_process_cannot_be_resumed(tmp_path):
    store = tmp_path / "store.sqlite"
    with run_lock(store, "run-1"):
        with pytest.raises(VariantlabError) as info:
            with run_lock(store, "run-1"):
                pass
        with run_lock(store, "run-2"):     # another run of the same store is free
            pass
    text = info.value.one_line()
    assert f"run run-1 is being carried out by a live process (pid {os.getpid()})" in text and "\n" not in text
    assert str(tmp_path / "store.sqlite.locks" / "run-1.lock") in text
    with run_lock(store, "run-1"):      # released when its holder is done
        pass


def test_the_lock_follows_the_stores_real_path_not_the_path_that_names_it(tmp_path, monkeypatch):
    """One store named three ways (absolute, relative from another working folder, through a symlinked
    folder) is one lock."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "link").symlink_to(tmp_path / "a")
    store = tmp_path / "a" / "store.sqlite"
    monkeypatch.chdir(tmp_path / "b")
    with run_lock(store, "run-1"):
        for other in (Path("../a/store.sqlite"), Path("link/store.sqlite")):
            assert lock_path(other, "run-1") == lock_path(store, "run-1")
            with pytest.raises(VariantlabError, match="being carried out by a live process"):
                with run_lock(other, "run-1"):
                    pass


def test_the_lock_of_a_killed_holder_is_free_at_once(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from variantlab.measure.run_lock import run_lock\n"
                               "with run_lock(Path(sys.argv[1]), 'r'):\n    print('held', flush=True); time.sleep(60)",
                               str(tmp_path / "store.sqlite")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    with run_lock(tmp_path / "store.sqlite", "r"):
        pass


class _Row:
    def __init__(self, suite_path: Path, plan: dict, suite: dict):
        self.run_id, self.suite_path, self.plan, self.suite = "run-1", str(suite_path), plan, suite


def test_replan_gives_the_stored_plan_back_or_names_what_changed(tmp_path):
    path = write_suite(tmp_path)
    plan = plan_suite_file(path)
    stored = plan.to_json()
    again = replan(_Row(path, stored, plan.suite.model_dump(mode="json")), tmp_path / "store.sqlite")
    assert again.to_json() == stored
    changed = dict(plan.suite.model_dump(mode="json"))
    changed["workload"] = dict(changed["workload"], dataset=dict(changed["workload"]["dataset"], seed=1))
    with pytest.raises(VariantlabError) as info:
        replan(_Row(path, stored, changed), tmp_path / "store.sqlite")
    assert "cannot be resumed: its plan made again today differs in samples_sha256" in info.value.one_line()


@pytest.mark.e2e
@pytest.mark.slow
def test_sigterm_ends_a_ray_run_as_interrupted_and_leaves_no_process_behind(tmp_path):
    pytest.importorskip("ray")
    suite, store = write_suite(tmp_path), tmp_path / "store.sqlite"
    proc = cli("bench", suite, "--executor", "ray", cwd=tmp_path)
    deadline = time.monotonic() + 400
    while measured(store) < 1 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1]
    tree = psutil.Process(proc.pid).children(recursive=True)     # its Ray cluster, tasks and workers
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    _, alive = psutil.wait_procs(tree, timeout=30)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    with Store(store) as s:
        (run,) = s.runs()
        assert run.status == "interrupted" and 1 <= len(s.records(run.run_id, "measure")) < 6


@pytest.mark.slow
def test_a_run_begun_with_a_relative_suite_path_replans_from_any_working_folder(tmp_path, monkeypatch):
    """The stored suite path is absolute: a resume from another folder finds the suite's relative dataset."""
    from variantlab.pipeline import run_bench
    from variantlab.store import Store

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    lines = [json.dumps({"id": f"s{i}", "prompt": f"Order {i}: price?", "answer": str(i)}) for i in range(4)]
    (tmp_path / "a" / "data.jsonl").write_text("\n".join(lines) + "\n")
    suite = {"name": "t", "model": "builtin:tiny-structured", "threads": 1, "rounds": 1,
             "variants": [{"name": "base"}],
             "workload": {"dataset": {"path": "data.jsonl"}, "max_new_tokens": 2,
                          "scenarios": [{"type": "single-stream", "requests": 1, "warmup": 0}],
                          "accuracy": {"samples": 1}},
             "output": {"dir": "runs", "store": str(tmp_path / "store.sqlite")}}
    (tmp_path / "a" / "suite.yaml").write_text(yaml.safe_dump(suite))
    monkeypatch.chdir(tmp_path / "a")
    result = run_bench("suite.yaml")
    with Store(tmp_path / "store.sqlite") as store:
        row = store.run(result.run_id)
    assert Path(row.suite_path).is_absolute()
    monkeypatch.chdir(tmp_path / "b")
    assert replan(row, tmp_path / "store.sqlite").to_json() == row.plan
