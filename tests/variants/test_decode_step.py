"""variantlab's decode step (variants/decode_step.py, kernels/decode_step.cpp) against transformers' own forward:
the same tokens, token for token, on every recipe it runs, one request and a left-padded batch."""
from __future__ import annotations

import types

import pytest
import torch

from variantlab.backends.base import GenerationRequest, run_requests
from variantlab.backends.torch_engine import TorchEngine
from variantlab.variants import kernels as vk
from variantlab.variants.build import VariantDefinition, build
from variantlab.variants.decode_step import LABEL, DecodeStep, unsupported

RECIPES = [("fp32", {}), ("bf16", {}), ("int8", {}), ("int4", {"group_size": 32}), ("w8a8", {}),
           ("w4a8", {"group_size": 32}), ("int4", {"group_size": 32, "symmetric": True}),
           ("w4a8", {"group_size": 32, "symmetric": True})]


@pytest.fixture(scope="module")
def qwen2_dir(tiny_model_dir, tmp_path_factory):
    """A tiny Qwen2: grouped K/V heads (4 query, 2 K/V), q/k/v biases, tied embeddings, peaked logits."""
    from tests.conftest import tiny_qwen2
    return tiny_qwen2(tiny_model_dir, tmp_path_factory.mktemp("qwen2_step"), 128, 0.5)


def requests(n: int, new: int = 12) -> list[GenerationRequest]:
    return [GenerationRequest(f"r{i}", prompt_ids=tuple(range(5 + i, 12 + 3 * i)), max_new_tokens=new,
                              stop_on_eos=False) for i in range(n)]


def tokens(engine, reqs) -> list[tuple[int, ...]]:
    with torch.inference_mode():
        return [r.token_ids for r in run_requests(engine, reqs)]


def engines(model_dir, recipe="fp32", options=None):
    built = build(model_dir, VariantDefinition(recipe, recipe, options or {}), "cpu")
    ours = TorchEngine(built.model, built.tokenizer, "cpu", "test")
    theirs = TorchEngine(built.model, built.tokenizer, "cpu", "test", decode_step=False)
    return ours, theirs


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_fp32_step_gives_transformers_tokens(our_kernels, tiny_model_dir, qwen2_dir, family):
    ours, theirs = engines(tiny_model_dir if family == "llama" else qwen2_dir)
    assert isinstance(ours.step, DecodeStep) and theirs.step is None
    for n in (1, 3):    # one request (no mask), and a left-padded batch (mask, per-row positions)
        assert tokens(ours, requests(n, 24)) == tokens(theirs, requests(n, 24))


@pytest.mark.parametrize("recipe,options", RECIPES)
def test_every_recipe_runs_in_the_step_with_transformers_tokens(our_kernels, qwen2_dir, recipe, options):
    ours, theirs = engines(qwen2_dir, recipe, options)
    assert ours.step is not None, ours.step_note
    assert ours.step.plan is not None         # the whole token in one call: embedding, layers, norm, head, argmax
    for n in (1, 2):
        assert tokens(ours, requests(n)) == tokens(theirs, requests(n))


@pytest.mark.parametrize("recipe,options", [("fp32", {}), ("bf16", {}), ("int8", {}), ("w8a8", {}),
                                            ("int4", {"group_size": 32, "symmetric": True}), ("w4a8", {"group_size": 32})])
def test_the_team_computes_what_one_thread_computes(our_kernels, qwen2_dir, recipe, options):
    """With 2 or more threads every layer of a token runs in one OpenMP region, each thread its share of each
    step (kernels/decode_step.cpp); 3 threads split every step unevenly. The logits of each step are the same,
    bit for bit, as one thread's (which runs the layers one kernel call at a time)."""
    ours, _ = engines(qwen2_dir, recipe, options)
    got = logits_by_threads(ours)
    assert got[1].shape[0] == 4
    assert torch.isfinite(got[1]).all()
    assert torch.equal(got[1], got[2]) and torch.equal(got[1], got[3])


def logits_by_threads(ours) -> dict[int, torch.Tensor]:
    """The logits of 4 decode steps after a 4-token prompt, with 1, 2 and 3 threads."""
    ids = torch.tensor([[5, 9, 11, 3]])
    before = torch.get_num_threads()
    logits: list[torch.Tensor] = []
    plan = ours.step.plan           # the whole token in one call: its logits kept by the plan, not the head module
    hook = ours.model.lm_head.register_forward_hook(lambda mod, args, out: logits.append(out.detach().clone()))
    got = {}
    try:
        if plan is not None:
            plan.keep(True)
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            with torch.inference_mode():
                cache = ours.caches.acquire(1, 16)
                ours.model(input_ids=ids, past_key_values=cache, use_cache=True)
                logits.clear()
                nxt = ids[:, -1:]
                for _ in range(4):
                    nxt = ours.step(nxt, cache, None, None)
                    if plan is not None:
                        logits.append(plan.logits().clone())
            got[threads] = torch.stack(logits)
    finally:
        hook.remove()
        if plan is not None:
            plan.keep(False)
        torch.set_num_threads(before)
    return got


