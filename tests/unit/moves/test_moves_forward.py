"""Every move and the best-known candidates against the reference forward, on CPU.

Each rendered candidate prefills a batch of prompts of different lengths (one continuing a
cached prefix) and decodes two steps; its logits must match the reference's in fp32. Triton
options run their kernels in the interpreter (tests/unit/conftest.py sets TRITON_INTERPRET=1).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import sys
from pathlib import Path

import pytest
import torch

from athanor.model import BuildContext, DecodeBatch, ModelSpec, make_prefill_batch
from athanor.model.presets import PRESETS
from athanor.model.random_init import random_model
from athanor.model.reference import build as build_reference
from athanor.moves import MOVES, best_options, render

_serial = itertools.count()


def load_candidate(source: str, tmp_path: Path):
    """Import a candidate source from a file (as the engine does, so @triton.jit can read it)."""
    path = tmp_path / f"candidate_{next(_serial)}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


PAGE_SIZE = 4
"""Pages of 4 tokens, dealt to the slots in a shuffled order: every prompt spans several pages, none of a
sequence's pages are consecutive, and a continued prefill and each decode step cross page boundaries."""


def shuffled_table(max_seqs: int, max_seq_len: int) -> tuple[int, torch.Tensor]:
    per_seq = -(-max_seq_len // PAGE_SIZE)
    num_pages = max_seqs * per_seq
    table = torch.full((max_seqs + 1, per_seq), num_pages, dtype=torch.int32)
    table[:-1] = torch.randperm(num_pages, generator=torch.Generator().manual_seed(7)).view(max_seqs, per_seq)
    return num_pages, table


def run(build, model, gen, dtype: torch.dtype = torch.float32):
    """Logits of prefill (3 prompts, one continued) and two decode steps."""
    num_pages, table = shuffled_table(4, 64)
    ctx = BuildContext(torch.device("cpu"), dtype, max_seqs=4, max_seq_len=64, page_size=PAGE_SIZE,
                       num_pages=num_pages, block_table=table)
    fwd = build(model, ctx)
    lens = [5, 11, 2]
    prompts = [torch.randint(0, model.spec.vocab_size, (n,), generator=gen).tolist() for n in lens]
    outs = [fwd.prefill(make_prefill_batch(prompts, [0, 2, 3]))]
    # continue slot 2 by 4 more tokens (a chunked prefill)
    more = torch.randint(0, model.spec.vocab_size, (4,), generator=gen).tolist()
    outs.append(fwd.prefill(make_prefill_batch([more], [2], seq_lens=[11])))
    positions = torch.tensor([5, 15, 2])
    for _ in range(2):
        tokens = torch.randint(0, model.spec.vocab_size, (3,), generator=gen)
        batch = DecodeBatch(tokens, positions.clone(), torch.tensor([0, 2, 3]), positions.clone())
        if hasattr(fwd, "decode_greedy"):  # the engine's call for all-greedy rows: the tokens must be the argmax
            greedy_tokens, logits = fwd.decode_greedy(batch)
            assert torch.equal(greedy_tokens, logits.argmax(-1))
            outs.append(logits)
        else:
            outs.append(fwd.decode(batch))
        positions += 1
    return outs


LAYERS = 2
"""Layers of the models the candidates run on: two, so that what one layer leaves behind (split-K and epilogue
tickets, the residual the fused norm carries, the cache's layer index) is read by the next; the presets' third
and fourth layers would add nothing the second does not, at a third to a half of each test's time under the
Triton interpreter."""


def check(source: str, preset: str | ModelSpec, tmp_path: Path, gen: torch.Generator) -> None:
    spec = PRESETS[preset] if isinstance(preset, str) else preset
    model = random_model(spec.with_layers(LAYERS), seed=int(torch.randint(0, 1000, (1,), generator=gen)))
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    candidate = load_candidate(source, tmp_path)
    with torch.no_grad():
        got = run(candidate.build, model, torch.Generator().manual_seed(seed))
        expected = run(build_reference, model, torch.Generator().manual_seed(seed))
    for step, (a, b) in enumerate(zip(got, expected)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m, s=step: f"step {s}: {m}")


SINGLE_MOVES = [(m.name, v) for m in MOVES for v in m.values
                if v != m.baseline and m.name != "compile" and not m.lossy]


@pytest.mark.parametrize(("name", "value"), SINGLE_MOVES, ids=[f"{n}={v}" for n, v in SINGLE_MOVES])
def test_one_move_matches_reference(name, value, tmp_path, gen):
    preset = "tiny-moe" if name in ("moe", "routing", "fused_gate_up") else "tiny-qwen"
    check(render("fast", {name: value}), preset, tmp_path, gen)


@pytest.mark.parametrize(("device", "preset"), [
    ("cuda", "tiny-dense"), ("cuda", "tiny-moe"),
    pytest.param("cuda", "tiny-qwen", marks=pytest.mark.slow),  # a third model through the same kernels
    ("cpu", "tiny-dense"), ("cpu", "tiny-qwen"), ("cpu", "tiny-moe"),
])
def test_best_known_matches_reference(preset, device, tmp_path, gen):
    check(render("fast", best_options(PRESETS[preset], device)), preset, tmp_path, gen)


def test_everything_triton_with_token_major_kv_and_split_k(tmp_path, gen):
    options = {**best_options(PRESETS["tiny-moe"]), "kv_layout": "token_major", "gemv": "triton_splitk",
               "fused_gate_up": True}
    check(render("fast", options), "tiny-moe", tmp_path, gen)


def test_compiled_baseline_matches_reference(tmp_path, gen):
    pytest.importorskip("torch._inductor")
    check(render("fast", {"compile": "default", "fused_qkv": True}), "tiny-dense", tmp_path, gen)


def test_fused_gemv_layer_with_separate_weights(tmp_path, gen):
    """Separate q/k/v and gate/up weights through the fused layer (the fused weights: the test below)."""
    options = {**best_options(PRESETS["tiny-dense"]), "gemv": "triton_fused", "fused_qkv": False,
               "fused_gate_up": False}
    source = render("fast", options)
    assert "FUSED_ROWS = 1\n" in source
    check(source.replace("FUSED_ROWS = 1\n", "FUSED_ROWS = 3\n"), "tiny-dense", tmp_path, gen)  # check's 3 rows


@pytest.mark.parametrize(("preset", "options"), [("tiny-dense", {}),
                                               ("tiny-qwen", {"fused_qkv": True, "fused_gate_up": True})])
def test_bf16_linear_weights_are_close_to_the_reference_but_lossy(preset, options, tmp_path, gen):
    model = random_model(PRESETS[preset], seed=int(torch.randint(0, 1000, (1,), generator=gen)))
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    candidate = load_candidate(render("fast", {**options, "linear_dtype": "bfloat16"}), tmp_path)
    with torch.no_grad():
        got = run(candidate.build, model, torch.Generator().manual_seed(seed))
        expected = run(build_reference, model, torch.Generator().manual_seed(seed))
    for a, b in zip(got, expected):
        assert a.dtype == torch.float32  # cast back to the model's dtype
        # bf16 keeps 8 mantissa bits: ~1% relative error, far beyond fp32's tolerance, and a tiny KL.
        assert float((a - b).norm() / b.norm()) < 0.05
        assert float((a - b).abs().max()) > 1e-3
        p, q = torch.log_softmax(b.double(), -1), torch.log_softmax(a.double(), -1)
        assert float((p.exp() * (p - q)).sum(-1).mean()) < 1e-3


def test_bf16_linear_weights_leave_routing_in_the_model_dtype(tmp_path, gen):
    # A routing flip moves a MoE model's logits by far more than rounding, so no closeness bound here:
    # which weights are converted, and that the step runs.
    model = random_model(PRESETS["tiny-moe"], seed=int(torch.randint(0, 1000, (1,), generator=gen)))
    candidate = load_candidate(render("fast", {"linear_dtype": "bfloat16"}), tmp_path)
    fwd = candidate.build(model, BuildContext(torch.device("cpu"), torch.float32, max_seqs=4, max_seq_len=64))
    layer = fwd.layers[0]
    assert {w.dtype for w in (fwd.lm_head, layer.wq, layer.wo, layer.w_gate, layer.w_down)} == {torch.bfloat16}
    assert {w.dtype for w in (layer.router, layer.experts_down, *layer.experts_gate_up)} == {torch.float32}
    with torch.no_grad():
        logits = run(candidate.build, model, gen)
    assert all(x.dtype == torch.float32 and bool(torch.isfinite(x).all()) for x in logits)


def test_bf16_linear_weights_change_nothing_for_a_bf16_model(tmp_path, gen):
    model = random_model(PRESETS["tiny-qwen"], seed=int(torch.randint(0, 1000, (1,), generator=gen)),
                         dtype=torch.bfloat16)
    lossy = load_candidate(render("fast", {"linear_dtype": "bfloat16"}), tmp_path)
    baseline = load_candidate(render("fast", {}), tmp_path)
    ctx = BuildContext(torch.device("cpu"), torch.bfloat16, max_seqs=4, max_seq_len=64)
    fwd = lossy.build(model, ctx)
    assert fwd.lm_head is model.get("lm_head") and fwd.layers[0].wq is model.layer(0, "wq")  # no copies
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    with torch.no_grad():
        got = run(lossy.build, model, torch.Generator().manual_seed(seed), torch.bfloat16)
        expected = run(baseline.build, model, torch.Generator().manual_seed(seed), torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


_MOE = PRESETS["tiny-moe"].moe
assert _MOE is not None
ROUTED_ONLY = dataclasses.replace(PRESETS["tiny-moe"], name="tiny-moe-routed",
                                  moe=dataclasses.replace(_MOE, shared_intermediate_size=0, shared_gate=False))
"""tiny-moe without its shared expert, as Qwen3-MoE and Mixtral: the fused layer's own MoE path."""


@pytest.mark.parametrize(("preset", "routing"), [
    pytest.param("tiny-moe", None, id="tiny-moe"),
    pytest.param(ROUTED_ONLY, "triton_moe_block", id="routed-only-moe-block"),
    pytest.param("tiny-qwen", "triton_router_epilogue", id="tiny-qwen-epilogues"),
    # The slow tier's: the other routing options on the routed-only path (each kernel is checked against its
    # composition in tests/unit/kernels), and the best-known options alone ("routed-only", "tiny-qwen"), which
    # already put RoPE in the QKV epilogue as the cases above do.
    *(pytest.param(preset, routing, id=name, marks=pytest.mark.slow) for preset, routing, name in (
        (ROUTED_ONLY, None, "routed-only"),
        (ROUTED_ONLY, "triton_router_epilogue", "routed-only-epilogues"),
        (ROUTED_ONLY, "triton_expert_prologue", "routed-only-expert-prologue"),
        (ROUTED_ONLY, "triton_o_epilogue", "routed-only-o-epilogue"),
        ("tiny-qwen", None, "tiny-qwen"))),
])
def test_fused_layer_at_few_rows_moe_and_qk_norm(preset, routing, tmp_path, gen):
    """The fused decode of a MoE model (with a shared expert: the general MoE path; routed experts only:
    expert ids read on the device, no grouping, `expert_gemv`) and of a Qwen-style one (q/k norms inside the
    RoPE kernel, QKV bias in the GEMV); with a `routing` option, RoPE and the cache write inside the QKV GEMV
    too, and the top-k inside the router GEMV (`triton_router_epilogue`) or in every expert program
    (`triton_expert_prologue`), or the router's logits summed by the O projection (`triton_o_epilogue`), or that and
    the experts in one persistent launch (`triton_moe_block`)."""
    spec = PRESETS[preset] if isinstance(preset, str) else preset
    options = {**best_options(spec), "gemv": "triton_fused", "fused_qkv": True}
    if routing is not None:
        options |= {"rope": "triton_qkv_epilogue", "routing": routing}
    source = render("fast", options)
    check(source.replace("FUSED_ROWS = 1\n", "FUSED_ROWS = 3\n"), preset, tmp_path, gen)


@pytest.mark.parametrize("preset, lm_head", [
    pytest.param("tiny-dense", "triton_fused", id="tiny-dense"),
    # The slow tier's: the greedy LM head is also on the fused layer's path in the one-row test below.
    pytest.param(ROUTED_ONLY, "triton_greedy", id="routed-only-greedy", marks=pytest.mark.slow),
])
def test_fused_layer_with_the_final_norm_in_the_lm_head_and_the_embedding_gather(preset, lm_head, tmp_path, gen):
    """`lm_head=triton_fused` (the final RMSNorm inside the LM head's GEMV), or `triton_greedy` (and the greedy
    tokens in its epilogue: `run` decodes through `decode_greedy`), and `embedding=triton` on the fused layer's
    path, where they act (elsewhere the LM head stays a norm then `_linear`)."""
    spec = PRESETS[preset] if isinstance(preset, str) else preset
    options = {**best_options(spec), "gemv": "triton_fused", "fused_qkv": True, "lm_head": lm_head,
               "embedding": "triton"}
    check(render("fast", options).replace("FUSED_ROWS = 1\n", "FUSED_ROWS = 3\n"), preset, tmp_path, gen)


@pytest.mark.parametrize("preset", ["tiny-dense", ROUTED_ONLY], ids=["tiny-dense", "routed-only"])
def test_one_row_decode_with_the_gather_in_the_first_qkv_kernel(preset, tmp_path, gen):
    """`embedding=triton_qkv_prologue`: a one-row decode step on the fused layer gathers its row inside the first
    layer's QKV kernel, which writes it out for the O projection's residual add; logits as the reference's (prefill
    and the non-fused paths gather it first)."""
    spec = PRESETS[preset] if isinstance(preset, str) else preset
    model = random_model(spec.with_layers(LAYERS), seed=int(torch.randint(0, 1000, (1,), generator=gen)))
    options = {**best_options(spec), "embedding": "triton_qkv_prologue", "lm_head": "triton_greedy"}
    candidate = load_candidate(render("fast", options), tmp_path)
    candidate.embedding = lambda *args, **kwargs: pytest.fail("the decode step gathered its row in a launch")
    ctx = BuildContext(torch.device("cpu"), torch.float32, max_seqs=4, max_seq_len=64)
    forwards = [candidate.build(model, ctx), build_reference(model, ctx)]
    prompt = torch.randint(0, spec.vocab_size, (6,), generator=gen).tolist()
    with torch.no_grad():
        for fwd in forwards:
            fwd.prefill(make_prefill_batch([prompt], [1]))
        for step in range(2):
            token, pos = torch.randint(0, spec.vocab_size, (1,), generator=gen), torch.tensor([6 + step])
            batch = DecodeBatch(token, pos, torch.tensor([1]), pos)
            tokens, logits = forwards[0].decode_greedy(batch)
            expected = forwards[1].decode(batch)
            torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
            assert torch.equal(tokens, logits.argmax(-1))


@pytest.mark.parametrize("gemv, expected", [("onednn", [1, 3, 16, 40]), ("onednn_decode", [3, 16])])
def test_onednn_takes_the_rows_its_option_names(gemv, expected, tmp_path, monkeypatch):
    """'onednn' sends every linear layer through oneDNN; 'onednn_decode' only 2-32 rows (one row and prefills
    go to MKL's sgemm), which measured faster there on the 2-core AVX2 VM."""
    from athanor.kernels.onednn import has_onednn

    if not has_onednn(torch.float32):
        pytest.skip("this torch or CPU has no oneDNN fp32 linear")
    spec = PRESETS["tiny-dense"].with_layers(1)
    candidate = load_candidate(render("fast", {"gemv": gemv}), tmp_path)
    fwd = candidate.build(random_model(spec, seed=0), BuildContext(torch.device("cpu"), torch.float32, 4, 64))
    seen: list[int] = []
    real = candidate.onednn_linear
    monkeypatch.setattr(candidate, "onednn_linear", lambda x, packed, b: seen.append(x.shape[0]) or real(x, packed, b))
    w = fwd.layers[0].wo
    for rows in (1, 3, 16, 40):
        x = torch.randn(rows, w.shape[1])
        torch.testing.assert_close(fwd.linear(x, w), torch.nn.functional.linear(x, w), rtol=1e-4, atol=1e-4)
    assert sorted(set(seen)) == expected
