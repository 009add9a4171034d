"""Attention masks and score mods by name: their canonical text, which (query, key) pairs a mask
keeps, and how many. Imports nothing of attnprof; torch only inside `dense_mask` and `alibi_slopes`.

A mask is text (a `RunSpec` field, a results column): `causal`, `none`, `sliding_window:W`,
`documents:N` or `prefix:P`. Queries are the last `q_len` of `kv_len` positions (bottom-right
alignment): query row i sits at position p = i + kv_len − q_len, and keeps key j when

- `none`: always;
- `causal`: j ≤ p;
- `sliding_window:W`: p − W < j ≤ p (the W keys up to and including its own position);
- `documents:N`: j ≤ p in the same one of N equal documents (kv_len / N positions each);
- `prefix:P`: j ≤ p or j < P (the first P positions are seen by every query: prefix-LM).

Every query keeps at least its own position, so no row is fully masked (q_len ≤ kv_len); rows say so
(`fully_masked_rows`, counted by `Mask.empty_rows`).
A score mod is None, `softcap:C` (scores → C·tanh(scores / C)), `alibi` (minus slope_h · (p − j),
slopes 2^(−8(h+1)/H) for query head h of H) or `sinks` (gpt-oss's attention sinks: one logit s_h per query
head that takes part in the softmax's denominator only, weights exp(z_j) / (Σ_k exp(z_k) + exp(s_h)); it
brings no value, so a row's weights sum to less than 1).
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from typing import Any

MASK_KINDS = ("causal", "none", "sliding_window", "documents", "prefix")
SIZED_KINDS = ("sliding_window", "documents", "prefix")  # the kinds that carry a size
PLAIN_KINDS = ("causal", "none")  # what every variant supports (a variant that declares nothing)
SCORE_MODS = ("softcap", "alibi", "sinks")
LABELS = {"sliding_window": "sw", "documents": "doc", "prefix": "prefix"}


@dataclass(frozen=True)
class Mask:
    """One mask: its kind and, for a sized kind, its size (window, documents, prefix length)."""

    kind: str
    size: int | None = None

    @classmethod
    def plain(cls, causal: bool) -> Mask:
        """The plain mask a causal flag names: `causal` (True) or `none` (False)."""
        return cls("causal" if causal else "none")

    @property
    def text(self) -> str:
        """The canonical text: `causal`, `none`, `sliding_window:256`, ..."""
        return self.kind if self.size is None else f"{self.kind}:{self.size}"

    @property
    def label(self) -> str:
        """The shape label's suffix: '' for causal and none, else `sw256`, `doc8`, `prefix64`."""
        return "" if self.size is None else f"{LABELS[self.kind]}{self.size}"

    def problem(self, q_len: int, kv_len: int) -> str | None:
        """Why this mask does not fit q_len queries against kv_len keys, or None."""
        if self.kind == "sliding_window" and self.size is not None and self.size > kv_len:
            return f"sliding_window {self.size} is larger than kv_len {kv_len}"
        if self.kind == "documents" and self.size is not None and kv_len % self.size:
            return f"{self.size} documents do not divide kv_len {kv_len}"
        if self.kind == "prefix" and self.size is not None and self.size > kv_len:
            return f"prefix {self.size} is longer than kv_len {kv_len}"
        return None

    def keys_of_row(self, p: int, kv_len: int) -> int:
        """How many keys the query at position p keeps (the module docstring's rules)."""
        if self.kind == "none":
            return kv_len
        if self.kind == "causal":
            return p + 1
        assert self.size is not None
        if self.kind == "sliding_window":
            return min(p + 1, self.size)
        if self.kind == "documents":
            return p % (kv_len // self.size) + 1
        return max(p + 1, self.size)  # prefix

    def same_as_causal(self, kv_len: int) -> bool:
        """True when this mask keeps exactly the causal pairs at `kv_len` keys (whatever the queries): a
        window of at least kv_len, one document, a prefix of at most 1 (key 0 is causal for every query)."""
        if self.kind == "causal":
            return True
        if self.kind == "sliding_window":
            return self.size is not None and self.size >= kv_len
        if self.kind == "documents":
            return self.size == 1
        return self.kind == "prefix" and self.size is not None and self.size <= 1

    def empty_rows(self, q_len: int, kv_len: int) -> int:
        """Query rows that keep no key (the float64 reference gives them zeros): counted row by row
        (O(q_len)); 0 for every mask here, since each query keeps its own position."""
        return _empty_rows(self, q_len, kv_len)

    def pairs(self, q_len: int, kv_len: int) -> int:
        """The exact number of kept (query, key) pairs of one head: a closed form per kind."""
        offset = kv_len - q_len
        if self.kind == "none":
            return q_len * kv_len
        if self.kind == "causal":
            return _capped_sum(offset + q_len, None) - _capped_sum(offset, None)
        assert self.size is not None
        if self.kind == "sliding_window":
            return _capped_sum(offset + q_len, self.size) - _capped_sum(offset, self.size)
        if self.kind == "documents":
            length = kv_len // self.size
            return _cyclic_sum(offset + q_len, length) - _cyclic_sum(offset, length)
        # prefix: max(p + 1, P) = (p + 1) + max(0, P − p − 1)
        below = _shortfall(offset + q_len, self.size) - _shortfall(offset, self.size)
        return _capped_sum(offset + q_len, None) - _capped_sum(offset, None) + below


@functools.lru_cache(maxsize=256)
def _empty_rows(mask: Mask, q_len: int, kv_len: int) -> int:
    """`Mask.empty_rows`, remembered per (mask, q_len, kv_len): every row of a results file asks."""
    return sum(1 for p in range(kv_len - q_len, kv_len) if mask.keys_of_row(p, kv_len) <= 0)


def _capped_sum(n: int, cap: int | None) -> int:
    """Σ_{p<n} min(p + 1, cap) (cap None: no cap)."""
    if cap is None or n <= cap:
        return n * (n + 1) // 2
    return cap * (cap + 1) // 2 + (n - cap) * cap


def _cyclic_sum(n: int, length: int) -> int:
    """Σ_{p<n} (p mod length + 1)."""
    whole, rest = divmod(n, length)
    return whole * length * (length + 1) // 2 + rest * (rest + 1) // 2


def _shortfall(n: int, size: int) -> int:
    """Σ_{p<n} max(0, size − p − 1)."""
    m = min(n, size)
    return m * size - m * (m + 1) // 2


def parse_mask(value: Any) -> Mask:
    """A Mask from a config value or its text: `causal`, `none`, `{sliding_window: 256}`,
    `sliding_window:256`; ValueError (one line, with a close match) otherwise."""
    if isinstance(value, Mask):
        return value
    if isinstance(value, str) and ":" in value:
        kind, _, size = value.partition(":")
        value = {kind.strip(): size.strip()}
    if isinstance(value, str):
        if value in PLAIN_KINDS:
            return Mask(value)
        if value in SIZED_KINDS:
            raise ValueError(f"mask {value} needs a size: {{{value}: N}}")
        raise ValueError(_unknown("mask", value, MASK_KINDS))
    if isinstance(value, dict) and len(value) == 1:
        ((kind, size),) = value.items()
        if kind not in SIZED_KINDS:
            raise ValueError(_unknown("mask", str(kind), MASK_KINDS))
        return Mask(kind, _positive(size, kind))
    raise ValueError("mask must be causal, none or one of {sliding_window: W}, {documents: N}, {prefix: P}")


def parse_score_mod(value: Any) -> str | None:
    """The canonical text of a score mod (None, `softcap:C`, `alibi`, `sinks`); ValueError otherwise.
    `{sinks: true}` (or `sinks`, `sinks:true`) is `sinks`; `{sinks: false}` is no score mod."""
    if value is None or value == "none":
        return None
    if isinstance(value, str) and ":" in value:
        kind, _, cap = value.partition(":")
        value = {kind.strip(): cap.strip()}
    if value in ("alibi", "sinks"):
        return str(value)
    if isinstance(value, str):
        raise ValueError(_unknown("score_mod", value, SCORE_MODS))
    if isinstance(value, dict) and len(value) == 1:
        ((kind, cap),) = value.items()
        if kind == "sinks":
            return "sinks" if _flag(cap, "sinks") else None
        if kind != "softcap":
            raise ValueError(_unknown("score_mod", str(kind), SCORE_MODS))
        try:
            number = float(cap)
        except (TypeError, ValueError):
            raise ValueError(f"softcap must be a positive number (got {cap!r})") from None
        if not number > 0:
            raise ValueError(f"softcap must be a positive number (got {cap!r})")
        return f"softcap:{number:g}"
    raise ValueError("score_mod must be null, alibi, {softcap: C} or {sinks: true}")


def _flag(value: Any, name: str) -> bool:
    """A config's true/false (YAML's booleans, or `true`/`false` as text from the command line)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{name} must be true or false (got {value!r})")


def score_mod_kind(score_mod: str | None) -> str | None:
    """`softcap`, `alibi` or `sinks` (None: no score mod)."""
    return None if score_mod is None else score_mod.split(":", 1)[0]


def softcap_value(score_mod: str | None) -> float | None:
    """C of `softcap:C`, else None."""
    if score_mod is None or not score_mod.startswith("softcap:"):
        return None
    return float(score_mod.split(":", 1)[1])


def score_mod_label(score_mod: str | None) -> str:
    """The shape label's suffix of a score mod: '', `softcap30`, `alibi`, `sinks`."""
    return "" if score_mod is None else score_mod.replace(":", "")


def _positive(value: Any, kind: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{kind} must be a positive integer (got {value!r})") from None
    if number <= 0 or (isinstance(value, float) and value != number) or isinstance(value, bool):
        raise ValueError(f"{kind} must be a positive integer (got {value!r})")
    return number


def _unknown(what: str, name: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(known)}"
    return f"unknown {what} {name!r}{hint}"


def dense_mask(mask: Mask, q_len: int, kv_len: int, device: Any = "cpu") -> Any:
    """The [q_len, kv_len] bool tensor of kept pairs (True = may attend, SDPA's convention)."""
    import torch

    p = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    j = torch.arange(kv_len, device=device)[None, :]
    if mask.kind == "none":
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    causal = j <= p
    if mask.kind == "causal":
        return causal
    assert mask.size is not None
    if mask.kind == "sliding_window":
        return causal & (j > p - mask.size)
    if mask.kind == "documents":
        length = kv_len // mask.size
        return causal & (j // length == p // length)
    return causal | (j < mask.size)  # prefix


def alibi_slopes(heads: int, device: Any = "cpu") -> Any:
    """ALiBi's per-head slopes 2^(−8(h+1)/H), a float32 tensor of `heads`."""
    import torch

    return torch.pow(2.0, -8.0 * torch.arange(1, heads + 1, dtype=torch.float64, device=device) / heads).float()


def spec_mask(mask: Mask | str | None, causal: bool | None) -> Mask:
    """`RunSpec.mask` from the constructor's inputs: `mask` parsed (a Mask passes through), a plain one
    (or none) replaced by the one `causal` chooses when it is given; neither given: causal."""
    parsed = parse_mask(mask) if mask is not None else None
    if causal is not None and (parsed is None or parsed.kind in PLAIN_KINDS):
        return Mask.plain(causal)
    return parsed if parsed is not None else Mask("causal")
