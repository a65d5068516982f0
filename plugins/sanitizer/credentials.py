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
    # OpenAI-style (with a digit: "sk-learn-pipeline-preprocessing-guide" is a slug)
    (("sk-",), r"\bsk-(?=[A-Za-z_-]*\d)(?:proj-|live-|test-|ant-)?[A-Za-z0-9_-]{20,}"),
    (("akia", "asia", "agpa", "aida", "aroa"),
     r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b"),  # AWS access key ids
    (("eyj",), r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWT
    (("private key",),
     r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?:[\s\S]*?-----END "
     r"(?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|[\s\S]{0,8192})"),  # cut off: still a key
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
     r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})(?![A-Za-z0-9])"),
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
    (("hooks.slack.com",),
     r"hooks\.slack\.com/services/T[A-Za-z0-9]+/B[A-Za-z0-9]+/[A-Za-z0-9]+"),
    (("bot", ":aa"), r"\b(?:bot)?\d{8,10}:AA[A-Za-z0-9_-]{30,40}"),  # Telegram bots
    (("gsk_",), r"\bgsk_[A-Za-z0-9]{40,60}\b"),  # Groq
    (("r8_",), r"\br8_[A-Za-z0-9]{30,40}\b"),  # Replicate
    (("xai-",), r"\bxai-[A-Za-z0-9]{60,100}\b"),  # xAI
    (("atatt",), r"\bATATT[A-Za-z0-9_=-]{100,}"),  # Atlassian
    # A password in a URL ("postgres://app:s3cret@db/app") or after curl's -u.
    (("://",), r"\b[A-Za-z][A-Za-z0-9+.-]{1,20}://[^\s:/@]{1,64}:[^\s@/]{1,128}@"),
    (("-u", "--user"), r"(?<!\S)(?:-u|--user)\s+[^\s:]{1,64}:[^\s]{3,128}"),
    (("aws", "secret_access", "secretaccesskey"),  # an AWS secret key, named as one
     r"(?i:aws[\w \-]{0,20}?secret[\w \-]{0,20}?|secret_?access_?key)[\"']?\s*[:=]?\s*"
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



# "password is X", "pwd: X", "api key = X", "DB_PASSWORD=X", '{"password": "X"}',
# "密码是 X": the value is what gets redacted (with the phrase, so the placeholder reads
# naturally). A quoted value is taken to its closing quote (spaces and all).
_KEYWORD = (r"pass(?:word|wd|code|phrase)|pwd|pw|pword|pin\s+(?:code|number)|passwort|"
            r"kennwort|contrase[nñ]a|mot\s+de\s+passe|senha|wachtwoord|lösenord|"
            r"adgangskode|salasana|has[lł]o|şifre|sifre|пароль|パスワード|비밀번호|"
            r"api[\s_-]?key|access[\s_-]?token|auth[\s_-]?token|refresh[\s_-]?token|"
            r"secret[\s_-]?key|client[\s_-]?secret")
_PHRASE = re.compile(
    rf"(?i:(?<![A-Za-z])(?:{_KEYWORD})"
    r"(?:\s+(?:for|to|of|on)(?:\s+[\w.@-]{1,40}){1,3}?)?"  # "password for my bank"
    r"(?:[\"'`]?\s*(?:=>|[=:])\s*"  # "password: X", "DB_PASSWORD=X", '"password": "X"'
    r"|'s\s+|\s*(?:는|은|は)\s*|\s+(?:is|was|would\s+be|will\s+be|ist|lautet|es|est|é|è|"
    r"är|er|jest|это)\s*:?\s+))"
    r"(?:(?P<q>[\"'`])(?P<qv>[^\"'`\n]{3,512})(?P=q)|(?P<v>[^\s\"'`]\S{2,511}))"
    r"|(?:密码|口令|密钥)\s*(?:是|为|[:=])\s*(?P<zh>\S{3,64})"
    r"|(?i:(?<![A-Za-z])pin(?:\s+(?:code|number))?(?:\s+is\s+|\s*[:=]\s*))(?P<pin>\d{4,8})\b"
    r"|(?i:(?<![A-Za-z])(?:(?:changed|updated|reset)\s+(?:(?:my|the|your)\s+)?"
    r"|set\s+(?:my|the|your)\s+)password\s+to\s+)(?P<to>\S{3,128})")
# Where a phrase can start: the regex runs only at these words, not at every position.
_PHRASE_STARTS = ("pass", "pw", "pin", "kennwort", "contrase", "mot", "senha", "wachtwoord",
                  "lösenord", "adgangskode", "salasana", "has", "şifre", "sifre", "пароль",
                  "パスワード", "비밀번호", "api", "access", "auth", "refresh", "secret",
                  "client", "changed", "updated", "reset", "set", "密码", "口令", "密钥")

# The literals of both, as one trie: at a place where several begin, the shortest is
# what the scan reports, so each reported word stands for every literal it begins.
_NEEDS = [n for needs, _ in _FORMATS for n in needs]
_ANY_WORD = re.compile(_trie(_NEEDS + list(_PHRASE_STARTS)))
_WORDS = set(_NEEDS) | set(_PHRASE_STARTS)
_MAYBE_NEED = frozenset(w for w in _WORDS if any(n.startswith(w) for n in _NEEDS))
_MAYBE_START = frozenset(w for w in _WORDS if any(t.startswith(w) for t in _PHRASE_STARTS))

# Words that follow "password is" in ordinary talk about passwords, not a password.
_NOT_A_VALUE = frozenset("""
a an the my your our their his her its this that not no too very so also still now
required incorrect wrong invalid valid correct expired missing empty blank set unset
reset changed weak strong long short case case-sensitive stored saved hashed encrypted
needed optional mandatory same different forgotten lost protected shown hidden ok fine
good bad being used working accepted rejected there here what which how where when why
must should can cannot will would needs need has have contains containing requires
at least more less than only just like sent then never always see below above minimum
maximum given too random default expire expires expired include
str string int integer bool boolean float bytes true false none null nil undefined
any list dict object number text secret password
falsch richtig ungültig abgelaufen erforderlich nicht kein zu sehr leer mindestens
incorrecto incorrecta correcto correcta obligatorio requerido inválido inválida muy
demasiado válido válida vacío vacía
requis obligatoire invalide expiré trop très
incorreto incorreta errado errada obrigatório obrigatória muito
""".split())
# Values that are code or a stand-in, not a secret: a variable or template
# ("$PASSWORD", "${{ secrets.X }}", "<your-password>", "%(pw)s"), a call or lookup
# ("os.environ['X']", "getpass.getpass()", "config.password"), a type ("Optional[str]"),
# a placeholder ("YOUR_API_KEY", "xxxxxxxx", "********").
_NOT_A_SECRET = re.compile(
    r"\$(?:[{(]|[A-Z_]+(?:_[A-Z0-9]+)*\Z)"  # $PASSWORD, ${DB_PASSWORD}, $(cat key)
    r"|%\(|\{\{?\s*[\w.$-]+\s*\}|\([^()]*\)?\Z"  # %(pw)s, {password}, {{ x }}, (optional)
    r"|<[^<>\s]{1,40}>|[*•]+\Z|\[\w+\]\Z"  # <your-password>, ********, [REDACTED]
    r"|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:[(\[].*)?\Z|[A-Za-z_]\w*[(\[]"  # calls, lookups
    r"|(?i:your[_-]|x{4,}\Z)")  # YOUR_API_KEY, xxxxxxxx
# An ordinary word in its -ed, -ly or -ing form ("is updated", "is randomly ...").
_PROSE = re.compile(r"[a-zà-ÿ]{3,}(?:ed|ly|ing)")


def _value_ok(value: str) -> bool:
    v = value.rstrip(".,;:!?)")
    low = v.lower()
    return (len(v) >= 3 and low not in _NOT_A_VALUE and _NOT_A_SECRET.match(v) is None
            and _PROSE.fullmatch(v) is None)


def find_secrets(text: str) -> Iterator[Span]:
    low = text.lower()
    # One scan for every literal a family needs and every word a phrase starts with (a
    # search per word cost more than the rest of the detector).
    need = False
    starts: list[int] = []
    for hit in _ANY_WORD.finditer(low):
        word = hit.group()
        need = need or word in _MAYBE_NEED
        i = hit.start()
        if word in _MAYBE_START and not (i and "a" <= low[i - 1] <= "z"):
            starts.append(i)
    if need:
        for needs, rx in _FORMAT_RX:
            if any(n in low for n in needs):
                for m in rx.finditer(text):
                    yield m.span()
    if len(low) != len(text):  # lower-casing moved offsets (rare letters): scan it all
        matches: Iterator[re.Match[str]] = _PHRASE.finditer(text)
    else:  # the phrase tried only where one of its first words starts a word
        matches = _matches_at(text, starts)
    for m in matches:
        group = next(g for g in ("v", "qv", "zh", "pin", "to") if m.group(g) is not None)
        value = m.group(group)
        if group == "pin" or (_value_ok(value) and (group != "to" or _looks_made_up(value))):
            yield m.span()


def _matches_at(text: str, starts: list[int]) -> Iterator[re.Match[str]]:
    for i in starts:
        m = _PHRASE.match(text, i)
        if m is not None:
            yield m


def _looks_made_up(value: str) -> bool:
    """After "changed my password to", a password rather than a word ("to default",
    "to expire"): a digit, a symbol or mixed case in it."""
    v = value.rstrip(".,;:!?)")
    return (any(c.isdigit() for c in v) or not v.isalnum()
            or (v != v.lower() and v != v.upper() and v != v.capitalize()))
