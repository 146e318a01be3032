"""Candidate sources for the evaluator's tests: honest ones, slowed ones, wrong ones and one cheat per defence.

Each is the reference forward with a body appended that rewraps `build` (as an agent's edit would).
"""

from __future__ import annotations

from athanor.engine.candidate import Candidate, baseline_candidate

BASE = baseline_candidate()


def patched(body: str, description: str = "") -> Candidate:
    return Candidate.from_source(BASE.source + "\n\n" + body, description=description)


def _slowed(extra: int) -> str:
    # Real extra work on every decode step (matmuls whose result is folded in as 0 * y).
    return (
        "_reference_build = build\n"
        "def build(model, ctx):\n"
        "    forward = _reference_build(model, ctx)\n"
        "    decode = forward.decode\n"
        "    w = torch.randn(192, 192, device=ctx.device, dtype=ctx.dtype) / 16\n"
        "    def slow_decode(batch):\n"
        "        y = w\n"
        f"        for _ in range({extra}):\n"
        "            y = torch.tanh(y @ w)\n"
        "        return decode(batch) + 0 * y[0, 0]\n"
        "    forward.decode = slow_decode\n"
        "    return forward\n"
    )


SLOWED = patched(_slowed(3), "the reference plus extra work per decode step")
"""The incumbent an honest faster candidate beats: the reference doing needless work."""
HONEST = patched("# the reference, unchanged: it does less work than SLOWED\n", "reference (distinct id)")
"""The reference under another id: faster than SLOWED for real, equal to the baseline."""
SLOWER = patched(_slowed(3) + "# slower\n", "correct but slower")

WRONG = patched(
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    decode = forward.decode\n"
    "    forward.decode = lambda batch: decode(batch) * 1.01\n"
    "    return forward\n",
    "logits off by 1%",
)

IGNORES_TABLE = patched(
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    # Pages of its own per slot (slot s: s * per_seq, ...), consistent with itself: the engine's table unread.\n"
    "    per_seq = ctx.pages_per_seq\n"
    "    own = torch.arange(ctx.max_seqs * per_seq, dtype=torch.int32, device=ctx.device).view(ctx.max_seqs, per_seq)\n"
    "    pad = torch.full((1, per_seq), ctx.num_pages, dtype=torch.int32, device=ctx.device)\n"
    "    forward.block_table = torch.cat([own, pad])\n"
    "    return forward\n",
    "keeps its own per-slot pages instead of reading the engine's block table",
)

NUDGED = patched(
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    decode = forward.decode\n"
    "    forward.decode = lambda batch: decode(batch) * (1 + 2e-6)\n"
    "    return forward\n",
    "decode logits off by 2e-6 relative: within the fp32 tolerance, not bit-identical",
)

LOSSY = patched(
    "from athanor.model import Model\n"
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    # bf16-rounded copies of the weights, computed in the model's dtype: a lossy candidate\n"
    "    rounded = {k: v.to(torch.bfloat16).to(v.dtype) for k, v in model.weights.items()}\n"
    "    return _reference_build(Model(model.spec, rounded, model.source, model.full_num_layers), ctx)\n",
    "weights rounded to bf16",
)

MEMO = patched(
    _slowed(3).replace("def build(", "def _slow_build(") +
    "def build(model, ctx):\n"
    "    forward = _slow_build(model, ctx)\n"
    "    decode = forward.decode\n"
    "    memo = {}\n"
    "    def memo_decode(batch):\n"
    "        key = (tuple(batch.tokens.tolist()), tuple(batch.positions.tolist()), tuple(batch.slots.tolist()))\n"
    "        if key in memo:\n"
    "            return memo[key].clone()\n"
    "        out = decode(batch)\n"
    "        memo[key] = out.clone()\n"
    "        return out\n"
    "    forward.decode = memo_decode\n"
    "    return forward\n",
    "memoises logits keyed by the inputs (fast only when inputs repeat)",
)

CACHED = patched(
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    decode = forward.decode\n"
    "    state = {'n': 0, 'last': None}\n"
    "    def cached_decode(batch):\n"
    "        state['n'] += 1\n"
    "        last = state['last']\n"
    "        if last is not None and state['n'] % 2 == 0 and last.shape[0] == batch.tokens.shape[0]:\n"
    "            return last.clone()\n"
    "        out = decode(batch)\n"
    "        state['last'] = out.clone()\n"
    "        return out\n"
    "    forward.decode = cached_decode\n"
    "    return forward\n",
    "returns the previous call's logits every other step",
)

NO_WRITE = patched(
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    decode = forward.decode\n"
    "    state = {'n': 0}\n"
    "    out = {}\n"
    "    def lazy_decode(batch):\n"
    "        state['n'] += 1\n"
    "        n = batch.tokens.shape[0]\n"
    "        if n in out and state['n'] % 2 == 0:\n"
    "            return out[n]  # the same buffer, not written this time\n"
    "        out[n] = decode(batch)\n"
    "        return out[n]\n"
    "    forward.decode = lazy_decode\n"
    "    return forward\n",
    "skips writing its output buffer every other step",
)

