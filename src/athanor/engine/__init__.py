"""The persistent engine: a worker process that loads weights once and hot-swaps candidates.

Who owns what (docs/architecture.md, "The engine RPC"):
- `candidate`: `Candidate` (source + manifest) and importing one under a unique module name;
- `protocol`: the typed, versioned messages between client and worker;
- `worker` / `core`: the process (sandbox, model load, RPC loop) and the engine's state;
- `graphs`: static decode buffers, CUDA graphs, sampling inside the graph;
- `config` / `requests` / `trajectory`: engine settings, request batches, recorded trajectories;
- `client` / `supervisor`: the caller's side: `EngineClient`, `ZmqEngineClient`, `Supervisor`;
- `sandbox` / `violations` / `isolation`: confinement, violation reports, namespace restore;
- `candidate_dir`: the deployable directory a compile writes and a server reads.

This package's `__init__` imports nothing heavy: the worker enters its sandbox before torch loads.
"""
