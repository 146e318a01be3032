"""Named parametric traffic profiles, for demos and for users without a trace.

Each preset is a small generative model (log-normal lengths, gamma inter-arrivals, a prefix
hit share) whose parameters come from published production figures; `preset_profile` draws a
fixed-seed sample from it and profiles that, so a preset is an ordinary `TrafficProfile`.

Sources:
- chat, code: Azure LLM inference trace 2023, conversation and code services (Patel et al.,
  "Splitwise", ISCA 2024; Azure/AzurePublicDataset, CC-BY 4.0). Splitwise reports median prompt
  1020 / output 129 tokens for conversation and 1500 / 13 for code. The spreads (sigma of log
  length), rates and inter-arrival CVs were measured with `athanor traffic profile` on the
  published one-hour files: conv 5.53 req/s, CV 1.09, sigma_in 0.99, sigma_out
  0.86; code 2.57 req/s, CV 13.2 (capped at 4 here: beyond it a gamma sample of a few thousand
  gaps is dominated by a handful of outliers), sigma_in 1.36, sigma_out 0.85.
- agent: Mooncake "tool&agent" trace (Qin et al., "Mooncake", FAST 2025, trace statistics table):
  23,608 requests in one hour (6.56 req/s), mean input 8,596 and mean output 182 tokens, 59%
  prefix-cache hit ratio. Spreads and burstiness are not published for it; those of the Mooncake
  conversation trace measured here (sigma_in 1.20, CV 3.0) are used, and sigma_out 0.8 is assumed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from athanor.errors import ConfigError
from athanor.traffic.chunk import RequestChunk
from athanor.traffic.formats import MOONCAKE_BLOCK_TOKENS
from athanor.traffic.profile import PrefixStats, TrafficProfile, profile_chunks


@dataclass(frozen=True)
class PresetSpec:
    """A parametric request stream."""

    rate_rps: float
    interarrival_cv: float
    input_median: float
    input_sigma: float
    output_median: float
    output_sigma: float
    prefix_hit_share: float
    max_input: int = 131072
    max_output: int = 4096
    note: str = ""


def _median_from_mean(mean: float, sigma: float) -> float:
    return mean * math.exp(-sigma * sigma / 2)  # log-normal: mean = median * exp(sigma^2 / 2)


PRESETS: dict[str, PresetSpec] = {
    "chat": PresetSpec(5.53, 1.09, 1020, 0.99, 129, 0.86, 0.0,
                       note="Azure LLM 2023 conversation (Splitwise, ISCA 2024)"),
    "code": PresetSpec(2.57, 4.0, 1500, 1.36, 13, 0.85, 0.0,
                       note="Azure LLM 2023 code (Splitwise, ISCA 2024)"),
    "agent": PresetSpec(6.56, 3.0, _median_from_mean(8596, 1.20), 1.20, _median_from_mean(182, 0.8), 0.8, 0.59,
                        note="Mooncake tool&agent trace (FAST 2025)"),
}


def sample_preset(spec: PresetSpec, num_requests: int = 20000, seed: int = 0) -> RequestChunk:
    rng = np.random.default_rng(seed)
    shape = 1.0 / spec.interarrival_cv**2
    gaps = rng.gamma(shape, 1.0 / (spec.rate_rps * shape), num_requests)
    n_in = np.clip(np.rint(rng.lognormal(math.log(spec.input_median), spec.input_sigma, num_requests)),
                   1, spec.max_input).astype(np.int64)
    n_out = np.clip(np.rint(rng.lognormal(math.log(spec.output_median), spec.output_sigma, num_requests)),
                    1, spec.max_output).astype(np.int64)
    return RequestChunk(np.cumsum(gaps), n_in, n_out)


@cache
def preset_profile(name: str) -> TrafficProfile:
    """The `TrafficProfile` of preset `name` (chat, code, agent)."""
    spec = PRESETS.get(name)
    if spec is None:
        raise ConfigError(f"unknown traffic preset 'preset:{name}': use one of "
                          + ", ".join(f"preset:{n}" for n in PRESETS))
    prof = profile_chunks([sample_preset(spec)], f"preset:{name}")
    prefix = PrefixStats(MOONCAKE_BLOCK_TOKENS, 0, spec.prefix_hit_share, prof.num_requests)
    return dataclasses.replace(prof, prefix=prefix)
