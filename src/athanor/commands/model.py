"""`athanor generate`, `athanor models`, `athanor save-random`."""

from __future__ import annotations

import argparse
import sys
import time

from athanor.errors import ConfigError

DEFAULT_PROMPT = "What is the capital of France?"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text with a model and its reference forward")
    p.add_argument("--model", default="smollm2-135m", help="name, preset, HF directory or .gguf file")
    p.add_argument("--prompt", default=None, help="the prompt (default: standard input when it is not a terminal, "
                                                  f"else {DEFAULT_PROMPT!r})")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: fp32 on CPU, bf16 on CUDA)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("models", help="list model presets and what is cached")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("save-random", help="write a preset with random weights as an HF model directory")
    p.add_argument("preset")
    p.add_argument("directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cpu", help="where to generate the weights (cuda is faster for 8B)")
    p.set_defaults(func=cmd_save_random)


def cmd_generate(args: argparse.Namespace) -> int:
    import dataclasses

    from athanor.model import BuildContext
    from athanor.model.device import resolve_device, resolve_dtype
    from athanor.model.generate import SamplingParams, generate
    from athanor.model.reference import build
    from athanor.model.registry import load_model_and_tokenizer

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    params = SamplingParams(args.max_new_tokens, args.temperature, args.top_p, args.seed)
    start = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(args.model, device=device, dtype=dtype)
    load_s = time.perf_counter() - start
    if tokenizer is None:
        raise ConfigError(f"--model {args.model}: has no tokenizer, so it cannot generate text")
    if args.prompt is None:
        args.prompt = DEFAULT_PROMPT if sys.stdin.isatty() else sys.stdin.read()
        if not args.prompt.strip():
            raise ConfigError("--prompt: standard input was empty; pipe a prompt in or pass --prompt TEXT")
    text = args.prompt
    if args.chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
    prompt_ids = tokenizer.encode(text)
    max_seq_len = model.spec.max_position_embeddings
    if len(prompt_ids) + args.max_new_tokens > max_seq_len:
        raise ConfigError(
            f"--prompt is {len(prompt_ids)} tokens and --max-new-tokens {args.max_new_tokens}: more than "
            f"{model.spec.name}'s {max_seq_len}-token context"
        )
    # The KV cache only needs to hold this request.
    ctx = BuildContext(device=device, dtype=dtype, max_seqs=1, max_seq_len=len(prompt_ids) + args.max_new_tokens)
    forward = build(model, ctx)
    params = dataclasses.replace(params, stop_ids=tokenizer.stop_ids)
    result = generate(forward, [prompt_ids], params, device, ctx.max_seq_len)
    print(tokenizer.decode(result.tokens[0]).strip())
    decode_tokens = result.num_decode_steps
    print(
        f"[{model.spec.name} on {device.type}, {str(dtype).removeprefix('torch.')}; loaded in {load_s:.1f} s] "
        f"prefill: {result.num_prompt_tokens} tokens, {result.num_prompt_tokens / result.prefill_s:.1f} tok/s · "
        f"decode: {decode_tokens} tokens, {decode_tokens / max(result.decode_s, 1e-9):.1f} tok/s",
        file=sys.stdout,
    )
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from athanor.model.registry import list_models

    table = Table("model", "kind", "params", "cached at")
    for row in list_models():
        table.add_row(row.name, row.kind, f"{row.params / 1e9:.2f} B" if row.params > 1e9 else
                      f"{row.params / 1e6:.1f} M", row.cached)
    Console().print(table)
    return 0


def cmd_save_random(args: argparse.Namespace) -> int:
    from athanor.model.device import resolve_device, resolve_dtype
    from athanor.model.hf import save_hf
    from athanor.model.presets import get_preset
    from athanor.model.random_init import random_model

    spec = get_preset(args.preset)
    device = resolve_device(args.device)
    model = random_model(spec, seed=args.seed, device=device, dtype=resolve_dtype(args.dtype, device))
    out = save_hf(model, args.directory)
    print(f"wrote {spec.name} ({spec.num_params() / 1e9:.2f} B parameters, random, seed {args.seed}) to {out}")

    return 0
