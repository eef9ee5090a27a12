"""Single-stream decode, variantlab's engine against llama.cpp on the same weights (issue 9, "The peer benchmark").

One checkpoint goes to both sides. llama.cpp gets it through its own converter
(`convert_hf_to_gguf.py` from the llama-cpp-python source distribution) as GGUF F32 and BF16, and
through `llama_cpp.llama_model_quantize` (from the F32 file) as Q8_0 and Q4_0, each step in a
child process whose output is shown only when it fails. variantlab builds the same checkpoint with
`variants.build.build`. The pairs, by name and by what the kernels do (llama.cpp's Q8_0 and Q4_0 quantize the
activations to 8 bits a block and multiply in integers, as our w8a8 and w4a8 do):

    F32 <-> fp32    BF16 <-> bf16    Q8_0 <-> int8, w8a8
    Q4_0 <-> int4, w4a8 group_size 32 symmetric (Q4_0's format: a scale per 32 weights, 4.5 bits a weight)
    Q4_1 <-> int4, w4a8 group_size 32 (asymmetric, Q4_1's format: a scale and a zero point or minimum per
                                       32 weights, 5.0 bits a weight)

Each side runs in a worker process of its own (spawned, so that the two OpenMP runtimes, heaps and
thread settings never meet), with 2 threads, greedy, on the same prompt token ids (BOS included),
generating exactly --new-tokens tokens. Both sides run as `variantlab bench` runs them, so that the two
instruments measure the same thing: llama.cpp through our llama.cpp backend (backends/llamacpp.py:
`llama_decode` through the C API, the backend a `backend: llamacpp` variant is measured with; not
`Llama.generate`, whose Python loop costs llama.cpp 23% on Q4_0), variantlab through `TorchEngine`, made as
the measuring worker makes it (`--engine default`: our decode step where it runs, as a variant without
`compile`), both driven by `run_requests` with `stop_on_eos=False`. For each pair both workers load and
warm up, then run in adjacent pairs, alternating which side goes first (A B, B A, ...) so that a
drift in the machine's load lands on both sides alike. Both sides are timed the same way, on the
worker's `time.perf_counter` as each token reaches Python, and reduced by variantlab's own TPOT
(`measure.metrics.tpot`: time per output token after the first, so prefill is left out).

Printed per pair: tokens/s of each side (1 / median TPOT over the pairs), GB/s (the weight bytes
that must be read per token / time per token: llama.cpp's GGUF tensor bytes, `llama_model_size`;
variantlab's `facts.extra["resident_bytes"]`; both count the whole embedding table, which at this
vocabulary is under 1% of the weights), the paired ratio variantlab / llama.cpp (median of the
per-pair ratios, with their min and max), and how many leading greedy tokens the two sides agree on
(a check that the converted model is the same model: F32 <-> fp32 should agree for a long way;
quantized pairs use different quantizers and part sooner). llama.cpp's Q4_0 and Q8_0 keep its own
choices for the output tensor (Q4_0 stores it in Q6_K); variantlab keeps lm_head in bf16.

The tokenizer. The converter names a byte-level BPE tokenizer's pre-tokenizer by hashing the
token ids it produces for a fixed text, and refuses a hash it does not know ("BPE pre-tokenizer was
not recognized"); our shipped tokenizer (src/variantlab/models/tiny_structured) is one it does not
know. Its Llama class also tries SentencePiece first and fails on a missing `sentencepiece`
module, though this tokenizer has no tokenizer.model. So the conversion runs in a child process
that imports the converter's own model class for the checkpoint's architecture and subclasses it:
`get_vocab_base_pre` returns the converter's answer when it knows the hash and `gpt-2` otherwise,
and `set_vocab` goes straight to the GPT-2 (byte-level BPE) vocabulary when the folder holds a
BPE tokenizer.json and no tokenizer.model (variants/gguf_convert.py, which `backend: llamacpp` uses
too). Both sides receive token ids, never text, so the pre-tokenizer only labels the GGUF; it
changes no timing.

Needs llama-cpp-python 0.3.36 built for this CPU at its best and llama.cpp's converter, both from
`bash scripts/install_llamacpp.sh` (AVX-512/VNNI/BF16 where the CPU has them, AMX off: a build with
AMX on crashed with an illegal instruction on Q8_0 on our Xeons); the build's flags are printed:

    python benchmarks/decode_vs_llamacpp.py [--shape 115m|1024x2816|qwen2-0.5b|smollm-135m|tiny] [--pairs 6] [--workdir DIR]
                                            [--engine default|eager|compile] [--llama-cpp-src LLAMA_CPP_CHECKOUT]

Without --model it saves a random-weight model of --shape (issue 25's three: `115m`, a Llama of hidden 768,
16 layers, 12 heads, intermediate 2048, quant_decode.py's shape; `1024x2816`, a Llama of hidden 1024, 12 layers,
intermediate 2816; `qwen2-0.5b`, a Qwen2 of hidden 896, 24 layers, 14 query / 2 K/V heads, intermediate 4864,
tied embeddings; and two where a token's fixed cost weighs more: `smollm-135m`, SmolLM-135M's shape, and `tiny`,
4 layers of hidden 256), with the shipped tokenizer (1k tokens), in fp32, seeded by --seed; --workdir keeps it and its
GGUF files for the next run. Every GGUF is dropped from the page cache and read through once before it is
measured (variants/page_cache.py), as the bench's GGUF artifacts are: llama.cpp maps its file, and a file just
written stays in 4 KiB pages where one read from disk comes in large folios that map with 2 MiB entries. The
last lines say which goals of issue 25 the run met: every pair at ≥ 1.0x, and int4 (w4a8) ÷ fp32 ≥ llama.cpp's
Q4_0 ÷ F32. Never part of the test suite.
"""
from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from variantlab.errors import VariantlabError
from variantlab.variants import gguf_convert
from variantlab.variants.page_cache import as_read_from_disk

