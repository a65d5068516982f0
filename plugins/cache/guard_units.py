"""The guard's check on the units a question names: billing periods, data sizes,
measures (weights, volumes, temperatures: none of them a currency) and currencies.

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
    # weights and volumes: "lb" is no pound sterling ("5 lb of flour" / "£5 of flour")
    **dict.fromkeys(("lb", "lbs"), "lb"),
    **dict.fromkeys(("oz", "ounce", "ounces"), "oz"),
    **dict.fromkeys(("gram", "grams", "gramme", "grammes"), "gram"),
    **dict.fromkeys(("ton", "tons", "tonne", "tonnes"), "ton"),
    **dict.fromkeys(("ml", "milliliter", "milliliters", "millilitre", "millilitres"), "ml"),
    **dict.fromkeys(("liter", "liters", "litre", "litres"), "liter"),
    **dict.fromkeys(("gallon", "gallons"), "gallon"),
    **dict.fromkeys(("pint", "pints"), "pint"),
    **dict.fromkeys(("celsius", "centigrade"), "celsius"),
    **dict.fromkeys(("fahrenheit",), "fahrenheit"),
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
    # ("pound" alone: sterling, or a weight where `_WEIGHED` says so)
    **dict.fromkeys(("pound", "pounds", "gbp", "\u00a3", "quid", "sterling"), "gbp"),
    **dict.fromkeys(("yen", "jpy", "\u00a5"), "yen"),
    **dict.fromkeys(("rupee", "rupees", "inr", "\u20b9"), "rupee"),
    **dict.fromkeys(("cent", "cents"), "cent"),
    # (not "won", "real": "won't", "a real person")
    **{c: c for c in ("cad", "aud", "chf", "cny", "yuan", "peso", "pesos", "franc",
                      "francs", "krona", "kronor", "reais", "bitcoin", "btc")},
}
#: A currency's code ("USD", "EUR"), its word where it has one: a unit, no name; and
#: "US dollars", which are dollars (guard._tokens reads them so, guard.signature skips
#: them among the names).
CURRENCY_CODES = {"usd": "dollars", "eur": "euros", "gbp": "pounds", "jpy": "yen",
                  "inr": "rupees", "cad": "cad", "aud": "aud", "chf": "chf", "cny": "cny",
                  "btc": "btc"}
CURRENCY_CODE = re.compile(r"\b(?:usd|eur|gbp|jpy|inr)\b|\bu\.?s\.?\s+(?=dollars?\b)")
_UNIT = re.compile(r"[$\u20ac\u00a3\u00a5\u20b9%]|\b(?:" + "|".join(
    sorted((re.escape(w) for w in _CANON if w.isalpha()), key=len, reverse=True)) + r")\b")
#: `_UNIT`'s words, each whole: a question holding none of them, no sign and no digit
#: names no unit (guard.signature looks no further).
UNIT_WORDS = frozenset(w for w in _CANON if w.isalpha())
# Where no unit can be (most questions): no search.
_HINT = re.compile(
    r"[$\u20ac\u00a3\u00a5\u20b9%]|\d|\b(?:hour|hr|day|daily|week|fortnight|month|quarter|"
    r"year|annu|min|sec|kb|mb|gb|tb|gig|kbps|mbps|gbps|hz|kg|kilo|lb|mm|cm|met|km|inch|foot|"
    r"feet|ft|mile|percent|dollar|usd|buck|euro|eur|pound|gbp|quid|sterling|yen|jpy|rupee|"
    r"inr|cent|cad|aud|chf|cny|yuan|peso|franc|krona|kronor|reais|bitcoin|btc|oz|ounce|"
    r"gram|ton|ml|lit|gallon|pint|celsius|centigrade|fahrenheit)")
# "pounds" is a weight when what follows or the question says so ("5 pounds of flour",
# "does it weigh 3 pounds"), sterling otherwise ("is it 10 pounds?").
_POUNDS_OF = re.compile(r"\bpounds?\s+(?:of|in\s+weight|heavy)\b")
_WEIGHED = re.compile(r"\b(?:weigh|weighs|weighed|weighing|weight|heavy|heavier|lighter|"
                      r"lightest|heaviest|mass)\b")
# A time of day's half after its number ("9am", "9 a.m.", "3 PM"): "at 9am" / "at 9 pm"
# share the number and ask about other hours.
_MERIDIEM = re.compile(r"(?<=\d)\s?([ap])\.?m\b\.?")
# "20 per cent" is "20 percent" (not a cent).
_PER_CENT = re.compile(r"\bper\s+cent\b")


def units(lowered: str) -> tuple[str, ...]:
    """The units named, in order, synonyms as one ("monthly", "per month", "a month",
    "months" are "month"), a time of day's half ("am", "pm") among them."""
    if not _HINT.search(lowered):
        return ()
    if "cent" in lowered:
        lowered = _PER_CENT.sub("percent", lowered)
    weighed = "pound" in lowered and _WEIGHED.search(lowered) is not None
    out = []
    for m in _UNIT.finditer(lowered):
        unit = _CANON[m.group(0)]
        if unit == "gbp" and m.group(0).startswith("pound") and (
                weighed or _POUNDS_OF.match(lowered, m.start())):
            unit = "lb"
        out.append((m.start(), unit))
    if "m" in lowered:
        out += [(m.start(), m.group(1) + "m") for m in _MERIDIEM.finditer(lowered)]
    return tuple(unit for _, unit in sorted(out))


def units_differ(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Both name units, and not the same ones in the same order."""
    return bool(a and b and a != b)


def relative_differs(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """One question asks about a percentage and the other does not ("Can I get 50% off?"
    / "Can I get 50 off?", "a 10% discount" / "a 10 dollar discount" where only one side
    names its unit): a share of a thing is not an amount of it. The caller compares only
    questions whose numbers are the same."""
    return ("percent" in a) != ("percent" in b)
