"""The guard refuses a question about someone else's thing (guard_roles.py), and keeps
the paraphrases that name the same owners."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_roles import owners


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I delete my account?", "How do I delete a user's account?"),
    ("How do I change my own role?", "How do I change another member's role?"),
    ("Can I view my team's activity?", "Can my team view my activity?"),
    ("Can my employer see my messages?", "Can I see my employer's messages?"),
    ("Can my boss read my chats?", "Can I read my boss\u2019s chats?"),
    ("Can an admin delete my account?", "Can I delete an admin's account?"),
    ("How do I reset an employee's password?", "How do I reset my password?"),
    ("Can users change their own email?", "Can admins change users' emails?"),
    ("How do I see who viewed my profile?", "How do I see whose profile I viewed?"),
    ("Can I share my screen with the host?", "Can the host share their screen with me?"),
    ("How do I transfer credits from my account to my son's?",
     "How do I transfer credits from my son's account to mine?"),
    ("Can teachers see student grades?", "Can students see teacher grades?"),
    ("Can sellers see buyer reviews?", "Can buyers see seller reviews?"),
])
def test_other_owners_or_swapped_roles_miss(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I reset my password?", "I forgot my password, how do I reset it?"),
    ("Can I keep my phone number if I switch to you?",
     "Can I transfer my number to your network?"),
    ("Can my manager see my invoices?", "Is it possible for my manager to see my invoices?"),
    ("How do I reset my child's password?", "How can I reset my child's password?"),
])
def test_the_same_owners_pass(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


def test_owners_read_contractions_as_none() -> None:
    assert owners("what's it's there's where's") == ()
    assert owners("the users' emails and the admin's role") == ("user", "admin")


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can I see my orders?", "Can you see my orders?"),
    ("Can I cancel my order?", "Can you cancel my order?"),
    ("Do I need a passport?", "Do you need a passport?"),
    ("Should I update the app?", "Should you update the app?"),
    ("Will I get a refund?", "Will you get a refund?"),
    ("Can we change the plan?", "Can you change the plan?"),
    ("Hi, can I reset my password?", "Hi, can you reset my password?"),
])
def test_another_subject_of_a_yes_no_question_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is there a reason you need my ID?", "Is there a reason I need my ID?"),
    ("Is it true that you keep my card details?", "Is it true that I keep my card details?"),
    ("What is the way you store my data?", "What is the way I store my data?"),
])
def test_another_subject_of_a_clause_misses_where_the_asker_is_named(
        stored: str, asked: str) -> None:
    """A clause's subject after a noun ("a reason you need ..."): "you" is the other
    party where the asker is named ("my"), so "I" there is another subject."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I reset my password?", "How do you reset my password?"),  # anyone's "you"
    ("Can I see the invoice?", "Can we see the invoice?"),
    ("Is there a way I can reset the router?", "Is there a way you can reset the router?"),
])
def test_the_same_subject_or_a_generic_you_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is a tenant allowed to sublet the flat?", "Is a landlord allowed to enter the flat?"),
    ("Can the buyer cancel the sale?", "Is the seller able to cancel the sale?"),
    ("What must an employer pay after a dismissal?",
     "What must employees pay after a dismissal?"),
    ("Can students see the exam results early?",
     "Are teachers able to see the exam results early?"),
])
def test_the_other_party_of_a_relation_misses(stored: str, asked: str) -> None:
    """One side of a relation for its counterpart, the frame reworded round it (and the
    verb too: "sublet" / "enter")."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can a landlord evict a tenant in winter?",
     "Is a landlord allowed to evict tenants in winter?"),
    ("Can a seller cancel a sale?", "Could the seller cancel the sale?"),
])
def test_the_same_parties_hit(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I delete my account?", "How does an admin delete a user account?"),
    ("Can I cancel the order?", "Can the seller cancel the order?"),
    ("How do we reset the password?", "How does someone reset the password?"),
    ("Should I sign the contract first?", "Should my lawyer sign the contract first?"),
])
def test_the_asker_and_a_third_party_doing_it_miss(stored: str, asked: str) -> None:
    """The asker doing the thing, and a third party doing it, ask two things, whoever
    owns the thing (semantic_adversarial: 0.685, held off by the score alone)."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I delete my account?", "How can one delete an account?"),
    ("Can the seller cancel the order?", "Could the seller cancel an order?"),
])
def test_the_same_doer_hits(stored: str, asked: str) -> None:
    """"one" is the asker."""
    assert guard_ok(asked, stored)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Am I allowed to cancel the lease early?",
     "Is the landlord allowed to cancel the lease early?"),
    ("Am I able to see the shared files?", "Is my manager able to see the shared files?"),
    ("When are we allowed to file the report?",
     "When is the company allowed to file the report?"),
    ("Can I end the lease early?", "Is the landlord allowed to end the lease early?"),
])
def test_the_asker_and_a_third_party_allowed_to_do_it_miss(stored: str, asked: str) -> None:
    """"Am I allowed to ...?" / "Is the landlord allowed to ...?": a "be" and its subject
    before what it may do name the doer as an auxiliary does (it hit, 0.91)."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Am I allowed to cancel the lease early?", "Can I cancel the lease early?"),
    ("Is the landlord allowed to cancel the lease?",
     "Is a landlord allowed to cancel the lease?"),
    ("When are we allowed to file the report?", "When are we allowed to file our report?"),
    ("Do I need a referral to see a specialist?", "Is a referral required for a specialist?"),
])
def test_the_same_doer_allowed_to_do_it_hits(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)
