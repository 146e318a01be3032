"""The production server: OpenAI-compatible HTTP, continuous batching, request log, metrics, canary deploys.

Who owns what (docs/architecture.md, "Parts and their folders"):

- front-end process (`app`, `api`, `admin`, `frontend`, `metrics`, `reqlog`): FastAPI routes; it
  tokenizes, validates, streams text back, checks stop strings, writes the request log and the
  Prometheus metrics, and talks to one serving worker through `frontend.WorkerHandle` (zmq).
- serving worker process (`worker`, `scheduler`, `executor`, `canary`): the engine worker's boot
  (sandbox, model loaded once, `athanor.engine.core.Engine` with its resident candidates and
  DecodeRunners) plus the step loop of continuous batching. Requests go in, tokens come out; there
  is no round trip per decode step.
- `messages`: the typed JSON messages between the two; `config`: every knob, with its default.
- `athanor bench serve` (in `athanor.bench`) and `athanor watch` (in `athanor.loop`) are clients of a
  running server.

Nothing here imports torch at module level except the worker-side modules.
"""
