"""Sanitizer: the shapes a detector reads (stop 52): a card's digits bounded as a
number's, not a run inside a hex word or a hex dump's row; a key's body as a key's, not
words after "sk-"; look-alikes read as the marks and capitals a reader sees."""

from __future__ import annotations

import base64
import random

import pytest

from plugins.sanitizer.detectors import BUILTIN, forget
from proxy.text import fold, scanned, scanned_places


def found(name: str, text: str) -> list[str]:
    """What detector `name` finds in `text` as the sanitizer reads it (folded, then
    scanned), each span placed back in the folded text."""
    folded = fold(text)
    norm = scanned(folded)
    at = scanned_places(folded)
    try:
        return [folded[at[a]:at[b - 1] + 1] for a, b in BUILTIN[name].find(norm)]
    finally:
        forget()


def _xxd(data: bytes) -> str:
    """`data` as `xxd` writes it: an offset, eight groups of two bytes, the text."""
    rows = []
    for i in range(0, len(data), 16):
        row = data[i:i + 16].hex()
        groups = " ".join(row[j:j + 4] for j in range(0, len(row), 4))
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in data[i:i + 16])
        rows.append(f"{i:08x}: {groups:<39}  {text}")
    return "\n".join(rows)


def _hexdump_c(data: bytes) -> str:
    rows = []
    for i in range(0, len(data), 16):
        chunk = data[i:i + 16]
        pairs = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        rows.append(f"{i:08x}  {pairs:<47}  |{text}|")
    return "\n".join(rows)


_BYTES = random.Random(52).randbytes(16384)


# ---------------------------------------------------------- cards in hex (stop 52)

@pytest.mark.parametrize("text", [
    _BYTES.hex(),  # `xxd -p`, `.hex()`: one long hex word
    "\n".join(_BYTES[i:i + 30].hex() for i in range(0, len(_BYTES), 30)),  # `xxd -p` lines
    "sha256 " + "ab4546252854754769cd" * 3,
    "segfault at 0x7ffd4546252854754769 ip 00007f3a36147206854082 sp 7ffc4190745331541f",
    "commit 9f4546252854754769e0c1 fixed it",
    _xxd(bytes.fromhex("4111111111111111") + _BYTES[:24]),
    _xxd(_BYTES[:6] + bytes.fromhex("4111111111111111") + _BYTES[:18]),
    _hexdump_c(_BYTES[:512]),
])
def test_digits_inside_a_hex_word_or_a_hex_dump_are_no_card(text: str) -> None:
    """A run of decimal digits inside a longer hex word (a hash, an address, `xxd -p`'s
    lines: 16 hex digits in a row are all decimal one time in 2,000) was read as a card
    wherever it passed Luhn and began as an issuer's: the card pattern's bounds were
    digits only, so a hex letter beside the run bounded it as a space does. And a row of
    `xxd` whose groups happen to be decimal read as a card grouped by spaces. A card's
    digits are bounded by what is neither a letter nor a digit, and groups of a hex
    dump's row (after its offset, beside other hex groups) are bytes."""
    assert found("card", text) == []


@pytest.mark.parametrize("text", [
    "card 4111 1111 1111 1111 exp 12/29",
    "card:4111111111111111.",
    "カード4111111111111111です",
    "(4111-1111-1111-1111)",
    "pay_4111111111111111",
    "00000010: my card is 4111 1111 1111 1111",
    "2026-12-07 10:00:01 charge 4111 1111 1111 1111 ok",
])
def test_a_card_bounded_by_other_than_letters_and_digits_is_still_one(text: str) -> None:
    assert found("card", text), text


# ------------------------------------------ a double low line for a low line (stop 52)

@pytest.mark.parametrize(("text", "key"), [
    ("token ghp\u2017aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6 ok",
     "ghp\u2017aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6"),
    ("sk\u2017live\u20174eC39HqLyjWDarjtT1zdp7dc", "sk\u2017live\u20174eC39HqLyjWDarjtT1zdp7dc"),
    ('{"k": "ghp\\u2017aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6"}',
     "ghp\\u2017aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6"),
])
def test_a_double_low_line_for_a_low_line_hides_no_key(text: str, key: str) -> None:
    """"\u2017" (DOUBLE LOW LINE) reads as "_" to a reader, but NFKC makes it a space and a
    combining double low line: "ghp\u2017..." reached the detectors as "ghp \u0333...", no
    key. It is kept through NFKC and read as "_" where the other look-alike marks are
    (`proxy.text._AS`)."""
    assert key in found("secret", text), found("secret", text)


