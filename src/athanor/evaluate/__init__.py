"""The gate every candidate passes: static checks, correctness against the reference, honest timing.

The compile loop calls `Evaluator(EvaluateConfig(...)).evaluate(candidate, incumbent) -> Verdict`
(engines kept across calls) or `evaluate_candidate(candidate, config, incumbent)` for one-off use.
Modules, in the order of the cascade (docs/architecture.md, "The evaluator"):
- `static_checks`: the source's imports and constructs;
- `scripts`: fresh real-text step scripts that every check and timing runs on;
- `correctness`: tolerance per dtype, greedy agreement, `--bitwise`, the quality budget;
- `timing`: paired ratios, bootstrap interval, A/A floor, physical limit, rounds of pairs, the decision;
- `objective`: GPU-seconds per 1,000 requests from the traffic's workload, tier projection;
- `figures`: a tier's timed pairs priced and projected into its `TierResult`;
- `cascade` / `engines`: the stages; the incumbent's, twin's, challenger's and reference's engine workers;
- `interleave`: a trajectory driven a step at a time across those workers, timed by the evaluator's clock;
- `lock`: the device lock; `verdict`: `Verdict`, `Measurement`.
"""

from athanor.evaluate.cascade import Evaluator, evaluate_candidate
from athanor.evaluate.config import EvaluateConfig, StageTimeouts
from athanor.evaluate.correctness import QualityBudget
from athanor.evaluate.verdict import Measurement, Speedup, TierResult, Verdict

__all__ = [
    "EvaluateConfig",
    "Evaluator",
    "Measurement",
    "QualityBudget",
    "Speedup",
    "StageTimeouts",
    "TierResult",
    "Verdict",
    "evaluate_candidate",
]
