"""`athanor candidate new`: write the baseline candidate out as an editable file."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    cand = sub.add_parser("candidate", help="work with candidate forward passes")
    cand_sub = cand.add_subparsers(dest="candidate_command", metavar="ACTION", parser_class=type(cand))
    cand.set_defaults(func=lambda args: (cand.print_help(), 2)[1])

    p = cand_sub.add_parser("new", help="write the reference forward as a standalone candidate file")
    p.add_argument("--model", default="smollm2-135m", help="the model the candidate is for (recorded in its header)")
    p.add_argument("-o", "--output", required=True, help="the candidate file to write")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=cmd_new)


def cmd_new(args: argparse.Namespace) -> int:
    from athanor.engine.candidate import reference_source
    from athanor.errors import ConfigError
    from athanor.model.presets import PRESETS

    out = Path(args.output)
    if out.exists() and not args.force:
        raise ConfigError(f"-o {out}: the file exists; pass --force to overwrite it")
    spec = PRESETS.get(args.model)
    family = spec.family if spec else "see the model's config"
    graph_note = ("decode is captured in CUDA graphs" if spec is None or spec.moe is None
                  else "MoE: decode is not graph-safe (graph_safe = False)")
    header = (f"# athanor candidate: the reference forward, for --model {args.model} (family: {family}).\n"
              f"# Edit freely: the engine calls build(model, ctx) and uses .prefill, .decode, .graph_safe;\n"
              f"# {graph_note}. Evaluate it with the engine (athanor.engine.Supervisor.swap).\n\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + reference_source())
    print(f"wrote {out}")
    return 0
