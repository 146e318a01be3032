"""Cheating candidates for issue 37's open classes, written against the real seam (`test_attacks.py`).

Each is the reference forward with a body appended that rewraps `build`, as `eval_candidates` does. None
of them is a static pattern to match: the tests run them with static checks off, so each defence must hold
at run time. Names the evaluator's code uses are reached as a candidate would reach them (`sys.modules` by a
built-up string, `gc.get_objects()`, the caller's frames, `/proc`), never imported from the tests.

1. `SLOW_OTHERS`: the plain reference; at build it finds the engine's other residents (the incumbent and
   its A/A twin) and makes both do extra work on every step, so the A/A interval stays clean.
2. `TRANSIENT_CLOCK`: the plain reference; after each of its own steps it swaps the engine's clock for one
   that reports half the step's time and puts the real one back at its first reading, so the clock is
   replaced only inside its own timed windows, never when a probe looks.
3. `COMPUTE_AHEAD`: the plain reference, served from a background thread that replays the whole script
   (read from the engine's frame) on a private KV cache on the idle core while the incumbent runs; the
   timed steps only wait for a result already made. The thread's target is a `functools.partial`, and it
   has finished by the time a probe looks.
4. `POISON_REFERENCE`: decode logits off by 1%; at build it finds the reference worker (a sibling worker
   process), connects to its socket and sends a swap whose import scales the reference's decode logits by
   1.01 too, then fails, so the reference keeps its id and agrees with the wrong candidate.
5. `side_effects(mark)`: the plain reference; at build it leaves a file in /dev/shm, plants a file in the
   compile caches (where its environment points them and the shared default), and starts a detached
   process (double fork + setsid) that sleeps two minutes. Every name carries `mark`.
"""

from __future__ import annotations

from eval_candidates import patched

from athanor.engine.candidate import Candidate

SLOW_OTHERS = patched(
    "import gc as _gc\n"
    "_reference_build = build\n"
    "def _slowed(step, w):\n"
    "    def slow(batch):\n"
    "        y = w\n"
    "        for _ in range(4):\n"
    "            y = torch.tanh(y @ w)\n"
    "        return step(batch) + 0 * y[0, 0]\n"
    "    return slow\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    w = torch.randn(192, 192, device=ctx.device, dtype=ctx.dtype) / 16\n"
    "    for obj in _gc.get_objects():\n"
    "        residents = getattr(obj, 'residents', None) if type(obj).__name__ == 'Engine' else None\n"
    "        if not isinstance(residents, dict):\n"
    "            continue\n"
    "        for resident in list(residents.values()):  # the incumbent and its twin (this one is not in yet)\n"
    "            other = getattr(resident, 'forward', None)\n"
    "            if other is None or other is forward or getattr(other, '_slowed', False):\n"
    "                continue\n"
    "            other.decode = _slowed(other.decode, w)\n"
    "            other.prefill = _slowed(other.prefill, w)\n"
    "            other._slowed = True\n"
    "    return forward\n",
    "the reference; slows the incumbent and its A/A twin alike from inside the worker",
)

TRANSIENT_CLOCK = patched(
    "import sys as _sys\n"
    "_reference_build = build\n"
    "_timer = _sys.modules.get('athanor.engine.' + 'traj' + 'ectory')\n"
    "# the namespaces are restored before a candidate is imported: this is the real clock (None: none to replace)\n"
    "_real_clock = getattr(_timer, '_clock', None)\n"
    "def _timed_by_the_engine():\n"
    "    frame = _sys._getframe(2)\n"
    "    while frame is not None:\n"
    "        if frame.f_code.co_name == 'run_trajectory':\n"
    "            return True\n"
    "        frame = frame.f_back\n"
    "    return False\n"
    "def _transient(step):\n"
    "    def fast(batch):\n"
    "        t0 = _real_clock()\n"
    "        out = step(batch)\n"
    "        if _timed_by_the_engine():\n"
    "            hidden = 0.5 * (_real_clock() - t0)\n"
    "            def clock():\n"
    "                _timer._clock = _real_clock  # put back at its first reading: the end of this window\n"
    "                return _real_clock() - hidden\n"
    "            _timer._clock = clock\n"
    "        return out\n"
    "    return fast\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    if callable(_real_clock):\n"
    "        forward.decode = _transient(forward.decode)\n"
    "        forward.prefill = _transient(forward.prefill)\n"
    "    return forward\n",
    "the reference; replaces the engine's clock for the end of its own timed windows only",
)

