"""Traffic: trace parsers, `TrafficProfile`, drift detection, workloads and MoE routing replay.

The compile loop calls `load_profile(spec)` (a trace path, a saved profile or `preset:NAME`),
`workload_from_profile(profile)` for the step counts it prices, `compare_profiles` /
`DriftMonitor` to decide when to recompile, and `routing` for MoE models with random weights.
"""

from athanor.traffic.chunk import RequestChunk
from athanor.traffic.drift import DriftMonitor, DriftReport, DriftThresholds, FeatureDrift, compare_profiles
from athanor.traffic.formats import FORMATS, athanor_log_record
from athanor.traffic.parsers import TraceReader, read_columns
from athanor.traffic.profile import TrafficProfile, load_profile, profile_chunks, profile_trace
from athanor.traffic.workload import (
    DecodeStep,
    PrefillStep,
    ReplayRequest,
    Workload,
    replay_requests,
    workload_from_profile,
)

__all__ = [
    "FORMATS",
    "DecodeStep",
    "DriftMonitor",
    "DriftReport",
    "DriftThresholds",
    "FeatureDrift",
    "PrefillStep",
    "ReplayRequest",
    "RequestChunk",
    "TraceReader",
    "TrafficProfile",
    "Workload",
    "athanor_log_record",
    "compare_profiles",
    "load_profile",
    "profile_chunks",
    "profile_trace",
    "read_columns",
    "replay_requests",
    "workload_from_profile",
]
