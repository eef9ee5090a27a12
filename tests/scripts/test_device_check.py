"""scripts/device_check.sh, the GPU device check, run here without CUDA (the dry mode): every step runs on
the CPU where it can, the report says what was skipped for lack of CUDA, and what comes back fits the
device tool's limits (at most 8 files, no deeper than 2 folders, plain names). Then a step that runs past
its time limit: stopped with its whole process group, recorded with why, and the report still written.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device_check.sh"
STEPS = ["environment", "cuda-tests", "hw", "bench-llama", "explain", "serve", "bench-reference", "cpu-kernels"]


def run_check(out: Path, work: Path, timeout: float, **env) -> subprocess.CompletedProcess:
    full = os.environ | {"OUT": str(out), "DEVICE_CHECK_DRY": "1", "DEVICE_CHECK_SITE": str(work / "site")} | env
    return subprocess.run(["bash", str(SCRIPT), "--work", str(work)], env=full, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_the_device_check_runs_dry_here_and_reports_every_step(tmp_path):
    out = tmp_path / "out"
    done = run_check(out, tmp_path / "work", 900, DEVICE_CHECK_BUDGET_S="840")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert [str(f) for f in files] == sorted(["device_check.md", "device_check.json", "steps.log", "hw.json",
                                              "bench-llama.json", "bench-reference.json", "explain.md"])
    assert len(files) <= 8 and all(len(f.parts) <= 3 and re.fullmatch(r"[\w.-]+", f.name) for f in files)
    md = (out / "device_check.md").read_text()
    assert "mode: dry" in md and "skipped for lack of CUDA:" in md
    table = {m[0]: m[1] for m in re.findall(r"^\| ([\w-]+) \| ([^|]+) \|", md, re.M)}
    assert [s for s in table if s in STEPS] == STEPS
    report = json.loads((out / "device_check.json").read_text())
    steps = {s["name"]: s for s in report["steps"]}
    assert report["mode"] == "dry" and report["finished"]
    assert {n: s["status"] for n, s in steps.items()} == {n: "skipped: no CUDA" if n == "cuda-tests" else "passed"
                                                          for n in STEPS}
    # the tests marked cuda were collected and each skipped, as on the CPU CI
    assert steps["cuda-tests"]["figures"]["counts"]["skipped"] >= 20 and "passed" not in steps["cuda-tests"]["figures"]["counts"]
    assert not steps["environment"]["figures"]["apis_missing"] and not steps["environment"]["figures"]["imports_failed"]
    for bench, variants in (("bench-llama", {"fp32", "bf16"}), ("bench-reference", {"fp32"})):
        figures = steps[bench]["figures"]["variants"]
        assert set(figures) == variants and all(f["status"] == "ok" and f["tok_s"] > 0 for f in figures.values())
        assert json.loads((out / f"{bench}.json").read_text())["schema"] == "variantlab.results/1"
    assert steps["hw"]["figures"]["device"] == "cpu" and steps["hw"]["figures"]["configuration"]
    assert len(steps["explain"]["figures"]["headlines"]) >= 2 and "bf16" in (out / "explain.md").read_text()
    serve = steps["serve"]["figures"]
    assert [q["status"] for q in serve["requests"]] == [200] * 4 and serve["burst"]["ok"] == 8
    assert serve["stream"]["ttft_s"] > 0 and len(serve["calibration"]) == 2   # both variants measured for adaptive
    assert "serve" in (out / "steps.log").read_text() and "$ " in (out / "steps.log").read_text()
    kernels = steps["cpu-kernels"]["figures"]          # our kernels' tests ran, switched on for that step alone
    assert kernels["isa"] in ("AVX-512", "AVX2") and kernels["counts"]["passed"] >= 50 and "failed" not in kernels["counts"]
    assert "VARIANTLAB_KERNELS=1 " in (out / "steps.log").read_text()


def test_without_a_compiler_the_cpu_kernels_step_says_why_it_skipped(tmp_path):
    out = tmp_path / "out"
    done = run_check(out, tmp_path / "work", 300, DEVICE_CHECK_STEPS="cpu-kernels", CXX="no-such-compiler")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    kernels = {s["name"]: s for s in json.loads((out / "device_check.json").read_text())["steps"]}["cpu-kernels"]
    assert kernels["status"] == "skipped: our CPU kernels are off: no C++ compiler (no-such-compiler not on PATH); aten runs instead"
    assert "no-such-compiler" in (out / "device_check.md").read_text()


@pytest.fixture(scope="module")
def driver():
    spec = importlib.util.spec_from_file_location("device_check", ROOT / "scripts" / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def ended(pid: int, within_s: float = 5.0) -> bool:
    """Whether process `pid` is gone (or a zombie: killed, not yet reaped by whoever adopted it)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (ProcessLookupError, FileNotFoundError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_a_command_past_its_limit_is_ended_with_its_children_and_recorded(driver, tmp_path):
    check = driver.Check(tmp_path, tmp_path, dry=True, budget_s=60, env=dict(os.environ))
    pid_file = tmp_path / "child.pid"
    with (tmp_path / "steps.log").open("w") as log:
        check.log = log
        ran = driver.run(check, ["bash", "-c", f"sleep 120 & echo $! > {pid_file}; echo started; wait"], 1)
    assert ran.rc is None and ran.seconds < 20
    assert "started" in ran.tail() and "time limit" in ran.tail()
    assert ended(int(pid_file.read_text()))      # the whole process group went, the background child too
    check.results = [driver.StepResult("environment", "passed", 1.0, "fine"),
                     driver.StepResult("hw", "timed out", 1.0, tail=ran.tail()),
                     driver.StepResult("serve", "not run: 5 s of the budget left")]
    driver.report(check, finished=True)
    md = (tmp_path / "device_check.md").read_text()
    assert "| hw | timed out |" in md and "| serve | not run: 5 s of the budget left |" in md and "time limit" in md
    assert json.loads((tmp_path / "device_check.json").read_text())["steps"][1]["status"] == "timed out"


@pytest.mark.slow
def test_the_check_told_to_end_ends_the_step_it_runs_and_still_writes_its_report(tmp_path):
    out, cache = tmp_path / "out", tmp_path / "cache"
    env = os.environ | {"OUT": str(out), "DEVICE_CHECK_DRY": "1", "DEVICE_CHECK_STEPS": "hw",
                        "VARIANTLAB_CACHE": str(cache)}      # a cold cache: hw measures for a while
    proc = subprocess.Popen(["bash", str(SCRIPT), "--work", str(tmp_path / "work")], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while "variantlab.cli hw" not in ((out / "steps.log").read_text() if (out / "steps.log").exists() else ""):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read() if proc.poll() else ""
        time.sleep(0.2)
    time.sleep(1)
    proc.terminate()                                     # what the wrapper's `timeout` sends the driver
    assert proc.wait(60) == 124
    report = json.loads((out / "device_check.json").read_text())
    hw = next(s for s in report["steps"] if s["name"] == "hw")
    assert hw["status"] == "timed out" and "SIGTERM" in hw["tail"] and not report["finished"]
    assert "| hw | timed out |" in (out / "device_check.md").read_text()
    assert not [pid for pid in with_env(f"VARIANTLAB_CACHE={cache}") if not ended(pid)]   # hw (its own session) too


def with_env(entry: str) -> list[int]:
    """The processes whose environment holds `entry` (NAME=value)."""
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if entry.encode() in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
        except OSError:
            continue
    return pids