LLAMA_CPP_VERSION = "0.3.36"
INSTALL_HINT = ("llama_cpp is not installed; build it for this CPU at its best with "
                f"`{gguf_convert.INSTALL}` (docs/runtimes.md), which also unpacks llama.cpp's converter")

# Same shape as benchmarks/quant_decode.py's CONFIG (115M parameters with the shipped 1k vocabulary).
CONFIG = dict(hidden_size=768, num_hidden_layers=16, num_attention_heads=12, num_key_value_heads=12,
              intermediate_size=2048, vocab_size=1024, max_position_embeddings=1024,
              bos_token_id=0, eos_token_id=1, pad_token_id=2)
COMMON = {k: v for k, v in CONFIG.items() if k in ("vocab_size", "max_position_embeddings", "bos_token_id",
                                                   "eos_token_id", "pad_token_id")}


@dataclass(frozen=True)
class Pair:
    """One precision on both sides: llama.cpp's GGUF type and the variantlab recipe that matches it."""

    gguf: str                       # F32 | BF16 (converter outtype) | Q8_0 | Q4_0 (llama_model_quantize)
    recipe: str
    options: tuple = ()             # recipe options as (key, value) pairs

    @property
    def label(self) -> str:
        opts = dict(self.options)
        group = f" g{opts['group_size']}" if "group_size" in opts else ""
        return f"{self.gguf} <-> {self.recipe}{group}{' sym' if opts.get('symmetric') else ''}"


# Paired by name, by format and by what the kernels do: llama.cpp's Q8_0 and Q4_0 quantize the activations to
# 8 bits per block and multiply in integers, as our w8a8 and w4a8 do; our int8 and int4 keep the activations in
# bf16. Q4_0 keeps a scale per 32 weights (4.5 bits a weight), as int4 with `symmetric: true` does; Q4_1 a scale
# and a minimum (5.0 bits), as our default, asymmetric int4 does (a scale and a zero point per 32 weights).
G32, G32_SYM = (("group_size", 32),), (("group_size", 32), ("symmetric", True))
PAIRS = (Pair("F32", "fp32"), Pair("BF16", "bf16"), Pair("Q8_0", "int8"), Pair("Q8_0", "w8a8"),
         Pair("Q4_0", "int4", G32_SYM), Pair("Q4_0", "w4a8", G32_SYM),
         Pair("Q4_1", "int4", G32), Pair("Q4_1", "w4a8", G32))

