"""The benchmark suite behind `athanor bench NAME`: each benchmark is a function that returns one JSON-ready record
stamped with its provenance (`record`), run the same way on any machine.

- `decode`: per-token decode through the engine's captured path and its share of the HBM roofline, over a grid
  of batches and contexts (`timing`: the clock and the roofline; `kernel_profile`: where a step's time goes);
- `swap`: cold start, swap, experiment and respawn of the persistent engine;
- `serve`: a trace replayed against a running server; `stream`: one stream through a server against the bare
  step; `batching`: continuous batching against one request at a time;
- `evaluate`: the evaluator's A/A noise floor and its verdict on a planted faster candidate;
- `compile`: a whole compile session's wall time, candidates and verified speedup;
- `reference`: the reference forward against HF transformers on the CPU;
- `tiers`: the fast tier's ranking against the slow tier's (`tier_figures`: its figures and equal-budget replay).
"""
