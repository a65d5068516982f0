"""The sanitizer: first in the chain, it protects the engine and the cache from hostile
or careless input and decides what is sensitive.

Order of work: limits (413/400 naming the param) -> normalization of every text ->
detectors over each normalized text (a message's adjacent text parts read joined too, with
nothing between them: a value split over parts is found, however they are joined), and
over consecutive texts of a conversation for a card split between them -> actions.
`block` stops with a deliberately vague 400; `redact` replaces matches with typed
placeholders before anyone else sees them; `flag` marks the request sensitive (the cache
neither reads nor writes it). Any injection detection, whatever its action, keeps the
answer out of the cache.

Detectors read each text's canonical form as a reader reads it (`proxy.text.scanned`:
a tab as a space, any script's digits as digits, no marks over ASCII); the texts go on
folded (`proxy.text.fold`: look-alikes and invisible characters, the layout kept), with
any redaction made in them. The cache keys on `ctx.key_request` (folded, redacted; the
cache takes its own canonical form of it); the engine gets `ctx.request`, folded or
original as configured (redacted either way). Matched text
is never logged or counted; metrics carry only detector and action.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import json
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal, TypeVar

from prometheus_client import Counter
from pydantic import BaseModel

from proxy.auth import keyed_digest
from proxy.chain import BasePlugin, Next, Reply, Services
from proxy.context import RequestContext, Screen, key_apart, screened_values
from proxy.errors import InvalidRequest
from proxy.jsonbody import loads_finite
from proxy.protocol import (
    SCHEMA_MAPS,
    ChatCompletionRequest,
    ChatTool,
    CompletionRequest,
    JsonSchemaFormat,
    NamedToolChoice,
    RefusalPart,
    TextPart,
    ToolCall,
)
from proxy.tasks import OFF_LOOP_CHARS
from proxy.telemetry import get_logger
from proxy.text import fold, scanned, scanned_places

from .config import SanitizerConfig
from .credentials import BLANK_LETTERS, secrets_across, windows_around
from .detectors import (
    BUILTIN,
    INJECTION,
    Detector,
    Span,
    card_across,
    custom,
    forget,
    quiet_ones,
)

log = get_logger("weir.sanitizer")


#: A schema's prose: shown to the model, not held to (redacted like message text).
_SCHEMA_PROSE = frozenset({"description", "title", "$comment", "examples", "default"})
#: A schema's data that the answer must match as it is: values (`enum`, `const`),
#: property names (`required`, `dependentRequired`).
_SCHEMA_HELD = frozenset({"enum", "const", "required", "dependentRequired", "type"})


def schema_names(schema: Any) -> list[str]:
    """The strings of a JSON schema that the answer must give back or match as they are:
    its values (`enum`, `const`), its property and definition names, its patterns and
    other keyword values; not its prose (`_SCHEMA_PROSE`)."""
    out: list[str] = []
    stack: list[tuple[Any, bool]] = [(schema, False)]  # (node, data: every string held)
    while stack:
        node, data = stack.pop()
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, list):
            stack.extend((v, data) for v in node)
        elif isinstance(node, dict):
            for k, v in node.items():
                if data:
                    stack += [(k, True), (v, True)]
                elif k in _SCHEMA_PROSE:
                    continue
                elif k in SCHEMA_MAPS and isinstance(v, dict):
                    out += list(v)
                    stack.extend((s, False) for s in v.values())
                else:
                    stack.append((v, k in _SCHEMA_HELD))
    return out


# A request whose texts the detectors read hold `OFF_LOOP_CHARS` characters or more (its
# messages' or prompts', its tool definitions', its response format's schema, the texts
# kept or sent beside them: all that `limits.max_total_chars` counts) is read in the
# sanitizer's own thread, not on the event loop.


class SanitizerPlugin(BasePlugin[SanitizerConfig]):
    name: ClassVar[str] = "sanitizer"
    Config = SanitizerConfig
    placement: ClassVar[Literal["first", "any", "last"]] = "first"
    before: ClassVar[tuple[str, ...]] = ("cache",)

    def __init__(self, config: SanitizerConfig, services: Services) -> None:
        super().__init__(config, services)
        self.cfg = config
        actions = config.detectors.model_dump()
        #: the actions of the detectors that also read across two texts (`_across`)
        self.across_actions: dict[str, str] = {n: actions[n] for n in ("card", "secret")}
        self.detectors: list[tuple[Detector, str]] = [
            (d, actions[name]) for name, d in BUILTIN.items() if actions[name] != "off"
        ]
        if actions["injection"] != "off":
            self.detectors.append((INJECTION, actions["injection"]))
        self.detectors += [(custom(c.name, c.pattern), c.action) for c in config.custom
                           if c.action != "off"]
        #: the detectors that still run on a text, by those `quiet_ones` answers for
        #: (filled as met: a few combinations of its clauses)
        self._running: dict[frozenset[Detector], tuple[
            list[tuple[Detector, str]], list[tuple[Detector, str]]]] = {}
        self.detections = Counter(
            "weir_sanitizer_detections_total", "Sanitizer detections.",
            ["detector", "action"], registry=services.metrics.registry)
        self._clean: dict[str, None] = {}  # see _remember_clean
        self._clean_lock = threading.Lock()
        # One thread: long prompts are read one at a time, off the event loop.
        self._reading_thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="weir-sanitize")
        # What a route keeps of a request (`_screen`: stored input items, metadata,
        # reasoning items) hides what a `block` detector finds as a `redact` one's: a
        # background response the chain refused is stored `failed`, its input with it,
        # and the text it was refused for must not stay there (nor a blocked value in
        # texts the chain never reads). The same detectors, with those actions.
        self._redacts = any(action in ("redact", "block") for _, action in self.detectors)
        #: the names of the `block` detectors (what fires in texts beside the prompt)
        self._blocks = frozenset({d.name for d, a in self.detectors if a == "block"}
                                 | {n for n, a in self.across_actions.items() if a == "block"})
        self._hider = copy.copy(self)
        self._hider.detectors = [(d, _hidden(a)) for d, a in self.detectors]
        self._hider.across_actions = {n: _hidden(a) for n, a in self.across_actions.items()}
        self._hider._running = {}

    #: The last request `_check_limits` passed (weakly), the route's aside characters
    #: then, and its count (read on the event loop only).
    _limits_memo: tuple[weakref.ref[Any], int, int] | None = None

    async def close(self) -> None:
        self._reading_thread.shutdown(wait=False, cancel_futures=True)
        await super().close()

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        chars = self._check_limits(ctx)
        fired: dict[str, str] = {}
        req = ctx.request
        if chars < OFF_LOOP_CHARS:
            key, engine, named, blocked, aside = self._read(ctx, fired)
        else:  # (`fired` is read again here only once the thread is done with it)
            key, engine, named, blocked, aside = await asyncio.get_running_loop().run_in_executor(
                self._reading_thread, self._read, ctx, fired)
        for name in blocked:  # (as a prompt is; no flag)
            fired[name] = "block"
        for name, action in fired.items():
            self.detections.labels(name, action).inc()
            ctx.flags.add(name)
            if action == "flag" or named:
                ctx.sensitive = True
        if fired:
            log.info("sanitizer detections", detectors=sorted(fired), route=ctx.route)
        if "block" in fired.values():
            raise InvalidRequest(self.cfg.block_message, code="content_policy_violation")
        ctx.key_request = key
        if ctx.sent is None:
            ctx.sent = req
        ctx.request = engine
        if "redact" in fired.values():
            ctx.screen = self._screen
        if self._redacts:
            ctx.screen_aside = self._screen
            ctx.aside_said = aside
        return await call_next(ctx)

    def _read(self, ctx: RequestContext, fired: dict[str, str],
              ) -> tuple[ChatCompletionRequest | CompletionRequest,
                         ChatCompletionRequest | CompletionRequest, bool, list[str],
                         dict[str, str] | None]:
        """The request's texts read: (the request for the cache key, the request that
        goes on, whether a name held something, the `block` detectors that fired in the
        caller's texts, the route's `aside_metadata` screened), what fired in them in
        `fired`. Touches nothing of `ctx` (it
        may run in the reading thread)."""
        req = ctx.request
        key: ChatCompletionRequest | CompletionRequest
        engine: ChatCompletionRequest | CompletionRequest
        named = False  # a name held something: it cannot be redacted, so it is flagged
        if isinstance(req, ChatCompletionRequest):
            key, engine = self._chat(req, fired)
            named = self._names(req, fired)
        else:
            key, engine = self._completion(req, fired)
        blocked, engine, aside = self._caller_texts(engine, ctx.aside_metadata)
        return key, engine, named, blocked, aside

    def _caller_texts(self, req: ChatCompletionRequest | CompletionRequest,
                      aside: dict[str, str] | None = None,
                      ) -> tuple[list[str], ChatCompletionRequest | CompletionRequest,
                                 dict[str, str] | None]:
        """The caller's texts that no prompt holds but that go on with it (to an upstream
        engine, which may store them: `metadata`'s keys and values, `user`,
        `safety_identifier`, `prompt_cache_key`), read once: `req` with them screened as
        what a route keeps is (`_screen`), and the `block` detectors that fire in
        `metadata` or in what the route keeps beside the prompt (`aside`: a Response's
        metadata, given back screened as kept: one read for both, so what the route
        keeps redacted is what blocks), for which the request is refused as one whose
        prompt holds the same (a blocked value was only hidden there, and went on to the
        store and the upstream as a placeholder). Never read for flags (an app that sends its user's
        address as `user` would keep every request of it out of the cache). An
        identifier is neither refused nor kept out of the cache: it goes on as its hash
        where anything fires in it (an app that sends its user's address as `user` is
        not refused every request where `email` blocks)."""
        if not self._redacts:
            return [], req, None
        fired: dict[str, str] = {}
        update: dict[str, Any] = {}
        for field in _CALLER_FIELDS:
            value = getattr(req, field, None)
            if isinstance(value, str) and value and self._screen([value])[0] != value:
                # an identifier: its hash, as OpenAI asks apps to send one (a placeholder
                # made every caller whose id is an address one user upstream)
                update[field] = keyed_digest(value, self.services.gateway_secret(),
                                             "identifier")
        metadata = _own_metadata(req)
        if metadata and (values := screened_values(
                dict(metadata), self._reading(fired))) != metadata:
            update["metadata"] = values
        said = screened_values(dict(aside), self._reading(fired)) if aside else aside
        blocked = [name for name in fired if name in self._blocks]
        return blocked, req.model_copy(update=update) if update else req, said

    def _reading(self, fired: dict[str, str]) -> Screen:
        """`_screen`, with what fires in the texts it reads fired in `fired` (each
        detector by its name, as the texts a route keeps read it: `_hidden`)."""
        def screen(texts: list[str], *, json: bool = False,
                   speakers: list[str] | None = None) -> list[str]:
            return self._hider._screened_texts(texts, json=json, speakers=speakers,
                                               fired=fired)
        return screen

    def screen_aside(self) -> Screen | None:
        return self._screen if self._redacts else None

    def screen_thread(self, ctx: RequestContext) -> concurrent.futures.Executor | None:
        try:
            chars = self._check_limits(ctx)
        except InvalidRequest:  # (refused unread: nothing to screen)
            return None
        return self._reading_thread if chars >= OFF_LOOP_CHARS else None

    def refuse_ahead(self, ctx: RequestContext) -> None:
        self._check_limits(ctx)  # (what `__call__` refuses before reading a text)

    def _screen(self, texts: list[str], *, json: bool = False,
                speakers: list[str] | None = None) -> list[str]:
        """Texts of the request, in order, as the chain passed them on
        (`RequestContext.screen`): read as one conversation (a card split between two is
        found, or between one speaker's two where `speakers` says who wrote each), each
        redacted where a `redact` or a `block` detector fires, else as it came; JSON
        texts (call arguments) each with its strings read."""
        return self._hider._screened_texts(texts, json=json, speakers=speakers)

    def _screened_texts(self, texts: list[str], *, json: bool,
                        speakers: list[str] | None,
                        fired: dict[str, str] | None = None) -> list[str]:
        fired = {} if fired is None else fired
        if json:
            return [self._json_text(t, fired) for t in texts]
        said = self._conversation(texts, fired, speakers)
        return [key if key != self._fold(text) else text
                for text, (key, _) in zip(texts, said, strict=True)]

    # ------------------------------------------------------------------- limits

    def _check_limits(self, ctx: RequestContext) -> int:
        """Refuse a request past the limits; else the characters the detectors will read
        (its messages' or prompts', its tools', its schema's, its caller's texts). A
        route that asks `screen_thread` and `refuse_ahead` first counted a request three
        times (a chat's every part and extra field, ~8 us each): the count of the last
        request passed is kept (by a weak reference: never the request itself) and
        given again for the same request."""
        memo = self._limits_memo
        if (memo is not None and memo[0]() is ctx.request
                and memo[1] == ctx.aside_chars):
            ctx.output_ceiling = self.cfg.limits.max_tokens
            return memo[2]
        chars = self._count_limits(ctx)
        self._limits_memo = (weakref.ref(ctx.request), ctx.aside_chars, chars)
        return chars

    def _count_limits(self, ctx: RequestContext) -> int:
        lim = self.cfg.limits
        req = ctx.request
        limit = req.output_limit
        # Only a limit the caller named is refused; a default (completions' 16) is cut
        # down to the ceiling like no limit at all.
        if (limit is not None and limit > lim.max_tokens
                and req.output_limit_param in req.model_fields_set):
            param = req.output_limit_param
            raise InvalidRequest(f"`{param}` may be at most {lim.max_tokens}.", param=param,
                                 code="integer_above_max_value")
        ctx.output_ceiling = lim.max_tokens  # for a request that names no limit
        if req.n > lim.max_n:
            raise InvalidRequest(f"`n` may be at most {lim.max_n}.", param="n",
                                 code="integer_above_max_value")
        stops = req.stops
        if len(stops) > lim.max_stop:
            raise InvalidRequest(f"At most {lim.max_stop} stop sequences are allowed.",
                                 param="stop", code="array_above_max_length")
        if any(len(s) > lim.max_stop_chars for s in stops):
            raise InvalidRequest(
                f"Stop sequences may be at most {lim.max_stop_chars} characters.", param="stop",
                code="string_above_max_length")
        if isinstance(req, ChatCompletionRequest):
            if len(req.messages) > lim.max_messages:
                raise InvalidRequest(f"At most {lim.max_messages} messages are allowed.",
                                     param="messages", code="array_above_max_length")
            # Every text the detectors read counts: content, and a message's name and
            # earlier call arguments (3 MB of arguments held the event loop for seconds).
            total = 0
            for i, m in enumerate(req.messages):
                n = len(m.text())
                if n > lim.max_message_chars:
                    raise InvalidRequest(
                        f"A message may be at most {lim.max_message_chars} characters.",
                        param=f"messages[{i}].content", code="string_above_max_length")
                n += len(m.name or "") + sum(len(c.function.arguments)
                                             for c in m.tool_calls or ())
                if m.content is not None:  # (read too, though not the prompt's: `text`
                    n += len(m.refusal or "")  # has it only for a turn with no content)
                if n > lim.max_message_chars:
                    raise InvalidRequest(
                        f"A message may be at most {lim.max_message_chars} characters, its "
                        "name, tool calls and refusal included.", param=f"messages[{i}]",
                        code="string_above_max_length")
                total += n
            return self._within_total(ctx, req, *_chat_parts(req, total))
        else:
            if len(req.prompts()) > lim.max_messages:
                raise InvalidRequest(f"At most {lim.max_messages} prompts are allowed.",
                                     param="prompt", code="array_above_max_length")
            prompt = sum(len(p) for p in req.prompts() if isinstance(p, str))
            return self._within_total(ctx, req, (
                "the prompt", "prompt", lambda: prompt), (
                "the fields sent beside it (fields the API does not name, stop sequences)",
                "prompt", lambda: _forwarded_chars(req)), (
                "the suffix", "suffix", lambda: len(req.suffix or "")))

    def _within_total(self, ctx: RequestContext, req: ChatCompletionRequest | CompletionRequest,
                      *parts: tuple[str, str, Callable[[], int]]) -> int:
        """`limits.max_total_chars` over a request's texts that the detectors read, each
        of `parts` (what it is, the param it is in, its characters) counted in the order
        they are read, then the caller's texts sent or kept beside them; past it, one 400
        that names what it counted and the param where it went past. Returns the count
        (the reading thread's measure)."""
        bound = self.cfg.limits.max_total_chars
        parts_read = list(parts)
        if self._redacts:
            # (what a route screens aside is read as the prompt is: 4 MB of a Response's
            # reasoning items held the event loop for seconds; where no detector redacts
            # or blocks, nothing screens them aside, nor reads them)
            parts_read.append((
                "the texts kept beside the input (reasoning items, metadata, user)"
                if ctx.aside_chars else "the texts sent beside "
                f"{'them' if isinstance(req, ChatCompletionRequest) else 'it'} (metadata, "
                "user, safety_identifier, prompt_cache_key)", parts[0][1],
                lambda: _caller_chars(req) + ctx.aside_chars))
        total = 0
        counted: list[str] = []
        for what, param, count in parts_read:
            n = count()
            total += n
            if n or not counted:
                counted.append(what)
            if total > bound:
                said = ", ".join(counted[:-1]) + (" and " if len(counted) > 1 else "")
                said += counted[-1]
                raise InvalidRequest(
                    f"{said[0].upper()}{said[1:]} may hold at most {bound} characters in "
                    "all.", param=param, code="invalid_value")
        return total

    # ---------------------------------------------------------------- texts

    def _process(self, text: str, fired: dict[str, str], folded: str | None = None,
                 extra: list[tuple[Span, str]] | None = None,
                 placed: list[tuple[Span, str]] | None = None,
                 norm: str | None = None) -> tuple[str, str]:
        """(text for the cache key, text for the engine). `extra`: spans to redact that
        were found across texts (a card split over two messages), `placed`: such spans
        placed in the folded text already (found with blank letters read as nothing);
        `folded`: `_fold(text)`, and `norm`, what detectors read of it, where the caller
        has them. Detectors read the text as a
        reader does (`scanned`); it goes on folded (its layout kept, so code keeps its
        indentation and a part its trailing space; the cache normalizes what it keys
        on), redacted there where a detector said so."""
        if folded is None:
            folded = self._fold(text)
        if norm is None:
            norm = scanned(folded) if self.cfg.normalize else text
        engine = folded if self.cfg.engine_sees == "normalized" else text
        blank = _blank_letters_out(text, folded) if self.cfg.normalize else None
        if not extra and not placed and blank is None and norm in self._clean:
            return folded, engine
        redact: list[tuple[Span, str]] = list(extra or [])
        found = False
        try:
            # An ordinary short text: one pass shows which built-in detectors can fire
            # there, and only those read it.
            detectors = (self._unquiet(quiet_ones(norm)) if len(norm) <= _QUIET_CHARS
                         else self.detectors)
            found, spans = _findings(detectors, norm, fired)
            redact += spans
            unblanked: list[tuple[Span, str]] = []
            if blank is not None:  # (a key split by blank letters: read them as nothing)
                found = self._unblanked(blank, fired, unblanked) or found
        finally:
            forget()
        if redact or unblanked or placed:
            red = _apply(folded, self._placed(folded, norm, redact) + unblanked + (placed or []))
            return red, red  # redaction: nobody downstream sees the original
        if not found and len(norm) <= _CLEAN_CHARS:
            self._remember_clean(norm)
        return folded, engine

    def _unquiet(self, quiet: frozenset[Detector]) -> list[tuple[Detector, str]]:
        """`detectors` but those `quiet` names (which can find nothing in the text)."""
        detectors = self.detectors
        if not quiet:
            return detectors
        memo = self._running.get(quiet)
        if memo is None or memo[0] is not detectors:  # (kept for this list of detectors)
            memo = detectors, [(d, a) for d, a in detectors if d not in quiet]
            self._running[quiet] = memo
        return memo[1]

    def _fold(self, text: str) -> str:
        """`text` as it goes on when nothing in it is redacted: folded, when normalizing."""
        return fold(text) if self.cfg.normalize else text

    def _screened(self, text: str, fired: dict[str, str]) -> tuple[str, str, bool]:
        """`_process(text)`'s (key text, engine text), and whether a redaction changed
        the text."""
        folded = self._fold(text)
        key, engine = self._process(text, fired, folded)
        return key, engine, key != folded

    def _remember_clean(self, norm: str) -> None:
        """Texts in which no detector found anything: repeated traffic (an FAQ) skips
        the detectors. Only clean texts are kept (nothing sensitive stays in memory),
        and only short ones, at most `_CLEAN_MAX` (the oldest goes first)."""
        with self._clean_lock:  # (a long prompt is read in the reading thread)
            if len(self._clean) >= _CLEAN_MAX:
                self._clean.pop(next(iter(self._clean)))
            self._clean[norm] = None

    def _conversation(self, texts: list[str], fired: dict[str, str],
                      speakers: list[str] | None = None) -> list[tuple[str, str]]:
        """`_process` over the texts of one conversation, in order, with the cards split
        between two of them (`speakers`: who wrote each text, where known)."""
        folds = [self._fold(t) for t in texts]
        norms = [scanned(f) for f in folds] if self.cfg.normalize else texts
        extra = self._across(norms, fired, speakers)
        placed: list[list[tuple[Span, str]]] = [[] for _ in texts]
        if (views := self._blank_views(texts, folds)) is not None:
            # (a key split over two texts and by a blank letter: read them as nothing)
            for i, spans in enumerate(self._across(_blank_read(norms, views), fired,
                                                   speakers)):
                placed[i] = _in_fold(views[i], spans) if spans else []
        return [self._process(t, fired, f, x, p, n)
                for t, f, x, p, n in zip(texts, folds, extra, placed, norms, strict=True)]

    def _blank_views(self, texts: list[str], folds: list[str],
                     ) -> list[tuple[str, list[int] | None]] | None:
        """Where one of `texts` holds a blank letter (and texts are normalized): each
        folded text (`folds`) as read with its blank letters as nothing, and where each
        of its characters is in the folded text (None: the folded text itself, one
        with none); None where no text holds one (most: a check of each for a letter
        outside ASCII, then for the five letters)."""
        if not self.cfg.normalize:
            return None
        blanks = [_blank_letters_out(t, f) for t, f in zip(texts, folds, strict=True)]
        if all(b is None for b in blanks):
            return None
        return [(f, None) if b is None else b for f, b in zip(folds, blanks, strict=True)]

    def _across(self, norms: list[str], fired: dict[str, str],
                speakers: list[str] | None = None) -> list[list[tuple[Span, str]]]:
        """Cards and keys split over consecutive texts of one conversation, or over one
        speaker's two turns with another's between ("my card is 4111 1111" / "go on" /
        "1111 1111"): per text, the spans to redact (where that detector's action is
        `redact`)."""
        extra: list[list[tuple[Span, str]]] = [[] for _ in norms]
        if len(norms) < 2:
            return extra
        for name, across, placeholder in (("card", card_across, "[CARD]"),
                                          ("secret", secrets_across, "[SECRET]")):
            action = self.across_actions[name]
            if action == "off":
                continue
            for i, span in _split(norms, speakers, across):
                if _rank(action) > _rank(fired.get(name, "off")):
                    fired[name] = action
                if action == "redact":
                    extra[i].append((span, placeholder))
        return extra

    def _chat(self, req: ChatCompletionRequest, fired: dict[str, str],
              ) -> tuple[ChatCompletionRequest, ChatCompletionRequest]:
        req = self._forwarded(req, fired)
        # Every text of the conversation in order (string contents, text and refusal
        # parts, a message's refusal): a card may be split between two of them.
        texts: list[str] = []
        speakers: list[str] = []
        for m in req.messages:
            if isinstance(m.content, str):
                texts.append(m.content)
            elif isinstance(m.content, list):
                texts += [getattr(p, f) for p in m.content
                          if (f := _PART_TEXT.get(type(p))) is not None]
            if m.refusal is not None:  # (an assistant's, beside `content: null`: its text)
                texts.append(m.refusal)
            speakers += [m.role] * (len(texts) - len(speakers))
        done = iter(self._conversation(texts, fired, speakers))
        key_msgs, eng_msgs = [], []
        for m in req.messages:
            k_upd: dict[str, Any] = {}
            e_upd: dict[str, Any] = {}
            if isinstance(m.content, str):
                k_upd["content"], e_upd["content"] = next(done)
            elif isinstance(m.content, list):
                kp: list[Any] = []
                ep: list[Any] = []
                for part in m.content:
                    field = _PART_TEXT.get(type(part))
                    if field is None:  # an image or other part: nothing to read
                        kp.append(part)
                        ep.append(part)
                        continue
                    k, e = next(done)
                    kp.append(_with(part, field, k))
                    ep.append(_with(part, field, e))
                k_upd["content"], e_upd["content"] = self._joined_runs(m.content, kp, ep,
                                                                       fired)
            if m.refusal is not None:
                k_upd["refusal"], e_upd["refusal"] = next(done)
            # The rest of what a message carries reaches the engine too: the speaker's
            # name and the arguments of calls the assistant made earlier.
            if m.name:
                k_upd["name"] = e_upd["name"] = self._redacted(m.name, fired)
            if m.tool_calls:
                k_upd["tool_calls"] = e_upd["tool_calls"] = self._calls(m.tool_calls, fired)
            key_msgs.append(_update(m, k_upd))
            eng_msgs.append(_update(m, e_upd))
        key = _with(req, "messages", key_msgs)
        engine = _with(req, "messages", eng_msgs)
        if req.tools:  # tool descriptions are read by the model as text
            tools = self._tools(req.tools, fired)
            key, engine = _with(key, "tools", tools), _with(engine, "tools", tools)
        fmt = req.response_format
        if fmt is not None and fmt.json_schema is not None:
            screened = self._schema_format(fmt.json_schema, fired)
            if screened is not fmt.json_schema:
                fmt = _with(fmt, "json_schema", screened)
                key, engine = _with(key, "response_format", fmt), _with(
                    engine, "response_format", fmt)
        return key, engine

    def _forwarded(self, req: ChatCompletionRequest, fired: dict[str, str],
                   ) -> ChatCompletionRequest:
        """`req` with what goes on with it (to an upstream engine, which gets the request
        as it came: `exclude_unset`, extras and all; and to the cache's key) beyond the
        texts `_chat` reads, screened as a tool's extra fields are (`_extras`): every
        field the protocol does not name, on the request, a message (vLLM's
        `reasoning_content`, anything), a content part, an earlier call and its function,
        a named `tool_choice`, the response format; the stop sequences; a prediction's
        content; and the call ids (`_call_ids`). The same request where nothing was
        redacted."""
        ids = self._call_ids(req)
        msgs = []
        for m in req.messages:
            upd: dict[str, Any] = {}
            if isinstance(m.content, list):
                upd["content"] = [self._extras(p, fired) for p in m.content]
            if m.tool_calls:
                upd["tool_calls"] = [self._extras(_update(c, {
                    "function": self._extras(c.function, fired),
                    "id": ids.get(c.id, c.id)}), fired) for c in m.tool_calls]
            if m.tool_call_id in ids:
                upd["tool_call_id"] = ids[m.tool_call_id]
            msgs.append(self._extras(_update(m, upd), fired))
        update: dict[str, Any] = {"messages": msgs}
        if (p := req.prediction) is not None:
            content = (self._redacted(p.content, fired) if isinstance(p.content, str) else
                       [self._extras(_with(t, "text", self._redacted(t.text, fired)), fired)
                        for t in p.content])
            update["prediction"] = self._extras(_with(p, "content", content), fired)
        if isinstance(c := req.tool_choice, NamedToolChoice):
            update["tool_choice"] = self._extras(
                _with(c, "function", self._extras(c.function, fired)), fired)
        if req.response_format is not None:
            update["response_format"] = self._extras(req.response_format, fired)
        return self._sampling(_update(req, update), fired)

    def _call_ids(self, req: ChatCompletionRequest) -> dict[str, str]:
        """The caller's call ids (an earlier call's `id`, a `tool` message's
        `tool_call_id`) in which a `redact` or `block` detector finds something, each to
        its hash (`call_` and 24 hex digits): they go upstream as sent otherwise, and a
        placeholder would make two calls one, or a call and its answer none. Read for no
        flag nor block: a server's random id reads as a number one time in a few hundred."""
        if not self._redacts:
            return {}
        secret = self.services.gateway_secret()
        return {i: "call_" + keyed_digest(i, secret, "call-id")[:24]
                for i in _all_call_ids(req) if self._screen([i])[0] != i}

    def _sampling(self, req: _R, fired: dict[str, str]) -> _R:
        """What a chat request and a completion alike carry upstream beside the prompt:
        the stop sequences, vLLM's `bad_words`, the stream options' extras and the
        request's own."""
        update: dict[str, Any] = {}
        if isinstance(req.stop, str):
            update["stop"] = self._redacted(req.stop, fired)
        elif req.stop:
            update["stop"] = [self._redacted(t, fired) for t in req.stop]
        if req.bad_words:
            update["bad_words"] = [self._redacted(t, fired) for t in req.bad_words]
        if req.stream_options is not None:
            update["stream_options"] = self._extras(req.stream_options, fired)
        return self._extras(_update(req, update), fired)

    def _names(self, req: ChatCompletionRequest, fired: dict[str, str]) -> bool:
        """Names the model reads and must give back as they are (a tool's, an earlier
        call's, a schema's, and what a schema holds the answer to: `schema_names`):
        screened, never rewritten (a redacted name is no tool's, a call to it no call,
        and a redacted `enum` value no value the caller allows). A `redact` detector
        that fires in one flags the request (the cache neither keeps nor serves it); a
        `block` one blocks it. (Call ids are the servers' random ids: one in a few
        hundred reads as a number.)"""
        names = [t.function.name for t in req.tools or ()]
        for t in req.tools or ():
            names += schema_names(t.function.parameters)
        for m in req.messages:
            names += [c.function.name for c in m.tool_calls or ()]
        fmt = req.response_format
        if fmt is not None and fmt.json_schema is not None:
            names.append(fmt.json_schema.name)
            names += schema_names(fmt.json_schema.schema_)
        found: dict[str, str] = {}
        for name in names:
            if name:
                self._process(name, found)
        for det, action in found.items():
            if action == "block":
                fired[det] = action
            elif _rank(fired.get(det, "off")) < _rank("flag"):
                fired[det] = "flag"
        return bool(found)

    def _joined_runs(self, parts: list[Any], kp: list[Any], ep: list[Any],
                     fired: dict[str, str]) -> tuple[list[Any], list[Any]]:
        """The model reads a message's adjacent text parts together (`ChatMessage.text()`,
        one a line); here they are read joined with nothing between them, so a value a
        client split over parts is found whatever the join: what is found only across two
        of them ("mail alice" + "@example.com") counts as
        found, and where the joined reading redacts what the parts' own readings do not
        (a value across a part's end, or one a neighbour names), that run of parts goes
        on as one text part, redacted whole, with what each part held alone (a part may
        hold the tail of it, "john.sm" + "ith@acme.com", which its own redaction took).
        Otherwise the parts keep their shape and their own redactions (joined,
        "...-6789" + "1 copy" reads as no number at all). `kp`, `ep`: the parts as each
        was processed alone."""
        out_k: list[Any] = []
        out_e: list[Any] = []
        i = 0
        while i < len(parts):
            j = i
            while j < len(parts) and type(parts[j]) in _PART_TEXT:
                j += 1
            if j - i < 2:  # one text part, or another kind of part
                j = max(j, i + 1)
                out_k += kp[i:j]
                out_e += ep[i:j]
                i = j
                continue
            texts = [_part_text(p) for p in parts[i:j]]
            folds = [self._fold(t) for t in texts]
            folded = "".join(folds)
            ends, at = [], 0
            for f in folds[:-1]:
                at += len(f)
                ends.append(at)
            # (what the joined text holds fires)
            found = self._folded_spans(folded, fired, "".join(texts))
            starts = [0, *ends]
            own = [((a + at, b + at), ph) for t, f, at in zip(texts, folds, starts, strict=True)
                   for (a, b), ph in self._folded_spans(f, text=t)]
            red = _apply(folded, found + own)
            if found and red != _apply(folded, own):
                # The joined reading redacts what the parts' own did not (a value across
                # a part's end, or one a part's neighbour names: "My SSN is " +
                # "123 45 6789"): redacted whole, with what each part held alone.
                out_k.append(TextPart(type="text", text=red))
                out_e.append(TextPart(type="text", text=red))
            else:
                out_k += kp[i:j]
                out_e += ep[i:j]
            i = j
        return out_k, out_e

    def _unblanked(self, blank: tuple[str, list[int]], fired: dict[str, str] | None,
                   out: list[tuple[Span, str]]) -> bool:
        """The detectors' reading of a text with its blank letters read as nothing
        (`blank`: `_blank_letters_out`'s view and places): what the `redact` ones find
        added to `out`, placed in the folded text; every detector's finding fired in
        `fired` where it is given (else only the `redact` ones read). Whether any
        found something. The text was read whole already, with its blank letters as
        blanks: what reads otherwise here is around them, so only the parts a match
        there can reach are read again (`windows_around`; a text of 64 KB with one
        braille blank was read twice), or all of it where they are many."""
        view, at = blank
        windows = windows_around(view, _blanks_at(at))
        found = False
        for a, b in [(0, len(view))] if windows is None else windows:
            forget()  # (the memos are the last reading's: this one is every detector's now)
            piece = view if windows is None else view[a:b]
            try:
                here, redact = _findings(self.detectors, scanned(piece), fired)
            finally:
                forget()
            found = here or found
            out += _in_fold((piece, at if windows is None else at[a:b + 1]), redact)
        return found

    def _folded_spans(self, folded: str, fired: dict[str, str] | None = None,
                      text: str | None = None) -> list[tuple[Span, str]]:
        """What the `redact` detectors find in a folded text, placed in it. Where `fired`
        is given, what every detector finds is fired there. `text`: what `folded` was
        folded from, where a caller has it: a text holding blank letters is read again
        with them as nothing, as `_process` reads it."""
        norm = scanned(folded) if self.cfg.normalize else folded
        try:
            _, found = _findings(self.detectors, norm, fired)
        finally:
            forget()
        placed = self._placed(folded, norm, found) if found else found
        if text is not None and self.cfg.normalize and (
                blank := _blank_letters_out(text, folded)) is not None:
            self._unblanked(blank, fired, placed)
        return placed

    def _placed(self, folded: str, norm: str, spans: list[tuple[Span, str]],
                ) -> list[tuple[Span, str]]:
        """Spans found in `norm` (what detectors read of `folded`) placed in `folded`,
        where the engine reads: redactions are made there."""
        if not (self.cfg.normalize and norm != folded):
            return spans
        at = scanned_places(folded)
        return [((at[a], at[b - 1] + 1 if b > a else at[a]), ph) for (a, b), ph in spans]

    def _schema_format(self, fmt: JsonSchemaFormat, fired: dict[str, str],
                       ) -> JsonSchemaFormat:
        """A structured output's schema: its description and every string in it
        (property descriptions, enums, defaults, examples) reach the model's prompt (the
        engine's template shows it) or shape what it writes. The same object where
        nothing was redacted."""
        update: dict[str, Any] = {}
        if fmt.description:
            text = self._redacted(fmt.description, fired)
            if text != fmt.description:
                update["description"] = text
        if fmt.schema_:
            schema = self._schema(fmt.schema_, fired)
            if schema is not fmt.schema_:
                update["schema_"] = schema
        return _update(fmt, update) if update else fmt

    def _calls(self, calls: list[ToolCall], fired: dict[str, str]) -> list[ToolCall]:
        """Earlier calls' arguments, the same for the key and the engine (left as they
        came unless something in them is redacted)."""
        out = []
        for call in calls:
            args = self._json_text(call.function.arguments, fired)
            out.append(_with(call, "function", _with(call.function, "arguments", args)))
        return out

    def _tools(self, tools: list[ChatTool], fired: dict[str, str]) -> list[ChatTool]:
        """Tool definitions: the description and every string of the parameters' schema
        (descriptions, enums, defaults) are shown to the model, and so is what a tool
        or its function carries beyond the fields the protocol names (the chat template
        gets the definitions as they came: `tool_dicts`)."""
        out = []
        for tool in tools:
            fn = tool.function
            update: dict[str, Any] = {}
            if fn.description:
                update["description"] = self._redacted(fn.description, fired)
            if fn.parameters:
                update["parameters"] = self._schema(fn.parameters, fired)
            fn = self._extras(_update(fn, update), fired)
            out.append(self._extras(_with(tool, "function", fn), fired))
        return out

    def _extras(self, model: _M, fired: dict[str, str]) -> _M:
        """`model` with the strings of its extra fields (the ones the protocol does not
        name, kept as they came) read as a schema's prose is, keys too; the same model
        where nothing was redacted."""
        extra = model.model_extra
        if not extra:
            return model
        said = self._json_value(extra, fired)
        if said is extra:
            return model
        known = {f: getattr(model, f) for f in type(model).model_fields}
        fields = (model.model_fields_set - set(extra)) | set(said)
        return type(model).model_construct(_fields_set=fields, **known, **said)

    def _redacted(self, text: str, fired: dict[str, str]) -> str:
        """`text` as it came, or its redacted form where a `redact` detector fired (no
        normalizing otherwise: these texts are data, such as JSON, not prose)."""
        key, _, redacted = self._screened(text, fired)
        return key if redacted else text

    def _json_text(self, text: str, fired: dict[str, str]) -> str:
        """A JSON document (call arguments): its strings are read decoded, as the chat
        template shows them to the model (`"\\u0040"` is an `@`); re-encoded only where
        something was redacted. Text that is not JSON is read as it is."""
        try:
            value = loads_finite(text)
        except (ValueError, RecursionError):
            return self._redacted(text, fired)
        if not isinstance(value, dict | list):
            return self._redacted(text, fired)
        try:
            redacted = self._json_value(value, fired)
        except RecursionError:
            return self._redacted(text, fired)
        return text if redacted is value else json.dumps(redacted)  # (\u-escaped: safe)

    def _schema(self, node: Any, fired: dict[str, str]) -> Any:
        """A JSON schema with its prose redacted (descriptions, titles, examples,
        defaults: the model reads them), and what holds the answer to left as it came
        (`schema_names`: read as names). The same object where nothing was redacted."""
        if isinstance(node, list):
            items = [self._schema(v, fired) for v in node]
            return node if all(a is b for a, b in zip(items, node, strict=True)) else items
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k in _SCHEMA_PROSE:
                out[k] = self._json_value(v, fired)
            elif k in SCHEMA_MAPS and isinstance(v, dict):
                pairs = {name: self._schema(s, fired) for name, s in v.items()}
                out[k] = v if all(pairs[n] is s for n, s in v.items()) else pairs
            elif isinstance(v, dict | list) and k not in _SCHEMA_HELD:
                out[k] = self._schema(v, fired)
            else:
                out[k] = v
        return node if all(out[k] is v for k, v in node.items()) else out

    def _json_value(self, value: Any, fired: dict[str, str]) -> Any:
        """`value` with its strings (keys too) read; the same object where nothing was
        redacted."""
        if isinstance(value, str):
            return self._redacted(value, fired)
        if isinstance(value, list):
            across = self._json_across(value, list(range(len(value))), fired)
            items = [across.get(i) or self._json_value(v, fired) for i, v in enumerate(value)]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            same = True
            split = self._json_across(list(value.values()), list(value), fired)
            for k, v in value.items():
                said = self._json_value(k, fired)
                v2 = split.get(k) or (self._keyed(k, v, fired) if isinstance(v, str) else
                                      self._json_value(v, fired))
                same = same and said is k and v2 is v
                out[key_apart(said, k, out, value)] = v2  # (redacted alike: kept apart)
            return value if same else out
        return value

    def _json_across(self, values: list[Any], names: list[Any], fired: dict[str, str],
                     ) -> dict[Any, str]:
        """A key split over the string values one after another of a JSON object or
        array ('{"a": "sk-proj-Ab3d...", "b": "...4zQ7"}': the model reads both), as
        split over two messages (`secrets_across`): each value that holds a piece,
        redacted, by its name (key or index) in `names`; the secret detector fired."""
        action = self.across_actions["secret"]
        at = [i for i, v in enumerate(values) if isinstance(v, str)]
        if action == "off" or len(at) < 2:
            return {}
        folds = [self._fold(values[i]) for i in at]
        norms = [scanned(f) for f in folds] if self.cfg.normalize else folds
        spans: dict[int, list[tuple[Span, str]]] = {}
        for j, span in secrets_across(norms, values=True):
            spans.setdefault(j, []).append((span, "[SECRET]"))
        placed: dict[int, list[tuple[Span, str]]] = {}
        if (views := self._blank_views([values[i] for i in at], folds)) is not None:
            # (a key split over two values and by a blank letter: read them as nothing)
            for j, span in secrets_across(_blank_read(norms, views), values=True):
                placed.setdefault(j, []).append((span, "[SECRET]"))
            placed = {j: _in_fold(views[j], found) for j, found in placed.items()}
        if not spans and not placed:
            return {}
        if _rank(action) > _rank(fired.get("secret", "off")):
            fired["secret"] = action
        if action != "redact":
            return {}
        return {names[at[j]]: self._redacted(_apply(folds[j], self._placed(
            folds[j], norms[j], spans.get(j, [])) + placed.get(j, [])), fired)
            for j in sorted(spans.keys() | placed.keys())}

    def _keyed(self, key: str, value: str, fired: dict[str, str]) -> str:
        """A JSON string read after its key, as the key names it ('"ssn": "219099999"',
        '"nino": "AB123456C"': the digits alone are any number); the value alone where
        the key adds nothing (no digit in it: every detector a label helps reads one)."""
        alone = self._redacted(value, fired)
        if alone is not value or len(key) > 64 or not any(c.isdigit() for c in value):
            return alone
        prefix = f"{key}: "
        said = self._redacted(prefix + value, fired)
        head = self._fold(prefix)
        if said == prefix + value or not said.startswith(head):
            return value
        return said[len(head):]

    def _completion(self, req: CompletionRequest, fired: dict[str, str],
                    ) -> tuple[CompletionRequest, CompletionRequest]:
        req = self._sampling(req, fired)
        p = req.prompt
        if isinstance(p, str):
            k, e = self._process(p, fired)
            key, engine = _with(req, "prompt", k), _with(req, "prompt", e)
        elif p and isinstance(p[0], str):
            pairs = [self._process(t, fired) for t in p]  # type: ignore[arg-type]
            key = _with(req, "prompt", [k for k, _ in pairs])
            engine = _with(req, "prompt", [e for _, e in pairs])
        else:
            key, engine = self._token_ids(req, fired)
        if req.suffix:
            k, e = self._process(req.suffix, fired)
            key, engine = _with(key, "suffix", k), _with(engine, "suffix", e)
        return key, engine

    def _token_ids(self, req: CompletionRequest, fired: dict[str, str],
                   ) -> tuple[CompletionRequest, CompletionRequest]:
        """A prompt of token ids, read as the model reads it where the terminal can tell
        its text (a local engine's tokenizer): it goes on as ids, unless a detector
        redacted something; then the redacted text goes on instead, for the cache key and
        the engine alike (a card, an address or an injection sent as ids had gone through
        every detector). Where the ids cannot be read (an upstream holds the tokenizer),
        nothing cleared them: flagged `unscreened`, never cached nor served from the
        cache."""
        read = self.services.terminal.read_tokens
        texts = [read(ids) if isinstance(ids, list) else None for ids in req.prompts()]
        if any(t is None for t in texts):
            fired["unscreened"] = "flag"
            return req, req
        screened = [self._screened(t, fired) for t in texts if t is not None]
        if not any(redacted for _, _, redacted in screened):
            return req, req
        if not isinstance(req.prompt[0], list):  # one prompt of ids: its text goes on
            key, engine, _ = screened[0]
            return _with(req, "prompt", key), _with(req, "prompt", engine)
        # (a list is all text or all ids: the others go on as their text too)
        keys = [k if redacted else t for (k, _, redacted), t in zip(screened, texts,
                                                                    strict=True)]
        engines = [e if redacted else t for (_, e, redacted), t in zip(screened, texts,
                                                                       strict=True)]
        return _with(req, "prompt", keys), _with(req, "prompt", engines)


#: The text field of each kind of content part the sanitizer reads.
_PART_TEXT: dict[type, str] = {TextPart: "text", RefusalPart: "refusal"}


def _part_text(part: Any) -> str:
    return str(getattr(part, _PART_TEXT[type(part)]))

_M = TypeVar("_M", bound=BaseModel)
_R = TypeVar("_R", ChatCompletionRequest, CompletionRequest)


def _update(model: _M, values: dict[str, Any]) -> _M:
    """`model` with `values` set; the model itself where they are already there. Most
    texts leave the sanitizer unchanged, and two copies of every message (key side and
    engine side) were a visible share of a cache hit's CPU."""
    changed = {f: v for f, v in values.items() if getattr(model, f) != v}
    return model.model_copy(update=changed) if changed else model


def _with(model: _M, field: str, value: Any) -> _M:
    return _update(model, {field: value})


#: The caller's texts besides `metadata` that go on with a request in no prompt.
_CALLER_FIELDS = ("user", "safety_identifier", "prompt_cache_key")


def _chat_parts(req: ChatCompletionRequest, messages: int,
                ) -> tuple[tuple[str, str, Callable[[], int]], ...]:
    """What a chat request's detectors read, for `_within_total`: its messages'
    `messages` characters, what is sent beside them, the tool definitions and the
    response format's schema."""
    fmt = req.response_format
    schema = fmt.json_schema if fmt is not None else None
    return (
        ("messages", "messages", lambda: messages),
        ("the fields sent beside them (fields the API does not name, stop sequences, "
         "a prediction, call ids)", "messages", lambda: _forwarded_chars(req)),
        # (characters, as the messages are counted: not `\u` escapes, six for a CJK
        # character and twelve for an emoji)
        ("tool definitions", "tools", lambda: len(json.dumps(
            req.tool_dicts(), ensure_ascii=False)) if req.tools else 0),
        ("the response format's schema", "response_format", lambda: len(json.dumps(
            schema.model_dump(by_alias=True), ensure_ascii=False)) if schema else 0))


def _caller_chars(req: ChatCompletionRequest | CompletionRequest) -> int:
    """Characters of the caller's texts `_caller_texts` reads."""
    n = sum(len(v) for f in _CALLER_FIELDS if isinstance(v := getattr(req, f, None), str))
    return n + sum(len(k) + len(v) for k, v in (_own_metadata(req) or {}).items())


def _own_metadata(req: ChatCompletionRequest | CompletionRequest) -> dict[str, str] | None:
    """A chat request's `metadata` (a string map, as parsed). `/v1/completions` names
    none: a `metadata` sent there is a field the API does not name, of any JSON shape,
    read with the others (`_extras`); read as a string map, a list in it was a 500."""
    return req.metadata if isinstance(req, ChatCompletionRequest) else None


def _all_call_ids(req: ChatCompletionRequest) -> set[str]:
    """The caller's call ids, each once: earlier calls' `id`s and `tool` messages'
    `tool_call_id`s."""
    ids = {c.id for m in req.messages for c in m.tool_calls or ()}
    return ids | {m.tool_call_id for m in req.messages if m.tool_call_id}


def _extra_chars(model: BaseModel | None) -> int:
    """Characters of a model's extra fields, as JSON (keys too: `_extras` reads them)."""
    extra = model.model_extra if model is not None else None
    return len(json.dumps(extra, ensure_ascii=False)) if extra else 0


def _forwarded_chars(req: ChatCompletionRequest | CompletionRequest) -> int:
    """Characters of what `_forwarded` and `_sampling` read beside the prompt's texts:
    extra fields everywhere, stop sequences, a prediction, the call ids (`_all_call_ids`:
    each read once, however many messages name it)."""
    n = _extra_chars(req) + sum(len(t) for t in [*req.stops, *(req.bad_words or ())])
    n += _extra_chars(req.stream_options)
    if not isinstance(req, ChatCompletionRequest):
        return n
    n += sum(map(len, _all_call_ids(req)))
    for m in req.messages:
        n += _extra_chars(m)
        if isinstance(m.content, list):
            n += sum(_extra_chars(p) for p in m.content)
        n += sum(_extra_chars(c) + _extra_chars(c.function) for c in m.tool_calls or ())
    if (p := req.prediction) is not None:
        n += _extra_chars(p) + (len(p.content) if isinstance(p.content, str) else sum(
            len(t.text) + _extra_chars(t) for t in p.content))
    if isinstance(c := req.tool_choice, NamedToolChoice):
        n += _extra_chars(c) + _extra_chars(c.function)
    return n + _extra_chars(req.response_format)


_CLEAN_MAX = 4096  # texts
_CLEAN_CHARS = 1024  # the longest text remembered as clean
_QUIET_CHARS = 2048  # the longest text `quiet` is asked about (a longer one seldom is)

_RANKS = {"off": 0, "flag": 1, "redact": 2, "block": 3}


def _split(norms: list[str], speakers: list[str] | None,
           across: Callable[[list[str]], Iterator[tuple[int, Span]]],
           ) -> Iterator[tuple[int, Span]]:
    """`across` (`card_across`, `secrets_across`) over consecutive texts, then over each
    pair of one speaker's texts that another's stand between."""
    yield from across(norms)
    if speakers is None:
        return
    last: dict[str, int] = {}
    for i, who in enumerate(speakers):
        j = last.get(who)
        last[who] = i
        if j is not None and i - j > 1:
            for k, span in across([norms[j], norms[i]]):
                yield (j if k == 0 else i), span


def _hidden(action: str) -> str:
    """An action as the texts a route keeps read it (`_screen`): a block hides as a
    redaction does."""
    return "redact" if action == "block" else action


def _rank(action: str) -> int:
    return _RANKS[action]


# Letters that render as a blank the width of a letter (the Hangul fillers, the braille
# blank): `fold` reads them as a space ("ignore\u3164all" is "ignore all" to a reader),
# and a key split by them ("sk-proj-Ab\u3164Cd...") read as two words, neither a key.
# Where a text holds one, it is read a second time with them as nothing (`BLANK_LETTERS`).
_BLANK_MARK = "\ue000"  # (a private-use character: NFKC and `fold` leave it as it is)
_MARKED = str.maketrans(dict.fromkeys(BLANK_LETTERS, _BLANK_MARK))


def _blank_letters_out(text: str, folded: str) -> tuple[str, list[int]] | None:
    """`folded` (`fold(text)`) with the blank letters `text` holds read as nothing, and
    where each of its characters is in `folded` (its end last); None where `text` holds
    none (or folding moved them: then it is read as folded only)."""
    if text.isascii() or not any(c in text for c in BLANK_LETTERS) or _BLANK_MARK in text:
        return None
    marked = fold(text.translate(_MARKED))
    if len(marked) != len(folded):
        return None
    at = [i for i, c in enumerate(marked) if c != _BLANK_MARK]
    return marked.replace(_BLANK_MARK, ""), [*at, len(marked)]


def _findings(detectors: list[tuple[Detector, str]], read: str,
              fired: dict[str, str] | None) -> tuple[bool, list[tuple[Span, str]]]:
    """What `detectors` (each with its action) find in `read`: whether any found
    something, and the `redact` ones' spans with their placeholders. Each finding is
    fired in `fired` (its detector's action, where higher than one fired already);
    with no `fired`, only the `redact` detectors read."""
    found = False
    redact: list[tuple[Span, str]] = []
    for det, action in detectors:
        if action != "redact" and fired is None:
            continue
        spans = list(det.find(read))
        if not spans:
            continue
        found = True
        if fired is not None and _rank(action) > _rank(fired.get(det.name, "off")):
            fired[det.name] = action
        if action == "redact":
            redact += [(s, det.placeholder) for s in spans]
    return found, redact


def _blanks_at(at: list[int]) -> list[int]:
    """Where a blank letter was in a text read with them as nothing (`at`: where each
    of its characters is in the folded text, its end last): before each character
    whose place skips one."""
    return [j for j in range(len(at)) if at[j] != (at[j - 1] + 1 if j else 0)]


def _blank_read(norms: list[str], views: list[tuple[str, list[int] | None]]) -> list[str]:
    """Each text as the detectors read it with its blank letters as nothing (`views`:
    `_blank_views`'): its own reading (`norms`) where it holds none."""
    return [n if at is None else scanned(v) for n, (v, at) in zip(norms, views, strict=True)]


def _in_fold(view: tuple[str, list[int] | None], spans: list[tuple[Span, str]],
             ) -> list[tuple[Span, str]]:
    """Spans found in `scanned` of a text read with its blank letters as nothing (`view`:
    `_blank_letters_out`'s text and places; None, the folded text itself) placed in the
    folded text."""
    text, at = view
    places = scanned_places(text)
    out: list[tuple[Span, str]] = []
    for (a, b), placeholder in spans:
        if b > a:
            x, y = places[a], places[b - 1] + 1
            out.append(((x, y) if at is None else (at[x], at[y - 1] + 1), placeholder))
    return out


def _apply(text: str, spans: list[tuple[Span, str]]) -> str:
    """Replace spans (overlaps merged: the earliest, then the longest, names the merged
    span; a span reaching past the one before it extends it)."""
    out, pos = [], 0
    for (start, end), placeholder in sorted(spans, key=lambda s: (s[0][0], -s[0][1])):
        if start < pos:
            pos = max(pos, end)
            continue
        out.append(text[pos:start])
        out.append(placeholder)
        pos = end
    out.append(text[pos:])
    return "".join(out)
