"""Sanitizer config: limits, normalization, and an action per detector."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from proxy.chain import PluginConfig
from proxy.config_model import ConfigModel
from proxy.protocol import MAX_N, MAX_STOP_CHARS, MAX_STOPS

Action = Literal["off", "flag", "redact", "block"]
#: The sanitizer's limits that the request parser bounds too: (its bound, what it counts).
_PARSER_BOUNDS = {"max_n": (MAX_N, "choices (`n`)"),
                  "max_stop": (MAX_STOPS, "stop sequences"),
                  "max_stop_chars": (MAX_STOP_CHARS, "characters in a stop sequence")}


class Limits(ConfigModel):
    max_messages: int = Field(256, ge=1, description="Messages per chat request.")
    max_message_chars: int = Field(65_536, ge=1, description="Characters in one message.")
    max_total_chars: int = Field(262_144, ge=1, description=(
        "Characters in all messages (a completion's prompts and suffix), with the "
        "fields sent beside them, the tool definitions, a response format's "
        "schema and the texts a Response keeps beside its input (reasoning items, "
        "metadata, user) where a detector redacts or blocks: the detectors read them "
        "all."))
    max_tokens: int = Field(8192, ge=1, description="Ceiling for max_tokens.")
    max_n: int = Field(8, ge=1, json_schema_extra={"maximum": MAX_N}, description=(
        f"Ceiling for n ({MAX_N} at most: the request parser refuses more)."))
    max_stop: int = Field(4, ge=0, json_schema_extra={"maximum": MAX_STOPS}, description=(
        f"Stop sequences at most ({MAX_STOPS} at most: OpenAI's bound, which the request "
        "parser enforces)."))
    max_stop_chars: int = Field(64, ge=1, json_schema_extra={"maximum": MAX_STOP_CHARS},
                                description=(
        f"Characters per stop sequence ({MAX_STOP_CHARS} at most: the request parser "
        "refuses longer ones)."))

    @field_validator("max_n", "max_stop", "max_stop_chars")
    @classmethod
    def _within_the_parser_s(cls, v: int, info: ValidationInfo) -> int:
        """A limit above the request parser's own bound would never be reached (the parser
        refuses first, with its own message): refused here, rather than left a silent
        no-op or quietly lowered, so the config says what the server enforces."""
        bound, what = _PARSER_BOUNDS[info.field_name or ""]
        if v > bound:
            raise ValueError(f"may be at most {bound}: the request parser refuses more "
                             f"than {bound} {what} before the sanitizer reads them, so a "
                             "higher limit would never apply")
        return v

    @model_validator(mode="before")
    @classmethod
    def _body_limit_moved(cls, v: Any) -> Any:
        if isinstance(v, dict) and "max_body_bytes" in v:
            raise ValueError("`max_body_bytes` moved to `server.max_body_bytes`, the one "
                             "body-size limit (bodies are refused there, before parsing)")
        return v


class CustomDetector(ConfigModel):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$", description="Name in metrics.")
    pattern: str = Field(description="Python regular expression.")
    action: Action = Field("flag", description="What to do on a match.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            compiled = re.compile(v)
        except re.error as e:
            raise ValueError(f"not a valid regular expression: {e}") from None
        if compiled.fullmatch(""):  # `a*`: a match at every position of every prompt
            raise ValueError("matches the empty string, so every request would match; "
                             "make it need at least one character (`a+`, not `a*`)")
        return v


class Detectors(ConfigModel):
    email: Action = Field("flag", description=(
        "E-mail addresses in any script, also spelled or spaced out (name at domain dot "
        "com, name [at] domain.com, name @ domain . com)."))
    phone: Action = Field("flag", description=(
        "International (+... or 00...) and NANP numbers, any separators; ten digits "
        "unseparated where the text says they are a number to call."))
    cn_mobile: Action = Field("flag", description="Mainland-China mobile numbers.")
    card: Action = Field("flag", description=(
        "Payment card numbers (Luhn-checked), also split over two messages or two lines."))
    cn_id: Action = Field("flag", description="Chinese resident ids (checksum, birth date).")
    iban: Action = Field("flag", description=(
        "IBANs (mod 97), in either case, grouped by spaces or dashes."))
    ip: Action = Field("flag", description=(
        "IPv4 and IPv6 addresses that name a host (not loopback, unspecified, link-local "
        "or a netmask; not a version number: 'version 1.2.3.4', 'torch==2.1.0.1')."))
    ssn: Action = Field("flag", description=(
        "US Social Security numbers: 3-2-4 digits in the ranges the SSA assigns; nine "
        "bare digits where the text names one ('SSN: 123456789')."))
    uk_nino: Action = Field("flag", description=(
        "UK National Insurance numbers: letters HMRC allocates, six digits, a suffix A-D; "
        "in pairs ('AB 12 34 56 C'), or bare where the text names one ('NINO AB123456C')."))
    secret: Action = Field("flag", description=(
        "API keys (OpenAI, GitHub, GitLab, Hugging Face, Stripe, Google, Slack, AWS, npm, "
        "PyPI, SendGrid, Shopify, DigitalOcean, Azure storage and Service Bus keys, SAS "
        "and S3 presigned signatures, Google OAuth, Docker Hub, Groq, Replicate, xAI, "
        "Atlassian, Telegram, Slack webhooks; not Stripe's publishable pk_ keys, which are "
        "public), also wrapped over lines, split over two messages or base64-encoded, "
        "bearer and basic "
        "credentials, passwords "
        "in URLs and curl -u, JWTs and JWEs, private keys (PGP, PuTTY), and 'my password is ...' / "
        "'api key: ...' / 'DB_PASSWORD=...' phrases in 15 languages (code that reads a "
        "secret from elsewhere, '$PASSWORD', 'os.getenv(...)', does not fire); also written "
        "with look-alike letters of other scripts, URL-, JSON- or HTML-escaped (\\u002d, &#45;), "
        "those disguises stacked, in a URL's query string, "
        "and UUID-shaped keys after a key's name ('api key: <uuid>')."))
    injection: Action = Field("flag", description=(
        "Prompt-injection phrases (en, zh, fr, de, es; look-alike letters folded)."))


class SanitizerConfig(PluginConfig):
    limits: Limits = Field(default_factory=Limits)
    normalize: bool = Field(True, description="NFKC, strip controls/zero-width/bidi.")
    engine_sees: Literal["normalized", "original"] = Field(
        "normalized", description="Text the engine gets: normalized folds look-alikes and "
        "drops invisible characters, keeping the layout (the cache always keys on "
        "normalized).")
    detectors: Detectors = Field(default_factory=Detectors)
    custom: list[CustomDetector] = Field(default_factory=list, description="Extra regexes.")
    block_message: str = Field(
        "The request was rejected by the content policy.",
        description="Message of a blocked request (vague on purpose).")

    @field_validator("custom")
    @classmethod
    def _names_of_their_own(cls, v: list[CustomDetector]) -> list[CustomDetector]:
        """A custom detector's name is its metric label: one a built-in detector (or
        another custom one) has would count two detectors as one."""
        taken = set(Detectors.model_fields)
        for d in v:
            if d.name in taken:
                raise ValueError(f"the name `{d.name}` is taken (by a built-in detector or "
                                 "another custom one): name it apart")
            taken.add(d.name)
        return v
