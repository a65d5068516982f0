"""The semantic index's partition bound, the near-miss guard, the lookup's deadline."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from plugins.cache.config import CacheConfig, SemanticConfig
from plugins.cache.entry import Entry
from plugins.cache.guard import guard_ok
from plugins.cache.keys import exact_key, scope_id
from plugins.cache.plugin import CachePlugin
from plugins.cache.semantic import SemanticIndex
from proxy.chain import Completion, Reply, Services, Stream
from proxy.context import RequestContext
from proxy.settings import Settings
from proxy.telemetry import Metrics
from tests.fakes import FakeEmbedder, FakeEngine
from tests.unit.plugins.test_cache import ALICE, Engine, ctx, run, sample
from tests.waiting import eventually


def entry(key: str) -> Entry:
    return Entry(key=key, route="chat", model="m", scope="s", tenant="t", role="r", user="u",
                 prompt="p", usage={"prompt_tokens": 1, "completion_tokens": 1},
                 choices=[{"index": 0, "text": "a", "finish_reason": "stop"}],
                 expires=1e12, stale_until=1e12)


def unit(i: int, dim: int = 8) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    v[i % dim] = 1.0
    return v


def test_partitions_are_bounded_and_the_least_recently_used_goes_whole() -> None:
    index = SemanticIndex(dim=8, capacity=10, max_partitions=2)
    index.partition("a").add("a1", unit(1), entry("a1"), "q")
    index.partition("b").add("b1", unit(2), entry("b1"), "q")
    assert index.get("a") is not None  # a is now the most recently used
    index.partition("c").add("c1", unit(3), entry("c1"), "q")
    assert list(index.partitions) == ["a", "c"] and index.evicted_partitions == 1
    assert index.get("b") is None and len(index) == 2
    found = index.get("a").search(unit(1), now=1.0)  # type: ignore[union-attr]
    assert found is not None and found[0] == "a1"
    for i in range(50):  # a new seed per request: memory stays bounded
        index.partition(f"seed-{i}").add(f"k{i}", unit(i), entry(f"k{i}"), "q")
    assert len(index.partitions) == 2 and index.evicted_partitions == 51


def test_the_partition_cap_is_configurable_and_described() -> None:
    field = SemanticConfig.model_fields["max_partitions"]
    assert field.description and SemanticConfig().max_partitions >= 1
    with pytest.raises(ValueError):
        SemanticConfig(max_partitions=0)
    assert SemanticConfig.model_fields["lookup_timeout_ms"].description


def test_a_partition_takes_the_model_dimension_on_first_vector() -> None:
    index = SemanticIndex(dim=384, capacity=4)
    index.partition("p").add("k", unit(0, 256), entry("k"), "q")
    assert index.get("p").search(unit(0, 256), now=1.0)[0] == "k"  # type: ignore[union-attr,index]


def test_search_passes_over_an_expired_best_match_to_the_next_usable_one() -> None:
    part = SemanticIndex(dim=8, capacity=10).partition("p")
    old = entry("old")
    old.expires = old.stale_until = 5.0
    near = np.array([1, 0.1, 0, 0, 0, 0, 0, 0], dtype=np.float32)
    part.add("old", unit(0), old, "q")  # the best match, expired at now=10
    part.add("next", near / np.linalg.norm(near), entry("next"), "q")
    part.add("far", unit(3), entry("far"), "q")
    found = part.search(unit(0), now=10.0)
    assert found is not None and found[0] == "next" and 0.9 < found[1] < 1.0
    assert part.search(unit(0), now=10.0, allow_stale=False)[0] == "next"  # type: ignore[index]
    assert part.search(unit(0), now=1.0)[0] == "old"  # type: ignore[index]
    part.remove("next")  # its row is zeroed: it scores 0, never a match
    assert part.search(unit(0), now=10.0) is None
    assert part.search(unit(5), now=1.0) is None  # nothing scores above 0


@pytest.mark.parametrize("extra", [
    "Answer in exactly one word.", "Answer like a pirate.", "answer like a pirate",
    "Reply in French.", "in German please", "Respond in JSON.", "Use a bulleted list.",
    "Keep it under ten words.", "Be brief.", "Just say yes or no.", "Write it as a haiku.",
    "Summarize in two sentences.", "Pretend you are a lawyer.", "Make it a table.",
    "Give me only the number.", "Explain like I'm five.", "Format the answer as markdown.",
    "ANSWER IN FRENCH.", "Reply In Json",
])
def test_an_added_instruction_is_a_different_question(extra: str) -> None:
    q = "How do I reset my password?"
    assert not guard_ok(f"{q} {extra}", q)
    assert not guard_ok(q, f"{q} {extra}")


@pytest.mark.parametrize("extra", ["ın french", "İN FRENCH", "Be ſhort."])
def test_an_instruction_with_letters_that_fold_to_ascii_is_seen(extra: str) -> None:
    """Dotless i, dotted capital I and long s match "i" and "s" case-insensitively, as
    the guard has always read them (a fast path for ASCII text must not drop them)."""
    q = "How do I reset my password?"
    assert not guard_ok(f"{q} {extra}", q)


@pytest.mark.parametrize("a, b", [
    ("How do I lock my card?", "How do I unlock my card?"),
    ("How do I follow a store?", "How do I unfollow a store?"),
    ("How do I activate my card?", "How do I deactivate my card?"),
    ("How do I import my contacts?", "How do I export my contacts?"),
    ("How do I get a refund for my order?", "Why was I charged for my order?"),
    ("Transfer money from savings to checking", "Transfer money from checking to savings"),
    ("Is the item refundable?", "Is the item non-refundable?"),
    ("How do I upgrade my plan?", "How do I downgrade my plan?"),
    ("Cancel order 1234", "Cancel order 1243"),
    ("Does the laptop come with a charger?", "Does the phone come with a charger?"),
    ("How do I update my billing address?", "How do I update my shipping address?"),
    ("How do I return an item?", "How long do I have to return an item?"),
    ("How do I change my plan?", "How much does it cost to change my plan?"),
    ("Where is my refund?", "Why is my refund late?"),
    # an operator between the same numbers
    ("What is 7 + 5?", "What is 7 - 5?"),
    ("What is 8 * 2?", "What is 8 / 2?"),
    ("What is 9 times 3?", "What is 9 divided by 3?"),
    ("Is 5 \u2265 3?", "Is 5 \u2264 3?"),
    # a sign written on a number; a decimal comma
    ("Is -7 greater than 5?", "Is 7 greater than 5?"), ("What is -5 + 3?", "What is 5 + 3?"),
    ("What is 1,5 + 1?", "What is 15 + 1?"),
    ("What is 5 + -3?", "What is 5 * -3?"), ("Solve 3x - 7 = 0", "Solve 3x + 7 = 0"),
    # superscripts and subscripts, which the text keeps (an exponent, an index)
    ("What is 2\u00b3?", "What is 2\u00b2?"), ("What is 2\u00b3?", "What is 23?"),
    ("How much is 1 m\u00b3?", "How much is 1 m\u00b2?"),
    ("What is H\u2082O?", "What is H\u2082O\u2082?"),
    # the same words in another order: who does what to whom, which way a conversion goes
    ("How do I convert miles to kilometers?", "How do I convert kilometers to miles?"),
    ("Convert 5 km into miles.", "Convert 5 miles into km."),
    ("Does the basic plan include priority support?",
     "Does priority support include the basic plan?"),
    # opposites of one family
    ("What is the boiling point of water in fahrenheit?", "What is the freezing point of water?"),
    ("What is the largest planet?", "What is the smallest planet?"),
    ("What is the fastest way to ship?", "What is the slowest way to ship?"),
    ("Who was the first president?", "Who was the last president?"),
    # the question asked in another language (the model answers in that language)
    ("What is the capital of France?", "Quelle est la capitale de la France ?"),
    ("Capital of France?", "Capitale de la France ?"),
    ("What is the capital of France?", "¿Cuál es la capital de Francia?"),
    ("What is the capital of France?", "Was ist die Hauptstadt von Frankreich?"),
    ("What is the capital of France?", "法国的首都是什么？"),
    ("How do I reset my password?", "Как сбросить мой пароль?"),
    # another time: a day, a period, next / last, a past against a future (a live pass
    # had "Did it snow yesterday?" answered with "Will it snow tomorrow?"'s answer)
    ("Will it snow tomorrow?", "Did it snow yesterday?"),
    ("Is the store open today?", "Is the store open tomorrow?"),
    ("What's the weather today?", "What was the weather yesterday?"),
    ("What are the sales figures for next week?", "What are the sales figures for last week?"),
    ("Is it going to rain tonight?", "Did it rain last night?"),
    ("Is it going to be sunny next week?", "Is it going to be hot this weekend?"),
    ("When is the next train to Boston?", "When is the last train to Boston?"),
    ("What is the first step?", "What is the next step?"),
    ("Will the bank be closed on Friday?", "Was the bank closed on Friday?"),
    ("What did the market do yesterday?", "What will the market do tomorrow?"),
    # this / last / next before a day of the week (the fresh set had them hit, 0.93)
    ("Is the office closed this Friday?", "Was the office closed last Friday?"),
    ("Is the gym open next Sunday?", "Is the gym open this Sunday?"),
    # symbols the embedding model reads as one unknown token, operators in code and
    # formulas (a live pass had each served the other's answer)
    ("What does the 👍 emoji mean?", "What does the 👎 emoji mean?"),
    ("What does ❤️ mean?", "What does 💔 mean?"),
    ("What does ∀ mean in logic?", "What does ∃ mean in logic?"),
    ("What does → mean?", "What does ← mean?"),
    ("What does x = a + b do?", "What does x = a - b do?"),
    ("SELECT * FROM users WHERE age > 30", "SELECT * FROM users WHERE age < 30"),
    ("What does print(a == b) output?", "What does print(a != b) output?"),
    ("What is x**2 when x is 3?", "What is x*2 when x is 3?"),
    ("What is the derivative of e^x?", "What is the derivative of e^-x?"),
    ("What is the derivative of sin(x)?", "What is the derivative of -sin(x)?"),
    ("What is {} in Python?", "What is [] in Python?"),
    # a small word that asks another thing: a question word, a modal, and / or; who is who
    ("How do bees make honey?", "Why do bees make honey?"),
    ("What is the Eiffel Tower?", "Where is the Eiffel Tower?"),
    ("Should I stop taking my medication?", "Can I stop taking my medication?"),
    ("Can I take ibuprofen and paracetamol together?",
     "Can I take ibuprofen or paracetamol together?"),
    ("Do I owe you money?", "Do you owe me money?"),
    ("Can I see your messages?", "Can you see my messages?"),
    ("What is the derivative of sin(x) - cos(x)?", "What is the derivative of sin(x) + cos(x)?"),
    ("Is a - b the same as b - a?", "Is a + b the same as b + a?"),
    # counts in words; whose; verbs of opposite ways (a third live pass found each)
    ("Can I add one extra user to my plan?", "Can I add two extra users to my plan?"),
    ("Do I need a single monitor?", "Do I need dual monitors?"),
    ("Can I refund one unused ticket?", "Can I refund both unused tickets?"),
    ("Can you delete my data?", "Can you delete your data?"),
    ("Can I lend money to my colleague?", "Can I borrow money from my colleague?"),
    ("How do I push my changes to the remote?", "How do I pull my changes from the remote?"),
])
def test_near_misses_are_refused(a: str, b: str) -> None:
    assert not guard_ok(a, b) and not guard_ok(b, a)


@pytest.mark.parametrize("a, b", [
    # the same kind of instruction, saying another thing
    ("Summarize the plot of Cinderella.", "Summarize the plot of Cinderella in one sentence."),
    ("Answer like a pirate.", "Answer like a cowboy."),
    ("Reply in french.", "Reply in german."),
    ("Answer in JSON.", "Answer in YAML."),
    ("Describe the water cycle in two sentences.", "Describe the water cycle in five sentences."),
    # an audience, or a tone
    ("What is inflation?", "What is inflation? Explain it for complete beginners."),
    ("Explain photosynthesis.", "Explain photosynthesis to a five-year-old."),
    ("Explain how a rainbow forms.", "Explain how a rainbow forms, for an expert physicist."),
    ("Explain photosynthesis.", "Explain photosynthesis in simple terms."),
    ("Write a funny poem about the sea.", "Compose a sad poem about the ocean."),
    # words added that narrow the question
    ("Write a story about a dog.", "Write a sad story about a dog."),
    ("Give me a recipe for pancakes.", "Give me a vegan recipe for pancakes."),
    ("Tell me a joke.", "Tell me a joke about cats."),
    ("List the planets.", "List the planets in order of size."),
    ("Explain recursion.", "Explain recursion with an example."),
    # ... with words that say nothing edited too (a review found them passing)
    ("Tell me a joke", "Please tell me a joke about cats"),
    ("How do I reset my password?", "How can I reset my work password?"),
    ("Is there a free trial?", "Is there currently a free trial for students?"),
    ("Write a story", "Now write a bittersweet story"),
    ("Explain quantum computing", "Could you explain quantum computing to a marketing manager"),
    ("Explain photosynthesis to a high school student", "Explain photosynthesis to a graduate"),
])
def test_a_question_that_asks_for_more_or_other_than_the_stored_one_is_refused(
        a: str, b: str) -> None:
    """An instruction is compared by what it says, not only by its kind, and a question
    that adds a qualifier to another asks something narrower (a re-probe had "Summarize
    X in one sentence" answered with the stored multi-sentence summary)."""
    assert not guard_ok(a, b) and not guard_ok(b, a)


@pytest.mark.parametrize("a, b", [
    ("How do I reset my password? Answer briefly.", "How can I reset my password? Be brief."),
    ("How do I reset my password? Reply in two sentences.",
     "How can I reset my password? Reply in two sentences."),
    ("Is there a free trial?", "Is there a free trial available?"),
    ("How do I check my gift card balance?", "gift card balance?"),
    ("Do you offer a student discount?", "Are there discounts for students?"),
    # greetings, thanks and lead-ins add nothing; audience and tone words in a question
    # that asks a fact (no "explain", "write" ...) are not instructions
    ("How do I reset my password?", "Hi, how do I reset my password?"),
    ("How do I reset my password?", "How do I reset my password? Thanks!"),
    ("How do I reset my password?", "Quick question: how do I reset my password?"),
    ("How do I reset my password?", "I need to know how to reset my password"),
    ("How do I talk to an expert?", "How can I reach an expert?"),
    ("Is the pool open to kids?", "Can kids use the pool?"),
    ("How do I enable dark mode?", "How can I turn on dark mode?"),
    ("How do I cancel my plan?", "How do I simply cancel my plan?"),
    ("Answer like a pirate.", "Answer like a pirate please."),
])
def test_instructions_and_questions_said_alike_still_pass(a: str, b: str) -> None:
    assert guard_ok(a, b) and guard_ok(b, a)


@pytest.mark.parametrize("a, b", [
    ("How do I reset my password?", "forgot my password, what now?"),
    ("Are you open on Sundays?", "Do you open on Sunday?"),
    ("How do I turn on notifications?", "How can I enable notifications?"),
    ("How do I cancel my subscription?", "I want to stop my subscription"),
    ("Can I pick up my order in store?", "Do you offer in-store collection?"),
    ("What is your refund policy?", "Can you explain your refund policy?"),
    ("What is 7 + 5?", "what is 7+5"),
    ("What does je ne sais quoi mean?", "What is the meaning of je ne sais quoi?"),
    ("Quelle est la capitale de la France ?", "Quelle est la capitale de la France?"),
    # a present is a past's or a future's paraphrase
    ("Will the bank be closed on Friday?", "Is the bank closed on Friday?"),
    ("Why was my card declined?", "My card got declined, why?"),
    ("Did my payment go through?", "Has my payment gone through?"),
    ("What's the next step?", "What should I do next?"),
    ("How do I reset my password?", "How do you reset your password?"),
    ("What is our refund policy?", "What is your refund policy?"),
    ("Can I cancel my order?", "Could I cancel my order?"),
    ("What are the terms & conditions?", "What are the terms and conditions?"),
    # what a symbol rule must not read as an operator or a sign (a review found each)
    ("Refund policy - how does it work?", "How does the refund policy work?"),
    ("What is the **refund** policy?", "What is the refund policy?"),
    ("How do I reset my password? 🙏", "How do I reset my password?"),
    ("Is Weir™ free?", "Is Weir free?"),
    ("How many ≥ 18 users?", "How many >= 18 users?"),
    ("Why do I get error [403]?", "Why do I get error 403?"),
    ("How do I change my e-mail address?", "How can I change my e-mail address?"),
    ("Can you send me my invoice?", "Can I get my invoice from you?"),
    ("When is the deadline?", "What is the deadline?"),
    ("Can I have more than one account?", "Is it allowed to have multiple accounts?"),
    ("Why was I charged twice?", "There is a double charge on my card"),
    # a count in words on one side only is an idiom's (a review found each refused)
    ("Can I see all my invoices in one place?", "Can I see all my invoices together?"),
    ("Is this a one time payment?", "Is this paid once?"),
    ("How do I turn on two-factor authentication?",
     "How can I enable two factor authentication on my account?"),
    ("How long does a refund take?", "How long until you give me my refund?"),
])
def test_paraphrases_pass(a: str, b: str) -> None:
    assert guard_ok(a, b) and guard_ok(b, a)


def test_the_price_of_the_slot_rule_a_one_word_synonym_swap_misses() -> None:
    assert not guard_ok("What are your opening hours?", "What are your business hours?")
    assert guard_ok("How do I reset my password?", "How can I reset my password?")


def test_the_price_of_the_order_rule_a_reordered_pair_misses() -> None:
    assert not guard_ok("What is the difference between cats and dogs?",
                        "What is the difference between dogs and cats?")
    assert not guard_ok("How do I reset my password?", "Password reset: how do I do it?")


class StuckEmbedder(FakeEmbedder):
    """Never answers: a model busy with someone else's batch."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = 0
        self.gave_up = asyncio.Event()

    async def embed(self, texts: list[str]) -> tuple[Any, list[int]]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            self.gave_up.set()
            raise
        raise AssertionError("unreachable")


async def test_a_slow_embedding_is_a_miss_not_a_wait() -> None:
    emb = StuckEmbedder()
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics(),
                        embedder=emb)
    # Not lazy: the index is empty, and a lazy cache would not embed (nothing to find).
    p = CachePlugin(CacheConfig.model_validate(
        {"semantic": {"lookup_timeout_ms": 20, "lazy": False}}), services)
    eng, c = Engine(), ctx("How do I reset my password?")
    await asyncio.wait_for(p(c, eng), 10)  # not run(): storing would embed again, forever
    assert c.response_headers["x-weir-cache"] == "miss" and eng.calls == 1
    # The generation did not wait for the lookup; the lookup's deadline still ends it.
    await asyncio.wait_for(emb.gave_up.wait(), 10)
    assert emb.cancelled == 1
    assert p.metrics.lookups.labels("semantic", "timeout")._value.get() == 1
    await p.close()


class GatedEmbedder(FakeEmbedder):
    """Answers once `gate` opens: a busy model, released when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.arrivals: asyncio.Queue[None] = asyncio.Queue()  # one per call

    async def embed(self, texts: list[str]) -> tuple[Any, list[int]]:
        self.arrivals.put_nowait(None)
        await self.gate.wait()
        return await super().embed(texts)


class Generation:
    """A call_next that records what became of its generation."""

    def __init__(self, stream: bool) -> None:
        self.engine = Engine(gate=None if stream else asyncio.Event())
        self.entered = self.engine.entered
        self.cancelled = False
        self.reply: Reply | None = None
        self.returned = asyncio.Event()

    async def __call__(self, c: RequestContext) -> Reply:
        c.response_headers["x-downstream"] = "generating"
        try:
            self.reply = await self.engine(c)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.returned.set()
        return self.reply


def racing_plugin() -> tuple[CachePlugin, GatedEmbedder]:
    emb = GatedEmbedder()
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics(),
                        embedder=emb)
    # No head start: every slow lookup races its generation (no timing in the test). Not
    # lazy: every miss looks up, even in an empty partition (lazy lookups: test_lazy.py).
    cfg = {"semantic": {"threshold": 0.8, "head_start_ms": 0, "lazy": False}}
    return CachePlugin(CacheConfig.model_validate(cfg), services), emb