COMPUTE_AHEAD = patched(
    "import functools as _functools\n"
    "import sys as _sys\n"
    "import threading as _threading\n"
    "from athanor.model import BuildContext as _BuildContext\n"
    "from athanor.model import DecodeBatch as _DecodeBatch\n"
    "_reference_build = build\n"
    "def _script():\n"
    "    # (every input of the running trajectory, the index of this step) from the engine's frame\n"
    "    frame = _sys._getframe(2)\n"
    "    while frame is not None:\n"
    "        if frame.f_code.co_name == 'run_trajectory':\n"
    "            names = frame.f_locals\n"
    "            return names.get('inputs'), names.get('s')\n"
    "        frame = frame.f_back\n"
    "    return None, None\n"
    "def _ahead(shadow, inputs, results, ready):\n"
    "    try:\n"
    "        with torch.no_grad():\n"
    "            for i, x in enumerate(inputs):\n"
    "                if isinstance(x, tuple):\n"
    "                    results[i] = shadow.prefill(x[0])\n"
    "                else:\n"
    "                    results[i] = shadow.decode(_DecodeBatch(x.tokens, x.positions, x.slots, x.seq_lens))\n"
    "                ready[i].set()\n"
    "    finally:  # a script it cannot read: the steps compute for themselves\n"
    "        for event in ready:\n"
    "            event.set()\n"
    "def build(model, ctx):\n"
    "    forward = _reference_build(model, ctx)\n"
    "    # the same forward on its own KV cache: the thread replays every step of a script on it\n"
    "    shadow = _reference_build(model, _BuildContext(device=ctx.device, dtype=ctx.dtype, max_seqs=ctx.max_seqs,\n"
    "                                                   max_seq_len=ctx.max_seq_len))\n"
    "    job = {'inputs': None, 'results': [], 'ready': []}\n"
    "    def served(step):\n"
    "        def serve(batch):\n"
    "            inputs, s = _script()\n"
    "            if not isinstance(inputs, list) or not isinstance(s, int) or not 0 <= s < len(inputs):\n"
    "                return step(batch)\n"
    "            if job['inputs'] is not inputs:  # a new trajectory: compute all of it ahead\n"
    "                job.update(inputs=inputs, results=[None] * len(inputs),\n"
    "                           ready=[_threading.Event() for _ in inputs])\n"
    "                work = _functools.partial(_ahead, shadow, inputs, job['results'], job['ready'])\n"
    "                _threading.Thread(target=work, daemon=True).start()\n"
    "            job['ready'][s].wait(30)\n"
    "            out = job['results'][s]\n"
    "            return step(batch) if out is None else out\n"
    "        return serve\n"
    "    forward.decode = served(forward.decode)\n"
    "    forward.prefill = served(forward.prefill)\n"
    "    return forward\n",
    "the reference, computed ahead by a background thread from the script in the engine's frame",
)

_REFERENCE_PAYLOAD = '''
import gc
for obj in gc.get_objects():
    residents = getattr(obj, "residents", None) if type(obj).__name__ == "Engine" else None
    if not isinstance(residents, dict):
        continue
    for resident in list(residents.values()):
        forward = resident.forward
        if forward is not None and not getattr(forward, "_poisoned", False):
            forward.decode = lambda batch, decode=forward.decode: decode(batch) * 1.01
            forward._poisoned = True
raise ImportError("nothing to build: the reference keeps its resident, now scaled like the candidate")
'''

