"""Layouts on the CPU: gloo ranks, each running the reference forward on its shard of a model
(`athanor.model.shard`), give one device's logits for a packed prefill, a second chunk and decode steps. TP2 for
a dense, a Qwen-style (q/k norms, biases, tied embeddings) and a MoE (shared expert with a gate) preset; TP4 over
two KV heads (each repeated on two ranks), TP2 over three KV heads (blocks of one and two); EP2 with replicated attention, TP2 with EP2 over the same ranks, DP2
replicas (no collective), and DCP2/DCP4 (each rank a share of every sequence's keys), alone and beside EP2."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from athanor.errors import ConfigError
from athanor.model import BuildContext, DecodeBatch, Layout, make_prefill_batch
from athanor.model.presets import PRESETS
from athanor.model.random_init import random_model
from athanor.model.reference import build
from athanor.model.registry import load_spec
from athanor.model.shard import shard_model, shard_spec
from athanor.model.spec import MLASpec, ModelSpec, MoESpec, RopeScaling


def _script(model, ctx: BuildContext) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Logits of the same steps on any forward: [prefill of two sequences, a second chunk, three decode steps]."""
    gen = torch.Generator().manual_seed(7)
    a, b = torch.randint(0, model.spec.vocab_size, (20,), generator=gen), torch.randint(0, 50, (6,), generator=gen)
    fwd = build(model, ctx)
    out = [fwd.prefill(make_prefill_batch([a[:12].tolist(), b.tolist()], [0, 1]))]
    out.append(fwd.prefill(make_prefill_batch([a[12:17].tolist()], [0], seq_lens=[12])))
    for n in range(17, 20):
        pos = torch.tensor([n])
        out.append(fwd.decode(DecodeBatch(a[n:n + 1], pos, torch.tensor([0]), pos)))
    return torch.cat(out)


def _spec(preset: str) -> ModelSpec:
    """A preset, or a tiny model of a family no tiny preset has (Gemma 3, gpt-oss, DeepSeek-V3's MLA)."""
    if preset in FAMILIES:
        return FAMILIES[preset]
    return load_spec(preset)


def _tiny_of(preset: str, **changes: Any) -> ModelSpec:
    shape = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=3, num_heads=4, num_kv_heads=2,
                 head_dim=16, max_position_embeddings=64, name=f"tiny-{preset}")
    spec = PRESETS[preset]
    windows = (6, 0, 6) if spec.layer_windows else ()
    return dataclasses.replace(spec, **{**shape, "layer_windows": windows, **changes})


FAMILIES = {
    "tiny-gemma3": _tiny_of("gemma-3-27b", embed_scale=8.0, attn_scale=24 ** -0.5),
    "tiny-gpt-oss": _tiny_of("gpt-oss-20b", intermediate_size=32, moe=MoESpec(num_experts=4, top_k=2, intermediate_size=32, logit_bias=True,
                                                         expert_bias=True, swiglu_limit=0.5),
                             rope_scaling=RopeScaling(factor=4.0, original_max_position_embeddings=16, kind="yarn",
                                                      truncate=False)),
    "tiny-deepseek": _tiny_of("deepseek-v3-5l", num_kv_heads=4, head_dim=24, dense_layers=(0,),
                              mla=MLASpec(kv_rank=16, q_rank=24, nope_dim=16, rope_dim=8, v_dim=12),
                              moe=MoESpec(num_experts=8, top_k=2, intermediate_size=16, scoring="sigmoid",
                                          shared_intermediate_size=16, num_groups=4, top_groups=2, routed_scale=2.5),
                              rope_scaling=RopeScaling(factor=4.0, original_max_position_embeddings=16, kind="yarn")),
    # SmolLM2's head shape: 9 query heads over 3 KV heads, which 2 ranks split one KV group and two
    "tiny-3kv": _tiny_of("smollm2-135m", num_heads=9, num_kv_heads=3, hidden_size=72, head_dim=8,
                         intermediate_size=120),
}
"""Tiny models of the families whose presets are large: every feature of the family, at the tiny presets' scale."""