def overlapped(p: CachePlugin, result: str) -> float:
    return sample(p, "weir_cache_overlapped_total", result=result)


async def test_a_late_semantic_hit_cancels_the_generation() -> None:
    p, emb = racing_plugin()
    await run(p, ctx("How can I reset my password please?"), Engine())
    emb.gate.clear()
    gen, c = Generation(stream=False), ctx("How do I reset my password please?")
    task = asyncio.create_task(p(c, gen))
    await gen.entered.wait()  # generating while the lookup waits for the model
    emb.gate.set()
    reply = await asyncio.wait_for(task, 10)
    assert c.response_headers["x-weir-cache"] == "semantic"
    assert "x-downstream" not in c.response_headers  # the dropped generation's headers
    assert gen.cancelled and isinstance(reply, Completion)
    assert reply.body["choices"][0]["message"]["content"] == "Use the reset link."
    assert overlapped(p, "cancelled") == 1 and overlapped(p, "generated") == 0
    await p.close()


@pytest.mark.parametrize(("headers", "cached"), [
    ({"cache-control": "max-age=60"}, False), ({"cache-control": "no-cache"}, False),
    ({"cache-control": "max-age=600"}, True), ({}, True),
])
async def test_a_follower_takes_the_leaders_hit_only_if_it_would_read_it(
        headers: dict[str, str], cached: bool) -> None:
    """The leader's late semantic hit goes to the identical requests waiting on it. A
    follower that would not read that answer (too old for its max-age, or no-cache)
    generates its own; one that would gets it, with its Age."""
    p, emb = racing_plugin()
    asked = "How can I reset my password please?"
    await run(p, ctx(asked), Engine())
    old = await p.store.get(exact_key(ctx(asked), p.cfg.scope), scope_id(ALICE, p.cfg.scope))
    assert old is not None
    old.created -= 120
    for part in p.store.index.partitions.values():  # (the semantic layer's own copy)
        for held, _ in part.entries.values():
            held.created -= 120
    emb.gate.clear()
    gen, lc = Generation(stream=False), ctx("How do I reset my password please?")
    leader = asyncio.create_task(p(lc, gen))
    await gen.entered.wait()  # generating while the lookup waits for the model
    own = Engine()
    fc = ctx("How do I reset my password please?", headers=headers)
    follower = asyncio.create_task(p(fc, own))
    # Its cache header is set (miss, or bypass for no-cache) just before it follows.
    await eventually(lambda: "x-weir-cache" in fc.response_headers)
    emb.gate.set()
    await asyncio.wait_for(leader, 10)
    await asyncio.wait_for(follower, 10)
    assert lc.response_headers["x-weir-cache"] == "semantic"
    if cached:
        assert fc.response_headers["x-weir-cache"] == "coalesced" and own.calls == 0
        assert int(fc.response_headers["Age"]) >= 120
    else:
        assert own.calls == 1  # generated for itself
    await p.close()


