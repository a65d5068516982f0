"""Secrets: vendor key formats, key blocks, tokens, and "my password is ..." phrases.

Each family has a literal that must occur before its regex runs: one scan of the text
finds every family's literals and every word a phrase starts with (most prompts hold
none of them). Vendor formats are matched by their documented prefixes and lengths; AWS
secret keys (40 characters with no prefix) only next to a name that says what they are;
generic phrases only when the value after "password is" / "api key:" is not an ordinary
word ("the password is incorrect" does not fire).
"""

from __future__ import annotations

import base64
import html
import re
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from proxy.text import fold, read_as

from .injection import LATIN_BASES, SHAPES
from .spans import Span, trie

# (literals, one of which must occur in the lower-cased text; pattern)
_FORMATS: list[tuple[tuple[str, ...], str]] = [
    (("sk-",), r"\bsk-(?:proj-|live-|test-|ant-)?[A-Za-z0-9_-]{20,}"),  # OpenAI-style
    (("akia", "asia", "agpa", "aida", "aroa"),  # AWS access key ids (`_aws_body`)
     r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)(?P<aws>[0-9A-Z]{16})\b"),
    # A JWT; a JWE (five parts, an encrypted key empty under "dir": a session cookie's)
    (("eyj",), r"\beyJ[A-Za-z0-9_-]{8,}\.(?:eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
               r"|[A-Za-z0-9_-]*\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"),
    (("private key",),
     r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?:[\s\S]*?-----END "
     r"(?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|[\s\S]{0,8192})"),  # cut off: still a key
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
     r"\b(?:gh[pousr]_(?P<b>[A-Za-z0-9]{36,255})|github_pat_(?P<b2>[A-Za-z0-9_]{22,255}))"
     r"(?![A-Za-z0-9])"),
    (("sk_", "rk_"), r"\b[sr]k_(?:live|test)_(?P<b>[A-Za-z0-9]{10,247})\b"),  # Stripe
    (("whsec_",), r"\bwhsec_(?P<b>[A-Za-z0-9+/]{24,128})={0,2}"),  # Stripe webhook signing secrets
    (("aiza",), r"\bAIza(?P<b>[0-9A-Za-z_-]{35})(?![0-9A-Za-z_-])"),  # Google API keys
    (("xox", "xapp-"),  # Slack (xoxe: refresh)
     r"\b(?:xox[abposre]|xapp)-(?P<b>[A-Za-z0-9-]{10,250})"),
    (("gocspx-",), r"\bGOCSPX-(?P<b>[A-Za-z0-9_-]{24,40})"),  # Google OAuth client secrets
    (("ya29.",), r"\bya29\.(?P<b>[A-Za-z0-9_-]{20,2048})"),  # Google OAuth access tokens
    (("dckr_pat_", "dckr_oat_"), r"\bdckr_(?:pat|oat)_(?P<b>[A-Za-z0-9_-]{20,64})"),  # Docker Hub
    (("putty-user-key-file-",),  # a PuTTY key file, to its MAC (or cut off: still a key)
     r"PuTTY-User-Key-File-\d+:(?:[\s\S]{0,8192}?Private-MAC: ?[0-9a-fA-F]+|[\s\S]{0,8192})"),
    (("hf_",), r"\bhf_(?P<b>[A-Za-z0-9]{30,64})\b"),  # Hugging Face
    (("glpat-", "gldt-", "glptt-", "glrt-", "gloas-"),
     r"\bgl(?:pat|dt|ptt|rt|oas)-(?P<b>[A-Za-z0-9_-]{20,})"),  # GitLab
    (("npm_",), r"\bnpm_(?P<b>[A-Za-z0-9]{36})\b"),
    (("pypi-",), r"\bpypi-(?P<b>[A-Za-z0-9_-]{50,})"),
    (("sg.",), r"\bSG\.[A-Za-z0-9_-]{16,32}\.(?P<b>[A-Za-z0-9_-]{16,64})"),  # SendGrid
    (("shpat_", "shpss_", "shpca_", "shppa_"), r"\bshp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}\b"),
    (("dop_v1_", "doo_v1_", "dor_v1_"), r"\bdo[opr]_v1_[a-f0-9]{64}\b"),  # DigitalOcean
    # Azure: a storage or Service Bus / Event Hubs connection string's key, a SAS
    # token's signature ("...&sig=...%3D", URL-encoded or not); an S3 presigned URL's.
    (("accountkey=", "sharedaccesskey="),
     r"(?i:\b(?:AccountKey|SharedAccessKey)=)[A-Za-z0-9+/]{40,}={0,2}"),
    (("sig=",), r"(?<![\w-])sig=(?:[A-Za-z0-9+/]|%2[BbFf]){40,}(?:=|%3[Dd]){0,2}"),
    (("x-amz-signature=",), r"(?i:\bX-Amz-Signature=)[0-9a-f]{64}\b"),
    # A credential after its scheme, whatever its format: "Bearer <token>" (with a digit
    # in it: "the bearer of bad news" is no token) and "Authorization: Basic/Token ...".
    (("bearer",), r"(?i:\bbearer)\s+(?=[A-Za-z._~+/-]*\d)[A-Za-z0-9._~+/-]{16,}=*"),
    (("authorization",),
     r"(?i:\bauthorization\b[\"']?\s*[:=]\s*[\"']?)(?:(?i:basic)\s+[A-Za-z0-9+/]{8,}={0,2}"
     r"|(?:(?i:token|bearer|apikey)\s+)?(?=[A-Za-z._~+/-]*\d)[A-Za-z0-9._~+/-]{8,}=*)"),
    (("hooks.slack.com",),
     r"hooks\.slack\.com/services/T[A-Za-z0-9]+/B[A-Za-z0-9]+/[A-Za-z0-9]+"),
    (("bot", ":aa"), r"\b(?:bot)?\d{8,10}:AA[A-Za-z0-9_-]{30,40}"),  # Telegram bots
    (("gsk_",), r"\bgsk_(?P<b>[A-Za-z0-9]{40,60})\b"),  # Groq
    (("r8_",), r"\br8_(?P<b>[A-Za-z0-9]{30,40})\b"),  # Replicate
    (("xai-",), r"\bxai-(?P<b>[A-Za-z0-9]{60,100})\b"),  # xAI
    # Atlassian API tokens: "ATATT3xFfGF0", base64url (171 characters), "=" and a checksum
    # of 8 hex digits (the body bounded: a run of "ATATT3xFfGF0-" with no "=" in it was
    # read on to its end from each literal, 64 KB of it two seconds)
    (("atatt3xffgf0",),
     r"\bATATT3xFfGF0(?P<ba>[A-Za-z0-9_-]{100,400})=[0-9A-Fa-f]{8}(?![\w-])"),
    (("discord",),  # Discord bot tokens (a base64 user id, a time, an HMAC)
     r"\b[MNO][A-Za-z0-9_-]{23,27}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,38}(?![A-Za-z0-9_-])"),
    (("/api/webhooks/",),
     r"\bdiscord(?:app)?\.com/api/webhooks/\d{5,30}/[A-Za-z0-9_-]{40,100}"),
    (("twilio",), r"\bSK[0-9a-f]{32}\b"),  # Twilio API keys (named: "sk" is in "ask")
    (("key-",), r"\bkey-[0-9a-f]{32}\b"),  # Mailgun
    (("-us",), r"\b[0-9a-f]{32}-us\d{1,2}\b"),  # Mailchimp
    (("sq0atp-", "sq0csp-", "eaaa"),
     r"\b(?:sq0atp-(?P<b>[A-Za-z0-9_-]{22})|sq0csp-(?P<b2>[A-Za-z0-9_-]{43})"
     r"|EAAA(?P<b3>[A-Za-z0-9_-]{60}))\b"),
    (("dapi",), r"\bdapi[0-9a-f]{32}(?:-\d)?\b"),  # Databricks
    (("age-secret-key-1",), r"\bAGE-SECRET-KEY-1[0-9A-Z]{58}\b"),
    (("hvs.", "hvb."), r"\bhv[sb]\.(?P<b>[A-Za-z0-9_-]{24,})"),  # HashiCorp Vault
    (("dp.pt.", "dp.st.", "dp.sa.", "dp.ct."), r"\bdp\.(?:pt|st|sa|ct)\.(?P<b>[A-Za-z0-9]{40,44})"),
    (("pmak-",), r"\bPMAK-[a-f0-9]{24}-[a-f0-9]{34}\b"),  # Postman
    (("lin_",),  # Linear ("lin_api_" hid "api" in "berlin_api")
     r"\blin_api_(?P<b>[A-Za-z0-9]{40})\b"),
    (("secret_", "ntn_"),  # Notion
     r"\b(?:secret_(?P<b>[A-Za-z0-9]{43})|ntn_(?P<b2>[A-Za-z0-9]{40,50}))\b"),
    (("figd_",), r"\bfigd_(?P<b>[A-Za-z0-9_-]{40,})"),  # Figma
    (("glsa_", "glc_"),
     r"\b(?:glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}|glc_(?P<b>[A-Za-z0-9+/]{32,})={0,2})"),
    (("sntrys_", "sntryu_"), r"\bsntry[su]_(?P<b>[A-Za-z0-9+/=_-]{40,})"),  # Sentry
    (("pplx-",), r"\bpplx-(?P<b>[A-Za-z0-9]{40,60})\b"),  # Perplexity
    (("pul-",), r"\bpul-[a-f0-9]{40}\b"),  # Pulumi
    # A password in a URL ("postgres://app:s3cret@db/app", "redis://:s3cret@cache"),
    # after curl's -u, after --password, in a <password> element, after mysql's -p.
    (("://",), r"\b[A-Za-z][A-Za-z0-9+.-]{1,20}://[^\s:/@]{0,64}:(?P<v>[^\s/]{1,128})@"),
    (("-u", "--user"), r"(?<!\S)(?:-u\s*|--user[\s=]+)(?:'[^'\n]{3,128}'|\"[^\"\n]{3,128}\""
                       r"|[^\s:'\"]{1,64}:(?P<v>\S{3,128}))"),
    (("--password", "--pass"), r"(?<!\S)--pass(?:word)?[\s=]+(?:'(?P<q1>[^'\n]{3,512})'"
                               r"|\"(?P<q2>[^\"\n]{3,512})\"|(?P<v>[^\s\"']\S{2,127}))"),
    (("<password>",), r"(?i:<password>)(?P<v>[^<\n]{3,128})(?i:</password>)"),
    (("mysql",), r"\bmysql\b[^\n]{0,60}?\s-p(?P<v>[^\s\"']\S{2,127})"),
    (("aws", "secret_access", "secretaccesskey"),  # an AWS secret key, named as one
     r"(?i:aws[\w \-]{0,20}?secret[\w \-]{0,20}?|secret_?access_?key)[\"']?\s*[:=]?\s*"
     r"(?:is\s+)?[\"']?[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])"),
]
# A format's pattern that starts with "\b" then a literal (or one of a few of one width:
# "\b(?:AKIA|ASIA|...)") is compiled with the literal first and the "\b" after it, as a
# look-behind: the same matches, but the engine skips to where the literal is (a "\b"
# first had it try every place of the text: 2 ms per format over 64 KB of code, every
# format's literal in it 100 ms).
_HEAD_TOKEN = r"(?:[A-Za-z0-9_-]|\\\.|\[[A-Za-z0-9]+\])"
_HEAD_RUN = rf"(?:[A-Za-z0-9_]|\[[A-Za-z0-9]+\]){_HEAD_TOKEN}*"
_LITERAL_HEAD = re.compile(rf"\\b({_HEAD_RUN}|\(\?:{_HEAD_RUN}(?:\|{_HEAD_RUN})+\))")
_TOKEN = re.compile(_HEAD_TOKEN)


def literal_first(pattern: str) -> str:
    """`pattern` with its leading "\b" and literal turned about (`_LITERAL_HEAD`): the
    literal, then a look-behind that no word character is before it."""
    m = _LITERAL_HEAD.match(pattern)
    if m is None or pattern[m.end():m.end() + 1] in ("?", "*", "+", "{"):
        return pattern  # (none, or its last character is a quantifier's)
    head = m[1]
    alternatives = head[3:-1].split("|") if head.startswith("(?:") else [head]
    widths = {len(_TOKEN.findall(a)) for a in alternatives}
    if len(widths) != 1:
        return pattern
    return f"{head}(?<!\\w.{{{widths.pop()}}}){pattern[m.end():]}"


_FORMAT_RX = [(needs, re.compile(literal_first(p))) for needs, p in _FORMATS]
# An OpenAI-style key's body is random (legacy keys 48 letters and digits, project,
# service-account and Anthropic keys longer, a "-" or "_" among them one time in 30): a
# run of 16 letters and digits or more, mixing digits with letters or both cases, 8 of
# its characters different at least. Words and short numbers joined by hyphens after
# "sk-" are a slug or a name ("sk-learn-pipeline-v2-final", "...-sk-2026-q1-planning"),
# and one letter repeated a placeholder ("sk-xxxx..."). A gateway's own keys are random
# too, of one kind or in segments: a run of 24 or more with 8 different characters (one
# case, digits alone: no word is as long), or two segments or more whose digits and
# letters or cases interleave ("a6fafb1c-9c29-...", a UUID's shape; "resnet50", "v2", a
# word and its number, and "MyProject", a name, do not).
#
# A run of letters alone in one case whose letters are all the amino acids' 20 ("sk-"
# then "MKTAYIAKQRQISFVKSHFSRQ": a protein's sequence, in capitals or in small letters)
# is no key: real ones mix digits and both cases, and a random body of 24 letters of one
# case lacks all six of B, J, O, U, X and Z once in 540 (32: once in 4,400).
_KEY_RUN = re.compile(r"[A-Za-z0-9]{16,}")
_AMINO_ACIDS = frozenset("ACDEFGHIKLMNPQRSTVWY")
_KEY_RUN_DISTINCT = 8
_KEY_RUN_ONE_KIND = 24
_KEY_SEGMENT = re.compile(r"(?<![A-Za-z0-9])[A-Za-z0-9]{4,}(?![A-Za-z0-9])")
# (digits between letters or letters between digits; or cases that change back and forth,
# a small letter before a capital twice: "MyProject", "getHTTPServer" once)
_INTERLEAVED = re.compile(r"[A-Za-z][0-9]+[A-Za-z]|[0-9][A-Za-z]+[0-9]|[a-z][A-Z].*[a-z][A-Z]")


