"""The Starlette app: OpenAI's endpoints over one continuous-batching Engine.

Completions and chat completions submit to the shared Engine, which steps on
a background thread while the app runs, so concurrent clients are decoded in
one batch. Embeddings do not touch the engine or its KV arena: they run the
model's forward pass on a throwaway contiguous cache, on a worker thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from refllm.errors import InvalidInputError
from refllm.models.decoder import DecoderModel
from refllm.runtime.checks import check_prompt
from refllm.runtime.engine import CompletionDelta, Engine
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.llm import LLM
from refllm.runtime.sampling import SamplingParams
from refllm.server import errors, protocol
from refllm.server.access_log import AccessLog
from refllm.server.embeddings import Embedder, encode
from refllm.server.generation import EventStream, Generation, events, unless_disconnected
from refllm.server.guard import AccessGuard
from refllm.server.inputs import RequestInputs
from refllm.server.inside import inside_view
from refllm.server.limits import ServerLimits
from refllm.server.page import page_routes
from refllm.server.protocol import MAX_TOP_LOGPROBS, RequestError, TokenLogprob

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")

@dataclasses.dataclass
class Choice:
    """One completion, gathered whole for a non-streaming answer."""

    text: str = ""
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = dataclasses.field(default_factory=list)


class OpenAIServer:
    """The endpoints, over one engine and (for embeddings) the model behind it."""

    def __init__(self, engine: Engine, model_name: str, *, owns_engine: bool, limits: ServerLimits):
        self.engine = engine
        self.model_name = model_name
        self.tokenizer = engine.tokenizer
        llm = getattr(engine.executor, "llm", None)  # an LLMExecutor's; a scripted one has no model behind it
        self.model: DecoderModel | None = llm.model if isinstance(llm, LLM) else None
        processor = getattr(self.model, "image_processor", None) if engine.info.vision else None
        self.inputs = RequestInputs(engine.tokenizer, engine.info.context_length, model_name, limits, processor)
        self.embedder = Embedder(self.model) if self.model is not None else None
        self.created = int(time.time())
        self._owns_engine = owns_engine

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Step the engine on its background thread while the app runs; warm up an engine of the app's own first."""
        if self._owns_engine:
            await self.engine.executor.warmup()  # the first request should not pay for compiling kernels
        started_here = not self.engine.running_in_background
        self.engine.start()
        try:
            yield
        finally:
            if self._owns_engine:
                self.engine.close()
            elif started_here:
                self.engine.stop()

    # --- models -------------------------------------------------------------------------------------

    def _model_card(self) -> dict[str, Any]:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "refllm"}

    async def health(self, request: Request) -> JSONResponse:
        """Up and serving: for load balancers and scripts that wait for the server to start."""
        return JSONResponse({"status": "ok", "model": self.model_name})

    async def list_models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def retrieve_model(self, request: Request) -> JSONResponse:
        self._check_model(request.path_params["model"])
        return JSONResponse(self._model_card())

    async def model_info(self, request: Request) -> JSONResponse:
        """The served model, what the server can do with it, and the state of its engine and KV arena."""
        info, caps = self.engine.info, self.engine.capabilities
        status = await anyio.to_thread.run_sync(self.engine.executor.status)  # waits for the executor's lock
        config = self.model.config if self.model is not None else None
        chat = self.tokenizer is not None and self.tokenizer.chat_template is not None
        capabilities = {
            "completions": True,
            "chat_completions": chat,
            "streaming": True,
            "embeddings": self.model is not None,
            "logprobs": True,
            "max_top_logprobs": MAX_TOP_LOGPROBS,
            "parallel_sampling": True,
            "prefix_caching": caps.prefix_caching,
            "speculative_decoding": caps.forward_verify,
            "vision": self.inputs.image_processor is not None,  # image_url parts (data URLs) in chat messages
        }
        kv_cache = {
            "block_size": caps.block_size,
            "blocks_total": status.blocks_total,
            "blocks_free": status.blocks_free,
            "live_caches": status.live_caches,
        }
        return JSONResponse(
            {
                "id": self.model_name,
                "object": "model.info",
                "architecture": info.name if info.vision or not config else config.model_type,
                "context_length": info.context_length,
                "vocab_size": info.vocab_size,
                "num_parameters": info.num_parameters,
                "embedding_dimensions": config.hidden_size if config else None,
                "max_batch_size": self.engine.max_batch_size,
                "capabilities": capabilities,
                "kv_cache": kv_cache,
                "engine": dataclasses.asdict(self.engine.stats),
            }
        )

    # --- completions ----------------------------------------------------------------------------------

    async def completions(self, request: Request) -> JSONResponse | EventStream:
        body = await self._read(request)
        prompts = await self.inputs.token_ids(body.get("prompt"), "prompt")
        logprobs = protocol.integer(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)
        params = self._params(body, protocol.integer(body, "max_tokens", 16, 1), logprobs)
        stream, include_usage = self._stream_flags(body)
        generation = request.state.generation = Generation(self.engine, prompts, params, "prompt")
        meta = self._meta("cmpl", "text_completion")
        if stream:
            offsets = [0] * generation.num_choices  # where each choice's next token starts in its text
            chunk = functools.partial(self._completion_chunk, logprobs=logprobs, offsets=offsets)
            return EventStream(events(generation, meta, chunk, include_usage), generation)
        choices = await self._gather(request, generation, logprobs)
        return JSONResponse(
            meta
            | {
                "choices": [
                    {
                        "index": i,
                        "text": c.text,
                        "logprobs": None if logprobs is None else protocol.completion_logprobs(c.logprobs, 0),
                        "finish_reason": c.finish_reason,
                    }
                    for i, c in enumerate(choices)
                ],
                "usage": generation.usage(),
            }
        )

    def _completion_chunk(
        self, i: int, delta: CompletionDelta, logprobs: int | None, offsets: list[int]
    ) -> dict[str, Any] | None:
        entry = self._token_logprob(delta, logprobs)
        if not (delta.text or entry or delta.finish_reason):
            return None
        choice = {"index": i, "text": delta.text, "logprobs": None, "finish_reason": delta.finish_reason}
        if entry:
            choice["logprobs"] = protocol.completion_logprobs([entry], offsets[i])
            offsets[i] += len(entry[0])
        return choice

    # --- chat completions -----------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> JSONResponse | EventStream:
        body = await self._read(request)
        prompt, images = await self.inputs.chat_prompt(*protocol.messages(body))
        logprobs = None
        if protocol.boolean(body, "logprobs"):
            logprobs = protocol.integer(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
        elif body.get("top_logprobs") is not None:
            raise RequestError("top_logprobs needs logprobs set to true", param="top_logprobs")
        caps = self.engine.capabilities
        room = min(self.engine.info.context_length, caps.num_blocks * caps.block_size) - len(prompt)
        max_tokens = protocol.integer(body, "max_completion_tokens", None, 1)
        max_tokens = max_tokens or protocol.integer(body, "max_tokens", max(room, 1), 1)  # default: all there is
        params = self._params(body, max_tokens, logprobs)
        stream, include_usage = self._stream_flags(body)
        generation = request.state.generation = Generation(self.engine, [prompt], params, "messages", images)
        if stream:
            meta = self._meta("chatcmpl", "chat.completion.chunk")
            chunk = functools.partial(self._chat_chunk, logprobs=logprobs)
            opening = [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                for i in range(generation.num_choices)
            ]
            return EventStream(events(generation, meta, chunk, include_usage, opening), generation)
        choices = await self._gather(request, generation, logprobs)
        return JSONResponse(
            self._meta("chatcmpl", "chat.completion")
            | {
                "choices": [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": c.text},
                        "logprobs": None if logprobs is None else protocol.chat_logprobs(c.logprobs),
                        "finish_reason": c.finish_reason,
                    }
                    for i, c in enumerate(choices)
                ],
                "usage": generation.usage(),
            }
        )

    def _chat_chunk(self, i: int, delta: CompletionDelta, logprobs: int | None) -> dict[str, Any] | None:
        entry = self._token_logprob(delta, logprobs)
        if not (delta.text or entry or delta.finish_reason):
            return None
        return {
            "index": i,
            "delta": {"content": delta.text} if delta.text else {},
            "logprobs": protocol.chat_logprobs([entry]) if entry else None,
            "finish_reason": delta.finish_reason,
        }

    # --- embeddings -----------------------------------------------------------------------------------

    async def embeddings(self, request: Request) -> JSONResponse:
        """Mean-pooled final hidden states, L2-normalised, one vector per input."""
        body = await self._read(request)
        if self.model is None:
            raise RequestError(f"the model {self.model_name!r} does not serve embeddings", param="model")
        inputs = await self.inputs.token_ids(body.get("input"), "input")
        context_length = self.engine.info.context_length
        for ids in inputs:
            try:
                check_prompt(ids, self.engine.info.vocab_size)
            except InvalidInputError as error:
                raise RequestError(str(error), param="input") from None
            if len(ids) > context_length:
                raise RequestError(
                    f"an input of {len(ids)} tokens is past the context length {context_length}",
                    param="input",
                    code="context_length_exceeded",
                )
        encoding = body.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            raise RequestError("encoding_format must be 'float' or 'base64'", param="encoding_format")
        hidden_size = self.model.config.hidden_size
        if protocol.integer(body, "dimensions", hidden_size, 1) != hidden_size:
            raise RequestError(f"this model's embeddings have {hidden_size} dimensions", param="dimensions")
        vectors = await unless_disconnected(request, self.embedder.embed(inputs))  # cancelled if the client goes
        data = [{"object": "embedding", "index": i, "embedding": encode(v, encoding)} for i, v in enumerate(vectors)]
        tokens = sum(len(ids) for ids in inputs)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": self.model_name, "usage": usage})

    async def inside(self, request: Request) -> JSONResponse:
        """The web page's panel: inside the model as it wrote an answer (``refllm/server/inside.py``)."""
        return JSONResponse(await inside_view(self, await self._read(request)))

    # --- shared ----------------------------------------------------------------------------------------

    async def _read(self, request: Request) -> dict[str, Any]:
        """The body (within the size and time limits) as a JSON object, naming this server's model, with no field
        the server cannot honour; parsed on a worker thread."""
        body = await self.inputs.body(request)
        self._check_model(protocol.string(body, "model"))
        protocol.check_supported(body)
        return body

    def _check_model(self, name: str) -> None:
        if name != self.model_name:
            raise RequestError(
                f"the model {name!r} does not exist; this server serves {self.model_name!r}",
                param="model",
                status=404,
                code="model_not_found",
            )

    def _params(self, body: dict[str, Any], max_tokens: int, logprobs: int | None) -> SamplingParams:
        max_n, vocab_size = self.engine.max_batch_size, self.engine.info.vocab_size
        return protocol.sampling_params(
            body, max_tokens=max_tokens, logprobs=logprobs, max_n=max_n, vocab_size=vocab_size
        )

    def _meta(self, prefix: str, kind: str) -> dict[str, Any]:
        """The fields every completion object and chunk starts with."""
        created = int(time.time())
        return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": created, "model": self.model_name}

    @staticmethod
    def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
        """(stream, stream_options.include_usage)."""
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise RequestError("stream_options must be an object", param="stream_options")
        return protocol.boolean(body, "stream"), protocol.boolean(options, "include_usage")

    def _token_logprob(self, delta: CompletionDelta, logprobs: int | None) -> TokenLogprob | None:
        """The delta's token, its logprob and its top alternatives, as text; None unless logprobs were asked for."""
        if logprobs is None or delta.token_id is None:
            return None
        top = [(self._token_text(t), logprob) for t, logprob in delta.top_logprobs]
        return self._token_text(delta.token_id), delta.logprob, top

    def _token_text(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.tokenizer is None else self.tokenizer.decode([token_id])

    async def _gather(self, request: Request, generation: Generation, logprobs: int | None) -> list[Choice]:
        """Every choice whole, for a non-streaming answer; all cancelled if the client goes away first."""
        choices = [Choice() for _ in range(generation.num_choices)]

        async def gather() -> None:
            async for i, delta in generation.deltas():
                choices[i].text += delta.text
                choices[i].finish_reason = delta.finish_reason or choices[i].finish_reason
                entry = self._token_logprob(delta, logprobs)
                if entry:
                    choices[i].logprobs.append(entry)

        try:
            await unless_disconnected(request, gather())
        finally:
            generation.cancel_soon()
        return choices


# --- the app -------------------------------------------------------------------------------------------


def create_app(
    engine_or_model: Engine | DecoderModel,
    *,
    model_name: str | None = None,
    max_batch_size: int | None = None,
    limits: ServerLimits | None = None,
    api_key: str | None = None,
    allowed_hosts: Sequence[str] | None = LOOPBACK_HOSTS,
    cors_origins: Sequence[str] = (),
) -> Starlette:
    """An OpenAI-compatible app over an Engine, or over a model (the app then builds and owns its Engine).

    ``model_name`` is the id clients ask for (default: the executor's model name, the
    architecture); ``max_batch_size`` caps the sequences decoded together (over a model
    only). The engine steps on its background thread while the app runs. ``limits``
    bound what one request may ask (``ServerLimits()`` by default); ``api_key``,
    ``allowed_hosts`` (None: any) and ``cors_origins`` say who may ask
    (``refllm/server/guard.py``).
    """
    if isinstance(engine_or_model, Engine):
        if max_batch_size is not None:
            raise InvalidInputError("max_batch_size is for an app over a model; an Engine has its own")
        engine, owns_engine = engine_or_model, False
    else:
        executor = LLMExecutor(LLM(engine_or_model))
        engine, owns_engine = Engine(executor, engine_or_model.tokenizer, max_batch_size=max_batch_size), True
    limits = limits or ServerLimits()
    server = OpenAIServer(engine, model_name or engine.info.name, owns_engine=owns_engine, limits=limits)
    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/models", server.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", server.retrieve_model, methods=["GET"]),
        Route("/v1/model/info", server.model_info, methods=["GET"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/embeddings", server.embeddings, methods=["POST"]),
        Route("/v1/inside", server.inside, methods=["POST"]),
        *page_routes(),
    ]
    handlers = {
        RequestError: errors.request_error,
        HTTPException: errors.http_error,
        ClientDisconnect: errors.client_gone,
        Exception: errors.server_error,
    }
    guard = Middleware(AccessGuard, api_key=api_key, allowed_hosts=allowed_hosts, cors_origins=cors_origins)
    cors = [Middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                       allow_headers=["Authorization", "Content-Type"])] if cors_origins else []  # fmt: skip
    middleware = [Middleware(AccessLog), *cors, guard]
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=server.lifespan, middleware=middleware)
    app.state.limits = limits  # the connection limits are the server's: serve() and BackgroundServer read them here
    return app