async def test_a_stream_that_starts_first_goes_out() -> None:
    """The first chunk is there before the lookup ends: the stream is the answer (the
    lookup still ends, and gives the stored entry its vector)."""
    p, emb = racing_plugin()
    await run(p, ctx("How can I reset my password please?"), Engine())
    emb.gate.clear()
    gen = Generation(stream=True)
    c = ctx("How do I reset my password please?", stream=True)
    reply = await asyncio.wait_for(p(c, gen), 10)
    assert reply is gen.reply and c.response_headers["x-weir-cache"] == "miss"
    assert overlapped(p, "generated") == 1 and overlapped(p, "cancelled") == 0
    assert isinstance(reply, Stream)
    [x async for x in reply]
    emb.gate.set()
    await p.store.drain()
    assert emb.calls == 2 and len(p.store.index) == 2  # one embedding per question
    await p.close()


async def test_a_generation_failing_before_output_still_takes_a_late_hit() -> None:
    p, emb = racing_plugin()
    await run(p, ctx("How can I reset my password please?"), Engine())
    emb.gate.clear()
    called = asyncio.Event()

    async def failing(c: RequestContext) -> Reply:
        called.set()
        raise RuntimeError("engine down")

    c = ctx("How do I reset my password please?")
    task = asyncio.create_task(p(c, failing))
    await called.wait()  # failed while the lookup waits for the model
    emb.gate.set()
    reply = await asyncio.wait_for(task, 10)
    assert c.response_headers["x-weir-cache"] == "semantic" and isinstance(reply, Completion)
    emb.gate.clear()
    called.clear()
    c = ctx("How do I close my account for good?")
    task = asyncio.create_task(p(c, failing))
    await called.wait()
    emb.gate.set()
    with pytest.raises(RuntimeError, match="engine down"):  # a miss: the failure stands
        await asyncio.wait_for(task, 10)
    await p.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_late_semantic_miss_keeps_the_generation(stream: bool) -> None:
    p, emb = racing_plugin()
    emb.gate.clear()
    gen, c = Generation(stream), ctx("How do I close my account for good?", stream=stream)
    task = asyncio.create_task(p(c, gen))
    await gen.entered.wait()
    if not stream:
        assert gen.engine.gate is not None
        gen.engine.gate.set()
    emb.gate.set()
    reply = await asyncio.wait_for(task, 10)
    assert reply is gen.reply and c.response_headers["x-weir-cache"] == "miss"
    assert c.response_headers["x-downstream"] == "generating"
    if isinstance(reply, Stream):
        [x async for x in reply]
    await p.store.drain()
    # Stored under the lookup's own vector: the question was embedded once.
    assert emb.calls == 1 and len(p.store.index) == 1
    assert overlapped(p, "generated") == 1 and overlapped(p, "cancelled") == 0
    _, layer = await run(p, ctx("How do I close my account for good please?"), Engine())
    assert layer == "semantic"
    await p.close()


