"""`POST /v1/embeddings`: the embedding model, behind the same traffic plugins as chat.

Auth, then the plugins that serve this route (those whose `serves` names it: the rate
limiter, counting requests and input tokens, and admission), then the embedder. Those
plugins see a completion-shaped view of the request (its inputs as prompts, one output
token), which is all they read; the embedder gets the request itself.
"""

from __future__ import annotations

import base64
from typing import Any

from aiohttp import web

from .app_state import INFO, REQUEST_ID, RESPONSE_HEADERS, STATE, AppState
from .auth import Principal, account
from .body import read_json
from .chain import Completion, Reply
from .context import RequestContext, header_map
from .embedding import Embedder, InputTooLong
from .errors import InvalidRequest, ModelNotFound, ModelNotSupported, shown
from .inflight import generating, note_usage, refuse_if_draining
from .protocol import CompletionRequest, EmbeddingRequest, parse_model
from .streaming import dumps

_ORIGINAL = "embeddings.request"


def terminal(embedder: Embedder) -> Any:
    async def embed(ctx: RequestContext) -> Reply:
        req: EmbeddingRequest = ctx.state[_ORIGINAL]
        texts = [req.input] if isinstance(req.input, str) else req.input
        try:
            vecs, counts = await embedder.embed(texts, refuse_over=embedder.max_tokens)
        except InputTooLong as e:
            raise _too_long(e, embedder.max_tokens,
                            listed=not isinstance(req.input, str)) from None
        items = []
        for i, v in enumerate(vecs):
            value: Any = (base64.b64encode(v.astype("<f4").tobytes()).decode()
                          if req.encoding_format == "base64" else v.tolist())
            items.append({"object": "embedding", "index": i, "embedding": value})
        tokens = sum(counts)
        ctx.prompt_tokens = tokens
        return Completion({"object": "list", "data": items, "model": embedder.model_id,
                           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    return embed


def _too_long(e: InputTooLong, limit: int, *, listed: bool) -> InvalidRequest:
    """A text longer than the model reads is a 400, as on OpenAI and vLLM: its vector
    would stand for its first `limit` tokens only (the model cuts it)."""
    where = f"input[{e.index}]" if listed else "the input"
    return InvalidRequest(
        f"This model's maximum context length is {limit} tokens, however you "
        f"requested {e.tokens} tokens in {where}. "
        "Please reduce the input (split a long text into parts).",
        param=f"input[{e.index}]" if listed else "input", code="context_length_exceeded")


async def embeddings(request: web.Request) -> web.StreamResponse:
    st = request.app[STATE]
    info = request[INFO]
    info["route"] = "embeddings"  # counted from here on, refused or not
    refuse_if_draining(st)
    principal = st.auth.for_generation(request.headers)
    info["tenant"] = principal.tenant  # (its line names it, whatever its body)
    with generating(st, request):  # (its body too: a drain waits for what it admitted)
        return await _embeddings(request, st, principal)


async def _embeddings(request: web.Request, st: AppState,
                      principal: Principal) -> web.StreamResponse:
    info = request[INFO]
    data, size = await read_json(request, st.settings.server.max_body_bytes,
                                 account(principal.tenant))
    req = parse_model(EmbeddingRequest, data)
    emb = st.embedder
    if emb is None or st.embed_chain is None or req.model != emb.model_id:
        if not st.terminal.has_model(req.model):
            raise ModelNotFound(req.model)
        # A generation model (listed by `/v1/models`): it exists, and serves no
        # embeddings (vLLM's server: "The model does not support Embeddings API").
        principal.check_model(req.model)
        raise ModelNotSupported(
            f"The model `{shown(req.model)}` does not serve embeddings: it generates "
            "text." + ("" if emb is None or st.embed_chain is None
                       or not principal.may_use(emb.model_id) else
                       f" The embedding model here is `{shown(emb.model_id)}`."))
    principal.check_model(req.model)
    info.update(model=req.model, tenant=principal.tenant)  # (a served name: a metric label)
    if req.dimensions is not None and req.dimensions != emb.dim:
        raise InvalidRequest(f"`dimensions` must be {emb.dim} for this model.",
                             param="dimensions", code="invalid_value")
    texts = [req.input] if isinstance(req.input, str) else req.input
    view = CompletionRequest.model_construct(model=req.model, prompt=list(texts),
                                             max_tokens=1, n=1, stream=False)
    ctx = RequestContext(route="embeddings", request=view, principal=principal,
                         request_id=request[REQUEST_ID],
                         headers=header_map(request.headers.items()),
                         body_bytes=size, state={_ORIGINAL: req})
    request[RESPONSE_HEADERS] = ctx.response_headers  # an error answer carries them
    reply = await st.embed_chain(ctx)
    assert isinstance(reply, Completion)
    note_usage(st, info, reply.body)  # its input tokens, as every route counts its own
    return web.Response(body=dumps(reply.body), content_type="application/json",
                        headers={**ctx.response_headers, **reply.headers})
