"""The reference forward against itself and against plain loops: KV cache, continued prefill, MoE, slices."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from athanor.model import BuildContext, DecodeBatch, make_prefill_batch
from athanor.model.presets import get_preset
from athanor.model.random_init import random_model
from athanor.model.reference import build, route, swiglu

PRESETS = ["tiny-dense", "tiny-qwen", "tiny-moe"]


def _ctx(max_seqs: int = 4, max_seq_len: int = 64) -> BuildContext:
    return BuildContext(device=torch.device("cpu"), dtype=torch.float32, max_seqs=max_seqs, max_seq_len=max_seq_len)


def _full_logits(model, seq: list[int]) -> torch.Tensor:
    """Logits at every position of `seq`, each from a fresh full prefill of its prefix."""
    out = []
    for n in range(1, len(seq) + 1):
        fwd = build(model, _ctx(max_seqs=1))
        out.append(fwd.prefill(make_prefill_batch([seq[:n]], [0]))[0])
    return torch.stack(out)


@pytest.mark.parametrize("preset", PRESETS)
def test_decode_with_cache_equals_full_prefill_at_every_position(preset: str) -> None:
    gen = torch.Generator().manual_seed(1)
    model = random_model(get_preset(preset), seed=2)
    lengths = [9, 4, 13]
    seqs = [torch.randint(0, model.spec.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    # Slots deliberately not 0..B-1 to catch slot/row mix-ups.
    slots = [2, 0, 3]
    fwd = build(model, _ctx())
    first = fwd.prefill(make_prefill_batch([s[:1] for s in seqs], slots))
    got = {b: [first[b]] for b in range(3)}
    cached = [1, 1, 1]
    while any(c < n for c, n in zip(cached, lengths)):
        rows = [b for b in range(3) if cached[b] < lengths[b]]
        batch = DecodeBatch(
            tokens=torch.tensor([seqs[b][cached[b]] for b in rows]),
            positions=torch.tensor([cached[b] for b in rows]),
            slots=torch.tensor([slots[b] for b in rows]),
            seq_lens=torch.tensor([cached[b] for b in rows]),
        )
        logits = fwd.decode(batch)
        for j, b in enumerate(rows):
            got[b].append(logits[j])
            cached[b] += 1
    for b, seq in enumerate(seqs):
        want = _full_logits(model, seq)
        torch.testing.assert_close(torch.stack(got[b]), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("preset", PRESETS)
def test_continued_prefill_equals_one_prefill(preset: str) -> None:
    model = random_model(get_preset(preset), seed=3)
    seqs = [list(range(5, 20)), list(range(100, 107))]
    whole = build(model, _ctx()).prefill(make_prefill_batch(seqs, [0, 1]))
    fwd = build(model, _ctx())
    fwd.prefill(make_prefill_batch([seqs[0][:6], seqs[1][:2]], [0, 1]))
    # Second chunk continues both slots from their cached lengths, packed together.
    cont = fwd.prefill(make_prefill_batch([seqs[0][6:], seqs[1][2:]], [0, 1], seq_lens=[6, 2]))
    torch.testing.assert_close(cont, whole, rtol=1e-4, atol=1e-4 * whole.abs().max().item())


def test_padding_slot_rows_do_not_disturb_real_slots() -> None:
    model = random_model(get_preset("tiny-dense"), seed=4)
    ctx = _ctx(max_seqs=2)
    fwd = build(model, ctx)
    fwd.prefill(make_prefill_batch([[1, 2, 3]], [0]))
    pad = ctx.max_seqs
    both = fwd.decode(DecodeBatch(torch.tensor([7, 0]), torch.tensor([3, 0]), torch.tensor([0, pad]), torch.tensor([3, 0])))
    alone = build(model, ctx)
    alone.prefill(make_prefill_batch([[1, 2, 3]], [0]))
    one = alone.decode(DecodeBatch(torch.tensor([7]), torch.tensor([3]), torch.tensor([0]), torch.tensor([3])))
    torch.testing.assert_close(both[0], one[0])


def _naive_moe(model, layer: int, x: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert: the plainest reading of the MoE layer."""
    moe = model.spec.moe
    router = model.layer(layer, "router")
    bias = model.weights.get(f"layers.{layer}.router_bias")
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        logits = router @ x[t]
        scores = torch.softmax(logits, -1) if moe.scoring == "softmax" else torch.sigmoid(logits)
        choose = scores if bias is None else scores + bias
        ids = sorted(range(moe.num_experts), key=lambda e: -float(choose[e]))[: moe.top_k]
        weights = scores[ids]
        if moe.renormalize:
            weights = weights / weights.sum()
        for w, e in zip(weights, ids):
            g, u, d = (model.layer(layer, f"experts.{n}")[e] for n in ("w_gate", "w_up", "w_down"))
            out[t] += w * (d @ (torch.nn.functional.silu(g @ x[t]) * (u @ x[t])))
        if moe.shared_intermediate_size:
            shared = swiglu(x[t : t + 1], *(model.layer(layer, f"shared.{n}") for n in ("w_gate", "w_up", "w_down")))[0]
            if moe.shared_gate:
                shared = torch.sigmoid(model.layer(layer, "shared.gate") @ x[t]) * shared
            out[t] += shared
    return out