async def test_a_client_gone_mid_race_cancels_both() -> None:
    p, emb = racing_plugin()
    emb.gate.clear()
    gen, c = Generation(stream=False), ctx("How do I close my account for good?")
    task = asyncio.create_task(p(c, gen))
    await gen.entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gen.cancelled and p.in_flight() == 0
    emb.gate.set()
    await p.store.drain()
    assert len(p.store.index) == 0 and len(p.store.l1) == 0  # type: ignore[arg-type]
    await p.close()


async def test_a_request_overtaken_during_its_lookup_takes_the_stored_answer() -> None:
    """Two identical requests look up at once; the first one's generation ends (and is
    stored) before the second decides to generate: the second answers from it."""
    p, emb = racing_plugin()
    p.cfg.semantic.head_start_ms = 10_000  # both wait for their lookups: no race here
    emb.gate.clear()
    eng = Engine()
    tasks = [asyncio.create_task(p(ctx("How do I close my account?"), eng))
             for _ in range(2)]
    for _ in tasks:
        await emb.arrivals.get()  # both lookups under way, neither request generating
    emb.gate.set()
    replies = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert eng.calls == 1 and all(isinstance(r, Completion) for r in replies)
    assert sample(p, "weir_cache_coalesced_total") == 1
    await p.close()