# The model shapes of issue 25's goals, random weights, the shipped 1k-token tokenizer.
SHAPES = {
    "115m": dict(hidden_size=768, num_hidden_layers=16, num_attention_heads=12, num_key_value_heads=12,
                 intermediate_size=2048),
    "1024x2816": dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=16,
                      intermediate_size=2816),
    # vocab_size padded past the tokenizer's 1,025 ids, as Qwen2's own is: its converter requires every id < it
    "qwen2-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                       intermediate_size=4864, tie_word_embeddings=True, vocab_size=1088),
    # two more, where a token's fixed cost weighs more: SmolLM-135M's shape (narrow, 30 layers, 9 query / 3 K/V
    # heads, tied embeddings) and a 4-layer model of hidden 256 (a draft model's size)
    "smollm-135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                        intermediate_size=1536, tie_word_embeddings=True),
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                 intermediate_size=704),
}


# ---------------------------------------------------------------------------- GGUF files

def convert(llama_cpp_dir: Path, model_dir: Path, out: Path, outtype: str) -> Path:
    """llama.cpp's converter to F32 or BF16 (variants/gguf_convert.py, in a child process)."""
    return gguf_convert.convert(model_dir, out, outtype, llama_cpp_dir)


def quantize(f32: Path, out: Path, gguf_type: str, threads: int) -> Path:
    """llama_model_quantize from the F32 GGUF to Q8_0 or Q4_0 (in a child process)."""
    return gguf_convert.quantize(f32, out, gguf_type, threads)


def find_converter(spec: str | None) -> Path:
    try:
        return gguf_convert.find_converter(spec or os.environ.get("LLAMA_CPP_SRC"))
    except VariantlabError as e:
        raise SystemExit(e.one_line()) from None


# ---------------------------------------------------------------------------- the two workers

def _run_llama(conn, gguf_path: str, model_dir: str, threads: int) -> None:
    """Worker: load the GGUF in our llama.cpp backend (what `variantlab bench` measures a `backend: llamacpp`
    variant with: llama_decode through the C API), then answer (prompt ids, n) with a RequestRecord until told None.
    Not `Llama.generate`: its Python sampling loop made llama.cpp 23% slower than its own eval clock on Q4_0
    (benchmarks/llamacpp_backend_check.py), a weakened peer."""
    import llama_cpp
    from transformers import AutoTokenizer

    from variantlab.backends.base import GenerationRequest, run_requests
    from variantlab.backends.llamacpp import LlamaCppBackend
    from variantlab.backends.tokenized import TokenizerText, eos_ids
    from variantlab.variants.gguf_model import cpu_features, model_info

    tok = AutoTokenizer.from_pretrained(model_dir)
    backend = LlamaCppBackend(gguf_path, TokenizerText(tok, eos_ids(tok)), threads=threads)
    info = model_info(backend.model)
    conn.send({"weight_bytes": info["tensor_bytes"], "parameters": info["parameters"],
               "system_info": llama_cpp.llama_print_system_info().decode().strip(), "features": cpu_features(),
               "version": llama_cpp.__version__})
    while (job := conn.recv()) is not None:
        ids, n = job
        req = GenerationRequest("llama.cpp", prompt_ids=tuple(ids), max_new_tokens=n, stop_on_eos=False)
        conn.send(run_requests(backend, [req])[0])
    backend.close()


def _run_variantlab(conn, model_dir: str, recipe: str, options: dict, threads: int, engine: str) -> None:
    """Worker: build the variant, then answer (prompt ids, n) with a RequestRecord until told None."""
    import torch
    torch.set_num_threads(threads)
    from variantlab.backends.base import GenerationRequest, run_requests
    from variantlab.backends.torch_engine import TorchEngine
    from variantlab.variants.build import VariantDefinition, build

    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    from variantlab.measure.backend_kinds.torch_kind import engine_facts

    built = build(model_dir, VariantDefinition(recipe, recipe, options), "cpu")
    runner = TorchEngine(built.model, built.tokenizer, "cpu", "peer-bench", compile_step=engine == "compile",
                         decode_step=engine == "default")      # as the measuring worker makes it (torch_kind)
    facts = engine_facts(runner, built.facts)
    conn.send({"weight_bytes": int(facts.extra.get("resident_bytes", facts.weight_bytes)),
               "parameters": int(facts.parameters),
               "kernels": ", ".join(facts.kernels + (("torch.compile of the decode step",) if engine == "compile"
                                                     else ())),
               "version": torch.__version__})
    with torch.inference_mode():                      # as the measuring worker runs the engine
        while (job := conn.recv()) is not None:
            ids, n = job
            req = GenerationRequest("variantlab", prompt_ids=tuple(ids), max_new_tokens=n, stop_on_eos=False)
            conn.send(run_requests(runner, [req])[0])


