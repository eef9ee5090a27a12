"""Single-stream decode, variantlab's engine against llama.cpp on the same weights (issue 9, "The peer benchmark").

One checkpoint goes to both sides. llama.cpp gets it through its own converter
(`convert_hf_to_gguf.py` from the llama-cpp-python source distribution) as GGUF F32 and BF16, and
through `llama_cpp.llama_model_quantize` (from the F32 file) as Q8_0 and Q4_0, each step in a
child process whose output is shown only when it fails. variantlab builds the same checkpoint with
`variants.build.build`. The pairs are:

    F32 <-> fp32    BF16 <-> bf16    Q8_0 <-> int8    Q4_0 <-> int4 (group_size 32, Q4_0's block)

Each side runs in a worker process of its own (spawned, so that the two OpenMP runtimes, heaps and
thread settings never meet), with 2 threads, greedy, on the same prompt token ids (BOS included),
generating exactly --new-tokens tokens. llama.cpp decodes through `Llama.generate` (temperature 0:
its greedy sampler; `generate` has no stop rule, so EOS cannot end a run early); variantlab through
`TorchEngine` + `run_requests` with `stop_on_eos=False`. For each precision both workers load and
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

    python benchmarks/decode_vs_llamacpp.py [--llama-cpp-src LLAMA_CPP_CHECKOUT]

Without --model it saves a random-weight Llama (hidden 768, 16 layers, 12 heads, intermediate
2048, the shipped tokenizer: 115M parameters, quant_decode.py's shape) in fp32 to a temporary
folder, seeded by --seed. Never part of the test suite.
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

LLAMA_CPP_VERSION = "0.3.36"
INSTALL_HINT = ("llama_cpp is not installed; build it for this CPU at its best with "
                f"`{gguf_convert.INSTALL}` (docs/runtimes.md), which also unpacks llama.cpp's converter")

# Same shape as benchmarks/quant_decode.py's CONFIG (115M parameters with the shipped 1k vocabulary).
CONFIG = dict(hidden_size=768, num_hidden_layers=16, num_attention_heads=12, num_key_value_heads=12,
              intermediate_size=2048, vocab_size=1024, max_position_embeddings=1024,
              bos_token_id=0, eos_token_id=1, pad_token_id=2)


@dataclass(frozen=True)
class Pair:
    """One precision on both sides: llama.cpp's GGUF type and the variantlab recipe that matches it."""

    gguf: str                       # F32 | BF16 (converter outtype) | Q8_0 | Q4_0 (llama_model_quantize)
    recipe: str
    options: tuple = ()             # recipe options as (key, value) pairs

    @property
    def label(self) -> str:
        opts = "".join(f" g{v}" for k, v in self.options if k == "group_size")
        return f"{self.gguf} <-> {self.recipe}{opts}"


PAIRS = (Pair("F32", "fp32"), Pair("BF16", "bf16"), Pair("Q8_0", "int8"),
         Pair("Q4_0", "int4", (("group_size", 32),)))


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

def _run_llama(conn, gguf_path: str, threads: int, n_ctx: int) -> None:
    """Worker: load the GGUF, then answer (prompt ids, n) with a RequestRecord until told None."""
    import llama_cpp
    from variantlab.measure.records import RequestRecord

    llm = llama_cpp.Llama(model_path=gguf_path, n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads,
                          n_threads_batch=threads, seed=0, verbose=False)
    conn.send({"weight_bytes": int(llama_cpp.llama_model_size(llm.model)),
               "parameters": int(llama_cpp.llama_model_n_params(llm.model)),
               "system_info": llama_cpp.llama_print_system_info().decode().strip(),
               "version": llama_cpp.__version__})
    clock = time.perf_counter
    while (job := conn.recv()) is not None:
        ids, n = job
        llm.reset()                                   # no KV prefix reuse: every run prefills the prompt
        times, toks = [], []
        send = clock()
        for tok in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
            times.append(clock())
            toks.append(int(tok))
            if len(toks) == n:
                break
        conn.send(RequestRecord("llama.cpp", send, times[-1], tuple(times), len(ids), "", None,
                                tuple(toks), "length"))