async def test_a_client_gone_as_the_race_is_won_frees_the_stream() -> None:
    """The lookup missed and the request awaits its generation; the client leaves in
    the very step the generation hands over its stream. The stream is ended (its hooks
    free the engine slot and the lease); awaiting the finished task dropped it before."""
    p, emb = racing_plugin()
    emb.gate.clear()
    entered, go = asyncio.Event(), asyncio.Event()
    ended: list[str] = []
    task: asyncio.Task[Reply]

    async def source() -> Any:
        yield {"n": 0}

    async def generate(c: RequestContext) -> Reply:
        entered.set()
        await go.wait()
        stream = Stream(source())
        stream.on_end(lambda s, outcome: ended.append(outcome))
        asyncio.get_running_loop().call_soon(task.cancel)  # before the handover runs
        return stream

    task = asyncio.create_task(p(ctx("How do I close my account for good?", stream=True),
                                 generate))
    await entered.wait()
    emb.gate.set()  # the lookup misses: the request now awaits the generation
    for _ in range(1000):  # bounded: a few loop turns
        if overlapped(p, "generated") == 1:
            break
        await asyncio.sleep(0)
    assert overlapped(p, "generated") == 1
    go.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(1000):
        if ended:
            break
        await asyncio.sleep(0)
    assert ended == ["cancelled"] and p.in_flight() == 0
    await p.close()


