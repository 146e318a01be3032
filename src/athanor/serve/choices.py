"""A request's choices (`n`): generations of one prompt, started so that the prompt is computed once, then finished
as the bodies' `Choice`s (with log-probabilities) or streamed as one stream of (choice, text) pieces."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from athanor.serve.api import APIError, Choice
from athanor.serve.generation import Detokenizer, Generation


async def start(make: Callable[[int], Generation], n: int) -> list[Generation]:
    """Start choice 0 (`make(i)` builds choice i), then the others once its first token is out: by then the
    prompt's full pages are in the prefix cache, so each other choice computes only its last partial page. If one
    is refused, those started are stopped and the refusal raised."""
    first = make(0)
    await first.start()
    rest = [make(i) for i in range(1, n)]
    results = await asyncio.gather(*(g.start() for g in rest), return_exceptions=True)
    refused = [r for r in results if isinstance(r, BaseException)]
    if refused:
        started = [first] + [g for g, r in zip(rest, results, strict=True) if not isinstance(r, BaseException)]
        await asyncio.gather(*(g.cancel() for g in started))
        raise refused[0]
    return [first, *rest]


async def complete(gens: list[Generation]) -> None:
    """Run every choice to its end; on an error, the others are stopped and the error raised."""
    tasks = [asyncio.ensure_future(g.complete()) for g in gens]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()  # a choice still running when another failed: its stream stops and aborts it


def finished(gen: Generation, tokenizer: Detokenizer, echo: str = "") -> Choice:
    """A finished generation as a body's choice: its text after `echo`, and its tokens' log-probabilities when it
    asked for them (each token's text decoded alone, special tokens included)."""
    if gen.params.logprobs < 0:
        return Choice(echo + gen.text, gen.finish_reason)

    def text(token: int) -> str:
        return tokenizer.decode([token], False)

    return Choice(echo + gen.text, gen.finish_reason, [text(t) for t in gen.output_ids], list(gen.logprobs),
                  [[(text(t), v) for t, v in row] for row in gen.top], len(echo), with_logprobs=True)


async def merged(gens: list[Generation]) -> AsyncIterator[tuple[int, str | None]]:
    """The choices' text as it is generated, interleaved: (choice, piece), then (choice, None) once that choice has
    finished (its `finish_reason` set). An error in one stops the others and is raised."""
    queue: asyncio.Queue[tuple[int, str | None, APIError | None]] = asyncio.Queue()

    async def pump(i: int, gen: Generation) -> None:
        try:
            async for piece in gen.deltas():
                await queue.put((i, piece, None))
            await queue.put((i, None, None))
        except APIError as e:
            await queue.put((i, None, e))

    tasks = [asyncio.ensure_future(pump(i, g)) for i, g in enumerate(gens)]
    try:
        left = len(gens)
        while left:
            i, piece, error = await queue.get()
            if error is not None:
                raise error
            left -= piece is None
            yield i, piece
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