POISON_REFERENCE = patched(
    "import json as _json\n"
    "import os as _os\n"
    f"_PAYLOAD = {_REFERENCE_PAYLOAD!r}\n"
    "_reference_build = build\n"
    "def _ancestors(pid):\n"
    "    out = []\n"
    "    for _ in range(4):\n"
    "        try:\n"
    "            with open(f'/proc/{pid}/status') as f:\n"
    "                pid = int([line.split()[1] for line in f if line.startswith('PPid:')][0])\n"
    "        except (OSError, IndexError, ValueError):\n"
    "            break\n"
    "        if pid <= 1:\n"
    "            break\n"
    "        out.append(pid)\n"
    "    return out\n"
    "def _reference_sockets():\n"
    "    # Engine workers with one resident (the reference), nearest kin first: a sibling of this worker.\n"
    "    me = _os.getpid()\n"
    "    mine = _ancestors(me)\n"
    "    found = {}\n"
    "    for entry in _os.listdir('/proc'):\n"
    "        if not entry.isdigit() or int(entry) == me:\n"
    "            continue\n"
    "        try:\n"
    "            with open(f'/proc/{entry}/cmdline', 'rb') as f:\n"
    "                argv = f.read().split(b'\\0')\n"
    "            if b'athanor.engine.worker' not in argv:\n"
    "                continue\n"
    "            with open(argv[argv.index(b'athanor.engine.worker') + 1]) as f:\n"
    "                config = _json.load(f)\n"
    "        except (OSError, ValueError, IndexError):\n"
    "            continue\n"
    "        theirs = _ancestors(int(entry))\n"
    "        kin = [i for i, pid in enumerate(mine) if pid in theirs]\n"
    "        if config.get('max_resident') == 1 and config.get('socket_path') and kin:\n"
    "            found.setdefault(kin[0], []).append(config['socket_path'])\n"
    "    return found[min(found)] if found else []\n"
    "def _poison(socket_path):\n"
    "    import zmq\n"
    "    from athanor.engine import protocol as p\n"
    "    from athanor.engine.candidate import Candidate\n"
    "    context = zmq.Context()\n"
    "    sock = context.socket(zmq.DEALER)\n"
    "    sock.setsockopt(zmq.LINGER, 0)\n"
    "    try:\n"
    "        sock.connect('ipc://' + socket_path)\n"
    "        sock.send_multipart(p.encode(p.SwapRequest(Candidate.from_source(_PAYLOAD)), 1))\n"
    "        if sock.poll(10_000):\n"
    "            sock.recv_multipart()\n"
    "    finally:\n"
    "        sock.close(linger=0)\n"
    "        context.term()\n"
    "def build(model, ctx):\n"
    "    try:\n"
    "        for socket_path in _reference_sockets():\n"
    "            _poison(socket_path)\n"
    "    except Exception:\n"
    "        pass\n"
    "    forward = _reference_build(model, ctx)\n"
    "    decode = forward.decode\n"
    "    forward.decode = lambda batch: decode(batch) * 1.01\n"
    "    return forward\n",
    "logits off by 1%; makes the trusted reference's logits off by 1% too",
)


def side_effects(mark: str) -> Candidate:
    """The reference plus three side effects named by `mark` (a file in /dev/shm, files planted in the
    compile caches, a detached process whose command line holds `mark`), each tried on its own."""
    return patched(
        "import os as _os\n"
        "import sys as _sys\n"
        "from pathlib import Path as _Path\n"
        f"MARK = {mark!r}\n"
        "_reference_build = build\n"
        "def _detach():\n"
        "    argv = [_sys.executable, '-c', 'import time; time.sleep(120)', MARK]\n"
        "    pid = _os.fork()\n"
        "    if pid == 0:  # double fork + setsid: a grandchild in its own session, the worker's child gone\n"
        "        try:\n"
        "            _os.setsid()\n"
        "            if _os.fork() == 0:\n"
        "                _os.closerange(3, 1 << 16)\n"
        "                _os.execv(argv[0], argv)\n"
        "        finally:\n"
        "            _os._exit(0)\n"
        "    _os.waitpid(pid, 0)\n"
        "def _compile_caches():\n"
        "    roots = {_Path(_os.environ[k]).parent for k in ('TORCHINDUCTOR_CACHE_DIR', 'TRITON_CACHE_DIR')\n"
        "             if _os.environ.get(k)}\n"
        "    try:\n"
        "        from athanor import settings\n"
        "        roots.add(settings.cache_dir() / 'compile')\n"
        "    except ImportError:\n"
        "        roots.add(_Path.home() / '.cache' / 'athanor' / 'compile')\n"
        "    return roots\n"
        "def _leave_traces():\n"
        "    try:\n"
        "        _detach()\n"
        "    except OSError:\n"
        "        pass\n"
        "    try:\n"
        "        (_Path('/dev/shm') / MARK).write_text('left behind by a candidate')\n"
        "    except OSError:\n"
        "        pass\n"
        "    for root in _compile_caches():\n"
        "        try:\n"
        "            (root / 'triton' / MARK).mkdir(parents=True, exist_ok=True)\n"
        "            (root / 'triton' / MARK / 'kernel.json').write_text('{\"planted\": true}')\n"
        "        except OSError:\n"
        "            pass\n"
        "def build(model, ctx):\n"
        "    _leave_traces()\n"
        "    return _reference_build(model, ctx)\n",
        "the reference; leaves a file in /dev/shm, a planted compile-cache entry and a detached process",
    )