def _rank(rank: int, layout: Layout, preset: str, rendezvous: str, out: str) -> None:
    torch.set_num_threads(1)
    ranks = _ranks(layout)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=ranks)
    try:
        model = random_model(_spec(preset), seed=0, device=torch.device("cpu"), dtype=torch.float32)
        ctx = BuildContext(torch.device("cpu"), torch.float32, max_seqs=2, max_seq_len=32, rank=rank,
                           world_size=ranks, layout=layout)
        with torch.no_grad():
            logits = _script(shard_model(model, rank, layout.tp, layout.ep), ctx)
        torch.save(logits, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def _ranks(layout: Layout) -> int:
    return max(layout.tp * layout.dp, layout.ep, layout.dcp)


SLOW = pytest.mark.slow  # the exhaustive variants: each start of the ranks costs seconds of imports
LAYOUTS = [("tiny-qwen", Layout(tp=2)), ("tiny-moe", Layout(tp=2, ep=2)), ("tiny-dense", Layout(dcp=2)),
           pytest.param("tiny-qwen", Layout(dcp=4), marks=SLOW), pytest.param("tiny-moe", Layout(ep=2, dcp=2), marks=SLOW),
           pytest.param("tiny-dense", Layout(tp=2), marks=SLOW), pytest.param("tiny-moe", Layout(tp=2), marks=SLOW),
           pytest.param("tiny-dense", Layout(tp=4), marks=SLOW), pytest.param("tiny-moe", Layout(ep=2), marks=SLOW),
           pytest.param("tiny-moe", Layout(dp=2), marks=SLOW),
           ("tiny-gpt-oss", Layout(tp=2)), pytest.param("tiny-gemma3", Layout(tp=2), marks=SLOW),
           ("tiny-3kv", Layout(tp=2)),
           pytest.param("tiny-deepseek", Layout(tp=2), marks=SLOW),
           pytest.param("tiny-deepseek", Layout(ep=2), marks=SLOW),
           pytest.param("tiny-gpt-oss", Layout(tp=2, ep=2), marks=SLOW)]


@pytest.mark.parametrize(("preset", "layout"), LAYOUTS, ids=lambda v: v if isinstance(v, str) else
                         f"tp{v.tp}-ep{v.ep}-dp{v.dp}-dcp{v.dcp}")
def test_layout_logits_equal_one_devices(tmp_path: Path, preset: str, layout: Layout) -> None:
    model = random_model(_spec(preset), seed=0, device=torch.device("cpu"), dtype=torch.float32)
    with torch.no_grad():
        want = _script(model, BuildContext(torch.device("cpu"), torch.float32, max_seqs=2, max_seq_len=32))
    out = str(tmp_path / "logits")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the ranks talk over loopback only
    ranks = _ranks(layout)
    mp.start_processes(_rank, args=(layout, preset, str(tmp_path / "rendezvous"), out), nprocs=ranks, join=True,
                       start_method="spawn")
    bound = 1e-4 * want.abs().max().item()
    for r in range(ranks):
        err = (torch.load(f"{out}.{r}") - want).abs().max().item()
        assert err <= bound, f"{preset} {layout} rank {r}: max |layout - one device| = {err:.3g} > {bound:.3g}"


def test_a_shape_that_does_not_divide_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="num_attention_heads 4 does not divide over 3 ranks"):
        shard_spec(load_spec("tiny-dense"), 3)
    with pytest.raises(ConfigError, match="num_experts 8 does not divide over 3 ranks"):
        shard_spec(load_spec("tiny-moe"), 1, ep=3)
    spec = shard_spec(load_spec("qwen3-30b-a3b"), 8)  # 4 KV heads over 8 ranks: one each, repeated
    assert (spec.num_heads, spec.num_kv_heads, spec.moe and spec.moe.intermediate_size) == (4, 1, 96)


def test_under_dcp_a_rank_writes_only_its_share_of_the_tokens() -> None:
    from athanor.model.partial_attention import kv_places
    from athanor.model.seam import identity_block_table

    table = identity_block_table(2, 16, 4, "cpu")  # slot 1's pages are 4..7
    positions = torch.arange(8)
    pages, rows = kv_places(table, torch.ones(8, dtype=torch.long), positions, 4, rank=1, dcp=2, scratch_page=99)
    assert pages.tolist() == [99, 4, 99, 4, 99, 4, 99, 4]  # odd tokens, at local positions 0..3: one page
    assert rows[1::2].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("preset", ["tiny-qwen", "tiny-moe", "tiny-gpt-oss"])
def test_a_rank_reads_only_its_shard_from_the_safetensors(tmp_path: Path, preset: str) -> None:
    """read_hf_dir(shard=) gives what shard_model cuts from the whole model, and holds no more than its share."""
    from athanor.model.hf import read_hf_dir, save_hf

    model = random_model(_spec(preset), seed=3, device=torch.device("cpu"), dtype=torch.float32)
    save_hf(model, tmp_path, hf_exact=False)
    for rank, tp, ep in [(0, 2, 1), (1, 2, 1), (1, 1, 2), (1, 2, 2)]:
        if ep > 1 and model.spec.moe is None:
            continue
        want = shard_model(model, rank, tp, ep)
        got, _ = read_hf_dir(tmp_path, shard=(rank, tp, ep))
        assert got.spec == want.spec and set(got.weights) == set(want.weights)
        for name, t in want.weights.items():
            assert torch.equal(got.weights[name], t), (preset, rank, tp, ep, name)
            assert got.weights[name].untyped_storage().nbytes() == t.numel() * t.element_size(), name  # its share