def _key_body(said: str) -> bool:
    """Whether what follows "sk-" in `said` holds a key's random run (`_KEY_RUN`), or is
    random segments."""
    for m in _KEY_RUN.finditer(said, 3):
        run = m.group()
        if len(set(run)) < _KEY_RUN_DISTINCT:
            continue
        digits = any(c.isdigit() for c in run)
        if (digits and not run.isdigit()) or (run != run.lower() and run != run.upper()):
            return True
        if len(run) >= _KEY_RUN_ONE_KIND and not _AMINO_ACIDS.issuperset(run.upper()):
            return True
    if len(set(said[3:])) < _KEY_RUN_DISTINCT:
        return False
    mixed = sum(1 for m in _KEY_SEGMENT.finditer(said, 3) if _INTERLEAVED.search(m.group()))
    return mixed >= 2


# "password is X", "pwd: X", "api key = X", "DB_PASSWORD=X", '{"password": "X"}',
# "密码是 X": the value is what gets redacted (with the phrase, so the placeholder reads
# naturally). A quoted value is taken to its closing quote (spaces and all).
#
# How sure a value must look depends on what names it. After "password is" in English,
# any word not in the lists below is taken (passwords are often plain words). After a
# machine credential's name ("api key", "token", "client secret", a bare "pass") or a
# keyword or link word of another language, it must look made up (a digit, a symbol or
# mixed case): "the token is 'hello'", "client secret: leave it empty", "Het wachtwoord
# is onjuist" are talk, not values.
_KW_PASSWORD = r"pass(?:word|wd|code|phrase)|pwd|pw|pword|pin\s+(?:code|number)"
_KW_MACHINE = (r"api[\s_-]?key|access[\s_-]?token|auth[\s_-]?token|refresh[\s_-]?token|"
               r"secret[\s_-]?key|client[\s_-]?secret|subscription[\s_-]?key|token(?![a-z])|"
               r"secret(?![a-z])|pass(?![a-z])")
_KW_OTHER = (r"passwort|kennwort|contrase[nñ]a|mot\s+de\s+passe|senha|wachtwoord|lösenord|"
             r"adgangskode|salasana|has[lł]o|şifre|sifre|пароль|パスワード|비밀번호")
_LINK_EN = r"[\"'`]?[ \t]*(?:=>|[=:])[ \t]*|'s\s+|\s+(?:is|was|would\s+be|will\s+be)\s*:?[ \t]+"
_LINK_OTHER = (r"\s*(?:는|은|は)\s*|\s+(?:ist|lautet|es|est|é|è|är|er|jest|это|is)"
               r"\s*:?[ \t]+")
_QUOTED = "|".join(f"{a}[^{b}\\n]{{3,4096}}{b}" for a, b in (
    ('"', '"'), ("'", "'"), ("`", "`"), ("\u201c", "\u201d"), ("\u2018", "\u2019"),
    ("\u00ab", "\u00bb")))
_PHRASE = re.compile(
    rf"(?i:(?<![A-Za-z])(?:(?P<kp>{_KW_PASSWORD})|(?P<km>{_KW_MACHINE})|(?P<ko>{_KW_OTHER}))"
    r"(?:[ \t]+(?:for|to|of|on)(?:[ \t]+[\w.@-]{1,40}){1,3}?)?"  # "password for my bank"
    rf"(?:(?P<le>{_LINK_EN})|(?P<lo>{_LINK_OTHER})))"
    rf"(?:(?P<qv>{_QUOTED})|(?P<v>[^\s\"'`\u201c\u2018\u00ab]\S{{2,511}}))"
    r"|(?:密码|口令|密钥)\s*(?:是|为|[:=])\s*(?P<zh>[!-~]{3,64})"
    r"|(?i:(?<![A-Za-z_])pin(?:\s+(?:code|number))?(?:\s+is\s+|\s*[:=]\s*))(?P<pin>\d{4,8})\b"
    r"|(?i:(?<![A-Za-z])(?:(?:changed|updated|reset)\s+(?:(?:my|the|your)\s+)?"
    r"|set\s+(?:my|the|your)\s+)password\s+to\s+)(?P<to>\S{3,128})")
# Where a phrase can start: the regex runs only at these words, not at every position.
_PHRASE_STARTS = ("pass", "pw", "pin", "kennwort", "contrase", "mot", "senha", "wachtwoord",
                  "lösenord", "adgangskode", "salasana", "has", "şifre", "sifre", "пароль",
                  "パスワード", "비밀번호", "api", "access", "auth", "refresh", "secret",
                  "client", "subscription", "token", "changed", "updated", "reset", "set",
                  "密码", "口令", "密钥")
# An environment variable that names a credential ("OPENAI_KEY=...", "GITHUB_TOKEN: ..."),
# found where the text holds one of these endings.
# (or one run into its PASSWORD: "PGPASSWORD=...", libpq's, as "DB_PASSWORD=..." is read)
_ENV = re.compile(r"(?<![A-Za-z0-9_])(?:[A-Z][A-Z0-9_]*_(?:KEY|SECRET|TOKEN|PASS|PWD|PASSWD|AUTH"
                  r"|CREDENTIALS?|CREDS)"
                  r"|[A-Z][A-Z0-9]*[A-Z0-9]PASSWORD)"
                  rf"[ \t]*[=:][ \t]*(?:(?P<qv>{_QUOTED})|(?P<v>[^\s\"'`]\S{{2,511}}))")
_ENV_ENDINGS = ("_key", "_secret", "_token", "_pass", "_pwd", "password", "_auth", "_cred")
# Names whose value is a password, plain words and all ("MYSQL_PWD=swordfish", as
# "DB_PASSWORD=" is read): a name ending in one of these, or redis-cli's own.
_PASSWORD_NAMES = ("PASSWORD", "PASSWD", "PWD", "_PASS", "REDISCLI_AUTH")
# A value that is a file's path, not the credential ("GOOGLE_APPLICATION_CREDENTIALS=
# /path/key.json", "TLS_KEY=./certs/server.key").
_PATH = re.compile(r"(?:~|\.{1,2})?/[\w./-]*\Z|[\w./-]+\.(?:json|pem|key|crt|p12|txt|ya?ml)\Z")

# The literals of both, as one trie: at a place where several begin, the shortest is
# what the scan reports, so each reported word stands for every literal it begins.
_NEEDS = [n for needs, _ in _FORMATS for n in needs]
_ANY_WORD = re.compile(trie(_NEEDS + list(_PHRASE_STARTS)))
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
maximum given too random randomly default expire expires include usually currently
automatically securely typically generally yes on off n/a value
str string int integer bool boolean float bytes true false none null nil undefined
any list dict object number
falsch richtig ungültig abgelaufen erforderlich nicht kein zu sehr leer mindestens
incorrecto incorrecta correcto correcta obligatorio requerido inválido inválida muy
demasiado válido válida vacío vacía obligatoria
requis obligatoire invalide expiré trop très
incorreto incorreta errado errada obrigatório obrigatória muito
""".split())
# Values that are code or a stand-in, not a secret: a variable or template
# ("$PASSWORD", "${{ secrets.X }}", "<your key here>", "%(pw)s", "{password}"), a
# lookup or call ("os.environ['X']", "config.password", "getpass()"), a placeholder
# ("YOUR_API_KEY", "xxxxxxxx", "********", "[REDACTED]", "(optional)", "sk-..."), a
# JSON schema's object. (A digit inside brackets makes it a password: "{hunter2}".)
_NOT_A_SECRET = re.compile(
    r"\$(?:[{(]|[A-Z_]+(?:_[A-Z0-9]+)*\Z)"
    r"|%\(|\{\{?\s*[A-Za-z_.$ -]+\s*\}\}?\Z|<[^<>\d]{1,40}>?\Z|\[+[A-Za-z_ ]+\]+\Z"
    r"|\([A-Za-z_ /]*\)?\Z|[*•]+\Z"
    r"|(?:os|process|config|settings|env|self|this|request|req|secrets|vars|params|args|"
    r"options|opts|cfg|app|ctx|context|environ|props)\.[\w.]*(?:[(\[].*)?\Z"
    r"|[A-Za-z_][A-Za-z_.]*\([^()]*\)\Z|[A-Za-z_][A-Za-z_.]*\[[^\[\]]*\]\Z"
    r"|(?i:your[_-][a-z_-]*\Z|x{4,}\Z|changeme\Z|!vault)|[^\d]*(?:\.\.\.|\u2026)\Z"
    r"|[{\[][\"'{\[]")
_LOWER_SLUG = re.compile(r"[a-z]+(?:[-._][a-z]+)+|[A-Z]+(?:_[A-Z]+)+")  # (or a NAME_OF_A_VAR)
# An ordinary word in its -ed form ("is updated", "is sent" is listed).
_PROSE = re.compile(r"[a-zà-ÿ]{3,}ed")


def _bare(value: str) -> str:
    """A value without the punctuation that ends a clause or closes a quote after it,
    nor the quotes or Markdown emphasis around it ("*not*", 'defined.")')."""
    return value.rstrip(".,;:!?)\"'`*_").lstrip("\"'`*_")


def _value_ok(value: str) -> bool:
    v = _bare(value)
    return (len(v) >= 3 and v.lower() not in _NOT_A_VALUE
            and _NOT_A_SECRET.match(value) is None and _PROSE.fullmatch(v) is None)


def _looks_made_up(value: str, env: bool = False) -> bool:
    """A password rather than a word: a digit, a symbol or mixed case in it (not a
    word in Markdown's emphasis, "**Experimental**", nor lower-case words joined by
    hyphens, dots or underscores, a slug or a name: "pydantic-mypy", "unk_piece",
    "GITHUB_TOKEN"; but in an environment assignment, `env`, one is the value itself:
    "SECRET_KEY=super-secret-key")."""
    v = _bare(value)
    if _LOWER_SLUG.fullmatch(v) is not None and not (env and v != v.upper()):
        return False
    return (any(c.isdigit() for c in v) or not v.replace(" ", "").isalnum()
            or (v != v.lower() and v != v.upper() and v != v.capitalize()))


def find_secrets(text: str) -> Iterator[Span]:
    """Secrets in `text`, as written and as disguised: with look-alike letters of other
    scripts read as the Latin ones they mimic ("sk-proj-..." with a Cyrillic "s"; one
    letter for one, so a span is the text's), and with its escapes decoded (`_ESCAPE`:
    "sk%2Dproj...", "Bearer%20...", "sk\\u002dproj..."), each span placed back over the
    text's own."""
    low = text.lower()
    hits = _scan(low)
    yield from _find(text, low, hits)
    pieces = escapes_read(text) if may_escape(text) else None
    if pieces is None or len(pieces) > 1 or pieces[0][1][0] or pieces[0][1][-1] < len(text):
        # (look-alikes outside the windows read decoded, or in a text with no escape)
        if not text.isascii() and (look := _unmasked(
                text, hits if len(low) == len(text) else None)) is not None:
            yield from _find(look)
    for kept, at in pieces or ():
        piece = blanks_as_spaces(kept)
        if piece is not kept:  # (an escaped blank letter: read as nothing too)
            yield from _blanks_out(kept, at)
        view = piece
        if not piece.isascii() and (look := _unmasked(piece)) is not None:
            view = look
        for a, b in _find(view):
            yield at[a], at[b]
        if not piece.isascii():  # (an accented letter escaped, as JSON's ASCII writes
            for a, b in _accented(piece):  # "\u015bk-proj-...")
                if at[b] - at[a] != b - a:  # (one with no escape: read as written too)
                    yield at[a], at[b]
    if not text.isascii():
        yield from _accented(text)


def _blanks_out(kept: str, at: list[int]) -> Iterator[Span]:
    """Keys in a decoded piece (`kept`, its blank letters kept; `at`, where each of its
    characters starts) read with its blank letters as nothing ("sk-proj-Ab\\u3164Cd..."
    in a pasted JSON value), each span placed back over the piece's text."""
    idx = [j for j, c in enumerate(kept) if c not in BLANK_LETTERS]
    for a, b in _find("".join(kept[j] for j in idx)):
        yield at[idx[a]], at[idx[b - 1] + 1]


# A look-alike or an accented letter read as a lower-case one ("\u0131" as "i", "\u026a"
# as "i", "\u0251" as "a") is a capital to a reader among capitals: a dotless i between
# capitals is an "I" ("AK\u0131A..." is an AWS key id, all capitals). In a run of letters
# and digits that is otherwise all capitals, each reads as the capital.
_SMALL = re.compile("[a-z]")


def _capitals_of(table: dict[str, str]) -> Callable[[str, str], str]:
    """What reads `text`'s letters of `table` (`read`, one for one) in capitals where a
    run of letters and digits is otherwise all capitals."""
    # (each word read once: a pattern of capitals around a look-alike backtracked over
    # every look-alike of a long word a small letter ends, "\u0131\u0131...\u0131a")
    word = re.compile(rf"[A-Za-z0-9{re.escape(''.join(table))}]+")
    lowers = frozenset(c for c, v in table.items() if v.islower())

    def capitals(text: str, read: str) -> str:
        out: list[str] = []
        pos = 0
        for m in word.finditer(text):
            a, b = m.span()
            if lowers.isdisjoint(m.group()) or _SMALL.search(text, a, b) is not None:
                continue  # (no look-alike of a small letter, or a small letter itself)
            if not any(c.isupper() for c in read[a:b]):
                continue  # (no capital in it: "\u0131" alone, Turkish "\u0131l\u0131k")
            out += [read[pos:a], read[a:b].upper()]
            pos = b
        return "".join([*out, read[pos:]]) if out else read

    return capitals


