"""The guard's check on the units a question names: billing periods, data sizes,
measures and currencies.

"How much is the monthly plan?" / "What does the yearly plan cost?", "Can I upload a 5
GB file?" / "Is it possible to upload a 5 MB file?", "a refund in euros" / "my refund
in dollars": one word apart, the frame reworded round it, and an embedding scores them
alike. Where both questions name units, they must name the same ones in the same order
(synonyms read alike: "yearly", "annual", "per year"; "GB", "gigabytes"; "$", "USD",
"dollars").
"""

from __future__ import annotations

import re

_CANON = {
    **dict.fromkeys(("hourly", "hour", "hours", "hr", "hrs"), "hour"),
    **dict.fromkeys(("daily", "day", "days"), "day"),
    **dict.fromkeys(("weekly", "week", "weeks"), "week"),
    **dict.fromkeys(("biweekly", "fortnightly", "fortnight", "fortnights"), "fortnight"),
    **dict.fromkeys(("monthly", "month", "months"), "month"),
    **dict.fromkeys(("quarterly", "quarter", "quarters"), "quarter"),
    **dict.fromkeys(("yearly", "annual", "annually", "year", "years", "annum"), "year"),
    # (not "second", "sec", "min": an ordinal, a minimum)
    **dict.fromkeys(("minute", "minutes", "mins"), "minute"),
    **dict.fromkeys(("seconds", "secs"), "second"),
    **dict.fromkeys(("kb", "kilobyte", "kilobytes"), "kb"),
    **dict.fromkeys(("mb", "megabyte", "megabytes"), "mb"),
    **dict.fromkeys(("gb", "gigabyte", "gigabytes", "gig", "gigs"), "gb"),
    **dict.fromkeys(("tb", "terabyte", "terabytes"), "tb"),
    **dict.fromkeys(("kbps",), "kbps"), **dict.fromkeys(("mbps",), "mbps"),
    **dict.fromkeys(("gbps",), "gbps"),
    **dict.fromkeys(("mhz",), "mhz"), **dict.fromkeys(("ghz",), "ghz"),
    **dict.fromkeys(("kg", "kgs", "kilo", "kilos", "kilogram", "kilograms"), "kg"),
    **dict.fromkeys(("lb", "lbs"), "pound"),
    **dict.fromkeys(("mm", "millimeter", "millimeters", "millimetre", "millimetres"), "mm"),
    **dict.fromkeys(("cm", "centimeter", "centimeters", "centimetre", "centimetres"), "cm"),
    **dict.fromkeys(("meter", "meters", "metre", "metres"), "meter"),
    **dict.fromkeys(("km", "kilometer", "kilometers", "kilometre", "kilometres"), "km"),
    **dict.fromkeys(("inch", "inches"), "inch"),
    **dict.fromkeys(("foot", "feet", "ft"), "foot"),
    **dict.fromkeys(("mile", "miles"), "mile"),
    **dict.fromkeys(("percent", "percentage", "%"), "percent"),
    **dict.fromkeys(("dollar", "dollars", "usd", "$", "bucks"), "dollar"),
    **dict.fromkeys(("euro", "euros", "eur", "\u20ac"), "euro"),
    **dict.fromkeys(("pound", "pounds", "gbp", "\u00a3", "quid", "sterling"), "pound"),
    **dict.fromkeys(("yen", "jpy", "\u00a5"), "yen"),
    **dict.fromkeys(("rupee", "rupees", "inr", "\u20b9"), "rupee"),
    **dict.fromkeys(("cent", "cents"), "cent"),
    # (not "won", "real": "won't", "a real person")
    **{c: c for c in ("cad", "aud", "chf", "cny", "yuan", "peso", "pesos", "franc",
                      "francs", "krona", "kronor", "reais", "bitcoin", "btc")},
}
_UNIT = re.compile(r"[$\u20ac\u00a3\u00a5\u20b9%]|\b(?:" + "|".join(
    sorted((re.escape(w) for w in _CANON if w.isalpha()), key=len, reverse=True)) + r")\b")
# Where no unit can be (most questions): no search.
_HINT = re.compile(
    r"[$\u20ac\u00a3\u00a5\u20b9%]|\d|\b(?:hour|hr|day|daily|week|fortnight|month|quarter|"
    r"year|annu|min|sec|kb|mb|gb|tb|gig|kbps|mbps|gbps|hz|kg|kilo|lb|mm|cm|met|km|inch|foot|"
    r"feet|ft|mile|percent|dollar|usd|buck|euro|eur|pound|gbp|quid|sterling|yen|jpy|rupee|"
    r"inr|cent|cad|aud|chf|cny|yuan|peso|franc|krona|kronor|reais|bitcoin|btc)")


def units(lowered: str) -> tuple[str, ...]:
    """The units named, in order, synonyms as one ("monthly", "per month", "a month",
    "months" are "month")."""
    if not _HINT.search(lowered):
        return ()
    return tuple(_CANON[m.group(0)] for m in _UNIT.finditer(lowered))


def units_differ(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Both name units, and not the same ones in the same order."""
    return bool(a and b and a != b)
