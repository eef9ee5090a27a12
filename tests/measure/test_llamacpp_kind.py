"""backend: llamacpp in the suite, the plan and a whole bench (measure/backend_kinds/llamacpp_kind.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from variantlab.suite import VariantSpec

SUITE = """name: runtimes
model: builtin:tiny-structured
rounds: {rounds}
variants:
  - {{name: fp32, recipe: fp32}}
{variants}
workload:
  dataset: {{generator: structured, n: 12}}
  max_new_tokens: 24
  scenarios: [{{type: single-stream}}, {{type: offline, batch_size: 4}}]
  accuracy: {{samples: 8}}
"""


def test_the_suite_says_what_a_llamacpp_variant_needs():
    with pytest.raises(ValueError, match="needs gguf_type"):
        VariantSpec(name="g", backend="llamacpp")
    with pytest.raises(ValueError, match=r"unknown gguf_type 'Q4'.*Q4_K_M"):
        VariantSpec(name="g", backend="llamacpp", gguf_type="Q4")
    with pytest.raises(ValueError, match="give one of them"):
        VariantSpec(name="g", backend="llamacpp", gguf_type="Q4_0", model="m.gguf")
    with pytest.raises(ValueError, match="gguf_type is for backend: llamacpp"):
        VariantSpec(name="g", gguf_type="Q4_0")
    with pytest.raises(ValueError, match="not by our recipes: recipe cannot apply"):
        VariantSpec(name="g", backend="llamacpp", gguf_type="Q4_0", recipe="int4")
    assert VariantSpec(name="g", backend="llamacpp", model="x.gguf").builds


def run_cli(args, cwd, env=None, timeout=900):
    return subprocess.run([sys.executable, "-m", "variantlab.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.e2e
def test_without_llama_cpp_python_a_llamacpp_variant_is_refused_at_planning_naming_the_install(tmp_path):
    blocked = tmp_path / "site"
    blocked.mkdir()
    (blocked / "sitecustomize.py").write_text("import sys\nsys.modules['llama_cpp'] = None\n")
    suite = tmp_path / "s.yaml"
    suite.write_text(SUITE.format(rounds=1, variants="  - {name: q4, backend: llamacpp, gguf_type: Q4_0}"))
    done = run_cli(["bench", str(suite)], tmp_path, {"PYTHONPATH": str(blocked)})
    assert done.returncode == 2, done.stderr
    assert "variants[1].backend" in done.stderr and "bash scripts/install_llamacpp.sh" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.e2e
def test_a_missing_gguf_file_is_bad_input(tmp_path):
    pytest.importorskip("llama_cpp")
    suite = tmp_path / "s.yaml"
    suite.write_text(SUITE.format(rounds=1, variants="  - {name: mine, backend: llamacpp, model: nope.gguf}"))
    done = run_cli(["bench", str(suite)], tmp_path)
    assert done.returncode == 2 and "variants[1].model" in done.stderr and "nope.gguf does not exist" in done.stderr


@pytest.mark.slow
@pytest.mark.e2e
def test_gguf_variants_built_and_given_share_one_table_with_torch(tmp_path):
    """F32 and Q4_0 made from the checkpoint and a user's GGUF (the Q4_0 file): one bench, accuracy included."""
    pytest.importorskip("llama_cpp")
    from variantlab.variants import gguf_convert
    gguf_convert.find_converter()
    suite = tmp_path / "s.yaml"
    suite.write_text(SUITE.format(rounds=1, variants="\n".join([
        "  - {name: f32, backend: llamacpp, gguf_type: F32}", "  - {name: q4, backend: llamacpp, gguf_type: Q4_0}"])))
    done = run_cli(["bench", str(suite)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = next(p for p in (tmp_path / "runs").iterdir())
    rows = cells(run)
    kld = rows["scoring.kld_mean"]
    assert kld["f32"]["value"] < 1e-4 < kld["q4"]["value"] < 1e-2, kld
    assert rows["grading.accuracy_retention"]["f32"]["value"] == 1.0
    assert rows["facts.model_size"]["q4"]["value"] < rows["facts.model_size"]["f32"]["value"] / 4
    assert rows["cold_start.total"]["q4"]["value"] > 0
    # a 0.7 MiB GGUF's peak above the post-import baseline: its mapped weights, a KV cache, llama.cpp's compute
    # buffers; not the 128 MiB buffer of the read-bandwidth probe (it runs after the memory tracker)
    assert 0 < rows["memory.peak"]["q4"]["value"] < 64 * 2**20
    assert rows["single-stream.decode_of_read_bandwidth"]["q4"]["value"] > 0
    assert "not measured on llama.cpp" in rows["stability.attention_error"]["q4"]["problem"]
    assert rows["single-stream.decode_gbps"]["q4"]["value"] > 0      # bytes a token reads, from the GGUF's tensors
    # explain: llama_decode's time as one category, the GGUF on the roofline
    done = run_cli(["explain", run.name, "fp32", "q4", "--rounds", "1"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    explanation = json.loads(next(run.rglob("explanation.json")).read_text())
    decode = next(p for p in explanation["phases"] if p["phase"] == "decode")
    runtime = next(c for c in decode["categories"] if c["category"].startswith("another runtime"))
    assert runtime["a"] == 0 < runtime["b"] and runtime["top_op"].startswith("llama.cpp::llama_decode")
    place = next(r for r in explanation["rooflines"] if r["variant"] == "q4" and r["phase"] == "decode")
    assert 0 < place["bytes_per_token"] < 1_000_000
    # the Q4_0 GGUF again, as a user's file: reused as it is, the same figures, the checkpoint's token ids
    user = next(p for p in run.rglob("model.gguf") if gguf_type(p.parent) == "Q4_0")
    suite.write_text(SUITE.format(rounds=1, variants=f"  - {{name: mine, backend: llamacpp, model: '{user}'}}"))
    done = run_cli(["bench", str(suite)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = max((tmp_path / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    assert abs(cells(run)["scoring.kld_mean"]["mine"]["value"] - kld["q4"]["value"]) < 1e-9


def cells(run: Path) -> dict:
    """key → variant → cell of a run's results.json."""
    rows = json.loads((run / "results.json").read_text())["comparison"]["rows"]
    return {r["key"]: r["cells"] for r in rows}


def gguf_type(artifact: Path) -> str | None:
    return json.loads((artifact / "variant.json").read_text()).get("gguf_type")