@pytest.mark.parametrize("scoring,renormalize,with_bias", [("softmax", True, False), ("sigmoid", False, True),
                                                           ("softmax", False, True)])
def test_moe_reference_equals_naive_per_token_loop(scoring: str, renormalize: bool, with_bias: bool) -> None:
    base = get_preset("tiny-moe")
    spec = dataclasses.replace(base, moe=dataclasses.replace(base.moe, scoring=scoring, renormalize=renormalize))
    model = random_model(spec, seed=5)
    if with_bias:
        model.weights["layers.1.router_bias"] = torch.randn(spec.moe.num_experts) * 0.3
    fwd = build(model, _ctx())
    x = torch.randn(11, spec.hidden_size)
    for layer in range(spec.num_layers):
        torch.testing.assert_close(fwd._moe(layer, x), _naive_moe(model, layer, x), rtol=1e-4, atol=1e-5)


def test_route_renormalises_and_bias_only_changes_the_choice() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    ids, w = route(logits, 2, "softmax", renormalize=True)
    assert ids.tolist() == [[0, 1]] and torch.allclose(w.sum(-1), torch.ones(1))
    ids, w = route(logits, 2, "softmax", renormalize=False, selection_bias=torch.tensor([0.0, 0.0, 5.0, 0.0]))
    assert ids.tolist() == [[2, 0]]
    assert torch.allclose(w, torch.softmax(logits, -1)[0, [2, 0]][None])


def test_slice_keeps_first_layers_and_shares_storage() -> None:
    model = random_model(get_preset("tiny-dense"), seed=6)
    cut = model.slice(2)
    assert cut.num_layers == 2 and cut.full_num_layers == 4
    assert not any(n.startswith(("layers.2.", "layers.3.")) for n in cut.weights)
    assert cut.get("layers.1.wq").data_ptr() == model.get("layers.1.wq").data_ptr()
    cut.validate("slice")
    # A sliced model runs and differs from the whole one.
    prompt = make_prefill_batch([[1, 2, 3, 4]], [0])
    assert not torch.allclose(build(cut, _ctx()).prefill(prompt), build(model, _ctx()).prefill(prompt))
    with pytest.raises(ValueError):
        model.slice(5)


@pytest.mark.parametrize("page_size", [4, 16])
def test_pages_dealt_in_any_order_give_the_same_logits(page_size: int) -> None:
    """The pool's map is the engine's: shuffled, non-consecutive pages and any page size change nothing."""
    gen = torch.Generator().manual_seed(3)
    model = random_model(get_preset("tiny-qwen"), seed=4)
    prompts = [torch.randint(0, model.spec.vocab_size, (n,), generator=gen).tolist() for n in (11, 6)]
    per_seq = -(-64 // page_size)
    shuffled = torch.randperm(5 * per_seq, generator=gen).to(torch.int32).view(5, per_seq)
    shuffled[-1] = 5 * per_seq  # the padding slot: all scratch
    outs = []
    for ctx in (_ctx(), BuildContext(device=torch.device("cpu"), dtype=torch.float32, max_seqs=4, max_seq_len=64,
                                     page_size=page_size, num_pages=5 * per_seq, block_table=shuffled)):
        fwd = build(model, ctx)
        logits = [fwd.prefill(make_prefill_batch(prompts, [1, 3]))]
        pos = torch.tensor([len(p) for p in prompts])
        logits.append(fwd.decode(DecodeBatch(torch.tensor([5, 7]), pos, torch.tensor([1, 3]), pos)))
        outs.append(torch.cat(logits))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