def test_code_indented_otherwise_is_another_question() -> None:
    """Indentation is meaning in code (a statement in a loop's body or after it) and an
    embedding does not see it: the guard refuses, on the text and on a digest from
    Redis. Prose has no layout, and its digests are as they were."""
    from plugins.cache.guard import DIGEST_MARK, guard_digest

    body = "How many times does this print hi?\n\nfor i in range(3):\n    x = i\n"
    inside, after = body + '    print("hi")', body + 'print("hi")'
    assert not guard_ok(inside, after) and not guard_ok(after, inside)
    assert not guard_ok(inside, guard_digest(after))
    assert guard_ok(inside, inside) and guard_ok(inside, guard_digest(inside))
    assert guard_digest("How do I reset my password?").startswith(DIGEST_MARK)
    assert guard_ok("How do I reset my password?",
                    guard_digest("How can I reset my password?"))


@pytest.mark.parametrize("text", ["\u017fingle room", "\u017fix users",
                                  "Why was I charged tw\u0130ce?", "ONE extra user"])
def test_odd_spellings_of_counts_are_read_without_failing(text: str) -> None:
    """(a count word matched case-blind in Unicode, "six" with a long s, had no value: a KeyError on
    the request path)"""
    from plugins.cache.guard import gate, guard_digest

    assert guard_ok(text, text) and gate(text) and guard_digest(text)