# Accented Latin letters for a key's own ("\u015bk-proj-...", "sk-pr\u00f6j-...",
# "\u01f5hp_...", "\u00c0KIA...", "\u00e9yJ..."): the letter as its base letter (one
# for one: a span is the text's), in the words that may be a key only. Folding every
# accented letter of a text cost Turkish prose 40%; a word is read so where it has a
# key's length and a digit and holds an accented Latin letter (`_LONG_WORD`, one scan of
# the text: prose has few such words, "\u00f6\u011frenci-i\u015fleri" neither length
# nor digit). The words holding a literal as written, a "-" or a "_" only (as this read
# before) missed a literal whose own letter was the accented one with no "-" or "_" in
# its word ("\u00c0KIA...", "d\u00e0pi..."). A long word is read in pieces, one from
# every `_WORD_CHARS * 4` characters, reaching `_WORD_CHARS * 8` either side.
_ACCENT_OF = str.maketrans(LATIN_BASES)  # (with those of no decomposition: "\u0142")
_accent_capitals = _capitals_of(LATIN_BASES)
_KEY_LEAST = 20
_DIGIT = re.compile("[0-9]")
_LONG_WORD = re.compile(r"(?<![^ \n])[^ \n]{20,}")
_ACCENTED = re.compile(f"[{''.join(LATIN_BASES)}]")


# Every letter of `LATIN_BASES` is in these two blocks: a text with none of them (most
# outside ASCII: Chinese, Cyrillic, emoji) holds no accented key, and skips the scan of
# its long words (64 KB of prose with a few Chinese words: 3 ms; this search: 0.1 ms).
_LATIN_BLOCKS = re.compile("[\u00c0-\u024f\u1e00-\u1eff]")


def _accented(text: str) -> Iterator[Span]:
    """Keys in the words of `text` that may be one with accented letters, those read as
    their base letters (`_ACCENT_OF`)."""
    if _LATIN_BLOCKS.search(text) is None:
        return
    end = -1
    for m in _LONG_WORD.finditer(text):
        if (m[0].isascii() or _DIGIT.search(text, m.start(), m.end()) is None
                or _ACCENTED.search(text, m.start(), m.end()) is None):
            continue  # (a key has 20 characters or more, a digit among them)
        for i in range(m.start(), m.end(), _WORD_CHARS * 4):
            if i < end:
                continue  # (a word read already)
            a, b = _word_around(text, i, _WORD_CHARS * 8)
            end = b
            word = text[a:b]
            if word.isascii() or (read := word.translate(_ACCENT_OF)) == word:
                continue
            read = _accent_capitals(word, read)
            for x, y in _find(read):
                if read[x:y] != word[x:y]:
                    yield a + x, a + y


def _found_all(text: str, c: str, most: int) -> list[int]:
    """Where `c` is in `text`, `most` places at most."""
    out: list[int] = []
    i = text.find(c)
    while i != -1 and len(out) < most:
        out.append(i)
        i = text.find(c, i + 1)
    return out


def may_escape(text: str) -> bool:
    """Whether `text` may hold an escape `unescaped` decodes (URL, HTML, backslash)."""
    return "%" in text or "\\" in text or "&" in text


def _disguised(text: str) -> tuple[str, list[int] | None] | None:
    """`text` as a reader of its disguises reads it, each undone in turn so that they
    compose (a look-alike letter in a URL-encoded key, "s\u043a%2Dproj-...", a
    JSON-escaped look-alike, "s\\u043a-proj-..."): its escapes decoded (`unescaped`),
    then, in what that reads, the words that mix look-alike letters with ASCII read as
    the letters they mimic (`_unmasked`); with where each of its characters starts in
    `text` (None: one for one). None where it reads as written. (A text every detector
    reads is read so by `find_secrets`, around its escapes only.)"""
    view, at = text, None
    if may_escape(text) and (decoded := unescaped(text)) is not None:
        view, at = decoded
    if not view.isascii() and (look := _unmasked(view)) is not None:
        view = look
    return None if view is text else (view, at)


# A word that mixes look-alike letters of another script with ASCII letters, digits or a
# key's punctuation (a Cyrillic "s" in "sk-proj-...", a Cyrillic "a" in its body): a key
# in disguise. Text in that script alone (Russian, Greek prose) mixes none, and is read
# once. (One pattern finds each such word whole, tried at word starts only: a run of
# text is scanned once.)
_LOOK = str.maketrans(SHAPES)
_look_capitals = _capitals_of(SHAPES)
_LOWER_SHAPES = frozenset(c for c, v in SHAPES.items() if v.islower())
_SHAPE = f"[{''.join(SHAPES)}]"
_SHAPE_CHAR = re.compile(_SHAPE)
_MIXED = re.compile(f"[A-Za-z0-9_-](?:(?={_SHAPE})|(?<={_SHAPE}.))")  # (where one mixes)
_MIXED_WORD = re.compile(
    rf"(?<!\S)(?=\S*?(?:[A-Za-z0-9_-]{_SHAPE}|{_SHAPE}[A-Za-z0-9_-]))\S+")


def _unmasked(text: str, hits: _Hits | None = None) -> str | None:
    """`text` with the words that mix look-alike letters with ASCII read as the Latin
    letters they mimic (one letter for one: a span is the text's), where one of those
    words, so read, holds what a secret is found from (`_worth_reading`; `hits`: the
    scan of `text` as written, where the caller has it); None otherwise."""
    if _SHAPE_CHAR.search(text) is None or (first := _MIXED.search(text)) is None:
        return None  # (most text in another script: no word mixes; one quick scan)
    start = _word_start(text, first.start())
    if not _worth_reading(text, start, hits):
        return None
    return text[:start] + _MIXED_WORD.sub(_folded_word, text[start:])


def _folded_word(m: re.Match[str]) -> str:
    return _look_capitals(m.group(), m.group().translate(_LOOK))


_HEX_LETTERS = frozenset("abcdef")
_NEAR = 64  # how far before what a secret is found from the secret may start
_AFTER = 640  # how far before the first word that mixes a secret's literal may be


def _worth_reading(text: str, start: int, hits: _Hits | None) -> bool:
    """Whether a word that mixes look-alike letters with ASCII (from `start` on), read
    as the letters it mimics, holds a secret, or the start of one that words after it
    end: where a word so read holds what anything here starts from (a format's literal,
    plain or disguised, with a look-alike in its body too; a phrase's first word where a
    word starts; a variable's ending, the words before a UUID or in a query; a UUID),
    the text around it, so read, is read for a secret. Most text in other scripts (and
    Turkish or Danish prose, whose own letters dotless i and o-slash are look-alikes)
    holds none, and is not read twice. Each place is found by a search of the text with
    every look-alike read (`str.replace`, once per look-alike present), for the words
    holding a letter a look-alike present reads as; what it holds as written is in
    `hits`, the text's own scan: no word of the text is folded one by one."""
    present = set(_SHAPE_CHAR.findall(text, start))
    read = text
    for c in present:
        read = read.replace(c, SHAPES[c])
    if not _LOWER_SHAPES.isdisjoint(present):
        read = _look_capitals(text, read)
    low = read.lower()
    if hits is None:
        written = text.lower()
        hits = _scan(written) if len(written) == len(text) else None
    if len(low) != len(text) or hits is None:
        return True  # (lower-casing moved offsets, rare letters: the text is read again)
    # (each place with the word found there: as written, the scan's; then the words
    # holding a letter a look-alike present reads as, and the ones any word may hold)
    places = list(hits.found)
    letters = {SHAPES[c].lower() for c in present}
    looked_for = {w for c in letters for w in _LOOKED_FOR_BY_LETTER[c]}
    words = looked_for.union(_WORDS_ANYWHERE)
    roots = {_ROOT_OF[w] for w in words}
    there = {r for r in roots if r in low}  # (a word whose root is not there is not)
    for word in words:
        if _ROOT_OF[word] not in there:
            continue
        if word not in _ANYWHERE:  # where a word starts (not "api" in "kap\u0131")
            places += [(m.start(), word) for m in _AT_WORD_START[word].finditer(low, start)]
            continue
        i = low.find(word, start)
        while i != -1:
            places.append((i, word))
            i = low.find(word, i + 1)
    if not letters.isdisjoint(_HEX_LETTERS) and "-" in text:
        places += [(m.start(), "") for m in _UUID.finditer(read, start)]
    read_for: set[object] = set()
    for i, word in sorted(set(places)):
        if i < start - _HEAD:
            continue  # (a phrase starts at most this far before the word that hides it)
        if word in _MAYBE_START and not (i and "a" <= low[i - 1] <= "z"):
            m = _PHRASE.match(read, i)  # (tried here first: most places are a phrase's)
            if m is not None and read[i:m.end()] != text[i:m.end()] and (
                    (i >= start and _mixes(text, i)) or _hidden_head(text, read, m)):
                return True
        if i >= start - _AFTER and word in _READ_AROUND and _hides_a_secret(
                text, read, low, i, word, max(0, start - _AFTER - _NEAR), read_for):
            return True
    return False


# How far a phrase's words (its keyword, "for my bank", its link) reach before its value.
_HEAD = 256


def _hidden_head(text: str, read: str, m: re.Match[str]) -> bool:
    """Whether the phrase `m` (of `read`) holds a look-alike in a word before its value
    that mixes with ASCII, in a word other than its first ("api k\u0435y: ...",
    "password \u0456s ..."): a phrase the text as written does not start."""
    head = next(m.start(g) for g in ("qv", "v", "zh", "pin", "to") if m[g] is not None)
    return (read[m.start():head] != text[m.start():head]
            and _MIXED.search(text, m.start(), head) is not None)


def _mixes(text: str, i: int) -> bool:
    """Whether the word at `i` mixes look-alike letters with ASCII (`_MIXED`)."""
    return _MIXED.search(text, *_word_around(text, i)) is not None


def _hides_a_secret(text: str, read: str, low: str, i: int, word: str, lo: int,
                    read_for: set[object]) -> bool:
    """Whether what may start from `word` at `i` of `read` (the text with its look-alikes
    read as the letters they mimic; `low`, lower-cased), other than a phrase, is a
    secret that the look-alikes hide in `text`: the formats whose literal it is, the
    variable it ends, the query's credential or the UUID it names. Each is read once
    per text, from `lo` on (`read_for`: those read already, and hiding none): a reading
    around each place cost a window's worth of every literal's format per place (64 KB
    of "aws secret " with one dotless i: seconds)."""
    def hidden(m: re.Match[str]) -> bool:  # (by a word there that mixes: `_MIXED`)
        return (read[m.start():m.end()] != text[m.start():m.end()]
                and _MIXED.search(text, m.start(), m.end()) is not None)

    def first(kind: object) -> bool:
        if kind in read_for:
            return False
        read_for.add(kind)
        return True

    for k in _FORMATS_FROM.get(word, ()):
        needs, rx = _FORMAT_RX[k]
        if any(low.startswith(n, i) for n in needs) and first(k) and any(
                _format_ok(m) and hidden(m) for m in rx.finditer(read, lo)):
            return True
    if word in _ENV_ENDINGS and first("env") and any(
            hidden(m) for m in _ENV.finditer(read, lo)):
        return True
    if word in _QUERY_WORDS and first("query") and any(
            hidden(m) for m in _QUERY.finditer(read, lo)):
        return True
    if (word in _UUID_WORDS or word == "") and first("uuid"):  # ("": a UUID's place)
        return any(read[lo + a:lo + b] != text[lo + a:lo + b]
                   and _MIXED.search(text, lo + a, lo + b) is not None
                   for a, b in _named_uuids(read[lo:]))
    return False


def _word_around(text: str, i: int, reach: int = 512) -> Span:
    """Where the word at `i` starts and ends, `reach` at most either side (a space or a
    line's end around it: the text the detectors read has no other blank)."""
    lo, hi = max(0, i - reach), min(len(text), i + reach)
    start = max(text.rfind(" ", lo, i), text.rfind("\n", lo, i)) + 1
    ends = [e for e in (text.find(" ", i, hi), text.find("\n", i, hi)) if e != -1]
    return max(start, lo), min(ends, default=hi)


# An escape a reader or a program reads as the character it names: URL-encoding
# ("sk%2Dproj", a UTF-8 letter's bytes "%D0%BA"), a JSON, JavaScript or Python escape
# written out in plain text ("sk\\u002dproj", "\\x2d", "\\U0000002d", as a log line or a
# pasted string literal holds it; an escaped backslash before one, "\\\\u002d", as JSON
# of JSON holds it), an HTML character reference ("sk&#45;proj", "&#x2d;"). Printable
# characters only: an escaped control character is no disguise of a key's. Also
# JavaScript's (and Rust's, Swift's) "\\u{2d}", JavaScript's escape() and IIS's "%u002D",
# a character reference a browser reads without its ";" ("&#45"), and the named ones a
# key's or an address's characters have, "&amp;" first (HTML escaped twice:
# "&amp;#45;" is "&#45;", then "-"). And an octal escape of three digits (C's, Python's,
# PHP's, printf's: "sk\\055proj"), and CSS's, of one to six hex digits and the one blank
# that may end it ("sk\\2d proj", "\\00002d"; three octal digits are read as octal),
# its first a digit (a key's characters', ASCII or a look-alike's, are; "\\beta",
# "\\Admin", "\\def" are LaTeX, a path, code).
_ENTITIES = ("amp", "AMP", "lt", "gt", "quot", "apos", "hyphen", "dash", "lowbar", "UnderBar",
             "period", "colon", "sol", "bsol", "plus", "equals", "commat", "num", "percnt",
             "excl", "quest", "nbsp",
             # (invisible: a key split by one, as a zero-width character as written is)
             "shy", "ZeroWidthSpace", "zwnj", "zwj", "NoBreak", "it", "ic", "af",
             "InvisibleTimes", "InvisibleComma", "ApplyFunction")
