"""The `variantlab` command as a user runs it: a subprocess, its exit status, stdout and stderr.

Every bad input must give exit status 2 and exactly one line on stderr that names the file and
the field, with no traceback. COLUMNS is wide so that rich never wraps that line.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e

# A workload so small that, should a check ever let a bad suite through, the run still ends soon.
TINY_WORKLOAD = """\
workload:
  dataset: {generator: structured, n: 2}
  scenarios: [{type: single-stream, requests: 1, warmup: 0}]
  max_new_tokens: 1
  accuracy: {samples: 0}
"""


def run_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    env = os.environ | {"COLUMNS": "400", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "variantlab.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    err = proc.stderr
    assert proc.returncode == 2, (proc.returncode, err, proc.stdout)
    assert "Traceback" not in err and "Traceback" not in proc.stdout
    line = err.rstrip("\n")
    assert line.strip(), "stderr is empty"
    assert "\n" not in line, f"stderr has more than one line:\n{err}"
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


def write_suite(tmp_path, body: str, name: str = "suite.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def model_copy(tiny_model_dir, tmp_path):
    return shutil.copytree(tiny_model_dir, tmp_path / "model")


# --------------------------------------------------------------------------- bench: bad input

def test_bench_malformed_yaml(tmp_path):
    suite = write_suite(tmp_path, "model: x\nvariants:\n  - name: a\n bad: [\n")
    assert_one_line_error(run_cli("bench", suite, cwd=tmp_path), "suite.yaml", "line ", "malformed YAML")


def test_bench_unknown_key(tmp_path):
    suite = write_suite(tmp_path, "model: x\nvariants:\n  - name: a\n    dtyp: bf16\n")
    line = assert_one_line_error(run_cli("bench", suite, cwd=tmp_path), "suite.yaml", "variants[0].dtyp")
    assert "recipe" in line   # the accepted keys are listed


def test_bench_wrong_type(tmp_path):
    suite = write_suite(tmp_path, 'model: x\nvariants: [{name: a}]\nthreads: "two"\n')
    assert_one_line_error(run_cli("bench", suite, cwd=tmp_path), "suite.yaml", "threads", "'two'")


def test_bench_rounds_true_is_a_type_error_before_anything_runs(tmp_path):
    """Issue 22: `rounds: true` was read as 1 and a full bench started."""
    suite = write_suite(tmp_path, "model: builtin:tiny-structured\nvariants: [{name: a}]\nrounds: true\n")
    line = assert_one_line_error(run_cli("bench", suite, cwd=tmp_path), "suite.yaml", "rounds",
                                 "not a boolean", "an integer from 1 to 1000")
    assert "got true" in line and not (tmp_path / "runs").exists() and not (tmp_path / "variantlab.sqlite").exists()


def test_bench_missing_model_directory(tmp_path):
    suite = write_suite(tmp_path, "model: ./no-such-model\nvariants: [{name: a}]\n" + TINY_WORKLOAD)
    assert_one_line_error(run_cli("bench", suite, cwd=tmp_path), "suite.yaml", ": model: ", "no-such-model",
                          "does not exist")


def test_bench_directory_that_is_not_a_causal_lm(tiny_model_dir, tmp_path):
    model = model_copy(tiny_model_dir, tmp_path)
    cfg = json.loads((model / "config.json").read_text())
    cfg["architectures"] = ["BertModel"]
    (model / "config.json").write_text(json.dumps(cfg))
    suite = write_suite(tmp_path, f"model: {model}\nvariants: [{{name: a}}]\n" + TINY_WORKLOAD)
    assert_one_line_error(run_cli("bench", suite, cwd=tmp_path), "suite.yaml", ": model: ", "not a causal LM",
                          "BertModel")


def test_bench_truncated_safetensors(tiny_model_dir, tmp_path):
    model = model_copy(tiny_model_dir, tmp_path)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    suite = write_suite(tmp_path, f"model: {model}\nvariants: [{{name: a}}]\n" + TINY_WORKLOAD)
    assert_one_line_error(run_cli("bench", suite, cwd=tmp_path), "suite.yaml", ": model: ",
                          "model.safetensors", "truncated")


def test_bench_truncated_safetensors_of_a_variants_own_model(tiny_model_dir, tmp_path):
    model = model_copy(tiny_model_dir, tmp_path)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    suite = write_suite(tmp_path, f"model: {tiny_model_dir}\nvariants: [{{name: a}}, {{name: b, model: ./model}}]\n"
                        + TINY_WORKLOAD)
    assert_one_line_error(run_cli("bench", suite, cwd=tmp_path), "suite.yaml", "variants[1].model",
                          "model.safetensors")


def test_bench_dataset_record_without_answer(tiny_model_dir, tmp_path):
    (tmp_path / "data.jsonl").write_text(json.dumps({"prompt": "Q: x\nA:", "answer": "1"}) + "\n"
                                         + json.dumps({"prompt": "Q: y\nA:"}) + "\n")
    suite = write_suite(tmp_path, f"""\
        model: {tiny_model_dir}
        variants: [{{name: a}}]
        workload:
          dataset: {{path: data.jsonl, n: 2}}
          scenarios: [{{type: single-stream, requests: 1, warmup: 0}}]
          max_new_tokens: 1
          accuracy: {{samples: 0}}
        """)
    assert_one_line_error(run_cli("bench", suite, cwd=tmp_path), "data.jsonl", "line 2", "answer")


def test_bench_unknown_recipe(tiny_model_dir, tmp_path):
    suite = write_suite(tmp_path, f"model: {tiny_model_dir}\nvariants: [{{name: a, recipe: int3}}]\n"
                        + TINY_WORKLOAD)
    line = assert_one_line_error(run_cli("bench", suite, cwd=tmp_path), "suite.yaml", "variants[0].recipe",
                                 "int3")
    assert "fp32" in line and "bf16" in line   # what is accepted


def test_bench_missing_suite_file(tmp_path):
    assert_one_line_error(run_cli("bench", "nope.yaml", cwd=tmp_path), "nope.yaml", "no such suite file")


# --------------------------------------------------------------------------- other verbs

def test_schema_prints_json(tmp_path):
    proc = run_cli("schema", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    assert "variants" in schema["properties"] and "model" in schema["properties"]


def test_dataset_make_writes_n_lines(tmp_path):
    from variantlab.data.structured import generate_samples

    proc = run_cli("dataset", "make", "--n", "1000", "--seed", "0", "-o", "X.jsonl", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "X.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1000
    first = json.loads(lines[0])
    assert first == generate_samples(1, 0)[0]
    assert all({"prompt", "answer"} <= json.loads(line).keys() for line in lines)


def test_dataset_make_into_a_missing_folder_or_under_a_file_is_one_line(tmp_path):
    """Issue 13: these were FileNotFoundError / NotADirectoryError tracebacks."""
    (tmp_path / "afile").write_text("x")
    assert_one_line_error(run_cli("dataset", "make", "--n", "2", "-o", "missing/x.jsonl", cwd=tmp_path),
                          "--out", "missing does not exist")
    assert_one_line_error(run_cli("dataset", "make", "--n", "2", "-o", "afile/x.jsonl", cwd=tmp_path),
                          "--out", "afile is a file, not a folder")
    assert_one_line_error(run_cli("dataset", "make", "--n", "2", "-o", ".", cwd=tmp_path), "a folder, not a file")


def test_runs_with_a_missing_store_exits_2_and_creates_nothing(tmp_path):
    assert_one_line_error(run_cli("runs", "--store", "missing.sqlite", cwd=tmp_path), "missing.sqlite")
    assert not (tmp_path / "missing.sqlite").exists()


def test_show_an_unknown_run_lists_the_known_ones(tmp_path):
    from variantlab.store import Store

    with Store(tmp_path / "s.sqlite") as store:
        store.create_run("20250101-120000-abcd", {"name": "demo"}, None, {}, {}, None)
    line = assert_one_line_error(run_cli("show", "zzz", "--store", "s.sqlite", cwd=tmp_path), "s.sqlite", "zzz")
    assert "20250101-120000-abcd" in line


def test_runs_lists_a_stored_run(tmp_path):
    from variantlab.store import Store

    with Store(tmp_path / "s.sqlite") as store:
        store.create_run("20250101-120000-abcd", {"name": "demo"}, None, {}, {}, None)
    proc = run_cli("runs", "--store", "s.sqlite", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "20250101-120000-abcd" in proc.stdout and "demo" in proc.stdout


def test_runs_never_cuts_the_run_id_at_80_columns(tmp_path):
    """Issue 22: the run id is what every other verb takes; a long variants list must not squeeze it."""
    from variantlab.measure.wire import BuildRecord
    from variantlab.store import Store

    run_id = "20250101-120000-abcd"
    with Store(tmp_path / "s.sqlite") as store:
        store.create_run(run_id, {"name": "quickstart-on-the-long-side"}, None, {}, {}, None)
        for v in ("fp32", "bf16", "int8", "int4-g64", "w8a8-dynamic", "mixed-precision"):
            store.put_record(run_id, BuildRecord(variant=v, status="ok", artifact_dir=""))
    proc = subprocess.run([sys.executable, "-m", "variantlab.cli", "runs", "--store", "s.sqlite"], cwd=tmp_path,
                          env=os.environ | {"COLUMNS": "80", "NO_COLOR": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert run_id in proc.stdout, proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80


def test_bench_help_names_the_ray_extra():
    proc = subprocess.run([sys.executable, "-m", "variantlab.cli", "bench", "--help"], capture_output=True,
                          text=True, env=os.environ | {"COLUMNS": "400", "NO_COLOR": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'variantlab[ray]'" in proc.stdout, proc.stdout


def test_bench_refused_for_its_store_leaves_no_run_folder(tmp_path):
    """Issue 22: a store that is not ours is refused before the run folder is made (none is left empty)."""
    suite = write_suite(tmp_path, "model: builtin:tiny-structured\nvariants: [{name: a}]\n" + TINY_WORKLOAD)
    (tmp_path / "junk.sqlite").write_bytes(b"this is not SQLite at all" * 10)
    assert_one_line_error(run_cli("bench", suite, "--store", "junk.sqlite", "-o", "out", cwd=tmp_path),
                          "junk.sqlite")
    assert not (tmp_path / "out").exists()
    assert (tmp_path / "junk.sqlite").read_bytes() == b"this is not SQLite at all" * 10


def test_recipes_lists_the_dtype_recipes(tmp_path):
    proc = run_cli("recipes", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in ("fp32", "bf16", "fp16"):
        assert name in proc.stdout


def test_hw_prints_the_machine_and_keeps_its_ceilings(tmp_path, fresh_cache):
    first = run_cli("hw", "--json", "--threads", "1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["facts"]["cores"] >= 1 and "AVX2" in out["facts"]["isa"]
    from variantlab.variants.kernels import _build   # which of our kernels this CPU runs, or why none
    assert out["cpu_kernels"]["available"] == (_build.missing_requirement() is None)
    assert _build.ISA is None or not out["cpu_kernels"]["available"] or _build.ISA.name in out["cpu_kernels"]["reason"]
    cpu = out["ceilings"]["cpu"]
    assert not cpu["cached"] and cpu["threads"] == 1 and cpu["copy_gbps"] > 0 and cpu["matmul_tflops"]["fp32"] > 0
    again = run_cli("hw", "--threads", "1", cwd=tmp_path)
    assert again.returncode == 0 and "read from" in again.stdout and "CPU: " in again.stdout
    assert f"our CPU kernels: {out['cpu_kernels']['reason']}" in again.stdout
    assert f"measured {cpu['measured_at']}" in again.stdout                 # the same measurement, read back
    config = out["configuration"]["cpu"]                                     # what `recipe: auto` picks, and why
    assert {c["name"] for c in config["decode-heavy"]["choices"]} >= {"dtype", "recipe", "compile", "threads"}
    timed = out["kernel_times"]["cpu"]                                        # one table per compute dtype timed
    assert [kt["threads"] for kt in timed] in ([1], [1, 1])
    assert [kt["compute_dtype"] for kt in timed] == (["bf16"] if out["facts"]["isa"].get("AVX-512 BF16")
                                                     or out["facts"]["isa"].get("AMX-BF16") else ["fp32", "bf16"])
    assert again.stdout.count("quantized recipes computing in") == len(timed)
    assert "configuration for decode-heavy" in again.stdout and "configuration for batch-heavy" in again.stdout


def _suite_over_bad_lines(tmp_path):
    good = [json.dumps({"prompt": f"Q: {i}\nA:", "answer": str(i)}) for i in range(3)]
    (tmp_path / "data.jsonl").write_text("\n".join([good[0], "{oops", good[1], '{"prompt": "p"}', good[2]]) + "\n")
    return write_suite(tmp_path, """\
        model: builtin:tiny-structured
        variants: [{name: a}]
        workload:
          dataset: {path: data.jsonl}
          scenarios: [{type: single-stream, requests: 1, warmup: 0}]
          max_new_tokens: 1
          accuracy: {samples: 0}
        """)


def test_bench_skip_bad_lines_says_what_it_skipped_before_measuring(tmp_path):
    """Without the flag the first bad line is the error (and names the flag); with it the skipped lines are a
    warning printed before anything runs. --artifacts at a missing folder then stops the run before measuring."""
    suite = _suite_over_bad_lines(tmp_path)
    assert_one_line_error(run_cli("bench", suite, cwd=tmp_path), "data.jsonl", "line 2", "invalid JSON",
                          "--skip-bad-lines")
    proc = run_cli("bench", suite, "--skip-bad-lines", "--artifacts", tmp_path / "nowhere", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    warning, error = proc.stderr.rstrip("\n").split("\n")
    assert warning == ("warning: workload.dataset: skipped 2 bad lines of data.jsonl (line 2: invalid JSON "
                       "(Expecting property name enclosed in double quotes at column 2), line 4: missing field "
                       "'answer')")
    assert error.startswith("error: ") and "--artifacts" in error


def test_build_skip_bad_lines_says_what_it_skipped(tmp_path):
    suite = _suite_over_bad_lines(tmp_path)
    assert_one_line_error(run_cli("build", suite, cwd=tmp_path), "data.jsonl", "line 2", "--skip-bad-lines")
    (tmp_path / "afile").write_text("")
    proc = run_cli("build", suite, "--skip-bad-lines", "--out", tmp_path / "afile" / "x", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    warning, error = proc.stderr.rstrip("\n").split("\n")
    assert warning.startswith("warning: workload.dataset: skipped 2 bad lines of data.jsonl (line 2: invalid JSON")
    assert error.startswith("error: ") and "artifacts folder" in error