def _serve(target, conn, *args) -> None:
    """Run a worker; any failure goes back as one line instead of a hung pipe."""
    try:
        target(conn, *args)
    except BaseException as e:                        # noqa: BLE001 - reported to the parent, then re-raised
        conn.send({"error": f"{type(e).__name__}: {e}"})
        raise


class Worker:
    """A spawned worker process driven over a pipe: hello on start, one record per job."""

    def __init__(self, name: str, target, *args) -> None:
        ctx = mp.get_context("spawn")
        self.name = name
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(target, child, *args), daemon=True)
        self.proc.start()
        self.hello = self._recv()

    def _recv(self, wait_s: float = 600.0):
        deadline = time.monotonic() + wait_s   # a load, a build of our kernels or a run: never a silent hang
        while not self.conn.poll(1.0):
            if not self.proc.is_alive():       # died without a word (killed, or it failed before _serve ran)
                raise SystemExit(f"{self.name} worker exited with status {self.proc.exitcode} before answering")
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.name} worker: no answer in {wait_s:.0f} s (its model load, kernel build "
                                 "or decode run)")
        msg = self.conn.recv()
        if isinstance(msg, dict) and "error" in msg:
            raise SystemExit(f"{self.name} worker failed: {msg['error']}")
        return msg

    def run(self, ids: list[int], n: int):
        self.conn.send((ids, n))
        rec = self._recv()
        if rec.tokens_out != n:
            raise SystemExit(f"{self.name} produced {rec.tokens_out} tokens, expected {n}")
        return rec

    def close(self) -> None:
        if self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(30)          # its backend's close: a context and a model freed
        if self.proc.is_alive():
            print(f"  {self.name} worker: still running 30 s after being told to stop; terminated",
                  file=sys.stderr, flush=True)
            self.proc.terminate()
            self.proc.join(5)


# ---------------------------------------------------------------------------- setup