def test_a_double_low_line_still_goes_on_as_written() -> None:
    assert fold("a\u2017b") == "a\u2017b"
    assert scanned(fold("a\u2017b \u00b2")) == "a_b 2"


# ------------------------------------------------------ a key's body after sk- (stop 52)

@pytest.mark.parametrize("text", [
    "see quarterly-review-sk-2026-q1-planning-notes-final",
    "naïve-bayes-sk-learn-pipeline-v2-final",
    "blog/2026/sk-2026-year-in-review-part-2",
    "tutorial sk-learn-0.24-compat-shim-notes-v3",
    "branch feature/sk-2026-billing-migration-step-4",
    "placeholder sk-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "sk-proj-your-key-goes-here-2026",
])
def test_words_after_sk_are_no_key(text: str) -> None:
    """A slug or a name with "-sk-" in it, words and short numbers joined by hyphens
    ("...-sk-2026-q1-planning-notes-final", "naïve-bayes-sk-learn-pipeline-v2-final"),
    matched the OpenAI format's 20 characters of [A-Za-z0-9_-] and was a key: only a slug
    of lower-case letters alone was given back. A key's body is random: a run of 16
    letters and digits at least that mixes digits or cases, of 8 characters or more."""
    assert found("secret", text) == []


@pytest.mark.parametrize("key", [
    "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7",
    "sk-proj-abcdefghijklmnopqrstuvwx1234",
    "sk-proj-abcdefghijklmnopqrstuvwxyzABCDEFGH",
    "sk-" + "T3BlbkFJ" * 6,
    "sk-proj-" + "Ab3dEf6h-Ij9kLm2nOp5_qRs8tUv1wXy4zQ7aB3d" * 4,
    "sk-ant-api03-" + "aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6" * 2 + "-" + "x1Y2z3" * 4 + "AA",
    "sk-svcacct-aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6",
    "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "sk-planted-SECRET-0123456789abcdef",
])
@pytest.mark.parametrize("dress", [
    "{}", "key: {} ok", "OPENAI_API_KEY={}", '{{"api_key": "{}"}}',
    "url?k={}&x=1",
])
def test_keys_after_sk_are_still_keys(key: str, dress: str) -> None:
    text = dress.format(key)
    assert key in found("secret", text), found("secret", text)


@pytest.mark.parametrize("text", [
    "s\u043a-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7",  # a Cyrillic ka
    "sk%2Dproj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7",  # URL-encoded
    "sk\\u002dproj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7",  # a JSON escape written out
    "sk&#45;proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7",  # an HTML character reference
    "\u015bk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7",  # an accented letter
    "key " + b"sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7".hex(),
    "key sk-proj-Ab3dEf6hIj9k\nLm2nOp5qRs8tUv1wXy4zQ7",  # wrapped
])
def test_a_key_after_sk_in_disguise_is_still_one(text: str) -> None:
    assert found("secret", text), text


# ------------------------------------- a look-alike among capitals is one (stop 52)

@pytest.mark.parametrize(("text", "key"), [
    ("aws AK\u0131AIOSFODNN7EXAMPLF", "AK\u0131AIOSFODNN7EXAMPLF"),  # dotless i
    ("aws_access_key_id=AK\u0131AIOSFODNN7EXAMPLF", "AK\u0131AIOSFODNN7EXAMPLF"),
    ("id AKIA\u0131OSFODNN7EXAMPLF ok", "AKIA\u0131OSFODNN7EXAMPLF"),
    ("AKIA0\u026a23456789ABCDEF", "AKIA0\u026a23456789ABCDEF"),  # a small capital I
    ("\u0131\u0131\u0131 AKIAIOSFODNN7EX\u0251MPLF", "AKIAIOSFODNN7EX\u0251MPLF"),  # Latin alpha
    ("key AK\u0131AIOSFODNN7EXAMPLF".encode().hex(), None),
])
def test_a_look_alike_in_a_word_of_capitals_reads_as_a_capital(text: str,
                                                               key: str | None) -> None:
    """A dotless i (or a small capital, a Latin alpha) reads as "i" (or "a"), so a key
    all in capitals with one in it ("AK\u0131A...") matched no format of capitals: to a
    reader "\u0131" among capitals is an "I". The look-alike reading of a word that is
    otherwise all capitals takes the capital."""
    said = found("secret", text)
    assert said and (key is None or key in said), said