FAKE_TOKENS = patched(
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    def greedy_decode(batch):\n"
    "        # the engine takes a greedy step's tokens from here: honest logits, tokens without the argmax;\n"
    "        # and the method drops itself, as if the forward had never offered it\n"
    "        if hasattr(forward, 'decode_greedy'):\n"
    "            del forward.decode_greedy\n"
    "        return torch.zeros_like(batch.tokens), forward.decode(batch)\n"
    "    forward.decode_greedy = greedy_decode\n"
    "    return forward\n",
    "hands the engine greedy tokens that are not its logits' argmax, then hides that it did",
)

TIMING_AWARE = patched(
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    decode = forward.decode\n"
    "    state = {'n': 0}\n"
    "    def sly_decode(batch):\n"
    "        state['n'] += 1\n"
    "        if state['n'] > 40:  # checks are short; a long run of calls must be a timing\n"
    "            x = F.embedding(batch.tokens, model.get('embed'))\n"
    "            return forward._logits(x)  # skips every layer\n"
    "        return decode(batch)\n"
    "    forward.decode = sly_decode\n"
    "    return forward\n",
    "correct for the first 40 decode calls, then skips the layers",
)

def corrupting(when: str = "True") -> Candidate:
    """Correct itself (it runs on a copy), it corrupts the shared weights, which only the incumbent reads then, on
    the ranks where `when` holds (an expression of `ctx`)."""
    return patched(
        "from athanor.model import Model\n"
        "_reference_build = build\n"
        "def build(model, ctx):\n"
        "    own = Model(model.spec, {k: v.clone() for k, v in model.weights.items()}, model.source,\n"
        "                model.full_num_layers)\n"
        "    forward = _reference_build(own, ctx)\n"
        f"    if {when}:\n"
        "        model.weights['layers.0.wq'].add_(0.5)\n"
        "    return forward\n",
        f"correct itself, corrupts the shared weights where {when}",
    )


WEIGHTS = corrupting()

PATCH_TIMER = patched(
    "import time as _time\n"
    "_real = _time.perf_counter\n"
    "_time.perf_counter = lambda: _real() * 0.5\n",
    "halves the clock",
)
PATCH_COMPARE = patched(
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    setattr(torch, 'allclose', lambda *a, **k: True)\n"
    "    return _reference_build(model, ctx)\n",
    "makes every comparison pass",
)
PATCH_AT_RUN = patched(
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    decode = forward.decode\n"
    "    def patching_decode(batch):\n"
    "        torch.equal = lambda *a, **k: True\n"
    "        return decode(batch)\n"
    "    forward.decode = patching_decode\n"
    "    return forward\n",
    "patches torch.equal from inside decode (after the swap)",
)

THREADS = patched(
    "import threading\n"
    "_reference_build = build\n"
    "def _spin(stop):\n"
    "    while not stop.wait(0.01):\n"
    "        pass\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    forward._stop = threading.Event()\n"
    "    threading.Thread(target=_spin, args=(forward._stop,), daemon=True).start()\n"
    "    return forward\n",
    "starts a background thread",
)

NETWORK = patched(
    "import socket\n"
    "_reference_build = build\n"
    "def build(model, ctx):\n"
    "    try:\n"
    "        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
    "        s.settimeout(0.2)\n"
    "        s.connect(('10.255.255.1', 80))\n"
    "    except OSError:\n"
    "        pass\n"
    "    return _reference_build(model, ctx)\n",
    "phones home",
)

STATIC_CHEATS = {
    "threads": "import threading\n",
    "processes": "import multiprocessing as mp\n",
    "stream": "def side(x):\n    s = torch.cuda.Stream()\n    with torch.cuda.stream(s):\n        return x * 2\n",
    "file read": "def peek():\n    return open('/tmp/reference_logits.pt', 'rb').read()\n",
    "torch.load": "def peek():\n    return torch.load('/tmp/reference_logits.pt')\n",
    "pathlib": "from pathlib import Path\n",
    "network": "import socket\n",
    "urllib": "import urllib.request\n",
    "reference outputs via gc": "import gc\n",
    "frames": "import sys\ndef f():\n    return sys._getframe(2).f_locals\n",
    "engine internals": "from athanor.engine import core\n",
    "evaluator": "import athanor.evaluate.correctness as c\n",
    "patch timer": "import time\ntime.perf_counter = lambda: 0.0\n",
    "patch event": "torch.cuda.Event.elapsed_time = lambda self, end: 1e-6\n",
    "patch allclose": "torch.allclose = lambda *a, **k: True\n",
    "setattr patch": "setattr(F, 'linear', None)\n",
    "exec": "exec('import os')\n",
    "dunder import": "os = __import__('os')\n",
}
"""Source lines appended to the reference that the static stage must refuse, by what they attempt."""
