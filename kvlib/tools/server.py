"""``python -m kvlib server``: an OpenAI-compatible HTTP server on the continuous-batching engine.

One :class:`~kvlib.tools.engine_loop.EngineLoop` thread steps the engine (a paged pool with prefix caching);
the event loop of FastAPI and uvicorn, the stack vLLM's own server uses, turns HTTP requests into engine
requests and their tokens back into OpenAI's JSON and server-sent events. Endpoints: ``/v1/completions`` (a
poem's start in, its continuation out), ``/v1/chat/completions`` (the last user message as the start),
``/v1/models``, ``/health`` (503 until the model is loaded), ``/tokenize``, ``/detokenize`` and Prometheus
``/metrics`` (vLLM's names with a ``kvlib:`` prefix). A full server answers 503 with ``Retry-After``; a bad
parameter 400 in OpenAI's error shape; a client that goes away has its request aborted and its blocks freed.
"""

import asyncio
import time
import uuid

from ..sampling import Sampling
from ..serving import Engine, Request
from .engine_loop import Busy, EngineLoop, Ticket
from .openai_api import ApiError, Params, StopText, params_of, prompt_of

SERVED = ("tang-char", "tang-bpe")
PREFILL_WAIT_S = 30.0  # how long the later choices of a request wait for the first one's prefill


def metrics_of(registry):
    """The server's Prometheus metrics, named as vLLM's with the ``kvlib:`` prefix."""
    from prometheus_client import Counter, Gauge, Histogram

    seconds = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
    return {
        "running": Gauge("kvlib:num_requests_running", "requests in the engine's batch", registry=registry),
        "waiting": Gauge("kvlib:num_requests_waiting", "requests queued for the engine", registry=registry),
        "kv_usage": Gauge("kvlib:kv_cache_usage_perc", "share of the KV pool's blocks in use (0-1)", registry=registry),
        "ttft": Histogram("kvlib:time_to_first_token_seconds", "from arrival to the first token", buckets=seconds,
                          registry=registry),
        "itl": Histogram("kvlib:inter_token_latency_seconds", "between two tokens of one request", buckets=seconds,
                         registry=registry),
        "e2e": Histogram("kvlib:e2e_request_latency_seconds", "from arrival to the last token", buckets=seconds,
                         registry=registry),
        "prompt": Counter("kvlib:prompt_tokens", "prompt tokens of admitted requests", registry=registry),
        "generation": Counter("kvlib:generation_tokens", "tokens written", registry=registry),
        "cached": Counter("kvlib:prefix_cache_hits", "prompt tokens found in the pool instead of computed",
                          registry=registry),
        "success": Counter("kvlib:request_success", "requests answered, by finish reason", ["finished_reason"],
                           registry=registry),
        "rejected": Counter("kvlib:request_rejected", "requests turned away because the server was full",
                            registry=registry),
    }