@pytest.mark.parametrize("text", [
    "Kap\u0131 a\u00e7\u0131k, AKIA bir kelime burada.",  # Turkish prose
    "KAPI A\u00c7IK ve ISIK",  # Turkish capitals (their own dotless I is a plain I)
    "\u0131\u0131\u0131 AK\u0131A",  # too short
])
def test_turkish_text_with_capitals_is_no_key(text: str) -> None:
    assert found("secret", text) == []


@pytest.mark.parametrize("text", [
    "https://example.com/list?x&amp;token=page3", "pip install torch%3D%3D2.1.0.1",
    "filter: ip >= 10.0.0.1", "https://example.com/login?auth=oauth2",
    "https://example.com/api?auth=hmac-sha256",
])
def test_ordinary_text_stays_clean(text: str) -> None:
    """(The address a filter compares is one: the IP detector's, and only that.)"""
    said = {n: found(n, text) for n in BUILTIN if found(n, text)}
    assert said == ({"ip": ["10.0.0.1"]} if "ip >=" in text else {})


# ----------------------------------------- phone numbers in hex (stop 52)


@pytest.mark.parametrize("text", [
    "segfault at 0x7ffd13812345678f ip 00007f3a1391234567a8",
    "sha1 f19722548486c5bd400b6abf13912345678e",
    _xxd(bytes.fromhex("f079746432c6f19722548486400b6abf") * 2),
    _xxd(bytes.fromhex("7536af333100224c0012345744ffa1b2") * 2),
    "chunk 00984641abcdef0123456789abcdef01 ok",
])
def test_digits_inside_a_hex_word_or_a_hex_dump_are_no_phone(text: str) -> None:
    """As a card's: a Chinese mobile number's 11 digits inside a hex word ("f197 2254
    8486" in a row of `xxd`, "...0x7ffd13812345678f") and an international number's
    "00" inside a hex dump's row were phone numbers."""
    assert found("cn_mobile", text) == [] and found("phone", text) == []


@pytest.mark.parametrize("text", [
    "我的手机是13812345678", "+86 138 1234 5678", "手机:138-1234-5678。", "call +44 20 7946 0958",
    "tel 0044 20 7946 0958", "00000010: call me on +44 20 7946 0958",
    "+44 20 7946 0958x204", "0044 20 7946 0958ext204",
])
def test_a_phone_bounded_by_other_than_letters_and_digits_is_still_one(text: str) -> None:
    assert found("cn_mobile", text) or found("phone", text), text


def test_an_od_row_s_offset_is_no_phone() -> None:
    """`od -A x -t x1z`'s rows start with an offset of six hex digits and no ":": read
    from the offset on ("001000 26 ab ..."), the row was an international number."""
    rows = "\n".join(f"{i:06x} " + " ".join(f"{b:02x}" for b in bytes.fromhex(
        "2666ab3f44966810" * 2)) + "  >&f.?D.h.&f.?D.h.<" for i in range(0x1000, 0x1200, 16))
    assert found("phone", rows) == []


def test_a_hex_dump_s_groups_are_no_iban() -> None:
    """Groups of `xxd` that start with a country's letters and two digits, their mod 97
    passing by chance ("ee24 2b4e 7d26 f346 5ab2 6ea9"), read as an IBAN grouped by
    spaces."""
    text = _xxd(bytes.fromhex("41ab7d02ee242b4e7d26f3465ab26ea9") * 2)
    assert found("iban", text) == []
    assert found("iban", "00000010: IBAN GB82 WEST 1234 5698 7654 32") != []


# ----------------------------- a number glued to a label's letters (stop 52, review)

