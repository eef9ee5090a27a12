"""`variantlab report` and `variantlab show --format` as a user runs them: subprocesses, exit statuses, files.

The fast tests read a store written by hand. The end-to-end ones make one real run on the shipped tiny
model (two variants, one round, a few requests: seconds), explain it, write the HTML report and render
it in headless Chromium: the table is there, every chart is drawn by plotly, nothing is fetched.
Chromium is Debian's package (/usr/bin/chromium; .ci/run installs it): without it the browser test is
skipped on a developer's machine and fails under CI=true.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess

import jsonschema
import pytest

from tests.report.test_stored import RUN, STOPPED, WHY, store_with_run, store_with_stopped_run
from tests.test_cli import assert_one_line_error, run_cli, write_suite
from variantlab.report.files import results_json_schema

pytestmark = pytest.mark.e2e
CHROMIUM = "/usr/bin/chromium"


# --------------------------------------------------------------------------- on a hand-written store

def test_show_formats(tmp_path):
    store_with_run(tmp_path)
    as_json = run_cli("show", "2026", "--store", "s.sqlite", "--format", "json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    jsonschema.validate(doc, results_json_schema(), cls=jsonschema.Draft202012Validator)
    assert doc["schema"] == "variantlab.results/1" and doc["run_id"] == RUN
    as_csv = run_cli("show", RUN, "--store", "s.sqlite", "--format", "csv", cwd=tmp_path)
    lines = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert as_csv.returncode == 0 and {r["variant"] for r in lines} == {"base", "lin-int8", "half", "broken"}
    md = run_cli("show", RUN, "--store", "s.sqlite", "--format", "markdown", cwd=tmp_path)
    alias = run_cli("show", RUN, "--store", "s.sqlite", "--markdown", cwd=tmp_path)
    assert md.returncode == alias.returncode == 0 and md.stdout == alias.stdout
    assert md.stdout.startswith("| Metric | base (baseline) |")
    table = run_cli("show", RUN, "--store", "s.sqlite", "--format", "table", cwd=tmp_path)
    assert table.returncode == 0 and "demo — run" in table.stdout and "(headline rows" in table.stdout


def test_show_of_an_interrupted_run_says_what_it_did_not_measure_not_that_it_failed(tmp_path):
    store_with_stopped_run(tmp_path)
    shown = run_cli("show", STOPPED, "--store", "stopped.sqlite", "--all", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f"run {STOPPED} (interrupted)" in shown.stdout
    assert f"late: not measured (interrupted) — {WHY['late']}" in shown.stdout
    assert f"never: not measured (interrupted) — {WHY['never']}" in shown.stdout
    assert "broken: failed — build: out of memory" in shown.stdout
    tpot = "\n".join(line for line in shown.stdout.splitlines() if line.lstrip().startswith("TPOT p50"))
    assert tpot.count("not measured (interrupted)") == 2 and tpot.count("failed") == 2   # over the split tables


def test_show_bad_formats_are_one_line_errors(tmp_path):
    store_with_run(tmp_path)
    assert_one_line_error(run_cli("show", RUN, "--store", "s.sqlite", "--format", "xml", cwd=tmp_path),
                          "--format", "'xml'", "table | markdown | json | csv")
    assert_one_line_error(run_cli("show", RUN, "--store", "s.sqlite", "--format", "csv", "--markdown", cwd=tmp_path),
                          "--format", "--markdown")


def test_report_bad_input_is_a_one_line_error_naming_the_path(tmp_path):
    store_with_run(tmp_path)
    (tmp_path / "plain").write_text("x")
    assert_one_line_error(run_cli("report", "zzz", "--store", "s.sqlite", "-o", "r.html", cwd=tmp_path),
                          "s.sqlite", "zzz", RUN)
    assert_one_line_error(run_cli("report", RUN, "--store", "none.sqlite", "-o", "r.html", cwd=tmp_path),
                          "none.sqlite")
    assert_one_line_error(run_cli("report", RUN, "--store", "s.sqlite", "-o", "missing/r.html", cwd=tmp_path),
                          "missing/r.html", "does not exist")
    assert_one_line_error(run_cli("report", RUN, "--store", "s.sqlite", "-o", "plain/r.html", cwd=tmp_path),
                          "plain/r.html", "is a file, not a folder")
    assert not (tmp_path / "none.sqlite").exists() and not list(tmp_path.glob("*.html"))


def test_report_of_a_hand_written_run_into_its_folder(tmp_path):
    store_with_run(tmp_path)
    proc = run_cli("report", RUN, "--store", "s.sqlite", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "runs" / RUN / "report.html").read_text(encoding="utf-8")
    assert "no requirements given" in page and "left out: the explanations in this run" in page


# --------------------------------------------------------------------------- a real run

WORKLOAD = """\
model: builtin:tiny-structured
threads: 1
rounds: 1
variants:
  - {name: base}
  - {name: lin-int8, recipe: int8, attention: linear}