def _run_variantlab(conn, model_dir: str, recipe: str, options: dict, threads: int, compile_step: bool) -> None:
    """Worker: build the variant, then answer (prompt ids, n) with a RequestRecord until told None."""
    import torch
    torch.set_num_threads(threads)
    from variantlab.backends.base import GenerationRequest, run_requests
    from variantlab.backends.torch_engine import TorchEngine
    from variantlab.variants.build import VariantDefinition, build

    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    built = build(model_dir, VariantDefinition(recipe, recipe, options), "cpu")
    engine = TorchEngine(built.model, built.tokenizer, "cpu", "peer-bench", compile_step=compile_step)
    facts = built.facts
    conn.send({"weight_bytes": int(facts.extra.get("resident_bytes", facts.weight_bytes)),
               "parameters": int(facts.parameters),
               "kernels": ", ".join(facts.kernels + (("torch.compile of the decode step",) if compile_step else ())),
               "version": torch.__version__})
    with torch.inference_mode():                      # as the measuring worker runs the engine
        while (job := conn.recv()) is not None:
            ids, n = job
            req = GenerationRequest("variantlab", prompt_ids=tuple(ids), max_new_tokens=n, stop_on_eos=False)
            conn.send(run_requests(engine, [req])[0])


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

    def _recv(self):
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
        self.conn.send(None)
        self.proc.join(30)


# ---------------------------------------------------------------------------- setup

def make_checkpoint(out: Path, seed: int) -> Path:
    """A random-weight Llama (CONFIG) with the shipped tokenizer, saved in fp32."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from variantlab.models.loading import BUILTIN_MODELS

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).float().eval()
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

    n_ctx = len(ids) + args.new_tokens + 8
    llama = Worker(f"llama.cpp {pair.gguf}", _run_llama, str(gguf_path), args.threads, n_ctx)
    vl = Worker(f"variantlab {pair.recipe}", _run_variantlab, str(model_dir), pair.recipe,
                dict(pair.options), args.threads, args.compile)
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
    by = {r.pair.gguf: r for r in results}
    if "F32" in by and "Q4_0" in by:
        f, q = by["F32"], by["Q4_0"]
        print(f"low-bit speedup over fp32: llama.cpp Q4_0/F32 "
              f"{statistics.median(f.llama_tpot) / statistics.median(q.llama_tpot):.2f}x, "
              f"variantlab int4/fp32 {statistics.median(f.vl_tpot) / statistics.median(q.vl_tpot):.2f}x")


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
    ap.add_argument("--precisions", default=",".join(p.gguf for p in PAIRS),
                    help="a subset of F32,BF16,Q8_0,Q4_0")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the checkpoint and GGUF files here")
    ap.add_argument("--compile", action="store_true",
                    help="variantlab compiles its decode step (a variant's `compile: true`); the warm-up compiles")
    args = ap.parse_args()
    if importlib.util.find_spec("llama_cpp") is None:
        raise SystemExit(INSTALL_HINT)
    wanted = args.precisions.split(",")
    unknown = set(wanted) - {p.gguf for p in PAIRS}
    if unknown:
        raise SystemExit(f"--precisions: unknown {sorted(unknown)}; accepted: F32, BF16, Q8_0, Q4_0")
    pairs = [p for p in PAIRS if p.gguf in wanted]
    if args.new_tokens < 2 or args.pairs < 1:
        raise SystemExit("--new-tokens must be at least 2 (TPOT needs two tokens) and --pairs at least 1")

    with tempfile.TemporaryDirectory(prefix="peer-bench-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        llama_cpp_dir = find_converter(args.llama_cpp_src)
        t0 = time.perf_counter()
        model_dir = args.model or make_checkpoint(work / "checkpoint", args.seed)
        f32 = convert(llama_cpp_dir, model_dir, work / "model-F32.gguf", "F32")
        files = {"F32": f32}
        if "BF16" in wanted:
            files["BF16"] = convert(llama_cpp_dir, model_dir, work / "model-BF16.gguf", "BF16")
        for q in ("Q8_0", "Q4_0"):
            if q in wanted:
                files[q] = quantize(f32, work / f"model-{q}.gguf", q, args.threads)
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
    print(f"model {model_dir if args.model else 'random-weight Llama (seed %d)' % args.seed}: "
          f"{lc['parameters'] / 1e6:.0f}M parameters; {args.threads} threads each side, greedy, "
          f"prompt {len(ids)} tokens, {args.new_tokens} new tokens, {args.pairs} interleaved pairs per "
          f"precision (conversion and quantization took {prep_s:.0f} s)")
    print(f"llama-cpp-python {lc['version']}: {lc['system_info']}")
    print(f"variantlab on torch {vl['version']}; load average (1, 5, 15 min) before "
          f"{', '.join(f'{x:.2f}' for x in load_before)}, after {', '.join(f'{x:.2f}' for x in load_after)}")
    print("tok/s = 1 / median TPOT (decode only); GB/s = weight bytes read per token / TPOT; "
          "ratio = median of per-pair variantlab / llama.cpp; agree = leading greedy tokens in common")
    print_table(results, args.new_tokens)
    for r in results:
        print(f"  {r.pair.recipe}: {r.kernels}")


if __name__ == "__main__":
    main()