@pytest.mark.parametrize(("name", "text"), [
    ("card", "card4111111111111111"), ("card", "cc4111111111111111"),
    ("card", "visa4111111111111111"), ("card", "ID4111111111111111"),
    ("card", "cafe4111111111111111"), ("card", "4111111111111111exp1229"),
    ("card", "pay with card4111-1111-1111-1111 now"), ("card", "tel+4915112345678"),
    ("cn_mobile", "mobile13812345678"), ("cn_mobile", "tel13812345678"),
    ("cn_mobile", "mob13812345678 call me"), ("cn_mobile", "13812345678abc"),
    ("phone", "call +44 20 7946 0958x204"), ("phone", "call +44 20 7946 0958ab"),
])
def test_a_number_glued_to_a_word_s_letters_is_still_one(name: str, text: str) -> None:
    """A card or a phone number glued to a label ("card4111...", "mobile138...") was none
    once a number was bounded by what is neither a letter nor a digit: a letter beside
    it bounded it as a digit does. Only a hex word's run is none: the letters and digits
    glued to it all hex and holding a digit too (a hash, an address, `xxd -p`'s lines
    mix them) or following "0x"; hex letters alone beside a number ("cc", "cafe") are
    a word, a label."""
    assert found(name, text), text


@pytest.mark.parametrize("text", [
    "0x4111111111111111", "0X4111111111111111 in r8", "at 0x13812345678",
    "a9" + "4111111111111111" + "e0", "f0" * 20 + "4111111111111111",
    "4111111111111111" + "ab12" * 20, "ip 00007f3a13812345678e",
])
def test_a_run_inside_a_hex_word_is_no_card_or_phone(text: str) -> None:
    said = {n: found(n, text) for n in ("card", "cn_mobile", "phone") if found(n, text)}
    assert said == {}, said


@pytest.mark.parametrize("text", [
    "b256151345463056a7ba361048455777\n499555cb5ee821e7ebf890fdfc",
    "1be542d547f5b119c82a6364\n824841408792bd17ef42745bf4487998",
    "\n".join(random.Random(7).randbytes(400)[i:i + 30].hex() for i in range(0, 400, 30))
    + "\n1088d462cc5314d9221a50906832\n476968488b707d0b1a5aed88f663f",
])
def test_a_hex_word_wrapped_over_lines_is_no_card(text: str) -> None:
    """`xxd -p`'s lines (and a hash wrapped): a run of digits at one line's end and
    another at the next one's start, each inside a hex word, passed Luhn together and
    were a card split over two lines."""
    assert found("card", text) == []


@pytest.mark.parametrize("text", [
    "card 4111 1111\n1111 1111", "card4111 1111\n1111 1111 ok", "cafe4111 1111\n1111 1111",
])
def test_a_card_wrapped_over_lines_is_still_one(text: str) -> None:
    assert found("card", text), text


def test_a_hex_word_a_window_cuts_is_no_iban() -> None:
    """The IBAN pattern is read in a window about runs of digits, and its "\\b" took the
    window's edge inside a word for a word's: the first 17 characters of a commit's hash
    ("ee23cc8aedeedbca3...", a country's letters, two digits) passed mod 97."""
    text = ("commit c98bcb5d44ab49a6603528006e92dabb9fcb01fb\n"
            "commit ee23cc8aedeedbca389af7bad9016f208fddd112")
    assert found("iban", text) == []
    assert found("iban", text + "\nIBAN GB82WEST12345698765432 ok") == ["GB82WEST12345698765432"]


@pytest.mark.parametrize("key", [
    "sk-nxfnwsysvqvpeumefdpxpwqosxfeiygesqkhwryjvwntssi",  # one case, random
    "sk-JAIPZMGFSLHKPYENWPWTGOSURAPXCMZX",
    "sk-29042052611114405795005566713976",  # digits alone
    "sk-KIHhQFGw-dTsRUKVl-PPUOjlx4-6PDhg7Jj-6vPUPMAJ-tP",  # in short segments
    "sk-X6UhlSmKAQ_Vz0ViLMj3z_ZmIHkKlm3q_xYsb1ZC5A8_0yu",
    "sk-a6fafb1c-9c29-5d3c-ac5c-b5bde7efb85c",  # a UUID's shape
])
@pytest.mark.parametrize("dress", ["{}", "key: {} ok", '{{"k": "{}"}}'])
def test_a_key_body_of_one_kind_or_in_short_segments_is_still_one(key: str,
                                                                  dress: str) -> None:
    """`_key_body` asked for a run of 16 or more that mixes digits with letters or both
    cases: a body of one case or of digits alone (a gateway's own keys, 32 or 48 random
    characters), or one in short segments (a UUID's shape, `-`/`_` every 8 or 12), was
    no key. A long run of one kind with 8 different characters is one, and so are two
    segments or more whose digits and letters interleave (not a word and its number:
    "resnet50", "v2")."""
    text = dress.format(key)
    assert key in found("secret", text), found("secret", text)