def test_a_layer_whose_linears_each_run_another_kernel(our_kernels, qwen2_dir):
    """One layer of every kernel kind that quantizes its input (as `mixed` mixes int4, int8 and bf16 linears): w4a8
    of group sizes 32 and 64, w8a8, symmetric w4a8, int4 and int8 weight-only (bf16 activations as two int8
    digits). The step decodes transformers' tokens, and the team gives one thread's logits."""
    from variantlab.variants.quant_linear import W4A8, Int4WeightOnly, Int8WeightOnly, W8A8
    made = {"q_proj": lambda l: W4A8(l, torch.bfloat16, group_size=32),
            "k_proj": lambda l: W4A8(l, torch.bfloat16, group_size=64),
            "v_proj": lambda l: W8A8(l, torch.bfloat16),
            "o_proj": lambda l: W4A8(l, torch.bfloat16, group_size=32, symmetric=True),
            "gate_proj": lambda l: Int4WeightOnly(l, torch.bfloat16, group_size=32),
            "up_proj": lambda l: Int8WeightOnly(l, torch.bfloat16),
            "down_proj": lambda l: W4A8(l, torch.bfloat16, group_size=64)}
    built = build(qwen2_dir, VariantDefinition("bf16", "bf16"), "cpu")
    for layer in built.model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, make in made.items():
                if hasattr(parent, name):
                    setattr(parent, name, make(getattr(parent, name)))
    ours = TorchEngine(built.model, built.tokenizer, "cpu", "test")
    theirs = TorchEngine(built.model, built.tokenizer, "cpu", "test", decode_step=False)
    assert ours.step is not None, ours.step_note
    from variantlab.variants.decode_step import INT4_DIGITS, INT8, W4A8 as W4A8_KIND, W8A8 as W8A8_KIND
    layer0 = [tuple(ours.step.ints[4 * i:4 * i + 4]) for i in range(7)]    # (kind, group size, n, rows) of q … down
    assert [k[:2] for k in layer0] == [(W4A8_KIND, 32), (W4A8_KIND, 64), (W8A8_KIND, 0), (W4A8_KIND, 32),
                                       (INT4_DIGITS, 32), (INT8, 0), (W4A8_KIND, 64)]
    hidden = built.model.config.hidden_size    # up_proj's K: int8 runs ours up to the CPU's row limit, then aten's
    assert [k[3] for k in layer0] == [8, 8, 8, 8, 8, min(vk.rows_up_to("int8_digits_mm", hidden), 8), 8]
    for n in (1, 2):
        assert tokens(ours, requests(n)) == tokens(theirs, requests(n))
    got = logits_by_threads(ours)
    assert torch.equal(got[1], got[2]) and torch.equal(got[1], got[3])


@pytest.mark.parametrize("k", [768, 1024, 1025, 2048, 4096])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_avx512_the_rows_from_python_are_the_rule_the_step_kept_in_cpp(monkeypatch, k, dtype):
    """Before the per-ISA table the C++ step chose ours per linear itself, for AVX-512 (before commit 0280e43:
    dense: fp32, or M ≤ 4, or K ≤ 1024; int8: M = 1 or K ≤ 1024). Under the AVX-512 table the rows Python
    hands it give the same choice at every M the step runs, on any host (pure: nothing runs a kernel)."""
    from torch import nn

    from variantlab.variants.decode_step import MAX_ROWS, linear_kind
    from variantlab.variants.quant_linear import Int8WeightOnly
    monkeypatch.setattr(vk, "OURS_UP_TO", vk.UP_TO["AVX-512"])
    fp32 = dtype == torch.float32
    dense = nn.Linear(k, 16, bias=False).to(dtype)
    int8 = Int8WeightOnly(nn.Linear(k, 16, bias=False).to(dtype), dtype)
    for module, old_rule in ((dense, lambda m: fp32 or m <= 4 or k <= 1024), (int8, lambda m: m == 1 or k <= 1024)):
        kind = linear_kind(module, dtype)
        assert not isinstance(kind, str), kind
        rows = kind[0][3]
        assert [m <= rows for m in range(1, MAX_ROWS + 1)] == [old_rule(m) for m in range(1, MAX_ROWS + 1)]


