"""Secrets: vendor key formats, key blocks, tokens, and "my password is ..." phrases.

Each family has a literal that must occur before its regex runs (most prompts hold none
of them, so the family costs one substring scan). Vendor formats are matched by their
documented prefixes and lengths; AWS secret keys (40 characters with no prefix) only next
to a name that says what they are; generic phrases only when the value after "password
is" / "api key:" is not an ordinary word ("the password is incorrect" does not fire).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from .spans import Span

# (literals, one of which must occur in the lower-cased text; pattern)
_FORMATS: list[tuple[tuple[str, ...], str]] = [
    (("sk-",), r"\bsk-(?:proj-|live-|test-|ant-)?[A-Za-z0-9_-]{20,}"),  # OpenAI-style
    (("akia", "asia", "agpa", "aida", "aroa"),
     r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b"),  # AWS access key ids
    (("eyj",), r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWT
    (("private key",),
     r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*"
     r"PRIVATE KEY-----|[\s\S]{0,8192})"),  # a cut-off block is still a key
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
     r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b"),
    (("sk_", "rk_"), r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{10,247}\b"),  # Stripe
    (("aiza",), r"\bAIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])"),  # Google API keys
    (("xox",), r"\bxox[abposr]-[A-Za-z0-9-]{10,250}"),  # Slack tokens
    (("hf_",), r"\bhf_[A-Za-z0-9]{30,64}\b"),  # Hugging Face
    (("glpat-", "gldt-", "glptt-", "glrt-", "gloas-"),
     r"\bgl(?:pat|dt|ptt|rt|oas)-[A-Za-z0-9_-]{20,}"),  # GitLab
    (("npm_",), r"\bnpm_[A-Za-z0-9]{36}\b"),
    (("pypi-",), r"\bpypi-[A-Za-z0-9_-]{50,}"),
    (("sg.",), r"\bSG\.[A-Za-z0-9_-]{16,32}\.[A-Za-z0-9_-]{16,64}"),  # SendGrid
    (("shpat_", "shpss_", "shpca_", "shppa_"), r"\bshp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}\b"),
    (("dop_v1_", "doo_v1_", "dor_v1_"), r"\bdo[opr]_v1_[a-f0-9]{64}\b"),  # DigitalOcean
    (("accountkey=",), r"(?i:\bAccountKey=)[A-Za-z0-9+/]{40,}={0,2}"),  # Azure storage
    # A credential after its scheme, whatever its format: "Bearer <token>" (with a digit
    # in it: "the bearer of bad news" is no token) and "Authorization: Basic/Token ...".
    (("bearer",), r"(?i:\bbearer)\s+(?=[A-Za-z._~+/-]*\d)[A-Za-z0-9._~+/-]{16,}=*"),
    (("authorization",),
     r"(?i:\bauthorization\b[\"']?\s*[:=]\s*[\"']?)(?:(?i:basic)\s+[A-Za-z0-9+/]{8,}={0,2}"
     r"|(?:(?i:token|bearer|apikey)\s+)?(?=[A-Za-z._~+/-]*\d)[A-Za-z0-9._~+/-]{8,}=*)"),
    (("aws", "secret_access"),  # an AWS secret key, named as one
     r"(?i:aws[\w \-]{0,20}?secret[\w \-]{0,20}?|secret_access_key)[\"']?\s*[:=]?\s*"
     r"(?:is\s+)?[\"']?[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])"),
]
_FORMAT_RX = [(needs, re.compile(p)) for needs, p in _FORMATS]


def _trie(words: list[str]) -> str:
    """A regex matching any of `words`, as a trie ("gh(?:p_|o_)" rather than
    "ghp_|gho_"): one branch per first character, so scanning text costs about the
    same however many literals there are."""
    heads: dict[str, list[str]] = {}
    for w in sorted(set(words)):
        heads.setdefault(w[:1], []).append(w[1:])
    branches = []
    for head, tails in heads.items():
        if "" in tails:  # a word that ends here: its longer forms are no different
            branches.append(re.escape(head))
        else:
            branches.append(re.escape(head) + (re.escape(tails[0]) if len(tails) == 1
                                               else f"(?:{_trie(tails)})"))
    return branches[0] if len(branches) == 1 else "|".join(branches)


# Any of the literals at all: one scan, and most prompts stop there.
_ANY_NEED = re.compile(_trie([n for needs, _ in _FORMATS for n in needs]))

# "password is X", "pwd: X", "api key = X", "密码是 X": the value is what gets redacted
# (with the phrase, so the placeholder reads naturally).
_PHRASE = re.compile(
    r"(?i:\b(?:pass(?:word|wd|code|phrase)|pwd|pw|pword|pin\s+(?:code|number)|"
    r"passwort|kennwort|contrase[nñ]a|mot\s+de\s+passe|senha|api[\s_-]?key|"
    r"access[\s_-]?token|auth[\s_-]?token|secret[\s_-]?key)"
    r"(?:\s+(?:for|to|of|on)(?:\s+[\w.@-]{1,40}){1,3}?)?"  # "password for my bank"
    r"(?:\s+(?:is|was|would\s+be|will\s+be|ist|es|est|é)\s+|\s*[=:]\s*))[\"'`]?(?P<v>[^\s\"'`]{3,128})"
    r"|(?:密码|口令|密钥)\s*(?:是|为|[:=])\s*(?P<zh>\S{3,64})")
# Where a phrase can start: the regex runs only at these words, not at every position.
_PHRASE_STARTS = ("pass", "pw", "pin", "kennwort", "contrase", "mot", "senha", "api",
                  "access", "auth", "secret", "密码", "口令", "密钥")

# Words that follow "password is" in ordinary talk about passwords, not a password.
_NOT_A_VALUE = frozenset("""
a an the my your our their his her its this that not no too very so also still now
required incorrect wrong invalid valid correct expired missing empty blank set unset
reset changed weak strong long short case-sensitive stored saved hashed encrypted needed
optional mandatory same different forgotten lost protected shown hidden ok fine good bad
being used working accepted rejected there here what which how where when why
must should can cannot will would needs need has have contains containing requires
at least more less than only just like
falsch richtig ungültig abgelaufen erforderlich nicht kein zu sehr
incorrecto incorrecta correcto correcta obligatorio requerido inválido inválida muy
requis obligatoire invalide expiré trop très
incorreto incorreta errado errada obrigatório obrigatória muito
""".split())


def _value_ok(value: str) -> bool:
    v = value.rstrip(".,;:!?)").lower()
    return len(v) >= 3 and v not in _NOT_A_VALUE


def find_secrets(text: str) -> Iterator[Span]:
    low = text.lower()
    if _ANY_NEED.search(low) is not None:
        for needs, rx in _FORMAT_RX:
            if any(n in low for n in needs):
                for m in rx.finditer(text):
                    yield m.span()
    if len(low) != len(text):  # lower-casing moved offsets (rare letters): scan it all
        matches: Iterator[re.Match[str]] = _PHRASE.finditer(text)
    else:
        matches = _phrases_at_starts(text, low)
    for m in matches:
        group = "v" if m.group("v") is not None else "zh"
        if _value_ok(m.group(group)):
            yield m.span()


def _phrases_at_starts(text: str, low: str) -> Iterator[re.Match[str]]:
    for word in _PHRASE_STARTS:
        i = low.find(word)
        while i != -1:
            m = _PHRASE.match(text, i)
            if m is not None:
                yield m
            i = low.find(word, i + 1)
