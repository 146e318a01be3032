"""`athanor compile`: the main job — find a faster, verified forward pass for a model and its traffic; and
`athanor watch`, which runs it again when a server's traffic drifts (`athanor.loop.watch`)."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from athanor.errors import ConfigError

if TYPE_CHECKING:
    from athanor.loop.status import SessionStatus

_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_duration(text: str, flag: str = "--budget") -> float:
    """`90`, `90s`, `3m`, `1.5h` -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"{flag} {text}: use a positive duration such as 180s, 3m or 1h")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compile", help="search for a faster verified forward pass (the main job)")
    # Flags a run records default to None, so `--resume` can tell the ones given (checked against the run's) from
    # the ones left out (taken from the run).
    p.add_argument("--model", default=None, help=f"default: {COMPILE_DEFAULTS['model']}")
    p.add_argument("--traffic", default=None, help="a trace file or preset:chat|code|agent (default: "
                                                   f"{COMPILE_DEFAULTS['traffic']})")
    p.add_argument("--budget", default=None, help=f"wall-clock budget, e.g. 180s, 3m, 1h (default: "
                                                  f"{COMPILE_DEFAULTS['budget']})")
    p.add_argument("--stretch-budget", action="store_true",
                   help="where this machine's record of past confirmations says --budget cannot confirm one candidate "
                        "and still search, run with the smallest budget that can (said first) rather than refuse")
    p.add_argument("--agents", default=None, help=f"comma-separated: variant, llm, cli (default: "
                                                  f"{COMPILE_DEFAULTS['agents']})")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--dtype", default="", help="float32, bfloat16 (default: fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--out", default="runs/latest", help="run directory (store, winner/, report.md, report.json)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out, with its model, traffic, "
                                                          "budget, agents, seed and device")
    p.add_argument("--incumbent", default=None, metavar="DIR",
                   help="a candidate directory to beat (e.g. what a server deploys): every candidate is timed "
                        "against it, the reference forward competes too (default: time against the reference)")
    p.add_argument("--bitwise", action="store_true", help="demand outputs identical to the reference")
    p.add_argument("--quality-budget", default="", metavar="kl=NUMBER,ppl=NUMBER",
                   help="quality mode: also search lossy moves (bf16 weights) and admit candidates within this "
                        "mean KL divergence and relative perplexity increase, e.g. kl=0.01,ppl=0.02")
    p.add_argument("--seed", type=int, default=None, help="default: 0")
    p.add_argument("--max-seqs", type=int, default=0, help="engine slots (0: device default)")
    p.add_argument("--max-seq-len", type=int, default=0, help="longest context held (0: device default)")
    p.add_argument("--dashboard", default="", metavar="URL", help="the base URL of an `athanor dashboard --store "
                   "OUT` that shows this run: report.md links its pages")
    p.add_argument("--store", default="", help="the experiment store: a path or a postgresql:// URL shared by a "
                   "team's runs (default: a SQLite file in --out)")
    p.add_argument("--plan", default="", metavar="FILE", help="an athanor plan --json FILE: after the search, the "
                   "best forward is confirmed in the plan's cheapest layouts that fit at the engines' concurrency")
    p.add_argument("--plan-top", type=int, default=2, metavar="N", help="layouts of --plan confirmed (default: 2)")
    p.add_argument("--layout", action="append", default=[], metavar="NAME", help="a layout to confirm the best "
                   "forward in, e.g. tp2 or tp2.ep2 (repeat it for more); with --plan, beside the plan's")
    p.add_argument("--cluster", default="", metavar="ADDRESS", help="screen on a Ray cluster's screeners, one per "
                   "GPU (or CPU) of it: auto (the cluster this process is in), HOST:PORT or ray://HOST:PORT; needs "
                   "athanor[cluster]")
    g = p.add_argument_group("LLM coder (--agents llm)")
    g.add_argument("--llm-base-url", default=None)
    g.add_argument("--llm-model", default=None)
    g.add_argument("--llm-api-key-env", default=None, help="environment variable holding the API key")
    g.add_argument("--llm-prompt", default=None, help="naive, expert, or a prompt file")
    g = p.add_argument_group("CLI agent (--agents cli)")
    g.add_argument("--cli-command", default=None, help="e.g. 'claude -p {prompt}' or 'codex exec {prompt}'")
    g.add_argument("--cli-time-limit", type=float, default=None)
    p.set_defaults(func=cmd_compile)

    w = sub.add_parser("watch", help="follow a request log; on drift, recompile and deploy the winner")
    w.add_argument("--model", default="smollm2-135m")
    w.add_argument("--log", required=True, help="the server's request log (JSONL) to follow")
    w.add_argument("--server", required=True, action="append", help="the server's URL, e.g. http://127.0.0.1:8000; "
                   "given again, more servers the winner is rolled out to after the first, one canary at a time")
    w.add_argument("--admin-token-file", default="", help="file holding the server's admin token")
    w.add_argument("--budget", default="10m", help="time budget of each compile session (e.g. 90s, 10m)")
    w.add_argument("--window", default="60s", help="traffic window compared for drift (e.g. 60s, 10m)")
    w.add_argument("--state", default="", help="state file (default: LOG.watch.json); survives restarts")
    w.add_argument("--workdir", default="", help="where compile sessions and winners go (default: beside the state)")
    w.add_argument("--device", default="cpu")
    w.add_argument("--once", action="store_true", help="stop at the end of the log instead of following it")
    w.add_argument("--store", default="", help="an experiment store (path or URL) to record each window's traffic, "
                                               "drift and recompile in (what the dashboard's traffic page shows)")
    w.set_defaults(func=cmd_watch)

    d = sub.add_parser("deploy", help="deploy a candidate directory to servers, one canary at a time, rolling every "
                                      "server back at the first that fails")
    d.add_argument("candidate", help="the candidate directory (a compile's winner/, or athanor candidate pack's)")
    d.add_argument("--server", required=True, action="append", help="a server's URL; give it once per server, in "
                                                                     "the order to deploy")
    d.add_argument("--admin-token-file", default="", help="file holding the servers' admin token")
    d.add_argument("--timeout", type=float, default=600.0, help="seconds each server's canary may take")
    d.add_argument("--store", default="", help="an experiment store (path or URL) to record each server's deployment")
    d.set_defaults(func=cmd_deploy)


