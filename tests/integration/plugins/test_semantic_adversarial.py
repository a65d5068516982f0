"""The semantic layer on near misses made to break the guard (tests/data/
semantic_adversarial.yaml): customer-support questions with a number, an entity, a
negation, a direction, a unit, an added instruction, an owner or a role, or an extreme
changed, each family written many ways. With the real embedding model, the default
threshold and the guard, none may hit; the paraphrases there mostly do."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from bench.embedders import DATA, rates, score_set
from plugins.cache.config import SemanticConfig
from proxy.embed_models import load_runtime
from proxy.settings import EmbeddingSettings

# (set, the paraphrase hit rate it must keep). adversarial: the near misses made to
# break the guard (module docstring). fresh (stop 45: HR, payroll, troubleshooting,
# medical admin, travel, banking, returns, subscriptions; typos, short forms, polite
# wrappers, numbers in words, dates, currencies, quantifiers, actions): measured before
# the guard was changed for it, 40/70 paraphrases, 10 near misses and 1 distinct stored
# question hit. probe (stop 45, written without reading the guard: programming, maths
# word problems, recipes, legal terms, multi-clause questions, versions and names,
# percentages, ranges, with/without, plurals, time zones, target languages,
# German/Spanish/French, very short and very long questions, ids, emails and URLs):
# measured before the guard was changed for it, 25/42 paraphrases, 6 of 124 near misses
# hit. None may hit now. blind (stop 46, written without reading the guard: outcomes
# that are not simple antonyms, actions and their undoing, exchanges seen from the other
# side, before / after, who does what to whom, numbers in words, currencies, versions,
# dates, plurals, with / without, can / must, places, product tiers, French / Spanish /
# German, code identifiers): measured before the guard was changed for it, 25/40
# paraphrases, 5 of 135 near misses hit ("My number is cancelled" / "I kept my number",
# archive / restore, gift / receive, "Can I" / "Do I have to", the first in Spanish);
# then 33/40 once phrasal verbs, currency codes, a day before its month and the small
# words of another language read as the guard's English (probe: 27/42). blind2 (stop 47,
# written without reading the guard: banking and fintech, telecom, insurance claims,
# enrolment, government forms, devops, shopping, health appointments, quantities,
# dates, must / may, if / unless, all / any, comparisons, actors, a question word
# swapped): measured before the guard was changed for it, 27/40 paraphrases, 5 of 79
# near misses hit ("Who can sign the form?" / "Where can I ...", add money to / enter a
# gift card, add / check data, file / check the status of a claim, register / check if
# registered); after the fixes they found, 27/40 and 0 of 124 near misses (45 variants
# added, 43 of them false hits before the fixes: 48 of 124 then). blind3 (stop 49,
# written before any guard change: travel, HR and payroll, health appointments, SaaS
# admin, returns, utilities, git / docker / python; who acts, a state against an act or
# a future, tense, modals, quantities, directions, scope, time, conditions, antonym
# verbs, purpose): measured before the guard was changed for it, 35/62 paraphrases, 10
# of 86 near misses hit ("Why do you need my ID?" / "Why do I need my ID?", "Is my
# account frozen?" / "Will my account be frozen?", "Is SSO enabled ...?" / "How do I
# enable SSO ...?", one and a half times / twice, all flights / this flight, part of /
# my whole order, stash / apply stashed changes); after the fixes they found, 0 of 86.
SETS = [("semantic_adversarial", 0.8), ("semantic_fresh", 0.7), ("semantic_probe", 0.6),
        ("semantic_blind", 0.8), ("semantic_blind2", 0.65), ("semantic_blind3", 0.55)]


@pytest.mark.parametrize(("name", "paraphrases"), SETS, ids=[n for n, _ in SETS])
def test_no_false_hit(name: str, paraphrases: float) -> None:
    s = EmbeddingSettings()
    runtime = load_runtime(s.model, s.max_input_tokens, s.threads)
    data: dict[str, Any] = yaml.safe_load((DATA / f"{name}.yaml").read_text())
    r = rates(score_set(data, runtime), SemanticConfig().threshold)
    print(f"\n{name}: paraphrase hits {r['paraphrase_hit_rate']:.0%} of "
          f"{r['paraphrases']}, near-miss hits {r['near_miss_hits_by_kind']}")
    assert r["near_miss_hits"] == 0, r["near_miss_hits_by_kind"]
    assert r["different_question_hits"] == 0
    assert r["paraphrase_hit_rate"] >= paraphrases