def test_the_step_advances_the_cache_and_hands_wide_batches_to_transformers(our_kernels, tiny_model_dir):
    ours, theirs = engines(tiny_model_dir)
    calls = []
    ours.step.fallback = lambda *a: calls.append(1) or theirs._forward(*a)
    assert tokens(ours, requests(9, 6)) == tokens(theirs, requests(9, 6))    # 9 rows: above the step's 8
    assert len(calls) == 5
    calls.clear()
    tokens(ours, requests(1, 6))
    assert not calls
    cache = ours.caches._pool[(1, 128)]
    prompt = len(requests(1)[0].prompt_ids)
    assert all(int(layer.cumulative_length) == prompt + 5 for layer in cache.layers)   # prefill + 5 steps


def test_without_a_plan_the_step_calls_the_modules_around_its_layers_with_the_same_tokens(our_kernels, qwen2_dir):
    """An embedding the plan does not read (int8 rows), or RoPE that changes with the length: no plan, and each step
    runs the model's embedding, rotary, norm and head modules around decode_layers; the tokens are the same."""
    ours, theirs = engines(qwen2_dir, "int8", {"quantize_embeddings": True})
    assert ours.step is not None and ours.step.plan is None
    for n in (1, 2):
        assert tokens(ours, requests(n)) == tokens(theirs, requests(n))
    planned, _ = engines(qwen2_dir)
    assert planned.step._plan() is not None
    planned.step.model.model.rotary_emb.rope_type = "dynamic"
    assert planned.step._plan() is None


def test_the_plan_chooses_as_argmax_does_a_nan_counting_as_the_largest(our_kernels, qwen2_dir):
    """decode_next's greedy choice is at::argmax's: the first largest logit, a NaN above every number. After the
    prompt, the head's row 7 made NaN: the plan's next token is 7, as transformers' forward chooses."""
    ours, theirs = engines(qwen2_dir)
    assert ours.step.plan is not None
    got = {}
    with torch.inference_mode():
        for name, step in (("plan", ours.step), ("transformers", theirs._forward)):
            cache = ours.caches.acquire(1, 16)
            ours.model(input_ids=torch.tensor([[5, 9, 11]]), past_key_values=cache, use_cache=True)
            head = ours.model.lm_head.weight
            row = head[7].clone()
            head[7] = float("nan")                        # tied: the embedding's row 7 too, for both
            try:
                got[name] = int(step(torch.tensor([[11]]), cache, None, None))
            finally:
                head[7] = row
    assert got == {"plan": 7, "transformers": 7}


def test_the_plan_binds_each_cache_with_the_rotary_module_s_own_cos_and_sin(our_kernels, qwen2_dir):
    """Bound to a cache, the plan holds the rotary module's cos and sin of every position of it: each row equal,
    bit for bit, to what the module gives that position alone (a step's call). A shorter cache after a longer one
    is handed the first rows of the longer one's table, not a table made anew."""
    ours, _ = engines(qwen2_dir, "bf16")
    step, inner = ours.step, ours.model.model
    with torch.inference_mode():
        h = inner.embed_tokens(torch.tensor([5]))
        for positions in (200, 40):                       # buckets of 256, then 128 positions
            cache = ours.caches.acquire(1, positions)
            ours.model(input_ids=torch.tensor([[5, 9, 11]]), past_key_values=cache, use_cache=True)
            seen = {}
            step.plan = types.SimpleNamespace(bind=lambda keys, values, counters, cos, sin: seen.update(
                cos=cos, sin=sin, keys=keys))            # what the C++ plan would be handed
            step._bind(cache)
            length = cache.layers[0].keys.shape[2]
            for position in (0, 1, 17, length - 1):
                cos, sin = inner.rotary_emb(h, torch.tensor([[position]]))
                assert torch.equal(seen["cos"][position], cos[0, 0]) and torch.equal(seen["sin"][position], sin[0, 0])
            assert seen["cos"].dtype == torch.bfloat16 and seen["cos"].shape[0] == length
            assert seen["cos"].is_contiguous() and seen["sin"].is_contiguous()
            assert [k.data_ptr() for k in seen["keys"]] == [layer.keys.data_ptr() for layer in cache.layers]
    assert seen["cos"].data_ptr() == step._rotary[0].data_ptr() and step._rotary[0].shape[0] == 256


