"""`athanor bench decode --kernels`' critical path: each kernel's share of the wall, from profiled spans."""

from __future__ import annotations

import pytest

from athanor.bench.kernel_profile import critical_path


def test_overlapping_kernels_own_only_what_they_add_and_the_shares_sum_to_the_wall() -> None:
    # Two steps of: a copy, then a GEMV launched early (resident from 1 us, done at 10), an attention kernel after
    # a 1 us gap, and a second GEMV launched during attention. Wall: 0 -> 40 us.
    step = [("copy", 0.0, 1.0), ("gemv", 0.5, 10.0), ("attn", 11.0, 14.0), ("gemv", 12.0, 20.0)]
    spans = step + [(n, a + 20.0, b + 20.0) for n, a, b in step]
    path = critical_path(spans, steps=2, layers=1)  # one layer: its two GEMV launches come apart
    shares = {r["name"]: r["us_per_step"] for r in path["path"]}
    assert shares == pytest.approx({"copy": 1.0, "gemv[1/2]": 9.0, "attn": 3.0, "gemv[2/2]": 6.0})
    assert path["path_gap_us_per_step"] == pytest.approx(1.0)
    assert path["path_us_per_step"] == pytest.approx(20.0)
    assert sum(shares.values()) + path["path_gap_us_per_step"] == pytest.approx(20.0)


def test_a_kernel_that_ends_inside_the_one_before_owns_nothing_and_uneven_spans_give_no_path() -> None:
    spans = [("long", 0.0, 10.0), ("inside", 2.0, 5.0), ("next", 9.0, 12.0)]
    shares = {r["name"]: r["us_per_step"] for r in critical_path(spans, steps=1)["path"]}
    assert shares == pytest.approx({"long": 10.0, "inside": 0.0, "next": 2.0})
    assert critical_path(spans, steps=2) == {}
    assert critical_path([], steps=1) == {}