@pytest.mark.parametrize("text", [
    "sk-resnet50-imagenet-finetune-run12-notes",
    "sk-llama3-8b-instruct-q4-gguf-v2",
    "see sk-2026-12-07-release-notes-draft-final",
])
def test_a_slug_with_numbers_after_sk_is_still_no_key(text: str) -> None:
    assert found("secret", text) == []


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds they take
@pytest.mark.parametrize("text", [
    "\u0131" * 262144 + "a", "A\u0131" * 131072 + "a", "\u00c9\u0251" * 131072 + "b",
])
def test_look_alikes_among_capitals_are_read_in_one_pass(text: str) -> None:
    """The reading of a look-alike among capitals backtracked over each look-alike of a
    long word that a small letter ends (a 32 KiB prompt of "\u0131" took 6 s, each
    doubling four times that); it reads each word once."""
    assert found("secret", text) == []


# ------------------------- a number glued to a label by punctuation (stop 53)

@pytest.mark.parametrize(("name", "text", "said"), [
    ("phone", "phone+442079460958", "+442079460958"),
    ("phone", "tel+4915112345678", "+4915112345678"),
    ("phone", "Mob00447700900123 after six", "00447700900123"),
    ("phone", "WhatsApp+44 7700 900123", "+44 7700 900123"),
    ("card", "no.4111111111111111", "4111111111111111"),
    ("card", "Nr.4111 1111 1111 1111 bitte", "4111 1111 1111 1111"),
])
def test_a_number_glued_to_a_label_by_its_plus_or_a_dot_is_one(name: str, text: str,
                                                                said: str) -> None:
    """A phone word glued to the number's "+" or "00" ("phone+44...") and an
    abbreviation's dot glued to a card ("no.4111...") hid the number: a word before a
    "+" and a "." before digits bounded it as a digit does."""
    assert found(name, text) == [said]


@pytest.mark.parametrize("text", [
    "n+100000000 users", "C++20 and x+12345678", "total+4420794609 rows",
    "pi is 3.4111111111111111 or so", "ratio .4111111111111111", "v1.4111111111111111",
    "https://example.com/p+442079460958", "build.20240101.1234567890123",
])
def test_a_sum_a_decimal_or_a_version_is_no_glued_number(text: str) -> None:
    said = {n: found(n, text) for n in ("card", "phone") if found(n, text)}
    assert said == {}, said


async def test_a_phone_glued_to_its_label_is_redacted_as_a_phone() -> None:
    """"tel+4915112345678" (a German mobile, 13 digits that pass Luhn and start as
    Visa's) went on as "tel+[CARD]": the card detector found its digits, the phone
    detector nothing. The phone's span, from its "+", names the redaction."""
    from tests.unit.plugins.test_sanitizer import Spy, chat_ctx, plugin
    ctx = chat_ctx("reach me on tel+4915112345678 today")
    await plugin(detectors={"card": "redact", "phone": "redact"})(ctx, Spy())
    assert ctx.request.messages[0].content == "reach me on tel[PHONE] today"  # type: ignore[union-attr]


# ------------------------------------------- the encoded runs' gate (stop 53)

