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


def test_logits_come_back_only_for_the_candidates_asked() -> None:
    cfg = EngineConfig(model="tiny-dense", max_seqs=4, max_seq_len=96, buckets=(1, 2, 4), cpu_threads=1)
    engine = Engine(cfg, load_model("tiny-dense"))
    assert engine.swap(p.SwapRequest(c.BASE)).status == "ok"
    assert engine.swap(p.SwapRequest(c.HONEST, keep_incumbent=True)).status == "ok"
    text = scripts.TextSource(engine.model.spec.vocab_size, seed=0)
    script = scripts.check_script(text, 4, 96)
    ids = (c.BASE.id, c.HONEST.id)
    every = trajectory.run_trajectory(engine, p.TrajectoryRequest(ids, script.steps, seed=1))
    one = trajectory.run_trajectory(engine, p.TrajectoryRequest(ids, script.steps, seed=1, logits_of=(c.HONEST.id,)))
    assert every.status == one.status == "ok", (every.error, one.error)
    assert every.logits is not None and one.logits is not None
    assert every.logits.shape[0] == 2 and one.logits.shape[0] == 1
    assert torch.allclose(one.logits[0], every.logits[1])  # the challenger's rows, the same outputs
    assert one.fingerprints is not None and one.fingerprints.shape[0] == 2  # fingerprints of every run still
    spent = dict(one.host_s)  # the worker's account of its wall, sent over the protocol as pairs
    assert set(spent) == {"inputs", "windows", "fingerprints", "logits", "total"}
    assert spent["total"] >= spent["windows"] >= float(one.times_s.sum()) > 0 and spent["logits"] > 0
    assert p.decode(p.encode(one, 1))[1].host_s == one.host_s
    bad = trajectory.run_trajectory(engine, p.TrajectoryRequest(ids, script.steps, seed=1, logits_of=("nobody",)))
    assert bad.status == "invalid" and "logits_of" in bad.error
