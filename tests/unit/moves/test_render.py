"""Rendering templates: validation, round trip, and the shape of the move catalogue."""

from __future__ import annotations

import pytest

from athanor.agents.variant import VariantConfig, device_search_space
from athanor.errors import ConfigError
from athanor.model.presets import PRESETS
from athanor.moves import (
    MOVES,
    baseline_options,
    best_candidate,
    best_options,
    read_options,
    render,
    search_space,
    template_source,
)


def test_template_options_are_the_baseline():
    assert read_options(template_source("fast")) == baseline_options()


def test_render_round_trips_and_changes_only_the_block():
    options = {"fused_qkv": True, "compile": "default", "attention": "triton_split_kv"}
    source = render("fast", options)
    assert read_options(source) == {**baseline_options(), **options}
    template = template_source("fast")
    assert source.split("# --- end OPTIONS ---")[1] == template.split("# --- end OPTIONS ---")[1]
    compile(source, "<rendered>", "exec")
    assert read_options(render(source, {"graphs": False}))["graphs"] is False  # re-render a rendered source


@pytest.mark.parametrize("options", [{"no_such_move": True}, {"rmsnorm": "cuda"}, {"fused_qkv": 1},
                                     {"compile": "reduce-overhead"}])
def test_render_refuses_unknown_options_and_values(options):
    with pytest.raises(ConfigError):
        render("fast", options)


def test_unknown_template_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown template"):
        render("nope", {})


def test_every_move_is_documented_and_in_the_search_space():
    assert all(len(m.doc) > 40 and len(m.values) >= 2 for m in MOVES)
    assert set(search_space(moe=True, lossy=True)) == {m.name for m in MOVES}
    assert "moe" not in search_space(moe=False)


def test_lossy_moves_are_searched_in_quality_mode_only():
    lossy = {m.name for m in MOVES if m.lossy}
    assert "linear_dtype" in lossy and baseline_options()["linear_dtype"] is None
    for moe in (False, True):
        assert not lossy & set(search_space(moe))
        assert lossy <= set(search_space(moe, lossy=True))
    for device in ("cpu", "cuda"):
        assert "linear_dtype" not in device_search_space(VariantConfig(device=device))
        assert device_search_space(VariantConfig(device=device, lossy=True))["linear_dtype"] == (None, "bfloat16")


def test_best_known_candidates_differ_for_dense_and_moe():
    dense, moe = PRESETS["llama-3.1-8b"], PRESETS["qwen3-30b-a3b"]
    assert best_options(dense)["fused_gate_up"] and not best_options(moe)["fused_gate_up"]
    assert read_options(best_candidate(moe))["moe"] == "triton"
    cpu = read_options(best_candidate(dense, "cpu"))
    assert cpu["attention"] == "torch_per_seq" and cpu["gemv"] == "onednn_decode"  # no gather copy; packed GEMMs


def test_quality_mode_proposes_the_lossy_best_known_first_then_the_exact_one():
    from athanor.agents.base import AgentContext
    from athanor.agents.variant import VariantSearch
    from athanor.moves import read_options

    context = AgentContext("run", "ref", "", num_proposals=2)
    lossy = [read_options(p.source) for p in VariantSearch(VariantConfig(lossy=True)).propose(context)]
    assert [o["linear_dtype"] for o in lossy] == ["bfloat16", None]
    assert {**lossy[0], "linear_dtype": None} == lossy[1]
    exact = VariantSearch(VariantConfig()).propose(AgentContext("run", "ref", "", num_proposals=1))
    assert read_options(exact[0].source) == lossy[1]


def test_cpu_search_space_leaves_out_what_needs_cuda():
    cpu, cuda = device_search_space(VariantConfig(device="cpu")), device_search_space(VariantConfig(device="cuda"))
    assert cpu["sdpa"] == (None, "math") and "cudnn_attention" in cuda["sdpa"]
    assert not any(str(v).startswith("triton") for values in cpu.values() for v in values)
    # and the GPU's leaves out the CPU's own paths (oneDNN GEMMs, host-synced flex attention)
    assert cpu["gemv"] == ("cublas", "onednn", "onednn_decode") and not {"onednn", "onednn_decode"} & set(cuda["gemv"])
    assert "torch_flex" in cpu["attention"] and "torch_flex" not in cuda["attention"]


def test_a_resumed_search_does_not_repeat_a_point_rendered_by_an_older_template():
    """The store's candidates may predate a move: the same options render to another source now."""
    from athanor.agents.base import AgentContext
    from athanor.agents.variant import VariantSearch
    from athanor.moves import read_options
    from athanor.store.records import EvaluationRecord

    agent = VariantSearch(VariantConfig())
    first = agent.propose(AgentContext("run", "ref", "", num_proposals=1))[0]
    old_source = first.source.replace('    "sdpa": None,\n', "")  # as rendered before the sdpa move existed
    assert old_source != first.source
    record = EvaluationRecord(id=1, run_id="run", candidate_id="old", incumbent_id="ref", author="variant",
                              tier="fast", status="accepted", accepted=True, stage="accepted", reason="",
                              speedup=1.2, speedup_ci_low=1.1, speedup_ci_high=1.3, gpu_s_per_1k=1.0, wall_s=1.0,
                              shapes=(), figures={}, created_at=0.0)
    resumed = VariantSearch(VariantConfig())
    resumed.warm_start([(old_source, record)])
    again = resumed.propose(AgentContext("run", "ref", "", num_proposals=12))
    assert read_options(first.source) not in [read_options(p.source) for p in again]


@pytest.mark.parametrize("options", [{m.name: v} for m in MOVES for v in m.values] + [
    best_options(PRESETS["llama-3.1-8b"]), best_options(PRESETS["qwen3-30b-a3b"]),
    best_options(PRESETS["llama-3.1-8b"], "cpu", lossy=True)])
def test_every_render_passes_the_evaluators_static_checks(options):
    """What the search proposes must get past the first stage (an import off the allowlist once sank every one)."""
    from athanor.evaluate.static_checks import check_source

    assert check_source(render("fast", options)) == []


def test_settings_from_a_command_line_are_literals_else_strings():
    from athanor.moves import parse_settings

    assert parse_settings(["merge_early=True", "compile=None", "lm_head=triton_greedy", "x=1"]) == {
        "merge_early": True, "compile": None, "lm_head": "triton_greedy", "x": 1}
    with pytest.raises(ConfigError, match="'lm_head' is not OPTION=VALUE"):
        parse_settings(["lm_head"])