COMPILE_DEFAULTS: dict[str, Any] = {"model": "smollm2-135m", "traffic": "preset:chat", "budget": "10m",
                                    "agents": "variant", "seed": 0}
"""What `compile` runs with where a flag is left out (and the run in --out does not say otherwise)."""


def settle_run_flags(args: argparse.Namespace) -> None:
    """Fill the flags a run records: on `--resume` from the run in --out (a given flag that disagrees with it is
    refused in one line), otherwise from `COMPILE_DEFAULTS`. Nothing is created here."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {args.out}: is a file; name a directory for the run")
    if not args.resume:
        for name, value in COMPILE_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
        return
    run = stored_run(out, args.store)
    was = {"model": run.model, "traffic": run.traffic, "budget": run.config.get("budget_s"),
           "agents": ",".join(run.config.get("agents", ())) or None, "seed": run.config.get("seed"),
           "device": run.device}
    for name, stored in was.items():
        given = getattr(args, name)
        if stored is None:  # a run from before this field was recorded
            setattr(args, name, given if given is not None else COMPILE_DEFAULTS.get(name))
            continue
        if given is not None and not _same_flag(name, given, stored):
            shown = f"{stored:g}s" if name == "budget" else stored
            raise ConfigError(f"--{name} {given}: run {run.id} in {args.out} was compiled with --{name} {shown}; "
                              f"resume without --{name} (it takes the run's) or choose another --out")
        setattr(args, name, f"{stored}s" if name == "budget" else stored)


def _same_flag(name: str, given: Any, stored: Any) -> bool:
    """Whether a flag given on `--resume` says what the run recorded (a budget in any unit, a device by its type)."""
    if name == "budget":
        return parse_duration(given) == stored
    if name == "device":
        return str(given).split(":")[0] == str(stored)
    return bool(given == stored)


def stored_run(out: Path, shared: str = "") -> Any:
    """The newest run of the run directory `out`, in the store `shared` (`--store`) or else its own (a one-line
    error where there is none, creating nothing)."""
    from athanor.loop.start import runs_in
    from athanor.store import open_store
    from athanor.store.connect import DEFAULT_FILENAME

    runs = []
    if shared or (out / DEFAULT_FILENAME).is_file():  # opening a store where there is none would create one
        with open_store(shared or out) as store:
            runs = runs_in(store, out)
    if not runs:
        raise ConfigError(f"--resume: {out} holds no run to resume; drop --resume to start one")
    return runs[0]


def cmd_compile(args: argparse.Namespace) -> int:
    import dataclasses

    from rich.console import Console

    from athanor.agents.config import AgentsConfig, CLIAgentConfig, LLMConfig
    from athanor.agents.registry import parse_agent_names
    from athanor.commands.evaluate import parse_budget
    from athanor.loop import CompileConfig, compile_session
    from athanor.model.device import resolve_device
    from athanor.progress import Progress

    settle_run_flags(args)
    console = Console(highlight=False)
    device = resolve_device(args.device)
    llm = {k: v for k, v in {"base_url": args.llm_base_url, "model": args.llm_model,
                             "api_key_env": args.llm_api_key_env, "prompt": args.llm_prompt}.items() if v is not None}
    cli = {k: v for k, v in {"command": args.cli_command, "time_limit_s": args.cli_time_limit}.items()
           if v is not None}
    cli["model"] = args.model
    config = CompileConfig(
        model=args.model, traffic=args.traffic, budget_s=parse_duration(args.budget),
        agents=tuple(parse_agent_names(args.agents)), device=device.type, dtype=args.dtype, out_dir=Path(args.out),
        resume=args.resume, bitwise=args.bitwise, seed=args.seed, max_seqs=args.max_seqs,
        max_seq_len=args.max_seq_len, dashboard=args.dashboard, cluster=args.cluster,
        store=args.store,
        incumbent=Path(args.incumbent) if args.incumbent is not None else None,
        quality=parse_budget(args.quality_budget),
        agents_config=AgentsConfig(llm=dataclasses.replace(LLMConfig(), **llm),
                                   cli=dataclasses.replace(CLIAgentConfig(), **cli)),
    )
    if args.plan or args.layout:
        from athanor.engine.config import parse_layout
        from athanor.loop.layouts import plan_layouts
        from athanor.seams import layout_name

        if args.plan_top < 1:
            raise ConfigError(f"--plan-top {args.plan_top}: confirm at least one of the plan's layouts")
        planned = plan_layouts(args.plan, config.model, config.evaluate_config("slow").max_seqs,
                               args.plan_top) if args.plan else ()
        given = tuple(layout_name(parse_layout(name)) for name in args.layout)
        config = dataclasses.replace(config, layouts=tuple(dict.fromkeys((*planned, *given))))
        console.print(f"layouts to confirm the best forward in: {', '.join(config.layouts) or 'none'}"
                      + (f" (the plan's cheapest that fit, {args.plan})" if args.plan else ""))
    if args.stretch_budget:
        from athanor.loop.reserve import stretched_budget

        wanted, config = config.budget_s, stretched_budget(config)
        if config.budget_s != wanted:
            console.print(f"--budget {wanted:.0f}s raised to {config.budget_s:.0f}s (--stretch-budget): confirming one "
                          f"candidate of {config.model} takes longer than the budget leaves on this machine")
    with Progress(console) as progress:
        report = compile_session(config, on_event=progress.print,
                                 status=lambda status: progress.set(_moving(status)))
    _print_summary(console, report.summary)
    if report.interrupted:
        return 130
    return 0 if report.verified else 1


def _moving(status: SessionStatus) -> Callable[[], str]:
    """The session's status line, its budget's clock moving on between the session's updates (the session's
    clock is `time.monotonic`, compile_session's default)."""
    taken = time.monotonic()
    return lambda: status.text(since_s=time.monotonic() - taken)


