"""The HTTP edge: OpenAI request schemas (pydantic), error bodies and response shapes.

Only what athanor serves is modelled. A field of the OpenAI (or vLLM) API that athanor does not implement is
refused with a 400 naming it when it asks for something (`UNSUPPORTED`): a client that asks for log-probabilities
or a JSON schema must not get plain text as if it had them. Fields no API defines are ignored, as other
OpenAI-compatible servers do. Every error is `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class APIError(Exception):
    """An error answered as an OpenAI-style body with an HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


MAX_CHOICES = 16
"""Most choices (`n`) one request may ask for."""
MAX_TOP_LOGPROBS = 20

UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1),
    "response_format": (None, {"type": "text"}),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "suffix": (None, ""),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
}
"""Fields athanor does not implement, with the values that ask for nothing (accepted)."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            for name, harmless in UNSUPPORTED.items():
                if name in raw and raw[name] not in harmless:
                    raise APIError(400, f"{name}: not supported by this server (omit it, or send "
                                        f"{json.dumps(harmless[-1])})", param=name, code="unsupported_field")
        return raw

    model: str
    max_tokens: int | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    ignore_eos: bool = False
    """vLLM's: generate max_tokens tokens past the end-of-sequence token (benchmarks use it)."""
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    """Choices generated for the prompt; choice i samples with seed + i (all alike when greedy)."""

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if len(stops) > 4:
            raise APIError(400, "stop: at most 4 stop sequences", param="stop")
        return [s for s in stops if s]

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))

    def top_logprobs_wanted(self) -> int:
        """-1: no log-probabilities; k >= 0: each output token's, with the k most likely tokens' (`Submit.logprobs`)."""
        return -1

    def _check_logprobs(self) -> None:
        if self.top_logprobs_wanted() >= 0 and self.stream:
            raise APIError(400, "logprobs: not supported on a streamed request (omit it, or send stream: false)",
                           param="logprobs", code="unsupported_field")


class CompletionRequest(_Request):
    prompt: str | list[int]
    echo: bool = False
    """Return the prompt's text before the completion's."""
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    """Each output token's log-probability and the `logprobs` most likely tokens' (the legacy API's form)."""

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        self._check_logprobs()
        if self.echo and self.logprobs is not None:
            raise APIError(400, "echo with logprobs: the prompt's log-probabilities are not supported (omit one)",
                           param="echo", code="unsupported_field")
        return self

    def top_logprobs_wanted(self) -> int:
        return -1 if self.logprobs is None else self.logprobs


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise APIError(400, f"messages: content parts of type {part.get('type')!r} are not supported "
                                    "(text only)", param="messages")
            parts.append(str(part.get("text", "")))
        return "".join(parts)


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs: true", param="top_logprobs")
        self._check_logprobs()
        return self

    def top_logprobs_wanted(self) -> int:
        return (self.top_logprobs or 0) if self.logprobs else -1


class DeployRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    candidate_dir: str


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


@dataclass(frozen=True)
class Choice:
    """One finished choice of a request, as the bodies below need it."""

    text: str
    finish_reason: str | None
    tokens: list[str] = field(default_factory=list)
    """With log-probabilities: each output token's text."""
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[str, float]]] = field(default_factory=list)
    """Per output token, the most likely tokens' texts and log-probabilities."""
    text_offset: int = 0
    """Where the first output token's text starts in `text` (after an echoed prompt)."""
    with_logprobs: bool = False


def completion_logprobs(c: Choice) -> dict[str, Any] | None:
    """The legacy completions API's `logprobs` object of a choice."""
    if not c.with_logprobs:
        return None
    offsets = list(itertools.accumulate((len(t) for t in c.tokens[:-1]), initial=c.text_offset))
    return {"tokens": c.tokens, "token_logprobs": c.logprobs, "text_offset": offsets[:len(c.tokens)],
            "top_logprobs": [dict(top) for top in c.top] if c.top else [{} for _ in c.tokens]}


def _token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def chat_logprobs(c: Choice) -> dict[str, Any] | None:
    """The chat API's `logprobs` object of a choice."""
    if not c.with_logprobs:
        return None
    tops = c.top or [[] for _ in c.tokens]
    return {"content": [{**_token(t, lp), "top_logprobs": [_token(u, v) for u, v in top]}
                        for t, lp, top in zip(c.tokens, c.logprobs, tops, strict=True)]}


def completion_body(rid: str, model: str, choices: list[Choice], prompt_tokens: int,
                    completion_tokens: int) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": i, "text": c.text, "logprobs": completion_logprobs(c), "finish_reason":
                         c.finish_reason} for i, c in enumerate(choices)],
            "usage": usage(prompt_tokens, completion_tokens)}


def completion_chunk(rid: str, model: str, text: str, finish: str | None, index: int = 0) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}]}


def chat_body(rid: str, model: str, choices: list[Choice], prompt_tokens: int,
              completion_tokens: int) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": i, "message": {"role": "assistant", "content": c.text}, "logprobs":
                         chat_logprobs(c), "finish_reason": c.finish_reason} for i, c in enumerate(choices)],
            "usage": usage(prompt_tokens, completion_tokens)}


def chat_chunk(rid: str, model: str, delta: dict[str, str], finish: str | None, index: int = 0) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def usage_chunk(rid: str, model: str, obj: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}