def test_prose_never_enters_the_encoded_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The base64, base64url and hex passes scanned every text of 24 characters or
    more: 13% of the secret detector's CPU time on 4 KB of prose, which holds no run of
    24 of their characters. A text without one skips them (counted: no call)."""
    from bench.sanitizer import prompt
    from plugins.sanitizer import credentials
    calls: list[str] = []
    inner = credentials._encoded

    def counting(text: str):  # type: ignore[no-untyped-def]
        calls.append(text)
        return inner(text)

    monkeypatch.setattr(credentials, "_encoded", counting)
    rng = random.Random(4096)
    for size in (4096, 65536):
        found("secret", prompt(size, rng))
    assert calls == []
    key = base64.b64encode(b"sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7").decode()
    assert found("secret", f"the value is {key} ok") == [key] and len(calls) == 1


@pytest.mark.parametrize("seed", range(20))
def test_the_encoded_gate_passes_every_text_a_pass_reads(seed: int) -> None:
    """`may_encode` answers for the three patterns: wherever one of them matches, it
    says so (fuzz of their characters among blanks, punctuation and other scripts)."""
    from plugins.sanitizer import credentials
    rng = random.Random(seed)
    alphabet = "aZ09+/_-=x. \n\u00e9\u4e2d\ud800"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) if rng.random() < 0.3 else rng.choice("aF3+_-")
                       for _ in range(rng.randrange(20, 120)))
        matched = any(rx.search(text) for rx in (
            credentials._B64_RUN, credentials._B64URL_RUN, credentials._HEX_RUN))
        assert credentials.may_encode(text) or not matched, text


@pytest.mark.parametrize("text", [
    "restore backup.4485069506992057.tar.gz first",
    "see events.4722227602602243.log",
    "https://cdn.example.com/img.4379849638964127.png",
    "package com.example.4971350970866196 loaded",
    "tx.4306010343993517 and ts.4847149218137945",
])
def test_a_number_after_a_dot_in_a_name_or_a_path_is_no_card(text: str) -> None:
    """A dot glued to a card is an abbreviation's ("no.4111...") only where an
    abbreviation that names a number is before it: a file's, a path's or a dotted name's
    dot before an id ("backup.4485...tar.gz", Luhn-valid one time in ten) is none, as
    before."""
    assert found("card", text) == []


@pytest.mark.parametrize(("text", "said"), [
    ("No.4111111111111111", "4111111111111111"),
    ("card no.4111111111111111 exp", "4111111111111111"),
    ("Kartennr.4111111111111111", "4111111111111111"),
    ("n\u00ba.4111111111111111", "4111111111111111"),
    ("Num.4111-1111-1111-1111", "4111-1111-1111-1111"),
    ("Ref.4111111111111111", "4111111111111111"),
])
def test_a_card_after_an_abbreviation_that_names_a_number_is_one(text: str,
                                                                  said: str) -> None:
    assert found("card", text) == [said]


@pytest.mark.parametrize("text", [
    "x = graph+442079460958;", "hotel+442079460958 rooms", "Intel+442079460958",
    "cancel+4915112345678", "recall+442079460958",
])
def test_a_word_that_ends_in_a_phone_label_is_no_label(text: str) -> None:
    """"graph" ends in "ph", "hotel" and "Intel" in "tel": a short label glued to a
    "+" is one only as a word of its own ("tel+49...", "Tel+49..."), or the sum
    "graph+4420..." was a phone."""
    assert found("phone", text) == []


@pytest.mark.parametrize(("text", "said"), [
    ("Tel+4915112345678", "+4915112345678"),
    ("ph+442079460958", "+442079460958"),
    ("smartphone+44 7700 900123", "+44 7700 900123"),
    ("(tel+442079460958)", "+442079460958"),
])
def test_a_phone_label_of_its_own_glued_to_a_plus_is_one(text: str, said: str) -> None:
    assert found("phone", text) == [said]


# ----------------- a protein's sequence after "sk-" is no OpenAI key (stop 54)

@pytest.mark.parametrize("text", [
    "sk-MKTAYIAKQRQISFVKSHFSRQ",
    "the construct sk-MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ folds",
    "sk-proj-MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEK",
    "sk-mktayiakqrqisfvkshfsrqleerlgliev",  # in small letters
])
def test_a_protein_sequence_after_sk_is_no_key(text: str) -> None:
    """A run of 24 letters of one case after "sk-" was a key (a gateway's own keys are
    of one case): a protein's sequence, whose letters are the amino acids' 20, is none.
    Real keys mix digits and both cases; a random run of one case holds one of B, J, O,
    U, X or Z but once in 540."""
    assert found("secret", text) == []


@pytest.mark.parametrize("key", [
    "sk-JAIPZMGFSLHKPYENWPWTGOSURAPXCMZX",  # one case, random (a letter past the 20)
    "sk-MKTAYIAKQRQISFVKSHFSRQ7",  # a digit in it
    "sk-MKTAYIAKQRQISFVKSHfSRQ",  # both cases
    "sk-proj-MKTAYIAKQRQ-ISFVKSH4FSRQLEERL_GLIEVQAP5ILSR",
])
def test_a_key_beside_the_amino_acids_alphabet_is_still_one(key: str) -> None:
    assert key in found("secret", f"key {key} ok"), found("secret", f"key {key} ok")