@dataclass
class _WatchTally:
    """What a watch's event lines say so far: windows seen and recompiles (those of earlier runs of the watch, from
    its first line, included), and the last line with the time it came."""

    windows: int = 0
    recompiles: int = 0
    last: str = ""
    last_at: str = ""

    def see(self, line: str) -> None:
        self.last, self.last_at = line, time.strftime("%H:%M:%S")
        if m := re.search(r"(\d+) windows and (\d+) recompiles so far", line):
            self.windows, self.recompiles = int(m.group(1)), int(m.group(2))
        elif m := re.match(r"window (\d+):", line):
            self.windows = max(self.windows, int(m.group(1)))
        elif re.match(r"recompile \d+: compiling", line):
            self.recompiles += 1

    def text(self) -> str:
        """The status line. It names the time of the last event, not the seconds since: a watch follows its log for
        days, and a status that changes only with its events adds one plain line per event, not one per interval."""
        return f"windows {self.windows}, recompiles {self.recompiles} | at {self.last_at}: {self.last}"


def cmd_watch(args: argparse.Namespace) -> int:
    import logging

    from rich.console import Console

    from athanor.commands.serve import read_admin_token
    from athanor.loop.watch import WatchOptions, watch
    from athanor.progress import Progress

    logging.getLogger("athanor").setLevel(logging.INFO)
    options = WatchOptions(model=args.model, log=args.log, server=args.server[0], fleet=tuple(args.server[1:]),
                           admin_token=read_admin_token(args.admin_token_file), budget=args.budget,
                           window=args.window, state=args.state, workdir=args.workdir, device=args.device,
                           follow=not args.once, store=args.store)
    tally = _WatchTally()
    with Progress(Console(highlight=False)) as progress:
        for line in watch(options):
            progress.print(line)
            tally.see(line)
            progress.set(tally.text())
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    """Exit 0 when every server took the candidate, 1 when the rollout stopped (and rolled back)."""
    from athanor.commands.serve import read_admin_token
    from athanor.engine.candidate_dir import load_candidate_dir
    from athanor.loop.fleet import roll_out
    from athanor.store import open_store

    load_candidate_dir(args.candidate)  # a bad directory is a one-line error before any server is touched
    store = open_store(args.store) if args.store else None
    rollout = roll_out([s.rstrip("/") for s in args.server], read_admin_token(args.admin_token_file),
                       Path(args.candidate), args.timeout, store, print)
    print(f"rollout {rollout.status}" + (f": {rollout.reason}" if rollout.reason else
                                         f" to {len(rollout.outcomes)} server(s)"))
    return 0 if rollout.status == "deployed" else 1


