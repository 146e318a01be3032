import json

import numpy as np
import pytest

from athanor.cli import main
from athanor.errors import ConfigError
from athanor.traffic.chunk import RequestChunk
from athanor.traffic.profile import TrafficProfile, load_profile, parse_window, profile_chunks, profile_trace


def test_mooncake_acceptance(traces, capsys):
    assert main(["traffic", "profile", str(traces / "mooncake_conversation.jsonl"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["num_requests"] == 12031
    assert round(d["input"]["mean"]) == 12035 and round(d["output"]["mean"]) == 343
    assert 0.2 < d["prefix"]["hit_share"] < 0.6


def test_round_trip_and_windows(traces, tmp_path):
    p = profile_trace(traces / "azure_llm_2023_code.csv", window_s=600)
    assert len(p.windows) == 6 and sum(w.num_requests for w in p.windows) == p.num_requests
    f = tmp_path / "p.json"
    f.write_text(p.to_json())
    edges = json.loads(f.read_text())["hist_edges"]  # the JSON says what its histograms' buckets are
    assert edges[:4] == [0, 2, 4, 8] and len(edges) == len(p.input.hist)
    assert load_profile(str(f)) == p


def test_littles_law_and_poisson_cv():
    rng = np.random.default_rng(0)
    n = 20000
    t = np.cumsum(rng.exponential(0.5, n))  # 2 req/s
    out = np.full(n, 100)
    prof = profile_chunks([RequestChunk(t, np.full(n, 1000), out)], "synthetic", tpot_s=0.05)
    assert prof.arrivals.rate_rps == pytest.approx(2.0, rel=0.03)
    assert prof.arrivals.cv == pytest.approx(1.0, abs=0.05)
    assert prof.arrivals.gamma_shape == pytest.approx(1.0, abs=0.1)
    assert prof.decode.mean_batch == pytest.approx(2.0 * 100 * 0.05, rel=0.05)  # L = lambda * W


def test_presets_and_errors():
    for name in ("chat", "code", "agent"):
        p = load_profile(f"preset:{name}")
        assert isinstance(p, TrafficProfile) and p.num_requests > 1000
    assert load_profile("preset:agent").input.mean == pytest.approx(8596, rel=0.1)
    with pytest.raises(ConfigError, match="preset:chat"):
        load_profile("preset:nope")
    assert parse_window("10m") == 600
    with pytest.raises(ConfigError, match="--window"):
        parse_window("ten")


def test_cli_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n')
    assert main(["traffic", "profile", str(bad)]) == 2
    assert f"{bad}:2: missing field 'input_length'" in capsys.readouterr().err
    assert main(["traffic", "profile", str(bad), "--skip-bad"]) == 0
    assert "skipped 1" in capsys.readouterr().out


def test_plot(traces, tmp_path):
    out = tmp_path / "p.png"
    assert main(["traffic", "plot", str(traces / "azure_llm_2023_conv.csv"), "-o", str(out)]) == 0
    assert out.stat().st_size > 10000


def test_plot_takes_what_profile_and_drift_take(tmp_path, capsys):
    saved = tmp_path / "code.json"
    assert main(["traffic", "profile", "preset:code", "--json"]) == 0
    saved.write_text(capsys.readouterr().out)
    assert saved.read_text().count("\n") > 10  # indented: a person can read it
    for spec in ("preset:chat", str(saved)):
        out = tmp_path / "p.png"
        assert main(["traffic", "plot", spec, "-o", str(out)]) == 0
        assert out.stat().st_size > 10000
