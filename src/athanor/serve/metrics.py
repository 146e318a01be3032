"""Prometheus metrics of the server (`GET /metrics`), on a registry of its own per app.

Latencies are measured in the front end (what a client sees); batch size, queue length and
running sequences come from the worker's `StepReport`s.
"""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from athanor.serve.messages import StepReport

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
STEP_BUCKETS = (0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048)
RATE_WINDOW_S = 10.0


class ServeMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.ttft = Histogram("athanor_time_to_first_token_seconds", "Arrival to the first generated token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("athanor_time_per_output_token_seconds", "Mean time per generated token after the first",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("athanor_e2e_request_latency_seconds", "Arrival to the last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue_length = Gauge("athanor_queue_length", "Requests waiting for a slot in the worker", registry=r)
        self.running = Gauge("athanor_running_sequences", "Sequences holding a slot", registry=r)
        self.batch_size = Histogram("athanor_batch_size", "Sequences per decode step", buckets=BATCH_BUCKETS,
                                    registry=r)
        self.max_batch_size = Gauge("athanor_max_batch_size", "Largest decode batch seen", registry=r)
        self.prompt_tokens = Counter("athanor_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("athanor_generation_tokens", "Generated tokens", registry=r)
        self.prefill_tokens = Counter("athanor_prefill_tokens", "Prompt tokens computed by prefill (the rest of "
                                      "athanor_prompt_tokens came from the prefix cache)", registry=r)
        self.preemptions = Counter("athanor_num_preemptions", "Sequences whose KV pages were taken back when the "
                                   "pool ran out (they recompute their tokens later)", registry=r)
        self.step_seconds = Histogram("athanor_step_seconds", "Wall time of one worker step (host and device), by "
                                      "what it ran: decode rows only, prefill chunks only, or both (mixed)",
                                      ["kind"], buckets=STEP_BUCKETS, registry=r)
        self.step_prefill_tokens = Counter("athanor_step_prefill_tokens", "Prompt tokens computed, by the kind of "
                                           "step that computed them", ["kind"], registry=r)
        self.kv_pool_tokens = Gauge("athanor_kv_pool_tokens", "Tokens each candidate's KV pool holds", registry=r)
        self.tokens_per_s = Gauge("athanor_generation_tokens_per_second",
                                  f"Generated tokens per second over the last {RATE_WINDOW_S:g}s", registry=r)
        self.requests = Counter("athanor_requests", "Finished requests by outcome", ["outcome"], registry=r)
        self.candidate = Gauge("athanor_current_candidate", "1 for the candidate serving new requests",
                               ["candidate"], registry=r)
        self.deployments = Counter("athanor_deployments", "Finished deploys by outcome", ["outcome"], registry=r)
        self._recent: deque[tuple[float, int]] = deque()
        self._current = ""

    def on_step(self, report: StepReport) -> None:
        if report.num_decode_rows:
            self.batch_size.observe(report.num_decode_rows)
            if report.num_decode_rows > self.max_batch_size._value.get():
                self.max_batch_size.set(report.num_decode_rows)
        if report.num_prefill_tokens:
            self.prefill_tokens.inc(report.num_prefill_tokens)
        if report.num_decode_rows or report.num_prefill_tokens:
            kind = ("mixed" if report.num_decode_rows else "prefill") if report.num_prefill_tokens else "decode"
            self.step_seconds.labels(kind).observe(report.step_s)
            if report.num_prefill_tokens:
                self.step_prefill_tokens.labels(kind).inc(report.num_prefill_tokens)
        if report.num_preempted:
            self.preemptions.inc(report.num_preempted)
        self.queue_length.set(report.num_waiting)
        self.running.set(report.num_running)
        n = sum(len(o.tokens) for o in report.outputs)
        if n:
            self.generation_tokens.inc(n)
            now = time.monotonic()
            self._recent.append((now, n))
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
            self.tokens_per_s.set(sum(k for _, k in self._recent) / RATE_WINDOW_S)

    def on_request(self, outcome: str, prompt_tokens: int, ttft_s: float | None, e2e_s: float,
                   num_output: int) -> None:
        self.requests.labels(outcome).inc()
        self.prompt_tokens.inc(prompt_tokens)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
            if num_output > 1:
                self.tpot.observe((e2e_s - ttft_s) / (num_output - 1))
        self.e2e.observe(e2e_s)

    def set_candidate(self, candidate_id: str) -> None:
        if self._current:
            self.candidate.labels(self._current).set(0)
        self._current = candidate_id
        self.candidate.labels(candidate_id).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
