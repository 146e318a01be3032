"""The evaluate tests' evaluator configuration (a module of its own: `conftest` names clash across test folders)."""

from athanor.evaluate import EvaluateConfig, StageTimeouts

CONFIG = EvaluateConfig(model="tiny-dense", max_seqs=4, max_seq_len=96, decode_pairs=64, prefill_pairs=48,
                        timing_budget_s=0.3,
                        fast_layers=2, timeouts=StageTimeouts(start_s=120, swap_s=60, smoke_s=30, check_s=60,
                                                              timing_s=60))
