"""`athanor candidate new` writes the baseline candidate out as an editable file; `athanor candidate pack` turns
such a file into the directory `athanor serve --candidate` and a deploy take (candidate.py + manifest.json)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    cand = sub.add_parser("candidate", help="work with candidate forward passes")
    cand_sub = cand.add_subparsers(dest="candidate_command", metavar="ACTION", parser_class=type(cand))
    cand.set_defaults(func=lambda args: (cand.print_help(), 2)[1])

    p = cand_sub.add_parser("new", help="write the reference forward as a standalone candidate file")
    p.add_argument("--model", default="smollm2-135m", help="the model the candidate is for (recorded in its header)")
    p.add_argument("--from", dest="start", choices=("reference", "best"), default="reference",
                   help="start from the reference forward, or from the best-known render of the template for "
                        "--model on --device (default: reference)")
    p.add_argument("--device", default="cuda", help="with --from best: cuda or cpu, whose best-known options to take")
    p.add_argument("-o", "--output", required=True, help="the candidate file to write")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=cmd_new)

    k = cand_sub.add_parser("pack", help="make a candidate file a deployable directory (serve --candidate DIR)")
    k.add_argument("file", help="the candidate file (e.g. from `athanor candidate new`)")
    k.add_argument("-o", "--output", required=True, help="the directory to write")
    k.add_argument("--description", default="", help="what the candidate does (default: the file's name)")
    k.add_argument("--force", action="store_true", help="overwrite a candidate already in the directory")
    k.set_defaults(func=cmd_pack)


def cmd_new(args: argparse.Namespace) -> int:
    from athanor.engine.candidate import reference_source
    from athanor.errors import ConfigError
    from athanor.model.presets import PRESETS
    from athanor.model.registry import load_spec
    from athanor.moves.best import best_candidate

    out = Path(args.output)
    if out.exists() and not args.force:
        raise ConfigError(f"-o {out}: the file exists; pass --force to overwrite it")
    spec = PRESETS.get(args.model)
    family = spec.family if spec else "see the model's config"
    graph_note = ("decode is captured in CUDA graphs" if spec is None or spec.moe is None
                  else "MoE: decode is not graph-safe (graph_safe = False)")
    if args.start == "best":
        source = best_candidate(load_spec(args.model), "cuda" if args.device.startswith("cuda") else "cpu")
        what = f"the best-known render of the template on {args.device}"
    else:
        source, what = reference_source(), "the reference forward"
    header = (f"# athanor candidate: {what}, for --model {args.model} (family: {family}).\n"
              f"# Edit freely: the engine calls build(model, ctx) and uses .prefill, .decode, .graph_safe;\n"
              f"# {graph_note}.\n"
              f"# Judge it:  athanor evaluate {out.name} --model {args.model}\n"
              f"# Serve it:  athanor candidate pack {out.name} -o DIR, then athanor serve {args.model} --candidate DIR\n"
              f"#            (or deploy DIR to a running server: POST /admin/deploy, see the README).\n\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + source)
    print(f"wrote {out}")
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    from athanor.engine.candidate import Candidate
    from athanor.engine.candidate_dir import SOURCE_NAME, write_candidate_dir
    from athanor.errors import ConfigError
    from athanor.seams import seam_mismatch

    path, out = Path(args.file), Path(args.output)
    if not path.is_file():
        raise ConfigError(f"{args.file}: no such candidate file (give a .py defining build(model, ctx))")
    source = path.read_text()
    try:
        compile(source, str(path), "exec")
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: {e.msg}; fix the candidate before packing it") from None
    if "def build" not in source:
        raise ConfigError(f"{path}: defines no build(model, ctx); a candidate's entry point is build")
    if mismatch := seam_mismatch(source, str(path)):
        raise ConfigError(mismatch)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"-o {out}: is a file; name a directory")
    if (out / SOURCE_NAME).exists() and not args.force:
        raise ConfigError(f"-o {out}: already holds a candidate; pass --force to overwrite it")
    candidate = Candidate.from_source(source, author="user", description=args.description or path.name)
    write_candidate_dir(candidate, out)
    print(f"wrote {out} (candidate {candidate.id}); serve it: athanor serve MODEL --candidate {out}")
    return 0