def test_requests_alternating_between_two_caches_get_transformers_tokens(our_kernels, qwen2_dir):
    """The engine keeps a cache per length bucket and the plan is bound again at each change: a short and a long
    request in turn, each rebinding, decode what transformers' forward decodes."""
    ours, theirs = engines(qwen2_dir)
    short, long = requests(1, 12)[0], GenerationRequest("long", prompt_ids=(5, 9, 11), max_new_tokens=140,
                                                          stop_on_eos=False)
    for reqs in ([long], [short], [long], [short]):
        assert tokens(ours, reqs) == tokens(theirs, reqs)
    assert set(ours.caches._pool) == {(1, 128), (1, 256)}


def test_a_model_it_does_not_run_keeps_transformers_and_says_why(our_kernels, family_dirs, tiny_lm):
    from variantlab.measure.backend_kinds.torch_kind import engine_facts

    built = build(family_dirs["gpt2"], VariantDefinition("fp32"), "cpu")
    engine = TorchEngine(built.model, built.tokenizer, "cpu", "test")
    assert engine.step is None
    assert "GPT2LMHeadModel is not one of its families" in engine.step_note
    facts = engine_facts(engine, built.facts)
    assert engine.step_note in facts.notes and LABEL not in facts.kernels
    ours = TorchEngine(tiny_lm[0], tiny_lm[1], "cpu", "test")
    assert LABEL in engine_facts(ours, built.facts).kernels


def test_without_our_kernels_the_step_says_so(aten_only, tiny_lm):
    assert "kernels are off" in unsupported(tiny_lm[0])


def test_compile_false_given_is_transformers_modules_and_absent_is_the_step(tmp_path):
    import yaml

    from variantlab.measure.plan import plan_suite_file
    suite = {"name": "t", "model": "builtin:tiny-structured",
             "variants": [{"name": "default", "recipe": "fp32"}, {"name": "eager", "recipe": "fp32", "compile": False},
                          {"name": "compiled", "recipe": "fp32", "compile": True}],
             "workload": {"dataset": {"generator": "structured", "n": 4, "seed": 0}, "max_new_tokens": 4,
                          "scenarios": [{"type": "single-stream", "requests": 2, "warmup": 0}]}}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    plan = plan_suite_file(tmp_path / "suite.yaml")
    default, eager, compiled = (plan.variant(n).definition for n in ("default", "eager", "compiled"))
    assert default.decode_step and not default.compile
    assert not eager.decode_step and not eager.compile
    assert compiled.compile


def test_planning_knows_which_checkpoints_the_step_runs(our_kernels, tiny_model_dir, qwen2_dir, family_dirs):
    import json

    from variantlab.variants.decode_step import runs_config
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert runs_config(config) and runs_config(json.loads((qwen2_dir / "config.json").read_text()))
    assert not runs_config(json.loads((family_dirs["gpt2"] / "config.json").read_text()))
    assert not runs_config(config | {"architectures": ["MistralForCausalLM"], "sliding_window": 16})
    assert not runs_config(config | {"hidden_act": "gelu"})


# ------------------------------------------------------------------ the native loop (DecodeStep.run, collect)

@pytest.fixture(scope="module")
def structured():
    """The shipped tiny model, fp32: it answers the dataset's questions, so "\\n" and EOS really end requests."""
    from pathlib import Path

    from variantlab.models.loading import load_causal_lm, resolve_model_path
    return load_causal_lm(Path(resolve_model_path("builtin:tiny-structured")), torch.float32, "cpu")


def counted(engine) -> list:
    """The engine's DecodeStep.run, counting its calls (it still runs)."""
    calls, run = [], engine.step.run
    engine.step.run = lambda *a: calls.append(1) or run(*a)
    return calls