_ESCAPE = re.compile(r"%(?P<p>[2-6][0-9A-Fa-f]|7[0-9A-Ea-e])|\\u(?P<u>[0-9A-Fa-f]{4})"
                     r"|(?P<b>%[C-Fc-f][0-9A-Fa-f](?:%[89ABab][0-9A-Fa-f]){1,3})"
                     r"|\\x(?P<x>[0-9A-Fa-f]{2})|\\U(?P<U>[0-9A-Fa-f]{8})"
                     r"|\\u\{(?P<ub>[0-9A-Fa-f]{1,6})\}|%u(?P<pu>[0-9A-Fa-f]{4})"
                     r"|&#(?:(?P<d>[0-9]{1,7})|[xX](?P<h>[0-9A-Fa-f]{1,6}));?"
                     rf"|(?P<n>&(?:{'|'.join(_ENTITIES)});)"
                     r"|(?P<bs>\\\\)(?=[uUx])"
                     r"|\\(?P<o>(?!00[0-9A-Fa-f]{4})[0-3][0-7]{2})"
                     r"|\\(?P<c>[0-9][0-9A-Fa-f]{0,5})(?:\r\n|[ \t\r\n\f])?")
# Escapes are decoded round after round while a round decodes any ("%25252D" is "%252D",
# then "%2D", then "-"): a URL encoded once more at each hop of a redirect or a proxy,
# a JSON string of a URL. At most this many rounds: each reads the whole text, and no
# tool chain nests deeper (a text nested past it costs eight linear passes, not one per
# level of a megabyte's worth of "%25").
_ESCAPE_ROUNDS = 8


# Letters that render as a blank a letter wide (the Hangul fillers, the braille blank):
# `fold` reads them as a space, and a key split by them ("sk-proj-Ab\u3164Cd...") is
# read a second time with them as nothing (`plugin._blank_letters_out`; escaped, by
# `find_secrets`).
BLANK_LETTERS = "\u115f\u1160\u3164\uffa0\u2800"
_BLANK_LETTER = re.compile(f"[{BLANK_LETTERS}]")
_BLANKS_AS_SPACES = str.maketrans(dict.fromkeys(BLANK_LETTERS, " "))


def blanks_as_spaces(view: str) -> str:
    """`view` (a decoding kept its blank letters, `unescaped`) with each a space, as
    `fold` reads one written as it is (one for one)."""
    if view.isascii() or _BLANK_LETTER.search(view) is None:
        return view
    return view.translate(_BLANKS_AS_SPACES)


def _escaped_char(m: re.Match[str], keep_blanks: bool = False) -> str | None:
    """What the escape `m` names, read as the text's own characters are (`read_as`: a
    full-width or look-alike letter as it is read, an invisible one as nothing; with
    `keep_blanks`, a blank letter as itself), or None where it names no character read
    here."""
    if m["bs"] is not None:
        return "\\"
    if m["n"] is not None:
        return read_as(html.unescape(m["n"]))
    if m["b"] is not None:
        try:
            c = bytes.fromhex(m["b"].replace("%", "")).decode()
        except UnicodeDecodeError:
            return None
    else:
        code = int(m["d"]) if m["d"] else int(m["o"], 8) if m["o"] else int(
            m["p"] or m["u"] or m["x"] or m["U"] or m["h"] or m["ub"] or m["pu"] or m["c"], 16)
        if code > 0x10FFFF:
            return None
        c = chr(code)
    if not c.isprintable() and fold(c):  # (a lone surrogate, a control character)
        return None
    return c if c.isascii() or (keep_blanks and c in BLANK_LETTERS) else read_as(c)


# A text's reading with its escapes decoded (`unescaped`), kept for the detectors that
# run one after another on the same string: the secret detector's own reading and every
# other's (`detectors.with_escapes`) are one decoding, not one each (up to
# `_ESCAPE_ROUNDS` passes over the whole text apiece). One per thread: a long prompt is
# read in the sanitizer's thread while the loop reads short ones, each forgetting its
# own (a shared one was dropped mid-scan, and decoded again by every detector).
class _Memo(threading.local):
    read_of: tuple[str, list[tuple[str, list[int]]] | None] = ("", None)


_memo = _Memo()


def escapes_read(text: str) -> list[tuple[str, list[int]]] | None:
    """`text` with its escapes decoded (`unescaped`), decoded once for the last text
    read, as the pieces the detectors read again (`_decoded_pieces`): each with where
    its characters start in `text` (its end last). None where it holds none."""
    memo = _memo.read_of
    if memo[0] is not text:
        memo = _memo.read_of = (text, _decoded_pieces(text))
    return memo[1]


# What the detectors read again of a text with escapes: the text around its escapes,
# decoded, not all of it (one escape in 64 KB of HTML had every detector read the whole
# page twice: 20 ms of CPU time became 54). What is found away from every escape reads
# as written, and was found there. A window reaches `_WINDOW_REACH` either side of its
# escapes (further than any detector's match with its context: a phrase's keyword
# before its value, a spelled e-mail address, a phone word before its number), then on
# to a blank, `_WINDOW_TOKEN` at most (a key with an escape in it, however far its
# characters go either side, is read whole); one holding a private key's or a PuTTY
# file's first line reaches on `_BLOCK_REACH` (its body, to its END line). Many
# windows, or most of the text, and the whole text is decoded and read.
_WINDOW_REACH = 1024
_WINDOW_TOKEN = 8192
_BLOCK_REACH = 8192 + 512
_BLOCK_WORDS = ("private key", "putty-user-key-file-")
_WINDOWS_MOST = 16
_ESCAPE_STARTS = 512  # "%", "\\" and "&" looked at one by one, at most
_BLANK = re.compile(r"\s")


def _escape_windows(text: str) -> list[Span] | None:
    """Where `text`'s escapes are, each widened by `_WINDOW_REACH` and the overlapping
    ones merged; None where they are many (the whole text is read)."""
    starts: list[int] = []
    for c in "%\\&":
        i = text.find(c)
        while i != -1:
            if len(starts) == _ESCAPE_STARTS:
                return None
            starts.append(i)
            i = text.find(c, i + 1)
    found = (m for i in sorted(starts) if (m := _ESCAPE.match(text, i)) is not None)
    return _reaches((m.start(), m.end()) for m in found)


def _reaches(places: Iterable[Span]) -> list[Span] | None:
    """Each of `places` (sorted by start) widened by `_WINDOW_REACH` either side, the
    overlapping ones merged; None where they are more than `_WINDOWS_MOST`."""
    spans: list[Span] = []
    for a, b in places:
        lo, hi = a - _WINDOW_REACH, b + _WINDOW_REACH
        if spans and lo <= spans[-1][1]:
            spans[-1] = (spans[-1][0], hi)
        elif len(spans) == _WINDOWS_MOST:
            return None
        else:
            spans.append((lo, hi))
    return spans


def _token_out(text: str, a: int, b: int) -> Span:
    """`a`..`b` widened to the blanks around it (`_WINDOW_TOKEN` at most each side)."""
    floor = max(0, a - _WINDOW_TOKEN)
    blank = max(text.rfind(c, floor, a) for c in " \n\t\r")
    if blank == -1 and floor:
        blank = floor - 1
    after = _BLANK.search(text, b, b + _WINDOW_TOKEN)
    return blank + 1, min(len(text), after.start() if after is not None else b + _WINDOW_TOKEN)


def _wrap_out(text: str, a: int, b: int) -> int:
    """A window's end `b` moved on over the lines a key may wrap over (`_wrapped`'s, one
    word whole each, `_WRAP_LINES` at most) where its last line is one word whole (a
    key's first piece, or a wrapped piece of one): a key wrapped over long lines from an
    escaped literal on its first ("sk%2Dproj-..." then eight lines of 400) ran past the
    window's reach, and its lines past it went on."""
    line = max(text.rfind("\n", a, b), a - 1) + 1
    first = _FIRST_WORD.match(text, line, b)  # (the line's one word, blanks before it)
    if first is None or first.end(1) != b or (brk := _LINE_END.match(text, b)) is None:
        return b
    pos = brk.end()
    for _ in range(_WRAP_LINES):
        m = _FIRST_WORD.match(text, pos)
        if m is None or "\n" in text[pos:m.start(1)]:  # (a blank line ends it)
            break
        b = m.end(1)
        if (brk := _LINE_END.match(text, b)) is None:  # (the key ends on this line)
            break
        pos = brk.end()
    return b


def _widened(text: str, spans: list[Span]) -> list[Span]:
    """`spans` (each a place's reach, merged) widened to the words around them and on
    over the lines a key wrapped from them runs over (`_token_out`, `_wrap_out`), the
    ones that then overlap merged."""
    windows: list[Span] = []
    for lo, hi in spans:
        a, b = _token_out(text, max(0, lo), min(len(text), hi))
        b = _wrap_out(text, a, b)
        if windows and a <= windows[-1][1]:
            windows[-1] = (windows[-1][0], max(b, windows[-1][1]))
        else:
            windows.append((a, b))
    return windows


def windows_around(text: str, places: list[int]) -> list[Span] | None:
    """The parts of `text` a detector's match at or beside `places` (sorted) can reach,
    as the escapes' windows are (`_WINDOW_REACH` either side, out to the words around,
    over a wrapped key's lines; one holding a private key's first line over its body),
    merged; None where they are many or most of the text (it is read whole)."""
    spans = _reaches((i, i + 1) for i in places)
    if spans is None:
        return None
    widened = _widened(text, spans)
    if sum(b - a for a, b in widened) > len(text) // 2:
        return None
    low = text.lower()  # (as `_find`: lower-casing moved offsets, no chain read)
    literals = _scan(low).needs_at if len(low) == len(text) else []
    windows: list[Span] = []
    for a, b in widened:
        a, b = _chains_over(text, a, b, literals)
        if b < len(text) and _holds_block(text[a:b]):
            b = _token_out(text, a, min(len(text), b + _BLOCK_REACH))[1]  # (its body)
        while windows and a <= windows[-1][1]:
            a, b = min(a, windows[-1][0]), max(b, windows.pop()[1])
        windows.append((a, b))
    return None if sum(b - a for a, b in windows) > len(text) // 2 else windows


# How far before a window a key wrapped over lines or split over values may start and
# still run into it: its first piece and `_WRAP_LINES` more, each with what parts it from
# the one before (`_FIRST_WORD`'s blanks; `_NEXT_VALUE`, a mapping's key between: 400
# characters at most).
_CHAIN_REACH = 9 * (512 + 512)  # (`_WRAP_LINES` + 1 pieces)
_WORD_STOP = re.compile(r"[\s\"'`\\]")


def _chains_over(text: str, a: int, b: int, literals: list[int]) -> Span:
    """The window `a`..`b` widened over every key wrapped over lines or split over
    string values (`_wrap_pieces`, `_value_pieces`) from a format's literal (`literals`:
    where each is in `text`, sorted) that runs into it from before it or out of it past
    its end: a blank letter in a key's last line or value, its literal over
    `_WINDOW_REACH` before, was read in a window without it, and the key's pieces from
    the blank letter on went on."""
    start, end = a, b
    done = 0  # (the literals of one word read as its first: each starts the same chains)
    for at in literals[bisect_left(literals, a - _CHAIN_REACH):bisect_left(literals, b)]:
        if at < done or a <= at < b - _CHAIN_REACH:
            continue  # (read already, or a chain from here ends in the window)
        stop = _WORD_STOP.search(text, at, at + _WORD_CHARS)
        done = stop.start() if stop is not None else at + _WORD_CHARS
        for pieces in (_wrap_pieces(text, at), _value_pieces(text, at)):
            if pieces is not None and len(pieces) > 1 and pieces[-1][2] > a:
                start, end = min(start, pieces[0][1]), max(end, pieces[-1][2])
    return start, end


def _decoded_pieces(text: str) -> list[tuple[str, list[int]]] | None:
    """`text` decoded (`unescaped`) around its escapes (`_escape_windows`), or whole."""
    spans = _escape_windows(text)
    windows = _widened(text, spans or [])
    if spans is None or sum(b - a for a, b in windows) > len(text) // 2:
        decoded = unescaped(text, True)
        return None if decoded is None else [decoded]
    pieces: list[tuple[str, list[int]]] = []
    i = 0
    while i < len(windows):
        a, b = windows[i]
        i += 1
        decoded = unescaped(text[a:b], True)
        if decoded is None:
            continue
        if b < len(text) and _holds_block(decoded[0]):
            b = _token_out(text, a, min(len(text), b + _BLOCK_REACH))[1]  # (its body)
            # (the windows its body reaches over are read in it, not again each on its
            # own: 15 windows a private key's words apiece read 64 KB 2.4 times over;
            # one holding a block's first line too reaches it on past its own end)
            while i < len(windows) and windows[i][1] <= b:
                wa, wb = windows[i]
                i += 1
                inner = unescaped(text[wa:wb], True)
                if wb < len(text) and inner is not None and _holds_block(inner[0]):
                    b = max(b, _token_out(text, a, min(len(text), wb + _BLOCK_REACH))[1])
            decoded = unescaped(text[a:b], True) or decoded
        view, at = decoded
        pieces.append((view, [a + j for j in at]))
    return pieces or None


def _holds_block(view: str) -> bool:
    low = blanks_as_spaces(view).lower()
    return any(w in low for w in _BLOCK_WORDS)


def forget_escapes() -> None:
    """Drop the last text's reading (`escapes_read`, this thread's): no prompt kept alive
    past its scan."""
    _memo.read_of = ("", None)


def unescaped(text: str, keep_blanks: bool = False) -> tuple[str, list[int]] | None:
    """`text` with its escapes decoded (`_ESCAPE`, round after round: "%25252D" is "-"), and
    where each of its characters starts in `text` (the text's end last); None where it
    holds none. With `keep_blanks`, an escaped blank letter is decoded as itself (not a
    space: `find_secrets` reads a key split by one joined too)."""
    at: list[int] | None = None
    for _ in range(_ESCAPE_ROUNDS):
        out: list[str] = []
        places: list[int] = []
        pos = 0
        for m in _ESCAPE.finditer(text):
            c = _escaped_char(m, keep_blanks)
            if c is None:
                continue
            out.append(text[pos:m.start()])
            places += range(pos, m.start())
            out.append(c)
            places += [m.start()] * len(c)
            pos = m.end()
        if not out:
            break
        out.append(text[pos:])
        places += range(pos, len(text) + 1)
        at = places if at is None else [at[i] for i in places]
        text = "".join(out)
    return None if at is None else (text, at)