def create_app(model_name: str = "tang-char", *, num_blocks: int = 256, kv_block_size: int = 16,
               max_num_seqs: int = 32, max_in_flight: int = 64, api_key: str | None = None, data_dir=None):
    """The FastAPI app; the model loads when the app starts (``/health`` answers 503 until then)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request as HttpRequest
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from prometheus_client import CollectorRegistry, generate_latest

    if model_name not in SERVED:
        raise ValueError(f"model must be one of {', '.join(SERVED)}, got {model_name!r}")
    registry = CollectorRegistry()
    metrics = metrics_of(registry)
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app):
        from .loading import DATA_DIR, load_pretrained

        model, tok = await asyncio.to_thread(load_pretrained, model_name, data_dir or DATA_DIR)
        engine = Engine(model, num_blocks, kv_block_size=kv_block_size, max_num_seqs=max_num_seqs,
                        enable_prefix_caching=True)
        state.update(model=model, tok=tok, engine=engine, loop=EngineLoop(engine, max_in_flight).start())
        yield
        state["loop"].stop()

    app = FastAPI(title="kvlib", lifespan=lifespan, docs_url=None, redoc_url=None)  # no docs from a CDN

    @app.exception_handler(ApiError)
    async def api_error(_, err: ApiError):
        headers = {"Retry-After": "1"} if err.status == 503 else None
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    @app.middleware("http")
    async def check_key(http: HttpRequest, call_next):
        if api_key and http.url.path.startswith("/v1") and http.headers.get("authorization") != f"Bearer {api_key}":
            err = ApiError(401, "a valid API key is needed: Authorization: Bearer KEY", kind="authentication_error",
                           code="invalid_api_key")
            return JSONResponse(err.body(), status_code=401)
        return await call_next(http)

    def ready():
        if "loop" not in state:
            raise ApiError(503, "the model is still loading", kind="server_error")
        return state["loop"], state["tok"]

    async def body_of(http: HttpRequest) -> dict:
        try:
            return await http.json()
        except ValueError:
            raise ApiError(400, "the request body is not valid JSON") from None

    def check_model_name(body):
        if isinstance(body, dict) and body.get("model") not in (None, model_name):
            raise ApiError(404, f"the model {body.get('model')!r:.40} does not exist; this server serves "
                                f"{model_name!r}", "model", code="model_not_found")

    @app.get("/health")
    async def health():
        ready()
        return {}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "kvlib",
                                            "max_model_len": state["model"].config.block_size if state else None}]}

    @app.post("/tokenize")
    async def tokenize(http: HttpRequest):
        _, tok = ready()
        body = await body_of(http)
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object such as {\"prompt\": \"床前\"}")
        ids = prompt_of(body, tok, chat="messages" in body)
        return {"tokens": ids, "count": len(ids), "max_model_len": state["model"].config.block_size}

    @app.post("/detokenize")
    async def detokenize(http: HttpRequest):
        _, tok = ready()
        body = await body_of(http)
        ids = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                and 0 <= t < tok.vocab_size for t in ids):
            raise ApiError(400, f"tokens: must be a list of token ids in [0, {tok.vocab_size})", "tokens")
        return {"prompt": tok.decode(ids)}

    @app.get("/metrics")
    async def scrape():
        if "engine" in state:
            engine = state["engine"]
            metrics["running"].set(len(engine.running))
            metrics["waiting"].set(len(engine.waiting))
            used = engine.cache.used_blocks()
            metrics["kv_usage"].set(used / (used + engine.cache.num_free_blocks))
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    async def submit(params: Params) -> list[Ticket]:
        """The request's ``n`` choices in the engine. The first goes alone: once its prefill has run, the prompt's
        full blocks are in the pool, and the other choices find them there (prefix caching) instead of computing
        the prompt again."""
        loop, aio = state["loop"], asyncio.get_running_loop()
        tickets = []
        sampling = Sampling(params.temperature, params.top_k, params.top_p)
        try:
            for i in range(params.n):
                if i == 1:
                    await asyncio.wait_for(tickets[0].started.wait(), PREFILL_WAIT_S)
                tickets.append(loop.submit(lambda rid, i=i: Request(
                    rid, params.prompt_ids, params.max_tokens, sampling=sampling, seed=(params.seed + i) % 2**63,
                    stop_token_ids=params.stop_token_ids, banned=params.banned, logprobs=params.logprobs), aio))
        except (Busy, asyncio.TimeoutError) as err:
            for t in tickets:
                loop.abort(t.id)
            metrics["rejected"].inc()
            raise ApiError(503, f"the server is full ({err}); try again shortly", kind="server_error",
                           code="server_overloaded") from None
        metrics["prompt"].inc(len(params.prompt_ids) * params.n)
        return tickets

    async def follow(index: int, ticket: Ticket, params: Params, tok, out: asyncio.Queue):
        """Read one choice's events; put (index, text, tokens, logprobs, finish_reason, cached) pieces on ``out``."""
        text, last = StopText(tok, params.stop, params.stop_token_ids), None
        while True:
            event = await ticket.events.get()
            if event.error is not None:
                await out.put((index, ApiError(400, str(event.error), "prompt")))
                return
            now = time.perf_counter()
            if event.tokens:
                metrics["generation"].inc(len(event.tokens))
                if last is None:
                    metrics["ttft"].observe(now - ticket.submitted)
                    metrics["cached"].inc(event.cached_tokens)
                else:
                    for _ in event.tokens:
                        metrics["itl"].observe((now - last) / len(event.tokens))
                last = now
            pieces = "".join(text.push(t) for t in event.tokens)
            finish = event.finish_reason
            if text.stopped and finish is None:        # a stop string: the rest is not wanted
                state["loop"].abort(ticket.id)
                finish = "stop"
            if finish is not None:
                pieces += text.finish()
                finish = "stop" if finish == "abort" and text.stopped else finish
                metrics["e2e"].observe(now - ticket.submitted)
                metrics["success"].labels(finished_reason=finish).inc()
            await out.put((index, pieces, event.tokens, event.logprobs, finish, event.cached_tokens))
            if finish is not None:
                return

    def shaped_logprobs(tok, tokens, logprobs, chat: bool, top: int):
        if chat:
            return [{"token": tok.decode([t]), "logprob": lp[t], "bytes": list(tok.decode([t]).encode()),
                     "top_logprobs": [{"token": tok.decode([k]), "logprob": v, "bytes": list(tok.decode([k]).encode())}
                                      for k, v in sorted(lp.items(), key=lambda kv: -kv[1])[:top]]}
                    for t, lp in zip(tokens, logprobs)]
        return {"tokens": [tok.decode([t]) for t in tokens], "token_logprobs": [lp[t] for t, lp in zip(tokens, logprobs)],
                "top_logprobs": [{tok.decode([k]): v for k, v in lp.items()} for lp in logprobs]}

    async def answer(http: HttpRequest, chat: bool):
        loop, tok = ready()
        body = await body_of(http)
        check_model_name(body)
        params = params_of(body, tok, state["model"].config.block_size, chat)
        tickets = await submit(params)
        out: asyncio.Queue = asyncio.Queue()
        readers = [asyncio.create_task(follow(i, t, params, tok, out)) for i, t in enumerate(tickets)]
        ident, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        answered: set[int] = set()   # the choices whose last event was read

        def stop_all():
            """Every choice still running is aborted (its client went away, or the answer is complete)."""
            for task in readers:
                task.cancel()
            for i, t in enumerate(tickets):
                if i not in answered:
                    loop.abort(t.id)
                    metrics["success"].labels(finished_reason="abort").inc()

        def usage(tokens_written, cached):
            return {"prompt_tokens": len(params.prompt_ids), "completion_tokens": tokens_written,
                    "total_tokens": len(params.prompt_ids) + tokens_written,
                    "prompt_tokens_details": {"cached_tokens": cached}}

        async def pieces():
            left, cached = len(tickets), 0
            while left:
                item = await out.get()
                if isinstance(item[1], ApiError):
                    raise item[1]
                cached = max(cached, item[5])
                if item[4] is not None:
                    left -= 1
                    answered.add(item[0])
                yield item, cached

        if not params.stream:
            texts, counts, logs, finishes, cached = [""] * params.n, [0] * params.n, [[] for _ in tickets], [None] * params.n, 0
            watcher = asyncio.create_task(watch_disconnect(http, stop_all))
            try:
                async for (i, piece, tokens, lps, finish, _), cached in pieces():
                    texts[i] += piece
                    counts[i] += len(tokens)
                    logs[i].append((tokens, lps))
                    finishes[i] = finish or finishes[i]
            finally:
                watcher.cancel()
                stop_all()
            choices = []
            for i in range(params.n):
                tokens = [t for ts, _ in logs[i] for t in ts]
                lps = [lp for _, ls in logs[i] for lp in ls]
                logprobs = shaped_logprobs(tok, tokens, lps, chat, params.logprobs) if params.logprobs else None
                if chat:
                    choices.append({"index": i, "message": {"role": "assistant", "content": texts[i]},
                                    "logprobs": {"content": logprobs} if logprobs else None, "finish_reason": finishes[i]})
                else:
                    choices.append({"index": i, "text": texts[i], "logprobs": logprobs, "finish_reason": finishes[i]})
            return {"id": ident, "object": kind, "created": created, "model": model_name, "choices": choices,
                    "usage": usage(sum(counts), cached)}

        async def events():
            import json

            written, cached = 0, 0
            head = {"id": ident, "object": f"{kind}.chunk" if chat else kind, "created": created, "model": model_name}
            try:
                if chat:
                    for i in range(params.n):
                        first = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}
                        yield f"data: {json.dumps(head | {'choices': [first]}, ensure_ascii=False)}\n\n"
                async for (i, piece, tokens, lps, finish, _), cached in pieces():
                    written += len(tokens)
                    logprobs = shaped_logprobs(tok, tokens, lps, chat, params.logprobs) if params.logprobs else None
                    if chat:
                        choice = {"index": i, "delta": {"content": piece} if piece else {},
                                  "logprobs": {"content": logprobs} if logprobs else None, "finish_reason": finish}
                    else:
                        choice = {"index": i, "text": piece, "logprobs": logprobs, "finish_reason": finish}
                    yield f"data: {json.dumps(head | {'choices': [choice]}, ensure_ascii=False)}\n\n"
                if params.include_usage:
                    yield f"data: {json.dumps(head | {'choices': [], 'usage': usage(written, cached)})}\n\n"
                yield "data: [DONE]\n\n"
            except ApiError as err:
                yield f"data: {json.dumps(err.body())}\n\n"
            finally:
                stop_all()   # the client went away, or the answer is complete: nothing is left running

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(http: HttpRequest):
        return await answer(http, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HttpRequest):
        return await answer(http, chat=True)

    app.state.kvlib = state
    return app


async def watch_disconnect(http, on_disconnect, every: float = 0.1) -> None:
    """Call ``on_disconnect()`` once the client of ``http`` has gone away (checked every ``every`` seconds)."""
    while not await http.is_disconnected():
        await asyncio.sleep(every)
    on_disconnect()


def serve(model_name: str = "tang-char", host: str = "127.0.0.1", port: int = 8000, **options) -> None:
    """Run the server until interrupted (uvicorn, one process: the engine's thread owns the model)."""
    import uvicorn

    uvicorn.run(create_app(model_name, **options), host=host, port=port, log_level="warning")


def serve_command(args) -> None:
    """``python -m kvlib server``'s body: check the extra is installed, warn about an open address, serve."""
    import sys

    import fastapi, prometheus_client, uvicorn  # noqa: F401, E401  (the server extra: ImportError names what is missing)

    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"serving on {args.host}: every machine that can reach it may call it; --api-key KEY asks for a key",
              file=sys.stderr)
    print(f"kvlib server: {args.model} on http://{args.host}:{args.port}/v1 (Ctrl+C stops it)", flush=True)
    serve(args.model, args.host, args.port, max_in_flight=args.max_in_flight, api_key=args.api_key)
