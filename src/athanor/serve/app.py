"""The FastAPI app: OpenAI-compatible routes, /health, /metrics and the admin routes (its state: `serve/state.py`).

`create_app(options)` builds it; its lifespan loads the tokenizer, starts the serving worker
(which loads the model and builds the candidate) and stops it again. `run_server` serves it with
uvicorn.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from athanor.engine.candidate_dir import load_candidate_dir
from athanor.errors import AthanorError
from athanor.serve import api, choices
from athanor.serve.admin import check_key, check_token, current_candidate
from athanor.serve.api import APIError
from athanor.serve.frontend import WorkerHandle
from athanor.serve.generation import Generation, GenerationParams
from athanor.serve.messages import Deploy
from athanor.serve.state import ServeOptions, ServerState

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


def _parse(raw: bytes, model: type[M]) -> M:
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON ({e})", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(x) for x in err.get("loc", ())) or None
        raise APIError(400, f"{param or 'body'}: {err.get('msg', 'invalid value')}", param=param) from None


def _generated(gens: list[Generation]) -> int:
    """Completion tokens of all a request's choices (its usage)."""
    return sum(len(g.output_ids) for g in gens)


def _sse(obj: object) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def create_app(options: ServeOptions, state: ServerState | None = None) -> FastAPI:
    """The app; its lifespan starts and stops a new `ServerState`, or leaves a given `state` to its owner."""
    owned = state is None
    state = state or ServerState(options)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if owned:
            await state.start()
        try:
            yield
        finally:
            if owned:
                await state.close()

    app = FastAPI(title="athanor", lifespan=lifespan)
    app.state.server = state

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(404)
    async def _not_found(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(APIError(404, f"no route {request.method} {request.url.path}").body(), status_code=404)

    @app.exception_handler(405)
    async def _bad_method(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(APIError(405, f"{request.method} is not allowed on {request.url.path}").body(),
                            status_code=405)

    def handle() -> WorkerHandle:
        if state.handle is None:
            raise APIError(503, "the server is starting", type="server_error")
        return state.handle

    @app.get("/health")
    async def health() -> JSONResponse:
        h = handle()
        ok = h.is_alive()
        return JSONResponse({"status": "ok" if ok else "restarting", "candidate": h.active_candidate,
                             "worker_pid": h.pid, "in_flight": h.num_in_flight}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    model_card = {"id": options.name, "object": "model", "created": 0, "owned_by": "athanor",
                  "max_model_len": options.max_seq_len}

    @app.middleware("http")
    async def api_key(request: Request, call_next: Any) -> Response:
        # vLLM's --api-key: every /v1 route wants it; health, metrics, version and the admin API (its own token) not.
        if options.api_key and request.url.path.startswith("/v1"):
            try:
                check_key(options.api_key, request.headers.get("authorization"))
            except APIError as e:
                return JSONResponse(e.body(), status_code=e.status)
        return await call_next(request)

    @app.get("/version")
    async def version() -> dict[str, str]:
        from athanor import __version__

        return {"version": __version__}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != options.name:
            raise APIError(404, f"the model {model_id!r} does not exist; this server serves {options.name!r}",
                           param="model", code="model_not_found")
        return model_card

    def params(req: api._Request, prompt_ids: list[int], max_tokens: int | None) -> GenerationParams:
        if req.model != options.name:
            raise APIError(404, f"the model {req.model!r} does not exist; this server serves {options.name!r}",
                           param="model", code="model_not_found")
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        room = options.max_seq_len - len(prompt_ids)
        if room < 1:
            raise APIError(400, f"the prompt is {len(prompt_ids)} tokens; this model's context is "
                                f"{options.max_seq_len} tokens (prompt plus output)", param="messages",
                           code="context_length_exceeded")
        if max_tokens is not None and max_tokens < 1:
            raise APIError(400, f"max_tokens is {max_tokens}; it must be at least 1", param="max_tokens")
        if max_tokens is not None and max_tokens > room:
            raise APIError(400, f"max_tokens is {max_tokens}, but the prompt ({len(prompt_ids)} tokens) leaves room "
                                f"for {room} in the {options.max_seq_len}-token context", param="max_tokens",
                           code="context_length_exceeded")
        vocab_ok = all(0 <= t < 1 << 31 for t in prompt_ids)
        if not vocab_ok:
            raise APIError(400, "prompt: token ids must be non-negative", param="prompt")
        seed = req.seed if req.seed is not None else secrets.randbits(31)
        return GenerationParams(max_tokens or room, req.temperature, req.top_p, seed,
                                tuple(req.stop_strings()), () if req.ignore_eos else tuple(state.tokenizer.stop_ids),
                                req.top_logprobs_wanted())

    async def start(prompt_ids: list[int], p: GenerationParams, n: int, prompt_text: str,
                    prefix: str) -> list[Generation]:
        """The request's `n` choices, started; choice i samples with seed + i."""
        def make(i: int) -> Generation:
            choice = dataclasses.replace(p, seed=(p.seed + i) & ((1 << 62) - 1))
            return Generation(handle(), state.tokenizer, state.metrics, state.request_log, prompt_ids, choice,
                              prompt_text if options.log_prompts else None, prefix)

        return await choices.start(make, n)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> JSONResponse | StreamingResponse:
        req = _parse(await request.body(), api.CompletionRequest)
        if isinstance(req.prompt, str):
            text, ids = req.prompt, list(state.tokenizer.encode(req.prompt))
        else:
            text, ids = "", list(req.prompt)
        gens = await start(ids, params(req, ids, req.max_tokens if req.max_tokens is not None else 16), req.n, text,
                           "cmpl")
        echo = (text or state.tokenizer.decode(ids)) if req.echo else ""
        rid, used = gens[0].request_id, len(ids)
        if not req.stream:
            await choices.complete(gens)
            return JSONResponse(api.completion_body(rid, options.name, [choices.finished(g, state.tokenizer, echo)
                                                                        for g in gens], used, _generated(gens)))

        async def events() -> AsyncIterator[bytes]:
            try:
                for i in range(len(gens)) if echo else ():
                    yield _sse(api.completion_chunk(rid, options.name, echo, None, i))
                async for i, piece in choices.merged(gens):
                    finish = gens[i].finish_reason if piece is None else None
                    yield _sse(api.completion_chunk(rid, options.name, piece or "", finish, i))
                if req.include_usage():
                    yield _sse(api.usage_chunk(rid, options.name, "text_completion", used, _generated(gens)))
            except APIError as e:
                yield _sse(e.body())
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> JSONResponse | StreamingResponse:
        req = _parse(await request.body(), api.ChatCompletionRequest)
        messages = [{"role": msg.role, "content": msg.text()} for msg in req.messages]
        try:
            text = state.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except AthanorError as e:
            raise APIError(400, str(e), param="messages") from None
        except Exception as e:  # the model's own Jinja template refused the conversation
            raise APIError(400, f"messages: the chat template refused them ({e})", param="messages") from None
        ids = list(state.tokenizer.encode(text))
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        gens = await start(ids, params(req, ids, max_tokens), req.n, text, "chatcmpl")
        rid, used = gens[0].request_id, len(ids)
        if not req.stream:
            await choices.complete(gens)
            return JSONResponse(api.chat_body(rid, options.name, [choices.finished(g, state.tokenizer) for g in gens],
                                              used, _generated(gens)))

        async def events() -> AsyncIterator[bytes]:
            try:
                for i in range(len(gens)):
                    yield _sse(api.chat_chunk(rid, options.name, {"role": "assistant", "content": ""}, None, i))
                async for i, piece in choices.merged(gens):
                    if piece is None:
                        yield _sse(api.chat_chunk(rid, options.name, {}, gens[i].finish_reason, i))
                    else:
                        yield _sse(api.chat_chunk(rid, options.name, {"content": piece}, None, i))
                if req.include_usage():
                    yield _sse(api.usage_chunk(rid, options.name, "chat.completion.chunk", used, _generated(gens)))
            except APIError as e:
                yield _sse(e.body())
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    # -- admin ------------------------------------------------------------------------------------
    @app.post("/admin/deploy", status_code=202)
    async def deploy(request: Request) -> JSONResponse:
        check_token(options.admin_token, request.headers.get("authorization"))
        if not options.canaries:
            raise APIError(409, "this server runs without canaries (--no-canary): restart it with the candidate "
                                "(--candidate DIR) to serve another", code="canaries_off")
        req = _parse(await request.body(), api.DeployRequest)
        try:
            candidate = load_candidate_dir(req.candidate_dir)
        except AthanorError as e:
            raise APIError(400, str(e), param="candidate_dir") from None
        busy = state.deployments.in_progress()
        if busy is not None:
            raise APIError(409, f"deployment {busy.id} of {busy.candidate_id} is still in progress ({busy.phase})",
                           code="deploy_in_progress")
        h = handle()
        dep = state.deployments.open(candidate.id, req.candidate_dir, h.active_candidate)
        m = candidate.manifest
        await h.deploy(Deploy(dep.id, candidate.source, m.content_hash, m.parent, m.author, m.description,
                              state.probes()))
        return JSONResponse({"deployment": dep.to_dict()}, status_code=202)

    @app.get("/admin/deployments")
    async def deployments(request: Request) -> dict[str, Any]:
        check_token(options.admin_token, request.headers.get("authorization"))
        return {"object": "list", "active_candidate": handle().active_candidate,
                "data": [d.to_dict() for d in state.deployments.all()]}

    @app.get("/admin/current")
    async def current(request: Request) -> dict[str, Any]:
        check_token(options.admin_token, request.headers.get("authorization"))
        h = handle()
        return current_candidate(h.active_candidate, h.config.candidate_dir)

    @app.get("/admin/deployments/{deployment_id}")
    async def deployment(request: Request, deployment_id: int) -> dict[str, Any]:
        check_token(options.admin_token, request.headers.get("authorization"))
        dep = state.deployments.get(deployment_id)
        if dep is None:
            raise APIError(404, f"no deployment {deployment_id}", param="deployment_id")
        return {"deployment": dep.to_dict()}

    return app


def run_server(options: ServeOptions, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve until interrupted (blocks). The worker starts first, so a model or candidate that cannot be served
    ends the command with its reason (EngineDied) before anything listens."""
    import asyncio

    import uvicorn

    async def serve() -> None:
        state = ServerState(options)
        try:
            await state.start()
            log.info("athanor serve: %s on http://%s:%d", options.name, host, port)
            app = create_app(options, state)
            config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
            await uvicorn.Server(config).serve()
        finally:
            await state.close()

    asyncio.run(serve())