def _print_summary(console, summary: dict) -> None:
    from rich.table import Table

    table = Table("rank", "candidate", "author", "tier", "speedup [95% CI]", "s / 1k requests", title="leaderboard")
    for e in summary["leaderboard"]:
        table.add_row(str(e["rank"]), e["candidate_id"], e["author"], e["tier"],
                      f"x{e['speedup']:.3f} [{e['speedup_ci_low']:.3f}, {e['speedup_ci_high']:.3f}]",
                      f"{e['gpu_s_per_1k']:.1f}")
    console.print(table)
    if summary["verified"]:
        s = summary["speedup"]
        against = f"incumbent {s['incumbent_id']}" if s.get("against") == "incumbent" else "the reference"
        precision = summary.get("precision") or {}
        quality = ""
        if precision.get("mode") == "quality":
            q = precision["quality_budget"]
            quality = f", quality mode: budget kl={q['max_kl']:g},ppl={q['max_ppl_increase']:g}"
        console.print(f"verified winner {summary['winner_id']}: x{s['median']:.3f} over {against} "
                      f"(95% CI [{s['ci_low']:.3f}, {s['ci_high']:.3f}], whole model{quality}) -> "
                      f"{summary.get('out_dir', '')}winner/", markup=False)
    else:
        console.print(f"no verified winner: {summary.get('reason', '')}", markup=False)