class _Hits(NamedTuple):
    """Where a text's scan (`_scan`) found what the detector starts from."""
    words: set[str]  # the formats' literals found (each as the scan reports it)
    starts: list[int]  # where a phrase may start
    needs_at: list[int]  # where a format's literal may start (a key wrapped there)
    found: list[tuple[int, str]]  # each place of those two, with the word found there


def _scan(low: str) -> _Hits:
    """One scan of a lower-cased text for every literal a family needs and every word a
    phrase starts with (a search per word cost more than the rest of the detector)."""
    words: set[str] = set()
    starts: list[int] = []
    needs_at: list[int] = []
    found: list[tuple[int, str]] = []
    for hit in _ANY_WORD.finditer(low):
        word = hit.group()
        i = hit.start()
        if word in _MAYBE_NEED:
            words.add(word)
            needs_at.append(i)
            found.append((i, word))
        if word in _MAYBE_START and not (i and "a" <= low[i - 1] <= "z"):
            starts.append(i)
            found.append((i, word))
        elif word == "--pass":  # the scan took "--pass": "password" starts inside it
            starts.append(i + 2)
            found.append((i + 2, "pass"))
    return _Hits(words, starts, needs_at, found)


def _find(text: str, low: str | None = None, hits: _Hits | None = None) -> Iterator[Span]:
    """Secrets in `text` as written (`low`, `hits`: its lower-cased form and its scan,
    where the caller has them)."""
    if low is None:
        low = text.lower()
    words, starts, needs_at, _ = _scan(low) if hits is None else hits
    if words:
        # (only the formats a literal found may start: a search of the text for each
        # literal of every format cost as much as the rest of the detector)
        for k in sorted({k for w in words for k in _FORMATS_FROM[w]}):
            needs, rx = _FORMAT_RX[k]
            if any(n in low for n in needs):
                for m in rx.finditer(text):
                    if _format_ok(m):
                        yield m.span()
        if "\n" in text and len(low) == len(text):
            yield from _wrapped(text, needs_at)
        if ('"' in text or "'" in text or "`" in text) and len(low) == len(text):
            yield from _split_values(text, needs_at)
        if "," in text and len(low) == len(text):
            yield from _split_cells(text, needs_at)
    if len(low) != len(text):  # lower-casing moved offsets (rare letters): scan it all
        matches: Iterator[re.Match[str]] = _PHRASE.finditer(text)
    else:  # the phrase tried only where one of its first words starts a word
        matches = _matches_at(text, starts)
    for m in matches:
        if _phrase_ok(m):
            yield m.start(), _phrase_end(text, m)
    if any(e in low for e in _ENV_ENDINGS):
        for m in _ENV.finditer(text):
            value = _unquoted(m["qv"]) if m["qv"] is not None else m["v"]
            # (a name run into its PASSWORD takes plain words, as "DB_PASSWORD=" does)
            password = m.group().partition("=")[0].partition(":")[0].rstrip().endswith(
                _PASSWORD_NAMES)
            if _PATH.match(_bare(value)):
                continue
            env = re.match(r"[A-Z0-9_]+=[^\s=]", m.group()) is not None  # (NAME=value)
            if _value_ok(value) and (_looks_made_up(value, env=env) or (
                    password and env and "(" not in value)):
                yield m.span()
    if len(text) >= _B64_LEAST and may_encode(text):
        yield from _encoded(text)
    if "-" in text and any(w in low for w in _UUID_WORDS):
        yield from _named_uuids(text)
    if "=" in text and any(w in low for w in _QUERY_WORDS):
        for m in _QUERY.finditer(text):
            if _query_value(m["qs"], m["name"]):
                yield m.span()



# What `_encoded` reads: a base64 or base64url run or a hex run, each of 24 characters
# of this class or more (a hex run's "0x" too). Whether a text holds one is asked of its
# UTF-8 bytes, each of the class read as "a" and any other as a blank (`bytes.translate`
# and a search for 24 "a"s: C speed, a thirtieth of one pattern's scan): prose never
# holds one, and skips the three patterns of `_encoded` (13% of the detectors' CPU time
# on 4 KB of it). (Every character of the class is ASCII: a byte of a character outside
# ASCII, 0x80 or above, is no character of the class.)
_ENCODED_CLASS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-")
_ENCODED_BYTES = bytes(0x61 if b in _ENCODED_CLASS else 0x20 for b in range(256))
_ENCODED_NEEDLE = b"a" * 24  # (`_B64_LEAST`; the shortest run of any of the three)


def may_encode(text: str) -> bool:
    """Whether `text` holds a run of 24 characters that `_encoded`'s patterns read (a
    strict superset of where they match)."""
    return _ENCODED_NEEDLE in text.encode("utf-8", "surrogatepass").translate(_ENCODED_BYTES)


def secrets_quiet(text: str, low: str) -> bool:
    """True only where `find_secrets(text)` finds nothing, for an ASCII `text` with no
    escape (`may_escape`) and `low` its lower-cased form: what each step of `_find`
    starts from is absent. A strict superset of `_find`'s triggers: keep it in step with
    `_find` (tests/unit/plugins/test_sanitizer_quiet.py compares the two)."""
    hits = _scan(low)
    return (not hits.words and not hits.starts  # (no format's literal, no phrase's start)
            and not any(e in low for e in _ENV_ENDINGS)
            and (len(text) < _B64_LEAST or not may_encode(text))
            and not ("-" in text and any(w in low for w in _UUID_WORDS))
            and not ("=" in text and any(w in low for w in _QUERY_WORDS)))

# A credential in a URL's query string, named as one ("?key=...&", "&client_secret=",
# "?access_token="): made up, not a slug ("?key=blue-shirt"), nor a page's or a
# request's own token ("?page_token=", "?next_token="), nor a key that names a record
# or an entry, not a credential ("?idempotency_key=", "?sort_key=", "?partition_key=").
# (Not a format's literal: a format's is where a key wrapped over lines is looked for.)
_QUERY_WORDS = ("key=", "secret=", "token=", "auth=", "password=", "passwd=", "pwd=",
                "credential")
_QUERY = re.compile(
    r"(?<=[?&;])(?i:(?!(?:page|next|continuation|sync|cursor|state)[_-]?token=)"
    r"(?!(?:idempotency|sort|primary|partition|foreign|cache|public|range|routing|shard"
    r"|dedup|dedupe|lookup|group|order|unique|composite|translation|i18n|hash)[_-]?key=)"
    r"(?P<name>(?:[a-z0-9]+[_-])*(?:api[_-]?key|apikey|key|secret|token|auth|pass(?:word|wd)?"
    r"|pwd|credentials?)))=(?P<qs>[^&#\s\"'<>]{8,512})")


# Words joined by "_" or "-", each capitalized or lower-case: a page's or a thing's name
# ("?key=Main_Page", "?token=Hello-World"), not a key.
_TITLE_SLUG = re.compile(r"[A-Za-z][a-z]+(?:[_-][A-Za-z][a-z]+)+")


# A key named only "key" ("?key=", "?item_key="; not "api_key", "access_key"), and so a
# bare "token" or "auth" ("?x&amp;token=page3", "?auth=oauth2"), names as often a record,
# a section, a page or a scheme as a credential: its value is a credential's only where
# it is not a name and a number ("section2", "chapter-3", "Page_12", "tenant42",
# "2024-01-01"): words, each with at most a few digits after it, or numbers. (Not a
# "secret": a webhook's "?secret=Summer2024" names nothing but its secret, and a
# person's chosen one is a word and a number.)
_BARE_KEY = re.compile(r"(?i:(?:[a-z0-9]+[_-])?(?:key|token|auth))")
_CREDENTIAL_KEY = re.compile(r"(?i:(?:api|access|secret|private|client|app|auth|account"
                             r"|license|licence|master|subscription|signing|encryption"
                             r"|refresh|bearer|session|id)[_-]?(?:key|token|secret))")
_NAMING = r"(?:(?:[a-z]{1,16}|[A-Z][a-z]{1,15}|[A-Z]{1,8})\d{0,6}|\d{1,6})"
_NAME_AND_NUMBER = re.compile(rf"{_NAMING}(?:[-_.]{_NAMING})*")
# (but not capitals in groups, two or more, with no lower-case word: a licence or an
# activation key's shape, "ABCD-1234-EFGH-5678", "ABCD1234-EFGH5678")
_CAPS = re.compile(r"[A-Z]+")


# A bare "token" or "auth" names a credential more often than a page ("?token=" of a
# reset link, an invite): its name and number of eight characters or more that mixes
# letters and digits is one ("?auth=letmein123", "?token=hunter22"), unless its first
# word is one a page, a record, a version or a scheme is named by ("section12",
# "version10", "oauth2-v2") or a word of it names a scheme or an algorithm
# (`_SCHEME_WORDS`); a shorter one stays a name ("page3", "row12", "oauth2").
_NAMED_LEAST = 8
_NAMING_WORDS = frozenset("""
page pg p section sec chapter ch part row item entry step version ver v rev revision
release build stage phase draft tab view slide level tier plan tenant user region zone
shard node batch round week day month year q fy list index idx id no num number test
demo sample example case line col column table sheet cell group team room lesson unit
module task issue ticket order doc docs note file folder oauth oauth2 saml sso ldap
openid oidc basic digest kerberos ntlm mfa otp hs rs es ps md ed
""".split())
# A scheme's or an algorithm's word anywhere in it names one too ("hmac-sha256",
# "google-oauth2", "aws-sigv4", "jwt-rs256", "x509-cert").
_SCHEME_WORDS = frozenset("""
oauth saml sso ldap openid oidc basic digest kerberos ntlm hmac sha scram jwt jws jwe
aws sigv tls mtls psk webauthn fido totp hotp rsa ecdsa cert
""".split())
_WORD = re.compile(r"[A-Za-z]+")


def _named_by_a_word(v: str, name: str) -> bool:
    """Whether `v`, a name and a number under a bare key, token or auth, names a page,
    a record or a scheme rather than being a credential (`_NAMING_WORDS`,
    `_SCHEME_WORDS`)."""
    if not name.lower().endswith(("token", "auth")) or len(v) < _NAMED_LEAST:
        return True
    words = [w.lower() for w in _WORD.findall(v)]
    return (not words or not any(c.isdigit() for c in v) or words[0] in _NAMING_WORDS
            or any(w in _SCHEME_WORDS for w in words))


def _query_value(value: str, name: str) -> bool:
    v = _bare(value)
    if (_BARE_KEY.fullmatch(name) is not None and _CREDENTIAL_KEY.fullmatch(name) is None
            and _NAME_AND_NUMBER.fullmatch(v) is not None
            and not (v == v.upper() and len(_CAPS.findall(v)) > 1)
            and _named_by_a_word(v, name)):
        return False
    return (_value_ok(v) and _LOWER_SLUG.fullmatch(v) is None
            and _TITLE_SLUG.fullmatch(v) is None
            and any(c.isalpha() for c in v) and _random_looking(v))


# A UUID-shaped key (Heroku's, many SaaS APIs'), named as a key just before it ("api key:
# <uuid>", "HEROKU_API_KEY=<uuid>", "token <uuid>"): a UUID alone is an id (an order's,
# a request's), and so is one after "primary key", "idempotency key", "page token".
_UUID = re.compile(r"(?<![0-9A-Za-z-])[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                   r"[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?![0-9A-Za-z-])")
_UUID_WORDS = ("key", "token", "secret", "pass", "pwd", "credential", "auth")
_UUID_NAMED = re.compile(
    r"(?i:(?<![a-z])(?P<w>(?:api|access|secret|auth|app|heroku|client|subscription|licen[cs]e"
    r"|private|service|account)[\s_-]?key|apikey|token|secret|pass(?:word|wd)?|pwd"
    r"|credentials?|auth))[\"']?[ \t]*(?:[:=]|\b(?:is|was)\b)?[ \t]*[\"'`]?\Z")
_NOT_A_KEY_TOKEN = re.compile(r"(?i:(?:page|next|continuation|pagination|sync|cursor"
                              r"|cancellation|idempotency)[\s_-]?)\Z")


def _named_uuids(text: str) -> Iterator[Span]:
    for m in _UUID.finditer(text):
        before = text[max(0, m.start() - 48):m.start()]
        named = _UUID_NAMED.search(before)
        if named is None or _NOT_A_KEY_TOKEN.search(before, 0, named.start("w")):
            continue
        yield m.start() - len(before) + named.start("w"), m.end()


# A key base64-encoded: a Docker config's "auth" ("user:ghp_..."), a Kubernetes secret's
# data, a key pasted encoded. A run of base64 (at most `_B64_MOST` characters: an image's
# is longer) that decodes to printable text holding a vendor format is one (what it
# decodes to must be the format itself, not a phrase: random text says "pass: x").
_B64_LEAST, _B64_MOST = 24, 2048
_LINE_BREAKS = re.compile(r"[\r\n\t]")  # what a file encoded holds beside printable text
_B64_RUN = re.compile(r"(?<![A-Za-z0-9+/=_-])[A-Za-z0-9+/]{24,2048}={0,2}(?![A-Za-z0-9+/=_-])")


# base64url (a URL's, a JWT's alphabet: "-" and "_" for "+" and "/"), and a run after
# "=" (a query's value, "state=..."), which the base64 run does not start at.
_B64URL_RUN = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9_-]{24,2048}={0,2}(?![A-Za-z0-9+/=_-])")
# A key written as the hex of its bytes (`xxd -p`, a byte string's `.hex()`, "0x..."):
# a run of hex digits, two for each of a key's 20 characters or more, read as the bytes
# it spells where those are printable UTF-8 (a hash or a commit id spells none).
_HEX_RUN = re.compile(r"(?<![0-9A-Za-z])(?:0x)?((?:[0-9a-fA-F]{2}){20,1024})(?![0-9A-Za-z])")