def make_checkpoint(out: Path, seed: int, shape: str = "115m") -> Path:
    """A random-weight model of SHAPES[shape] (a Llama; qwen2-0.5b a Qwen2) with the shipped tokenizer, in fp32."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from variantlab.models.loading import BUILTIN_MODELS

    torch.manual_seed(seed)
    config = COMMON | SHAPES[shape]
    if shape.startswith("qwen2"):
        model = Qwen2ForCausalLM(Qwen2Config(**config)).float().eval()
    else:
        model = LlamaForCausalLM(LlamaConfig(**config)).float().eval()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(BUILTIN_MODELS["tiny-structured"]).save_pretrained(out)
    return out


def prompt_ids(model_dir: Path, n: int, seed: int) -> list[int]:
    """The first n token ids (BOS included) of the structured-sample prompts for `seed`."""
    from transformers import AutoTokenizer

    from variantlab.data.structured import generate_samples

    tok = AutoTokenizer.from_pretrained(model_dir)
    k = 4
    while True:
        text = "\n".join(s["prompt"] for s in generate_samples(k, seed))
        ids = tok(text, add_special_tokens=True).input_ids
        if len(ids) >= n:
            return ids[:n]
        k *= 2


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ---------------------------------------------------------------------------- measure and print

@dataclass(frozen=True)
class PairResult:
    pair: Pair
    llama_tpot: tuple[float, ...]      # seconds per token, one per pair
    vl_tpot: tuple[float, ...]
    llama_bytes: int
    vl_bytes: int
    agree: int                         # leading greedy tokens the two sides share
    kernels: str

    @property
    def ratios(self) -> list[float]:
        """variantlab tok/s / llama.cpp tok/s, per pair."""
        return [lt / vt for lt, vt in zip(self.llama_tpot, self.vl_tpot)]


def measure(pair: Pair, gguf_path: Path, model_dir: Path, ids: list[int], args) -> tuple[PairResult, dict]:
    from variantlab.measure.metrics import tpot

    llama = Worker(f"llama.cpp {pair.gguf}", _run_llama, str(gguf_path), str(model_dir), args.threads)
    vl = Worker(f"variantlab {pair.recipe}", _run_variantlab, str(model_dir), pair.recipe,
                dict(pair.options), args.threads, args.engine)
    try:
        for w in (llama, vl):                         # warm-up: first-call allocations, page faults, compiling
            w.run(ids, args.new_tokens)
        lt, vt, agree = [], [], None
        for i in range(args.pairs):
            order = (llama, vl) if i % 2 == 0 else (vl, llama)
            recs = {w.name: w.run(ids, args.new_tokens) for w in order}
            lr, vr = recs[llama.name], recs[vl.name]
            lt.extend(tpot([lr]))
            vt.extend(tpot([vr]))
            if agree is None:
                agree = common_prefix(lr.token_ids, vr.token_ids)
    finally:
        llama.close()
        vl.close()
    res = PairResult(pair, tuple(lt), tuple(vt), llama.hello["weight_bytes"], vl.hello["weight_bytes"],
                     agree or 0, vl.hello["kernels"])
    return res, {"llama": llama.hello, "variantlab": vl.hello}


def print_table(results: list[PairResult], new_tokens: int) -> None:
    print(f"{'pair':18} {'llama.cpp tok/s':>15} {'variantlab tok/s':>16} {'ratio vl/lc [min, max]':>23} "
          f"{'lc GB/s':>7} {'vl GB/s':>7} {'lc MB':>6} {'vl MB':>6} {'agree':>6}")
    for r in results:
        l_s, v_s = statistics.median(r.llama_tpot), statistics.median(r.vl_tpot)
        rs = r.ratios
        ratio = f"{statistics.median(rs):.2f} [{min(rs):.2f}, {max(rs):.2f}]"
        print(f"{r.pair.label:18} {1 / l_s:15.1f} {1 / v_s:16.1f} {ratio:>23} "
              f"{r.llama_bytes / l_s / 1e9:7.1f} {r.vl_bytes / v_s / 1e9:7.1f} "
              f"{r.llama_bytes / 1e6:6.0f} {r.vl_bytes / 1e6:6.0f} {r.agree:>3}/{new_tokens}")
    by = {r.pair.recipe: r for r in results}
    if "fp32" in by:
        f = by["fp32"]
        for name in ("int4", "w4a8"):
            q = next((r for r in results if r.pair.recipe == name and r.pair.gguf == "Q4_0"), None)
            if q is not None:
                lc = statistics.median(f.llama_tpot) / statistics.median(q.llama_tpot)
                ours = statistics.median(f.vl_tpot) / statistics.median(q.vl_tpot)
                print(f"low-bit speedup over fp32: llama.cpp Q4_0/F32 {lc:.2f}x, variantlab {name}/fp32 {ours:.2f}x "
                      f"(goal: ≥ llama.cpp's: {'met' if ours >= lc else 'NOT met'})")
    low = [r.pair.label for r in results if statistics.median(r.ratios) < 1.0]
    print(f"pairs at ≥ 1.0x (goal: all): {len(results) - len(low)} of {len(results)}"
          + (f"; below: {', '.join(low)}" if low else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None,
                    help="Hugging Face checkpoint folder (default: a random-weight 115M Llama, seeded)")
    ap.add_argument("--llama-cpp-src", default=None,
                    help="a llama.cpp checkout or unpacked llama-cpp-python sdist holding the converter "
                         "(default: $LLAMA_CPP_SRC, else what scripts/install_llamacpp.sh unpacked)")
    ap.add_argument("--pairs", type=int, default=6, help="interleaved pairs per precision")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="weights of the default model and the prompt")
    ap.add_argument("--shape", default="115m", choices=sorted(SHAPES),
                    help="the random-weight model's shape, without --model (default 115m)")
    ap.add_argument("--precisions", default=",".join(dict.fromkeys(p.gguf for p in PAIRS)),
                    help="a subset of F32,BF16,Q8_0,Q4_0,Q4_1")
    ap.add_argument("--recipes", default=",".join(p.recipe for p in PAIRS),
                    help="a subset of fp32,bf16,int8,w8a8,int4,w4a8 (each with its GGUF type)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the checkpoint and GGUF files here")
    ap.add_argument("--engine", default="default", choices=("default", "eager", "compile"),
                    help="variantlab's engine: default (what a variant gets without `compile`: our decode step "
                         "where it runs), eager (`compile: false`: transformers' modules), compile (`compile: "
                         "true`; the warm-up compiles)")
    ap.add_argument("--compile", action="store_const", const="compile", dest="engine", help="--engine compile")
    args = ap.parse_args()
    if importlib.util.find_spec("llama_cpp") is None:
        raise SystemExit(INSTALL_HINT)
    wanted, recipes = args.precisions.split(","), args.recipes.split(",")
    unknown = set(wanted) - {p.gguf for p in PAIRS}
    if unknown:
        raise SystemExit(f"--precisions: unknown {sorted(unknown)}; accepted: F32, BF16, Q8_0, Q4_0, Q4_1")
    if set(recipes) - {p.recipe for p in PAIRS}:
        raise SystemExit(f"--recipes: unknown {sorted(set(recipes) - {p.recipe for p in PAIRS})}; accepted: "
                         f"{', '.join(p.recipe for p in PAIRS)}")
    pairs = [p for p in PAIRS if p.gguf in wanted and p.recipe in recipes]
    if args.new_tokens < 2 or args.pairs < 1:
        raise SystemExit("--new-tokens must be at least 2 (TPOT needs two tokens) and --pairs at least 1")

    with tempfile.TemporaryDirectory(prefix="peer-bench-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        llama_cpp_dir = find_converter(args.llama_cpp_src)
        t0 = time.perf_counter()
        ckpt = work / f"checkpoint-{args.shape}-seed{args.seed}"
        model_dir = args.model or (ckpt if args.workdir and (ckpt / "config.json").is_file()
                                   else make_checkpoint(ckpt, args.seed, args.shape))
        stem = "model" if args.model else f"{args.shape}-seed{args.seed}"

        def made(path: Path, make) -> Path:         # a --workdir keeps the files a previous run made
            path = path if args.workdir and path.is_file() else make(path)
            as_read_from_disk(path)     # in the page cache as a GGUF read from disk is, whatever made it when
            return path

        f32 = made(work / f"{stem}-F32.gguf", lambda p: convert(llama_cpp_dir, model_dir, p, "F32"))
        files = {"F32": f32}
        if "BF16" in wanted:
            files["BF16"] = made(work / f"{stem}-BF16.gguf", lambda p: convert(llama_cpp_dir, model_dir, p, "BF16"))
        for q in ("Q8_0", "Q4_0", "Q4_1"):
            if q in wanted:
                files[q] = made(work / f"{stem}-{q}.gguf", lambda p, q=q: quantize(f32, p, q, args.threads))
        ids = prompt_ids(model_dir, args.prompt_tokens, args.seed)
        prep_s = time.perf_counter() - t0
        load_before = os.getloadavg()
        results, hello = [], {}
        for p in pairs:
            r, hello = measure(p, files[p.gguf], model_dir, ids, args)
            results.append(r)
            print(f"  measured {p.label}", file=sys.stderr, flush=True)
        load_after = os.getloadavg()

    lc, vl = hello["llama"], hello["variantlab"]
    print(f"model {model_dir if args.model else f'random-weight {args.shape} (seed {args.seed})'}: "
          f"{lc['parameters'] / 1e6:.0f}M parameters; {args.threads} threads each side, greedy, "
          f"prompt {len(ids)} tokens, {args.new_tokens} new tokens, {args.pairs} interleaved pairs per "
          f"precision (conversion and quantization took {prep_s:.0f} s)")
    print(f"llama-cpp-python {lc['version']} (built with {lc['features']}): {lc['system_info']}")
    print(f"variantlab ({args.engine} engine) on torch {vl['version']}; load average (1, 5, 15 min) before "
          f"{', '.join(f'{x:.2f}' for x in load_before)}, after {', '.join(f'{x:.2f}' for x in load_after)}")
    print("tok/s = 1 / median TPOT (decode only); GB/s = weight bytes read per token / TPOT; "
          "ratio = median of per-pair variantlab / llama.cpp; agree = leading greedy tokens in common")
    print_table(results, args.new_tokens)
    for r in results:
        print(f"  {r.pair.recipe}: {r.kernels}")


if __name__ == "__main__":
    main()
