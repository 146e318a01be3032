"""A tier's figures from its timed pairs: `tier_figures` -> `TierResult`.

Each timed shape's step times (incumbent A, candidate B, the incumbent's twin A') are projected from
the tier's layers to the whole model, priced by the traffic's workload (`athanor.evaluate.objective`),
and turned into the candidate's speedup and the A/A floor over the objective
(`athanor.evaluate.timing`), with each shape's physical limit beside its measurement.
"""

from __future__ import annotations

import logging

import numpy as np

from athanor.evaluate import objective as obj
from athanor.evaluate.timing import (
    ShapeTimes,
    is_paired,
    objective_speedup,
    physical_floor_s,
    repeatability,
    robust_cv,
    speedup_interval,
    step_time,
)
from athanor.evaluate.verdict import Measurement, TierResult
from athanor.model.spec import ModelSpec
from athanor.traffic import Workload

log = logging.getLogger(__name__)

ShapeRuns = dict[obj.StepShape, tuple[np.ndarray, np.ndarray, np.ndarray]]
"""Per timed shape: the incumbent's, the candidate's and the twin's step times, pair by pair."""


def tier_figures(tier: str, times: ShapeRuns, spec: ModelSpec, workload: Workload, num_layers: int,
                 full_layers: int, dtype_bytes: int, bandwidth: float, lossy: bool = False) -> TierResult:
    """The `TierResult` of `times`, measured on `num_layers` layers at `bandwidth` bytes/s and projected
    to `full_layers` (the whole model's).

    `lossy`: the candidate may read narrower weights than the model's (bf16 copies of fp32, int8), so the
    physical limit assumes one byte per element, or an honest candidate would look impossibly fast."""
    full = full_layers
    factor = {s: obj.projection_factor(spec, num_layers, full, s, dtype_bytes) for s in times}
    inc_full = {s: step_time(a) * factor[s] for s, (a, _, _) in times.items()}
    cand_full = {s: step_time(b) * factor[s] for s, (_, b, _) in times.items()}
    inc_total, share = obj.price(workload, spec, inc_full, full, dtype_bytes)
    cand_total, _ = obj.price(workload, spec, cand_full, full, dtype_bytes)
    paired = {s: is_paired(a, c) for s, (a, _, c) in times.items()}  # the incumbent's runs alone decide
    floor_dtype_bytes = 1 if lossy else dtype_bytes
    measurements = []
    for s, (a, b, c) in times.items():
        if s.kind == "decode":
            floor_bytes = obj.decode_bytes(spec, num_layers, s.batch_size, s.context_len, floor_dtype_bytes)
        else:
            floor_bytes = (obj.head_bytes(spec, floor_dtype_bytes)
                           + num_layers * obj.layer_weight_bytes(spec, floor_dtype_bytes))
        m = Measurement(
            s.kind, s.batch_size, s.tokens, s.context_len, num_layers, step_time(b), step_time(a),
            speedup_interval(a, b, paired[s]), share[s] / max(inc_total, 1e-12),
            physical_floor_s(floor_bytes, bandwidth), paired[s], robust_cv(a), robust_cv(b), repeatability(a, c))
        measurements.append(m)
        log.info("%s b=%d t=%d ctx=%d: %d pairs, %s statistic, cv incumbent %.2f%% candidate %.2f%%, "
                 "run-to-run %.2f%%", s.kind, s.batch_size, s.tokens, s.context_len, len(a),
                 "per-pair" if m.paired else "quartile", 100 * m.incumbent_cv, 100 * m.candidate_cv,
                 100 * m.repeatability)
    speedup = objective_speedup([ShapeTimes(tuple(a), tuple(b), share[s], paired[s])
                                 for s, (a, b, _) in times.items()])
    noise = objective_speedup([ShapeTimes(tuple(a), tuple(c), share[s], paired[s])
                               for s, (a, _, c) in times.items()])
    return TierResult(tier, num_layers, tuple(measurements), speedup, noise, cand_total, inc_total)