# Each pattern above matches inside a run of 24 characters of `_ENCODED_CLASS` or more
# (and up to two "=" and the character after them): it is tried in those runs only, found
# once, not at every place of the text (three scans of 64 KB of code: 4 ms of 4.4).
_ENCODED_RUN = re.compile(r"[A-Za-z0-9+/_-]{24,}")


def in_runs(rx: re.Pattern[str], text: str, runs: list[Span]) -> Iterator[re.Match[str]]:
    """`rx.finditer(text)`, for a pattern of `_encoded`'s, read in `runs` (`_ENCODED_RUN`'s)."""
    for a, b in runs:
        yield from rx.finditer(text, a, min(len(text), b + 3))


def _encoded(text: str) -> Iterator[Span]:
    runs = [m.span() for m in _ENCODED_RUN.finditer(text)]
    for m in in_runs(_B64_RUN, text, runs):
        run = m.group().rstrip("=")
        if len(run) % 4 == 1:
            continue
        try:
            decoded = base64.b64decode(run + "=" * (-len(run) % 4)).decode()
        except (ValueError, UnicodeDecodeError):
            continue
        if _spells_a_key(decoded):
            yield m.span()
    for m in in_runs(_B64URL_RUN, text, runs):
        run = m.group().rstrip("=")
        if (len(run) % 4 == 1 or ("-" not in run and "_" not in run and (
                not m.start() or text[m.start() - 1] != "="))):
            continue  # (a base64 run: read above)
        # (a name in one case, "compute_the_total_v2", "enable-the-feature-flag-2024",
        # not decoded: a key's base64, of 18 bytes of text or more, mixes both cases)
        if run.islower() or run.isupper():
            continue
        try:
            decoded = base64.urlsafe_b64decode(run + "=" * (-len(run) % 4)).decode()
        except (ValueError, UnicodeDecodeError):
            continue
        if _spells_a_key(decoded):
            yield m.span()
    for m in in_runs(_HEX_RUN, text, runs):
        try:
            decoded = bytes.fromhex(m[1]).decode()
        except ValueError:  # (UnicodeDecodeError is one)
            continue
        if _spells_a_key(decoded):
            yield m.span(1)


def _spells_a_key(decoded: str) -> bool:
    """Whether what a run decodes to is printable text holding a key: as written, or
    with its own disguises undone (a key with a look-alike letter, an accented one or
    URL-encoded, then encoded)."""
    if not _LINE_BREAKS.sub("", decoded).isprintable():  # (`echo $KEY | base64`)
        return False
    reading = _disguised(decoded)
    return (_holds_a_format(decoded) or (reading is not None and _holds_a_format(reading[0]))
            or (not decoded.isascii() and next(_accented(decoded), None) is not None))


# Every place a format's literal is (overlapping: one may start inside another), each
# naming the formats it may start: what a run decodes to is tried against those only.
# Each line of a hex dump of prose spells text, and trying every format on each, a
# check of 50 literals a line, cost 64 KB of such a dump 45% more CPU time (ten times
# the detector's where its lines held a literal: "robot", "laws").
_NEED_AT = re.compile(f"(?=({trie(_NEEDS)}))")
_NEED_MOST = max(map(len, _NEEDS))
_FORMATS_OF: dict[str, list[int]] = {
    w: [k for k, (needs, _) in enumerate(_FORMATS) if any(n.startswith(w) for n in needs)]
    for w in _NEEDS}


def _holds_a_format(text: str) -> bool:
    low = text.lower()
    for k in sorted({k for m in _NEED_AT.finditer(low) for k in _FORMATS_OF[m[1]]}):
        needs, rx = _FORMAT_RX[k]
        if any(n in low for n in needs) and any(_format_ok(f) for f in rx.finditer(text)):
            return True
    return False


def _random_body(groups: dict[str, str | None]) -> bool:
    """Whether a vendor format's body (its group `b`, `b2` or `b3`; `ba`, an Atlassian
    token's) is random as the vendor's are: base62 or base64url, so a small letter or a
    digit among its capitals (36 random characters of base62 lack both once in 10^13).
    A run of capitals alone, every DNA or protein sequence's ("ghp_GATTACA...", a
    linker "EAAAKEAAAK..." after Square's "EAAA"), is none. An Atlassian token's body
    (180 characters and more) holds both a small letter and a digit: DNA read after
    "ATATT", soft-masked in small letters where it repeats, holds no digit."""
    body = groups.get("b") or groups.get("b2") or groups.get("b3")
    if body is not None:
        return _SMALL_OR_DIGIT.search(body) is not None
    body = groups.get("ba")
    if body is not None:
        return _SMALL.search(body) is not None and _DIGIT.search(body) is not None
    return True


_SMALL_OR_DIGIT = re.compile("[a-z0-9]")


def _aws_body(body: str | None) -> bool:
    """Whether an AWS key id's 16 characters after its prefix (base32: capitals and 2 to
    7) are a key's rather than a peptide's ("AKIAKQRQISFVKSHFSRQL", a word of its own:
    `\\b` either side, so never inside a longer run of capitals): a digit among them, or
    a capital no amino acid has (B, J, O, U, X, Z). 3.6% of real ids hold no digit, and of
    those 1.5% no such capital: one id in 1,850 is missed, where every 20-letter peptide
    starting AKIA or ASIA was a key."""
    return body is None or not _AMINO_ACIDS.issuperset(body)


def _format_ok(m: re.Match[str]) -> bool:
    """A vendor format's match, unless it is words after "sk-" (`_key_body`), a body of
    capitals alone (`_random_body`), its value a placeholder
    ("postgres://user:password@host", "--password $DB_PASS") or a uid:gid pair ("docker
    run -u 1000:1000")."""
    said = m.group(0)
    if said.startswith("sk-") and not _key_body(said):
        return False
    groups = m.groupdict()
    if not _random_body(groups) or not _aws_body(groups.get("aws")):
        return False
    value = groups.get("v") or groups.get("q1") or groups.get("q2")
    if value is None:
        return True
    if value.isdigit() and said.lstrip().startswith("-"):
        return False
    return _value_ok(value) and value.lower() not in _PLACEHOLDER_WORDS


# What a documentation example writes where a password goes.
_PLACEHOLDER_WORDS = frozenset({"password", "pass", "passwd", "pwd", "secret", "pw",
                                "<password>", "changeme"})


def _phrase_ok(m: re.Match[str]) -> bool:
    if m["pin"] is not None:
        return True
    if m["zh"] is not None:
        return _value_ok(m["zh"])
    if m["to"] is not None:
        return _value_ok(m["to"]) and _looks_made_up(m["to"])
    value = _unquoted(m["qv"]) if m["qv"] is not None else m["v"]
    if (name := _query_name(m)) is not None:  # a URL's parameter: the query's rule
        value = _QUERY_END.split(value, 1)[0]
        if m["kp"] is None:  # (a password's plain words are one, as in a phrase)
            return _query_value(value, name)
    env = _env_assignment(m)
    if m["v"] is not None and _code_value(m, m["v"], env):
        return False
    if not _value_ok(value):
        # "passphrase: correct horse battery staple": ordinary words, three or more
        first = (m["v"] or "").lower()
        return (_is_passphrase(m) and m["le"] is not None and m["v"] is not None
                and first not in _CLAUSE and first not in _NOT_A_PASSPHRASE
                and _PROSE.fullmatch(first) is None and m["v"][-1] not in ".,;:!?)"
                and len(_tail(m.string, m.end(), passphrase=True)) >= 2)
    if m["kp"] is not None and m["le"] is not None:
        return True  # "password is swordfish": plain words are passwords too
    cjk_link = m["lo"] is not None and m["lo"].strip() in ("는", "은", "は")
    return _looks_made_up(value, env) and (not cjk_link or value.isascii())


# A phrase that is a URL query's parameter ("?x&token=page3", "&amp;token=page3" as
# written): its keyword run into "=" after "?", "&" or ";" (a parameter's name may
# start before it: "item_token"). Its value is the query's, to the next separator.
_PARAM_BEFORE = re.compile(r"[?&;]([A-Za-z0-9_-]{0,64})\Z")
_QUERY_END = re.compile(r"[&#\s\"'<>]")


def _query_name(m: re.Match[str]) -> str | None:
    """The query parameter's name, where the phrase `m` is one (`_PARAM_BEFORE`)."""
    said = next((g for g in ("kp", "km", "ko") if m[g] is not None), None)
    if said is None or m["v"] is None or m["le"] != "=" or m.string[m.end(said):m.end(
            said) + 1] != "=":
        return None
    before = _PARAM_BEFORE.search(m.string, max(0, m.start() - 66), m.start())
    return None if before is None else before[1] + m[said]


_ENV_NAME = re.compile(r"(?:^|(?<=[\s;]))[A-Z0-9_]*\Z")


def _env_assignment(m: re.Match[str]) -> bool:
    """Whether the phrase is a shell or .env assignment, NAME=value ("DB_PASSWORD=...",
    "export OPENAI_API_KEY=..."): an upper-case name run into "=", whose value is
    literal text there, never a variable (that is "$NAME") nor an attribute."""
    said = m["kp"] or m["km"] or m["ko"] or ""
    if m["le"] != "=" or not said or any(c.islower() for c in said):
        return False
    line = m.string[:m.start()].rpartition("\n")[2]
    return _ENV_NAME.search(line) is not None


# Code that passes a credential along, after "=" or ":" unquoted: a call or its start
# ("password = decoded.split(':', 1)", "token = uuid.uuid4().hex"), an attribute
# ("password = request.url.password,"), an item, a type, a snake_case or CONSTANT_CASE name naming a
# credential, without a digit ("password = ssl_password", "api_key=admin_api_key,"),
# or the keyword's own name ("api_key=api_key,", "password=password)", "token: Token").
_CODE_VALUE = re.compile(
    r"[a-z_][a-z0-9_.]*[(\[]|[A-Za-z_][A-Za-z_]*\(|[A-Za-z_]\w*\.[\w.]*\("  # a call, an item
    r"|(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?P<end>[,;)\]]*)\Z"
    r"|[A-Za-z_]\w*\)"  # the end of a call: "token=token)[0]"
    r"|\{[A-Za-z_]+:"  # a dict: "token = {token_id: ..."
    r"|[A-Z][a-z]+(?:[A-Z][a-z]+)+[,)\]]+:?\Z"  # a type: "token: TokenInterface):"
    r"|(?:[a-z]+_[a-z_]*|[A-Z]+_[A-Z_]*)[,;)\]:]*\Z")
_CREDENTIAL_WORD = re.compile(r"pass|pwd|key|token|secret|auth|cred", re.IGNORECASE)


def _code_value(m: re.Match[str], value: str, env: bool = False) -> bool:
    """Whether an unquoted value after a code link ("=", ":") is code that names or
    computes a credential, not one (`_CODE_VALUE`). In an environment assignment
    (`env`) only a call is: a name or a dotted one there is the value itself
    ("DB_PASSWORD=my_secret_pass", "PASSWORD=admin.pass")."""
    link = (m["le"] or "").strip().lstrip("\"'`").strip()
    if link not in ("=", ":", "=>"):
        return False
    bare = value.rstrip(",;:)]}")
    said = m["kp"] or m["km"] or m["ko"] or ""
    if re.sub(r"[\s_-]", "", bare.lower()) == re.sub(r"[\s_-]", "", said.lower()):
        return True  # the keyword's own name: "api_key=api_key"
    if env and "(" not in value:
        return False
    code = _CODE_VALUE.match(value)
    if code is None:
        return False
    if code["attr"] is not None and not code["end"] and code["attr"].count(".") < 2:
        # ("a.b" alone may be a password, "password: john.smith": an attribute needs
        # code around it, or a deeper path, or a credential's name at its end)
        return _CREDENTIAL_WORD.search(code["attr"].rpartition(".")[2]) is not None
    if "_" in code.group() and "(" not in code.group() and "." not in code.group():
        return _CREDENTIAL_WORD.search(bare) is not None  # (a snake_case name)
    return True


# A password's words run on after "password is" ("the wifi password is blue elephant
# 42", "passphrase: correct horse battery staple") to the clause's end: a punctuation
# mark, a line's end, or a word that starts the rest of the sentence ("... and I forgot
# it", "... please help"). At most `_TAIL_WORDS` more words are taken.
_TAIL_WORDS = 5
_NEXT_WORD = re.compile(r"[ \t]+([^\s\"'`]+)")
_CLAUSE = frozenset("""
and or but so because since for to in on at with from by of if though although which who
whom whose that than then when where while why how what is are was were be been do does
did done can could would should will shall may might must i i'm i've i'd me my mine you
your yours we our us they their them he she him her his it it's its this these those
please pls plz thanks thank thx help ok okay now also still just yet too as after before
until unless whenever wherever not no yes the a an any some all but during into onto over
under via per using across through against about like without within between among upon
""".split())
# What cannot start a passphrase of ordinary words ("the passphrase is never stored").
_NOT_A_PASSPHRASE = frozenset("""
never always not also still only just usually currently automatically securely typically
generally being used required needed optional stored saved hashed encrypted set reset
changed must should can cannot will would needs need has have is was
""".split())


def _phrase_end(text: str, m: re.Match[str]) -> int:
    """Where a phrase's value ends: an unquoted English password goes on over the words
    after it that are not the sentence going on."""
    if m["v"] is None or m["kp"] is None or m["le"] is None or m["v"][-1] in ".,;:!?)":
        return m.end()
    ends = _tail(text, m.end(), passphrase=_is_passphrase(m))
    return ends[-1] if ends else m.end()


