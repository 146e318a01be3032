"""How the engine times a trajectory step (CPU side; the CUDA event path runs in tests/gpu)."""

from __future__ import annotations

import gc

import eval_candidates as c
import torch

from athanor.engine import protocol as p
from athanor.engine import trajectory
from athanor.engine.config import EngineConfig
from athanor.engine.core import Engine
from athanor.evaluate import scripts
from athanor.evaluate.objective import StepShape
from athanor.model.registry import load_model

SEES_GC = c.patched(
    "import gc as _gc\n"
    "GC_SEEN = []\n"
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    decode = forward.decode\n"
    "    def watched(batch):\n"
    "        GC_SEEN.append(_gc.isenabled())\n"
    "        return decode(batch)\n"
    "    forward.decode = watched\n"
    "    return forward\n",
    "records whether the garbage collector runs during its steps",
)


def test_steps_run_with_the_collector_off_and_it_is_restored() -> None:
    cfg = EngineConfig(model="tiny-dense", max_seqs=4, max_seq_len=96, buckets=(1, 2, 4), cpu_threads=1)
    engine = Engine(cfg, load_model("tiny-dense"))
    assert engine.swap(p.SwapRequest(SEES_GC)).status == "ok"
    seen = engine.residents[SEES_GC.id].module.GC_SEEN
    seen.clear()
    text = scripts.TextSource(engine.model.spec.vocab_size, seed=0)
    script = scripts.decode_script(text, StepShape("decode", 2, 1, 8), num_steps=6, warmup=1, max_seq_len=96)
    assert gc.isenabled()
    reply = trajectory.run_trajectory(engine, p.TrajectoryRequest((SEES_GC.id, SEES_GC.id), script.steps, seed=1))
    assert reply.status == "ok", reply.error
    assert gc.isenabled()  # restored for the rest of the worker
    assert len(seen) == 2 * 7 and not any(seen)  # no collection can land inside a timed step
    assert reply.times_s is not None and bool((reply.times_s[:, list(script.timed)] > 0).all())


def test_no_graph_to_stage_on_cpu() -> None:
    cfg = EngineConfig(model="tiny-dense", max_seqs=4, max_seq_len=96, buckets=(1, 2, 4), cpu_threads=1)
    engine = Engine(cfg, load_model("tiny-dense"))
    assert engine.swap(p.SwapRequest(c.BASE)).status == "ok"
    runner = engine.residents[c.BASE.id].runner
    x = runner._view(2)
    assert runner.stage(x, greedy=True) is None  # eager: timed with its host work, as the candidate's cost
    assert "torch.cuda._sleep" in trajectory._CRITICAL and torch.cuda._sleep is trajectory._device_sleep
