"""Pictures of a trace: length distributions and request rate over time (matplotlib, Agg; the `plot` extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from athanor.errors import ConfigError
from athanor.traffic.profile import load_profile


def plot_trace(path: str | Path, output: str | Path, format: str | None = None, skip_bad: bool = False) -> Path:
    """Write a PNG with input/output length histograms and request rate per minute."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ConfigError("athanor traffic plot needs the plot extra: pip install 'athanor[plot]'") from None
    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    trace = not str(path).startswith("preset:") and not str(path).endswith(".json")
    prof = load_profile(str(path), window_s=60.0, **({"format": format, "skip_bad": skip_bad} if trace else {}))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, name, stats in ((axes[0], "input", prof.input), (axes[1], "output", prof.output)):
        sample = np.asarray(getattr(prof.sample, f"{name}_length"), dtype=float)
        bins = np.logspace(0, np.log10(max(sample.max(), 2)), 50)
        ax.hist(np.maximum(sample, 1), bins=bins, color="tab:blue" if name == "input" else "tab:orange")
        ax.set_xscale("log")
        ax.set_title(f"{name} tokens: mean {stats.mean:,.0f}, p50 {stats.p50:,.0f}, p99 {stats.p99:,.0f}")
        ax.set_xlabel("tokens")
        ax.set_ylabel("requests (sample)")
    if prof.windows:  # every minute from the first to the last; one without requests at zero, not a line across it
        starts = [round((w.start_s - prof.start_s) / 60) for w in prof.windows]
        rates = np.zeros(max(starts) + 1)
        for minute, w in zip(starts, prof.windows):
            rates[minute] = w.arrivals.rate_rps
        axes[2].plot(np.arange(len(rates)), rates, marker=".")
        axes[2].set_title("request rate")
    else:  # a preset or a profile saved without windows: its mean rate is all it holds
        axes[2].plot([0, prof.duration_s / 60], [prof.arrivals.rate_rps] * 2)
        axes[2].set_title("request rate (the profile's mean: no per-minute windows)")
    axes[2].set_xlabel("minutes since start")
    axes[2].set_ylabel("requests / s (1-minute windows)")
    fig.suptitle(str(path))
    fig.tight_layout()
    out = Path(output)
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        raise ConfigError(f"-o {out}: cannot write the plot ({e.strerror})") from None
    finally:
        plt.close(fig)
    return out