def _tail(text: str, end: int, *, passphrase: bool) -> list[int]:
    """The ends of the words after `end` that go on a password (see `_TAIL_WORDS`); a
    passphrase's words may be ones that follow "password is" in talk ("correct")."""
    ends: list[int] = []
    for _ in range(_TAIL_WORDS):
        nxt = _NEXT_WORD.match(text, end)
        if nxt is None:
            break
        word = nxt[1]
        kept = word.rstrip(".,;:!?)")
        bare = kept.lower()  # (ends counted on `kept`: "\u0130" lower-cases as two)
        if (not bare or bare in _CLAUSE or word.endswith(":")  # (a label: "Host:")
                or (passphrase and _PROSE.fullmatch(bare) is not None)
                or (not passphrase and bare in _NOT_A_VALUE)):
            break
        end = nxt.start(1) + len(kept)
        ends.append(end)
        if len(kept) != len(word):  # the clause ends with this word
            break
    return ends


def _is_passphrase(m: re.Match[str]) -> bool:
    return m["kp"] is not None and m["kp"].lower() == "passphrase"


def _unquoted(quoted: str) -> str:
    return quoted[1:-1]


def _matches_at(text: str, starts: list[int]) -> Iterator[re.Match[str]]:
    """The phrase at each start, none inside the one before (as `finditer` reads it: a
    start within a value is part of that value, and reading it again made a text of
    repeated keywords cost a value's length per keyword)."""
    end = 0
    for i in starts:
        if i < end:
            continue
        m = _PHRASE.match(text, i)
        if m is not None:
            end = m.end()
            yield m


# A key split over a break: wrapped over lines (by an editor, a terminal, a chat client:
# "sk-proj-Ab3d...\n9kLm..."), over two messages, or over a message's two parts (which
# the Responses API joins with a line). The word with a format's literal that ends a line
# or a text is read joined with the first word of the next, and of the ones after while
# each is a whole line (a key wrapped over several): a key found across the break is
# redacted in every piece (a long key whose first line alone matched left the rest of
# it beside the placeholder). What goes on after the break must look made up (a digit,
# or mixed case), as a key's characters do: "see sk-learn" then "Documentation" is no
# key.
_WRAP_LINES = 8  # lines after the first that one key may run over
# (or more where they are short, a key split over 4-character values or lines: up to
# this many pieces in all, all of them within `_CHAIN_REACH` of the first's start, so
# that a window reaching back that far still reads every chain into it)
_PIECES_MOST = 24
_WORD_CHARS = 512  # the longest piece of a key one line holds
_FIRST_WORD = re.compile(r"[ \t\r\n]{0,64}(\S{1,512})")
_LINE_END = re.compile(r"[ \t\r]*\n")
_LIST_MARK = re.compile(r"[ \t]{0,64}-[ \t]{1,8}")  # (a YAML list item's, before its word)
_ITEM_WORD = re.compile(r"(\S{1,512})")
_BLANK_REST = re.compile(r"\s*\Z")
_SPACE = re.compile(r"\s")
# A variable's assignment ("NAME=value"; a key's characters hold "=" only as its
# base64 padding, at its end).
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*=[^=]")


def secrets_across(texts: list[str], values: bool = False) -> Iterator[tuple[int, Span]]:
    """Keys split over the end of one text and the start of the next (two messages):
    (text index, span) for each piece. With `values` (a JSON object's or array's string
    values), a value that is a key whole starts none, as pasted JSON's (`_starts_a_split`):
    the value after it is another's. Messages are one text broken anywhere: a key's first
    piece there reads as a key whole wherever the break falls past its format's shortest
    (a 164-character key broken past its 23rd), and its rest is the next message's start."""
    for i in range(len(texts) - 1):
        a = texts[i]
        end = len(a.rstrip())
        start = _word_start(a, end)
        if start == end or not any(n in a[start:end].lower() for n in _NEEDS):
            continue  # (no literal)
        pieces = [(i, start, end)]
        for j in range(i + 1, min(len(texts), i + 1 + _WRAP_LINES)):
            m = _FIRST_WORD.match(texts[j])
            if m is None:
                break
            pieces.append((j, m.start(1), m.end(1)))
            if _BLANK_REST.match(texts[j], m.end(1)) is None:  # the key ends in this text
                break
        if values and (pieces := _may_start(pieces, texts) or []) == []:
            continue  # (a prefix named, or a key whole: the next is another's)
        for found in _joined(pieces, texts):
            yield from found
    yield from _blocks_across(texts)


