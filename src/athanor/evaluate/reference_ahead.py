"""`ReferenceAhead`: the reference engine's runs of an evaluation's scripts, started before they are needed.

The reference's outputs depend only on a script and its seed, and an evaluation fixes both for its
correctness script and for each shape's first round of timed pairs before the candidate runs any. The
reference runs in a worker of its own, so on a GPU those runs can overlap the candidate engine's smoke
and correctness runs instead of following each of the candidate engine's runs: on the H200's 8B they
were 1.8 of a fast-tier evaluation's 7.5 s and 12 of a slow-tier one's 47.5 s, all in line.

What may overlap them, and what may not:
- They start after the candidate is loaded: its build and graph capture (a Triton autotune among
  them) and the incumbent's, if it had to be built, run on a device of their own, so no tuning
  decision that the timed steps inherit is taken under contention. The smoke and correctness runs
  after it are checks, not measurements (and a timed prefill's length is jittered, mostly one they
  did not run: `scripts.prefill_script`).
- `settle` waits for every run started before the timing stage begins: the timed windows have the
  device alone, as before. Runs the evaluator did not start ahead (later rounds of pairs, a second
  attempt) run in line, as before.
On a CPU the two workers would share the cores, so `Evaluator` runs the reference in line there.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait

from athanor.engine import protocol as p
from athanor.evaluate.engines import TierEngines
from athanor.evaluate.scripts import Script


class ReferenceAhead:
    """Reference runs of one evaluation's scripts, started on a background thread (or in line when disabled)."""

    def __init__(self, engines: TierEngines, enabled: bool) -> None:
        self._engines = engines
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="reference-ahead") if enabled else None
        self._runs: dict[int, tuple[Script, Future[p.TrajectoryReply]]] = {}

    def start(self, script: Script, seed: int, timeout_s: float) -> Script:
        """Start the reference's run of `script` (a no-op when disabled); returns the script, the one to run."""
        if self._pool is not None:
            self._runs[seed] = (script, self._pool.submit(self._engines.run_reference, script, seed, timeout_s))
        return script

    def script(self, seed: int) -> Script | None:
        """The script started ahead under `seed`, if any (the caller runs that very script, not a rebuilt one)."""
        run = self._runs.get(seed)
        return run[0] if run is not None else None

    def reply(self, script: Script, seed: int, timeout_s: float) -> p.TrajectoryReply:
        """The reference's reply to `script` under `seed`: the run started ahead, or one run now.

        Raises `ReferenceFailed` as `TierEngines.run_reference` does, whichever thread ran it."""
        run = self._runs.pop(seed, None)
        if run is not None and run[0] is script:
            return run[1].result()
        return self._engines.run_reference(script, seed, timeout_s)

    def settle(self) -> None:
        """Wait until every run started ahead has finished (their replies kept): the device is then the
        candidate engine's alone, as a timed window needs."""
        wait([future for _, future in self._runs.values()])

    def close(self) -> None:
        """Drop the runs not yet started and wait for the one running: nothing of this evaluation's is left on
        the device when the next one starts."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._runs.clear()