def test_the_native_loop_gives_the_python_loop_s_tokens_finish_and_text_on_time_perf_counter_s_clock(
        our_kernels, structured):
    """collect decodes a request's tokens after the first in C++ calls that return only at a token of the stop rules'
    wake set: the same tokens, finish reason and text as its Python loop, for a stop at "\\n" (an id set, as EOS
    is), at a stop string of three characters (the text followed) and at the length limit; each token's time on
    time.perf_counter's clock (between readings taken before and after), in order. An injected clock keeps the
    Python loop."""
    import time

    from variantlab.data.structured import generate_samples
    model, tok = structured
    engine = TorchEngine(model, tok, "cpu", "test")
    assert engine.step is not None and engine.step.plan is not None, engine.step_note
    calls = counted(engine)
    prompts = [s["prompt"] for s in generate_samples(4, 0)]
    cases = [dict(stop=("\n",), max_new_tokens=40), dict(max_new_tokens=40), dict(max_new_tokens=6),
             dict(stop=("\n",), max_new_tokens=1), dict(stop=("\nQ:",), max_new_tokens=60)]
    finishes = set()
    with torch.inference_mode():
        for i, (p, kw) in enumerate((p, kw) for kw in cases for p in prompts):
            req = GenerationRequest(f"r{i}", prompt=p, **kw)
            engine.native_loop, before = True, len(calls)
            t0 = time.perf_counter()
            (native,) = run_requests(engine, [req])
            t1 = time.perf_counter()
            used = len(calls) - before
            engine.native_loop = False
            (python,) = run_requests(engine, [req])
            assert native.token_ids == python.token_ids and native.finish_reason == python.finish_reason
            assert native.output_text == python.output_text and native.ok
            assert t0 <= native.send_time <= native.first_token_time <= native.end_time <= t1
            assert list(native.token_times) == sorted(native.token_times)
            assert (used > 0) == (native.tokens_out > 1)   # (a request ended by its first token needs no loop)
            finishes.add((kw.get("stop"), native.finish_reason))
    assert {(("\n",), "stop"), (("\nQ:",), "stop"), (None, "length")} <= finishes   # each rule ended some

    clocked = TorchEngine(model, tok, "cpu", "test", clock=time.thread_time)
    calls = counted(clocked)
    with torch.inference_mode():
        run_requests(clocked, [GenerationRequest("c", prompt=prompts[0], max_new_tokens=8, stop_on_eos=False)])
    assert not calls


def test_decode_run_ends_with_the_first_stop_id_and_keeps_it(our_kernels, qwen2_dir):
    """DecodeStep.run straight: with no stop rule it decodes `steps` tokens, what the step's calls decode one by one;
    with a stop mask it ends with the first token the mask holds. A batch it leaves to the step's calls (None)."""
    ours, _ = engines(qwen2_dir)
    step = ours.step

    def fresh():
        cache = ours.caches.acquire(1, 64)
        ours.model(input_ids=torch.tensor([[5, 9, 11]]), past_key_values=cache, use_cache=True)
        return cache

    with torch.inference_mode():
        cache, nxt, one_by_one = fresh(), torch.tensor([[11]]), []
        for _ in range(12):
            nxt = step(nxt, cache, None, None)
            one_by_one.append(int(nxt))
        tokens, times = step.run(torch.tensor([[11]]), fresh(), 12, None)
        assert tokens == one_by_one and len(times) == 12
        end = tokens[6]
        stop = torch.zeros(ours.model.lm_head.out_features, dtype=torch.bool)
        stop[end] = True
        cut, _ = step.run(torch.tensor([[11]]), fresh(), 12, stop)
        assert cut == tokens[:tokens.index(end) + 1]
        batch = ours.caches.acquire(2, 64)
        assert step.run(torch.tensor([[11], [12]]), batch, 4, None) is None


def test_the_engine_refuses_native_tokens_its_stop_rules_would_have_ended_elsewhere(tiny_lm):
    """After a native call the request's stop rules take its tokens in order (off the clock): a token they end the
    request at before the last, or a call that ended short of its steps at a token outside their wake set, is an
    error, not a record. A call that ends at a wake token the rules go on after gives None: the loop goes on."""
    from variantlab.backends.stopping import RequestStop
    model, tok = tiny_lm
    engine = TorchEngine(model, tok, "cpu", "test", decode_step=False)
    newline = min(engine.vocabulary.ids_containing("\n"))
    other = next(i for i in range(10, 100) if i not in engine.vocabulary.ids_containing("\n")
                 and i not in engine.eos_ids)

    def rule(limit=10) -> RequestStop:
        return engine.stop_rules(GenerationRequest("r", prompt="x", max_new_tokens=limit, stop=("\n",)))

    assert rule().remaining == 10 and newline in rule().wake and other not in rule().wake
    assert TorchEngine._replay(rule(), [other, other, newline], 9) == "stop"
    assert TorchEngine._replay(rule(3), [other, other, other], 3) == "length"
    with pytest.raises(RuntimeError, match="disagree"):
        TorchEngine._replay(rule(), [other, newline, other], 9)
    with pytest.raises(RuntimeError, match="disagree"):
        TorchEngine._replay(rule(), [other, other], 9)
    long = engine.stop_rules(GenerationRequest("s", prompt="x", max_new_tokens=9, stop=("\nQ:",)))
    long.finish(other)                               # the text's first token settles it
    colon = next(i for i in sorted(long.wake) if ":" in engine.vocabulary.pieces[i])
    assert TorchEngine._replay(long, [other, colon], 8) is None and long.remaining == 6