# A private key block left open at a text's end (its BEGIN line there, no END line after
# it: the text's own reading redacts it to that end) goes on in the texts after it: each
# that is the block's body (base64 lines, a PEM header such as "Proc-Type:") is a piece of
# the key whole, and the one holding its END line is, up to that line. Its lines may be
# indented (YAML, a string literal in code) and broken by a JSON escape, "\\n" (a
# service account's JSON, whose "private_key" holds the block on one line).
_BEGIN_BLOCK = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
_END_BLOCK = re.compile(r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
# (Each run of blanks read by one part of it alone: two parts that could split a run
# between them made a long run of blanks cost its length squared.)
_BLOCK_BODY = re.compile(r"(?:[ \t]*(?:(?:[A-Za-z0-9+/=]{16,}|=[A-Za-z0-9+/]{4})[ \t]*"
                         r"|[A-Za-z-]+: [^\n\\]*)?(?:\n|\\n|\Z))+")


def _blocks_across(texts: list[str]) -> Iterator[tuple[int, Span]]:
    """The pieces of a private key block split over texts (`_BEGIN_BLOCK`)."""
    for i in range(len(texts) - 1):
        if "PRIVATE KEY" not in texts[i]:
            continue
        begins = list(_BEGIN_BLOCK.finditer(texts[i]))
        if not begins or _END_BLOCK.search(texts[i], begins[-1].end()) is not None:
            continue
        for j in range(i + 1, min(len(texts), i + 1 + _WRAP_LINES)):
            end = _END_BLOCK.search(texts[j])
            body = _BLOCK_BODY.match(texts[j])
            if end is not None and body is not None and not texts[j][
                    body.end():end.start()].strip(" \t"):  # (its END line, indented too)
                yield j, (0, end.end())
                break
            if body is None or body.end() < len(texts[j]) or not texts[j].strip():
                break  # (what follows the open block is no key)
            yield j, (0, len(texts[j]))


def _wrapped(text: str, needs_at: list[int]) -> Iterator[Span]:
    """Keys wrapped over lines of `text`, from the words holding a format's literal
    (`needs_at`) that end a line."""
    done = 0
    for at in needs_at:
        if at < done or (pieces := _wrap_pieces(text, at)) is None:
            continue
        done = pieces[-1][2]
        for found in _joined(pieces, [text]):
            yield found[0][1][0], found[-1][1][1]


def _wrap_pieces(text: str, at: int) -> list[tuple[int, int, int]] | None:
    """The pieces (0, start, end) a key wrapped over lines from the word holding a
    format's literal at `at` may run over: that word, where it ends its line, then each
    line's first word (`_WRAP_LINES` at most); None where the word ends no line."""
    space = _SPACE.search(text, at, at + _WORD_CHARS)
    if space is None or (brk := _LINE_END.match(text, space.start())) is None:
        return None
    start = _word_start(text, space.start())
    pieces = [(0, start, space.start())]
    pos = brk.end()
    # (a YAML list's items, "  - piece" on each line: the item's word, where the next
    # line is an item of the same list, its marker and indentation the same)
    mark = _LIST_MARK.fullmatch(text, text.rfind("\n", 0, start) + 1, start)
    item = None if mark is None or not text.startswith(mark[0], pos) else mark[0]
    for k in range(_PIECES_MOST - 1):
        if item is not None:
            if not text.startswith(item, pos) or (m := _ITEM_WORD.match(
                    text, pos + len(item))) is None:
                break
        elif (m := _FIRST_WORD.match(text, pos)) is None or "\n" in text[pos:m.start(1)]:
            break  # (a blank line ends it)
        if (k >= _WRAP_LINES or item is not None) and _NEED_AT.match(
                text[m.start(1):m.start(1) + _NEED_MOST].lower()):
            break  # (an item, or a line past `_WRAP_LINES`, starting with a format's
            # literal starts another key, as a value does: a chain read over it hid the
            # key wrapped from there, `_wrapped`'s `done`)
        if k >= _WRAP_LINES and m.end(1) - start > _CHAIN_REACH:
            break  # (past `_WRAP_LINES`, short pieces only: `_PIECES_MOST`)
        pieces.append((0, m.start(1), m.end(1)))
        brk = _LINE_END.match(text, m.end(1))
        if brk is None:  # the key ends on this line
            break
        pos = brk.end()
    # (as a value's: a prefix named, "- sk-learn", or a key whole starts none)
    return pieces if item is None else _may_start(pieces, [text])


# A key split over two string values of JSON (or a Python dict) pasted as text, not read
# as a document ('{"a": "sk-proj-Ab3d...", "b": "...4zQ7"}', a document's values are read
# one after another where a request's structure carries it, `secrets_across`): the value
# holding a format's literal, closed, then "," and the next value (after its key, in an
# object), or the next string literal it is concatenated with in code ('"sk-proj-Ab3d"'
# then, on the next line, '"...4zQ7"' in Python, or after "+" in JavaScript) are read
# joined, and on over the values after while each is one word whole,
# as the lines of a wrapped key are (`_joined`: a key found across the break, what goes
# on after it made up). The first value must hold a made-up piece of the key after its
# literal ('"sk-proj-"' or '"sk-"', then an id or a UUID, is a prefix named beside it,
# not a key's first half), and not be a key whole ('{"openai": "sk-proj-...",
# "org": "org-Ab3d..."}': the value after is another; a key whose first half alone reads
# as one has that half redacted, and is no key). A value that starts with a format's
# literal starts another key (or a key's hint: '"sk-proj-1a2B", "sk-proj-1a2B...xY9z"'):
# the values end before it.
_VALUE_WORD = re.compile(r"[^\s\"'`\\]{1,512}")
_NEXT_VALUE = re.compile(r"\\?[\"'`][ \t]{0,64}(?:,[ \t\r\n]{0,64}"
                         r"(?:\\?[\"'][^\"'\\\n]{0,128}\\?[\"'][ \t]{0,64}:[ \t]{0,64})?"
                         r"|\+[ \t\r\n]{0,64}|\r?\n[ \t]{0,64}(?:\+[ \t]{0,64})?)\\?[\"'`]")
_KEY_SEPARATORS = re.compile(r".*[-_.]")


def _split_values(text: str, needs_at: list[int]) -> Iterator[Span]:
    """Keys split over string values one after another of JSON pasted as text (from the
    words holding a format's literal, `needs_at`)."""
    done = 0
    for at in needs_at:
        if at < done:
            continue
        if (pieces := _value_pieces(text, at)) is None or len(pieces) < 2:
            continue
        if (pieces := _may_start(pieces, [text]) or []) == []:
            continue  # (a prefix, or a key whole: the value after it is another's)
        done = pieces[-1][2]
        for found in _joined(pieces, [text]):
            for _, span in found:
                yield span


def _value_pieces(text: str, at: int) -> list[tuple[int, int, int]] | None:
    """The pieces (0, start, end) a key split over string values from the one holding a
    format's literal at `at` may run over: that value, where another follows it, then
    each one word whole after it (`_WRAP_LINES` at most); None where none follows."""
    first = _VALUE_WORD.match(text, at)
    if first is None or (sep := _NEXT_VALUE.match(text, first.end())) is None:
        return None
    # (the word from its opening quote, where one is nearer than a blank: that quote
    # found first, not every character of a run of values with no blank walked back)
    lo = max(text.rfind(q, max(0, at - _WORD_CHARS), at) for q in "\"'`") + 1
    start = _word_start(text, at, lo)
    pieces = [(0, start, first.end())]
    for k in range(_PIECES_MOST - 1):
        m = _VALUE_WORD.match(text, sep.end())
        if m is None or _NEED_AT.match(text[m.start():m.start() + _NEED_MOST].lower()):
            break  # (a value starting with a format's literal is another key's, or a hint)
        if k >= _WRAP_LINES and m.end() - start > _CHAIN_REACH:
            break
        pieces.append((0, m.start(), m.end()))
        if (sep := _NEXT_VALUE.match(text, m.end())) is None:
            break
    return pieces


# A key split over the cells of CSV ("prod,sk-proj-Ab3d...,...4zQ7" along a row, or down
# a column: "prod,sk-proj-Ab3d..." then "prod,...4zQ7" on the next line): the cell holding
# a format's literal, a word whole, is read joined with the cells after it along its row
# while each is a word whole, else with the same column's cells of the lines after it,
# with the guards of JSON values (`_starts_a_split`, `_tail_of_a_key`, `_joined`).
_CELL_WORD = re.compile(r"[^\s,\"'`\\;]{1,512}")
_CELL_END = re.compile(r",|[ \t]*(?:\r?\n|\Z)")
_CELLS_MOST = 64  # (the widest row whose column is read down)
_ROW_CHARS = 4096  # (and the longest rest of a row skipped to the next)


def _split_cells(text: str, needs_at: list[int]) -> Iterator[Span]:
    """Keys split over cells of CSV (from the words holding a format's literal,
    `needs_at`)."""
    done = 0
    for at in needs_at:
        if at < done or (pieces := _cell_pieces(text, at)) is None or len(pieces) < 2:
            continue
        if (pieces := _may_start(pieces, [text]) or []) == [] or not _mixes_case(
                "".join(text[a:b] for _, a, b in pieces)):
            continue  # (a prefix, or a key whole: the cell after it is another's; an SKU)
        done = pieces[-1][2]
        for found in _joined(pieces, [text]):
            for _, span in found:
                yield span


def _mixes_case(joined: str) -> bool:
    """A key split over cells from a literal of `_WHOLE_LENGTHS` has a body of both cases
    (base62 or base64url, 20 characters or more); an SKU and a serial in cells after it
    ("sk-A1B2C3,9F8E7D6C5B4A3210", or "sk-a1b2c3,9f8e...") have one."""
    lit = next((p for p, _ in _WHOLE_LENGTHS if joined.startswith(p)), None)
    body = joined if lit is None else joined[len(lit):]
    return lit is None or (body.lower() != body and body.upper() != body)


def _cell(text: str, pos: int) -> tuple[int, int] | None:
    """The cell at `pos` where it is one word whole (its end at "," or a line's)."""
    m = _CELL_WORD.match(text, pos)
    if m is None or _CELL_END.match(text, m.end()) is None:
        return None
    return m.start(), m.end()


def _cell_pieces(text: str, at: int) -> list[tuple[int, int, int]] | None:
    """The pieces (0, start, end) a key split over CSV cells from the one holding a
    format's literal at `at` may run over: that cell, then the cells after it in its row
    or, where it is followed by none that goes on, in its column (`_WRAP_LINES` more at
    most); None where the cell is no word whole on a line that holds a comma."""
    lo = max(0, at - _WORD_CHARS)
    line = text.rfind("\n", lo, at) + 1 or lo  # (or a line too long to count its cells)
    start = max(line, text.rfind(",", line, at) + 1)
    if _CELL_WORD.fullmatch(text, start, at + 1) is None or (text[at - 1:at].isalnum() and (
            at > start)) or (first := _cell(text, at)) is None:  # (a literal mid-word: no
        # key's start, "...3210sk-D4E5F6" where lines are read joined, `_wrapped`)
        return None
    head = text[start:first[1]]
    cut = _KEY_SEPARATORS.match(head)
    if (len(made := head[cut.end() if cut else 0:]) < 4 or not _random_looking(made)) and not any(
            3 < len(head) < len(lit) and lit.startswith(head) for lit in _SPLIT_LITERALS
    ) and not _ends_a_key(head):
        return None  # (a word or a prefix named: "sk-learn", "sk-proj-", "sk-" then "2";
        # not a literal's part, `_splits_a_literal`)
    pieces = [(0, start, first[1])]
    pos = first[1]
    while len(pieces) <= _WRAP_LINES and text.startswith(",", pos):  # (along its row)
        if (cell := _cell(text, pos + 1)) is None or _NEED_AT.search(
                text[cell[0]:cell[1]].lower()) or (
                len(pieces) == 1 and not _random_looking(text[cell[0]:cell[1]])):
            break  # (another key's cell, or a word: the key may go on down its column)
        pieces.append((0, *cell))
        pos = cell[1]
    if len(pieces) > 1:
        return pieces
    column = text.count(",", line, start) if line == 0 or text[line - 1] == "\n" else _CELLS_MOST
    if (column == 0 and not text.startswith(",", first[1])) or column >= _CELLS_MOST:
        return None  # (no comma on its line: no CSV, the lines read as lines, `_wrapped`)
    for _ in range(_WRAP_LINES):  # (down its column)
        if (end := text.find("\n", pos, pos + _ROW_CHARS)) < 0:
            break  # (the rest of its row skipped: a cell holds no line's end)
        pos = end + 1
        for _ in range(column):
            comma = text.find(",", pos, pos + _WORD_CHARS)
            if comma < 0 or text.find("\n", pos, comma) >= 0:
                return pieces
            pos = comma + 1
        if (cell := _cell(text, pos)) is None or _NEED_AT.search(
                text[cell[0]:cell[1]].lower()):
            break  # (a cell holding a literal: another key's, "...3210sk-D4E5F6")
        pieces.append((0, *cell))
        pos = cell[1]
    return pieces


def _may_start(pieces: list[tuple[int, int, int]], texts: list[str],
               ) -> list[tuple[int, int, int]] | None:
    """The pieces a key split over values (list items, cells) may run over from the
    first: all where it starts a split (`_starts_a_split`) or splits a format's literal
    (`_splits_a_literal`), the tail where it is a key whole (`_tail_of_a_key`); None
    where it starts none (a prefix named, a word)."""
    i, a, b = pieces[0]
    head = texts[i][a:b]
    if _starts_a_split(head):
        return pieces
    if _ends_a_key(head):
        return _tail_of_a_key(pieces, texts)
    if len(pieces) > 1 and _splits_a_literal(head, texts[pieces[1][0]][pieces[1][1]:pieces[1][2]]):
        return pieces
    return _whole_from_a_literal(pieces, texts)


# A key split inside its literal ('"sk-p", "roj-Ab3d..."'): the first value a part of a
# longer literal past "sk-", the next its rest and a key's body, no UUID or hash ("sk-proj-"
# then an id is a prefix named beside it, and a split there reads as one).
_SPLIT_LITERALS = ("sk-proj-", "sk-live-", "sk-test-", "sk-ant-")
_HEX = re.compile(r"[0-9a-fA-F-]*")


def _splits_a_literal(head: str, nxt: str) -> bool:
    """`head` ends with a part of a format's literal (`_SPLIT_LITERALS`) past "sk-" that
    `nxt` completes, then a key's body."""
    for lit in _SPLIT_LITERALS:
        cut = head.rfind(lit[:4])
        part = head[cut:] if cut >= 0 else ""
        if 3 < len(part) < len(lit) and lit.startswith(part) and nxt.startswith(
                lit[len(part):]):
            body = nxt[len(lit) - len(part):]
            return (_HEX.fullmatch(body) is None and _UUID.match(body) is None
                    and _key_body("sk-" + body))
    return False


def _starts_a_split(head: str) -> bool:
    """`head` (the first of a key's values, or list items) may start a key split over
    them: a made-up piece after its literal ('"sk-proj-"' then an id is a prefix named
    beside it), and no key whole (`_ends_a_key`)."""
    cut = _KEY_SEPARATORS.match(head)
    return _random_looking(head[cut.end() if cut else 0:]) and not _ends_a_key(head)


def _ends_a_key(head: str) -> bool:
    """`head` (a key's first piece: a value, a text's last word) ends with a key whole:
    the piece after it is another's ('"sk-proj-...", "org-..."'), not this key's rest."""
    return any(b == len(head) for _, b in _find(head))


# A long key split over values (or list items) whose first piece is a key whole by
# itself ('"sk-proj-<92>", "<64>"': the format reads 20 characters on as a key) left its
# tail sent on: the guard above reads the next value as another's. Its tail is read
# joined where the pieces after it make the key exactly its format's documented length,
# each a run of the key's characters, together no name ("gpt-4o-mini", "org-main"): an
# organization's id or a word after a key whole does not make it that length by chance.
_WHOLE_LENGTHS: tuple[tuple[str, tuple[int, ...]], ...] = (
    # (OpenAI's project, service-account and admin keys: 58 or 74 characters each side
    # of "T3BlbkFJ"; the longer literals first, "sk-" the legacy key's last)
    ("sk-proj-", (132, 164)), ("sk-svcacct-", (135, 167)), ("sk-admin-", (133, 165)),
    ("sk-ant-api03-", (108,)), ("sk-ant-admin01-", (110,)), ("github_pat_", (93,)),
    ("ghp_", (40,)), ("gho_", (40,)), ("ghu_", (40,)), ("ghs_", (40,)), ("ghr_", (40,)),
    ("hf_", (37,)), ("gsk_", (56,)), ("glpat-", (26,)), ("xai-", (84,)), ("pplx-", (53,)),
    ("sk-", (51,)))
_WHOLE_MOST = max(n for _, lengths in _WHOLE_LENGTHS for n in lengths)
_TAIL_PIECE = re.compile(r"[A-Za-z0-9_-]{1,512}")


def _tail_of_a_key(pieces: list[tuple[int, int, int]], texts: list[str],
                   ) -> list[tuple[int, int, int]] | None:
    """The pieces a key whole in the first of `pieces` runs on over to its format's
    documented length (`_WHOLE_LENGTHS`), or None where they do not make it that."""
    i, a, b = pieces[0]
    head = texts[i][a:b]
    key = max(((s, e) for s, e in _find(head) if e == len(head)), default=None)
    if key is None:
        return None
    word = head[key[0]:]
    lengths = next((n for p, n in _WHOLE_LENGTHS if word.startswith(p)), ())
    have, upto = len(word), 0
    for k in range(1, len(pieces)):  # (the longest of its lengths the pieces make)
        j, s, e = pieces[k]
        if _TAIL_PIECE.fullmatch(texts[j], s, e) is None:
            break
        have += e - s
        if have in lengths:
            upto = k
        if have >= max(lengths, default=0):
            break
    if upto:
        tail = "".join(texts[j][s:e] for j, s, e in pieces[1:upto + 1])
        if (not _random_looking(tail) or _NAME_AND_NUMBER.fullmatch(tail) is not None
                or (len(tail) >= 16 and len(set(tail)) < _KEY_RUN_DISTINCT)):
            return None  # (a name, a word, or a run of one character or a few)
        return pieces[:upto + 1]
    return None


def _whole_from_a_literal(pieces: list[tuple[int, int, int]], texts: list[str],
                          ) -> list[tuple[int, int, int]] | None:
    """The pieces from a first that starts with a format's literal and is too short to
    read as a key's start ('"ghp_"', '"sk-ant-"', '"sk-proj-Ab3dEf_g"') where together
    they make a key exactly its documented length (`_WHOLE_LENGTHS`) and its body is no
    UUID, hash or name: a prefix named beside an id does not make that length by chance."""
    if len(pieces) < 2:
        return None
    words = []
    for j, s, e in pieces:
        if _TAIL_PIECE.fullmatch(texts[j], s, e) is None:
            break
        words.append(texts[j][s:e])
    joined, upto = words[0] if words else "", 0
    for k in range(1, len(words)):
        joined += words[k]
        lengths = next((n for p, n in _WHOLE_LENGTHS if joined.startswith(p)), ())
        if len(joined) in lengths:
            upto = k
        if len(joined) >= _WHOLE_MOST:
            break
    if not upto:
        return None
    joined = "".join(words[:upto + 1])
    body = joined[next(len(p) for p, _ in _WHOLE_LENGTHS if joined.startswith(p)):]
    if (_HEX.fullmatch(body) is not None or _UUID.search(body) is not None
            or body.lower() == body or body.upper() == body  # (a key's body mixes case)
            or _NAME_AND_NUMBER.fullmatch(body) is not None
            or len(set(body)) < _KEY_RUN_DISTINCT):
        return None  # (an id, a hash or a name after a prefix named)
    return pieces[:upto + 1]


def _word_start(text: str, end: int, floor: int = 0) -> int:
    """Where the word that ends at `end` starts (at most `_WORD_CHARS` back, and not
    before `floor`)."""
    start, lo = end, max(floor, end - _WORD_CHARS)
    while start > lo and not text[start - 1].isspace():
        start -= 1
    return start


def _joined(pieces: list[tuple[int, int, int]], texts: list[str],
            ) -> Iterator[list[tuple[int, Span]]]:
    """Keys in the pieces (text index, start, end) read joined that start in the first
    and reach into the second: each as (text index, span) for every piece it covers.
    A piece after the break that ends in ":" is a label or a mapping's key ("secret:"
    then "  secretName: tls-cert" in a Kubernetes manifest), and one that is an
    assignment ("SKIP_AUTH=yes" then "NAME=app" in a .env file) is the next variable,
    no piece of a key: the pieces end before it."""
    for k in range(1, len(pieces)):
        i, a, b = pieces[k]
        if texts[i][b - 1] == ":" or _ASSIGNMENT.match(texts[i], a, b) is not None:
            pieces = pieces[:k]
            break
    if len(pieces) < 2:
        return
    words = [texts[i][a:b] for i, a, b in pieces]
    joined = "".join(words)
    first = len(words[0])
    for a, b in find_secrets(joined):
        if not a < first < b or not _random_looking(joined[first:min(b, first + len(words[1]))]):
            continue
        out: list[tuple[int, Span]] = []
        at = 0
        for (i, s, _), word in zip(pieces, words, strict=True):
            lo, hi = max(a, at), min(b, at + len(word))
            if lo < hi:
                out.append((i, (s + lo - at, s + hi - at)))
            at += len(word)
        yield out


def _random_looking(piece: str) -> bool:
    """A key's characters rather than a word: a digit, or mixed case ("Documentation"
    and "README" are words)."""
    return (any(c.isdigit() for c in piece)
            or (piece != piece.lower() and piece != piece.upper()
                and piece != piece.capitalize()))


# The formats each word the scan reports may start (a word stands for every literal it
# begins).
_FORMATS_FROM: dict[str, list[int]] = {
    w: [k for k, (needs, _) in enumerate(_FORMATS) if any(n.startswith(w) for n in needs)]
    for w in _WORDS}
# What the look-alike reading looks for in the words that mix (`_worth_reading`): the
# scan's words, a variable's ending, the words before a UUID or in a query; by the letters
# each holds, so that only those a look-alike present reads as are looked for (Turkish and
# Danish prose holds only the dotless i and the o-slash).
_LOOKED_FOR = sorted(_WORDS | {*_ENV_ENDINGS, *_UUID_WORDS, *_QUERY_WORDS})
_LOOKED_FOR_BY_LETTER: dict[str, list[str]] = {
    c: [w for w in _LOOKED_FOR if c in w] for c in {v.lower() for v in SHAPES.values()}}
_WORDS_ANYWHERE = frozenset({*_ENV_ENDINGS, *_UUID_WORDS, *_QUERY_WORDS})
_ANYWHERE = _WORDS_ANYWHERE | _MAYBE_NEED  # (the others count where a word starts)
# Each word's shortest other word inside it ("key" in "_key", "pass" in "password"): the
# text not holding it holds neither.
_ROOT_OF = {w: min((r for r in {*_LOOKED_FOR, *_WORDS_ANYWHERE} if r in w), key=len)
            for w in {*_LOOKED_FOR, *_WORDS_ANYWHERE}}
_AT_WORD_START = {w: re.compile(rf"{re.escape(w)}(?<![a-z]{re.escape(w)})")
                  for w in _LOOKED_FOR if w not in _ANYWHERE}
_READ_AROUND = _WORDS_ANYWHERE | {w for w, formats in _FORMATS_FROM.items() if formats} | {""}
