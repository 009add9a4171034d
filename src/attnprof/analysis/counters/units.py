"""Numbers and units as Nsight Compute writes them, into base units (bytes, seconds, bytes per second).

The raw CSV page scales each value to a readable unit (`Mbyte`, `Gbyte/s`, `ms`, `Kbyte/block`) and may
write thousands separators (`65,536`); the `ncu_report` module gives values in the metric's own unit
(`byte`, `ns`, `byte/block`). Both go through `to_base`: an SI prefix on a known base unit, in the
numerator or the denominator, is multiplied out; any other unit (`%`, `register/thread`) is left as it is.
"""

from __future__ import annotations

import re

#: SI prefixes Nsight Compute puts before a unit (decimal: a Kbyte is 1,000 bytes).
PREFIXES = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
#: Units a prefix may stand before.
BASES = frozenset(
    ("byte", "second", "s", "hz", "Hz", "inst", "cycle", "sector", "warp", "request", "thread", "block", "register")
)
#: What a cell holds when the report has no value.
NO_VALUE = frozenset(("", "n/a", "no data", "N/A"))
_NUMBER = re.compile(r"-?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?([eE][-+]?\d+)?")


def parse_number(text: str) -> float | None:
    """A number as the raw page writes it (`65,536`, `6.588064`, `1e-05`); None for anything else
    (`no data`, `(384, 1, 1)`, an empty cell)."""
    text = text.strip()
    if text in NO_VALUE or not _NUMBER.fullmatch(text):
        return None
    return float(text.replace(",", ""))


def _factor(part: str) -> float:
    """The multiplier into the base unit of one side of a unit (`Mbyte` 1e6, `ms` 1e-3, `%` 1)."""
    part = part.strip()
    if part in BASES:
        return 1.0
    if len(part) > 1 and part[0] in PREFIXES and part[1:] in BASES:
        return PREFIXES[part[0]]
    return 1.0


def unit_factor(unit: str) -> float:
    """The multiplier that turns a value in `unit` into base units: `Gbyte/s` 1e9 (bytes per second),
    `ms` 1e-3 (seconds), `%/Kbyte` 1e-3, `register/thread` 1."""
    numerator, _, denominator = (unit or "").partition("/")
    return _factor(numerator) / (_factor(denominator) if denominator else 1.0)


def to_base(value: float, unit: str) -> float:
    """`value` in `unit` as a value in base units (see `unit_factor`)."""
    return value * unit_factor(unit)
