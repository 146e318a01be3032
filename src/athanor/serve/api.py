"""The HTTP edge: OpenAI request schemas (pydantic), error bodies and response shapes.

Only what athanor serves is modelled. A field of the OpenAI (or vLLM) API that athanor does not implement is
refused with a 400 naming it when it asks for something (`UNSUPPORTED`): a client that asks for log-probabilities
or a JSON schema must not get plain text as if it had them. Fields no API defines are ignored, as other
OpenAI-compatible servers do. Every error is `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
import time
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


UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, 0, False),
    "top_logprobs": (None, 0),
    "n": (None, 1),
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

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if len(stops) > 4:
            raise APIError(400, "stop: at most 4 stop sequences", param="stop")
        return [s for s in stops if s]

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionRequest(_Request):
    prompt: str | list[int]
    echo: bool = False


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


class DeployRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    candidate_dir: str


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(rid: str, model: str, text: str, finish: str | None, prompt_tokens: int,
                    completion_tokens: int) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            "usage": usage(prompt_tokens, completion_tokens)}


def completion_chunk(rid: str, model: str, text: str, finish: str | None) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


def chat_body(rid: str, model: str, text: str, finish: str | None, prompt_tokens: int,
              completion_tokens: int) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish}],
            "usage": usage(prompt_tokens, completion_tokens)}


def chat_chunk(rid: str, model: str, delta: dict[str, str], finish: str | None) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def usage_chunk(rid: str, model: str, obj: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}