workload:
  dataset: {generator: structured, n: 4, seed: 0}
  max_new_tokens: 4
  scenarios:
    - {type: single-stream, requests: 3, warmup: 0}
    - {type: offline, batch_size: 2, passes: 1, warmup: 0}
    - {type: length-sweep, lengths: [16, 64], decode_tokens: 2, repeats: 1, warmup: 0}
  accuracy: {samples: 2}
requirements: {min_accuracy_retention: 0.5}
output: {dir: runs, store: s.sqlite}
"""
CHARTS = ("tradeoff", "percentiles-single-stream", "throughput", "length", "explain")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """(folder, run id, the report's path): a bench of two variants, explained, and its report."""
    tmp = tmp_path_factory.mktemp("report")
    write_suite(tmp, "name: demo\n" + WORKLOAD)
    bench = run_cli("bench", "suite.yaml", cwd=tmp)
    assert bench.returncode == 0, bench.stderr
    (run_id,) = [p.name for p in (tmp / "runs").iterdir()]
    explain = run_cli("explain", run_id, "base", "lin-int8", "--store", "s.sqlite", "--rounds", "1", "--json", cwd=tmp)
    assert explain.returncode == 0, explain.stderr
    assert json.loads(explain.stdout)["rounds"] == {"base": 1, "lin-int8": 1}      # `explain --json`: stdout is JSON
    report = run_cli("report", run_id, "--store", "s.sqlite", "-o", "x.html", cwd=tmp)
    assert report.returncode == 0, report.stderr
    assert "wrote x.html" in report.stdout
    return tmp, run_id, tmp / "x.html"


@pytest.mark.slow
def test_the_report_of_a_real_run_is_one_offline_file_with_every_chart_and_the_recommendation(real_run):
    _, _, path = real_run
    page = path.read_text(encoding="utf-8")
    assert page.count("<script>window.PlotlyConfig") == 1                   # plotly.js inlined once
    ours = re.sub(r"<script>window\.PlotlyConfig.*?</script>", "", page, flags=re.S)   # the page less plotly.js
    assert not re.search(r"<script[^>]*\ssrc\s*=", page, re.I), "a script is loaded from elsewhere"
    assert not re.search(r"<link\b", page, re.I) and "@import" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", ours, re.I)
    assert not re.search(r"url\(\s*[\"']?https?:", ours, re.I)
    for key in CHARTS:
        assert f'data-chart="{key}" data-drawn="yes"' in page, key
    assert "no requirements given" not in page
    assert re.search(r"pick: (base|lin-int8)", page) and "Pareto front" in page


@pytest.mark.slow
def test_results_json_and_show_json_follow_the_schema_and_show_csv_is_results_csv(real_run):
    tmp, run_id, _ = real_run
    validator = jsonschema.Draft202012Validator(results_json_schema())
    written = json.loads((tmp / "runs" / run_id / "results.json").read_text())
    shown = run_cli("show", run_id, "--store", "s.sqlite", "--format", "json", cwd=tmp)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    for d in (written, doc):
        validator.validate(d)
        assert d["schema"] == "variantlab.results/1"
    assert doc["comparison"] == written["comparison"] and doc["explanations"][0]["b"] == "lin-int8"
    assert doc["recommendation"] == written["recommendation"]       # the suite has requirements
    as_csv = run_cli("show", run_id, "--store", "s.sqlite", "--format", "csv", cwd=tmp)
    assert as_csv.stdout == (tmp / "runs" / run_id / "results.csv").read_text()


def chromium_or_skip() -> str:
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    if os.environ.get("CI") == "true":
        pytest.fail(f"{CHROMIUM} is missing under CI: .ci/run installs Debian's chromium package")
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium); CI installs it")


def render(path, tmp_path) -> str:
    """The page's DOM after headless Chromium has run its scripts (every network request refused)."""
    proc = subprocess.run([chromium_or_skip(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", f"--user-data-dir={tmp_path / 'chromium'}",
                           "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=10000",
                           "--dump-dom", path.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_chromium_renders_the_table_and_every_chart(real_run, tmp_path):
    _, _, path = real_run
    dom = render(path, tmp_path)
    assert re.search(r'<table class="comparison">.*Accuracy retention.*</table>', dom, re.S)
    sections = dict(re.findall(r'<section class="chart"[^>]*data-chart="([^"]+)"[^>]*>(.*?)</section>', dom, re.S))
    assert set(sections) == set(CHARTS)
    for key, body in sections.items():
        assert 'class="main-svg"' in body, f"chart {key} was not drawn"
        assert "<g class=\"point\"" in body or "class=\"points\"" in body, f"chart {key} has no data drawn"
    assert not re.search(r"<script[^>]*\ssrc\s*=\s*[\"']?https?:", dom) and not re.search(r"<link\b[^>]*https?:", dom)


def test_chromium_is_there_under_ci():
    """CI must render the page: a missing browser is a failure there, a skip elsewhere."""
    if os.environ.get("CI") == "true":
        assert os.path.exists(CHROMIUM) or shutil.which("chromium"), f"{CHROMIUM} is missing under CI"