async def test_a_lookup_overtaken_by_an_identical_answer_is_dropped() -> None:
    """An identical request generated and stored its answer while this one's semantic
    lookup ran past its head start: this one is answered from that entry, and its lookup
    (an embedding a busy model had yet to do) is cancelled; it ran on to its own
    deadline, for nothing."""
    p, _ = racing_plugin()
    await run(p, ctx("Where is my order please?"), Engine())  # (a partition to look in)
    release, hold, started, cancelled = (asyncio.Event() for _ in range(4))

    async def head_start(look: Any) -> bool:  # the head start runs out when we say
        await release.wait()
        return bool(look.done())

    real = p.store.lookup

    async def lookup(*a: Any, **kw: Any) -> Any:  # a busy model: it waits for `hold`
        started.set()
        try:
            await hold.wait()
            return await real(*a, **kw)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    p._given_head_start = head_start  # type: ignore[method-assign]
    p.store.lookup = lookup  # type: ignore[method-assign]
    asked = "How do I reset my password please?"
    c, own = ctx(asked), Engine()
    waiting = asyncio.create_task(p(c, own))
    try:
        await asyncio.wait_for(started.wait(), 10)  # its lookup is under way
        # an identical request that does not read the cache generates and stores
        await run(p, ctx(asked, headers={"cache-control": "no-cache"}), Engine())
        release.set()
        await asyncio.wait_for(waiting, 10)
        assert c.response_headers["x-weir-cache"] == "coalesced" and own.calls == 0
        await asyncio.wait_for(cancelled.wait(), 10)
    finally:
        hold.set()
        await p.close()
