"""Packed variable-length batches: a shape's `seq_lens`, the sequences of those lengths packed into one batch
of their total tokens (`cu_seqlens`), each sequence attending only within itself (causal or not). Imports
nothing of attnprof; torch only inside `cu_seqlens_tensor`, `packed_dense_mask` and `pad_index`.

A config gives the lengths as a list (`seq_lens: [512, 100, 2048]`) or draws them
(`seq_lens: {count: 8, mean: 512, distribution: uniform|lognormal, seed: 0}`): uniform draws integers in
[1, 2·mean − 1]; lognormal draws exp(N(ln(mean) − σ²/2, σ²)) with σ = `LOGNORMAL_SIGMA`, rounded, at least 1
(so both have the mean asked for, before rounding). Python's `random.Random(seed)` draws them, so the lengths
are the same on every machine.
"""

from __future__ import annotations

import difflib
import math
import random
from collections.abc import Sequence
from typing import Any

from attnprof.masks import PLAIN_KINDS

DISTRIBUTIONS = ("uniform", "lognormal")
GENERATOR_KEYS = ("count", "mean", "distribution", "seed")
LOGNORMAL_SIGMA = 0.5  # the spread of drawn lognormal lengths (about 0.53 × mean standard deviation)
MAX_SEQUENCES = 65536  # more sequences in one packed batch than any kernel's grid needs to be shown
MAX_TOTAL_TOKENS = 1 << 24  # 16M packed tokens: q, k and v of 1 head of 128 in bf16 are already 12 GiB


def parse_seq_lens(value: Any) -> tuple[int, ...]:
    """The lengths of a config's `seq_lens` (a list, or the generator mapping of the module docstring);
    ValueError in one line otherwise."""
    if isinstance(value, dict):
        return _drawn(value)
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError("seq_lens must be a list of lengths or {count: N, mean: L, distribution: uniform|lognormal}")
    if not value:
        raise ValueError("seq_lens must not be empty")
    return _checked(tuple(_positive(v, "seq_lens") for v in value))


def _drawn(spec: dict[str, Any]) -> tuple[int, ...]:
    for key in spec:
        if key not in GENERATOR_KEYS:
            close = difflib.get_close_matches(str(key), GENERATOR_KEYS, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(GENERATOR_KEYS)}"
            raise ValueError(f"unknown seq_lens key {key!r}{hint}")
    missing = [k for k in ("count", "mean") if k not in spec]
    if missing:
        raise ValueError(f"seq_lens needs {' and '.join(missing)}: {{count: N, mean: L}}")
    count = _positive(spec["count"], "seq_lens count")
    if count > MAX_SEQUENCES:
        raise ValueError(f"seq_lens count {count} is above {MAX_SEQUENCES}")
    mean = _positive(spec["mean"], "seq_lens mean")
    distribution = spec.get("distribution", "uniform")
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"seq_lens distribution must be {' or '.join(DISTRIBUTIONS)} (got {distribution!r})")
    seed = spec.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seq_lens seed must be an integer (got {seed!r})")
    rng = random.Random(seed)
    if distribution == "uniform":
        lengths = tuple(rng.randint(1, 2 * mean - 1) for _ in range(count))
    else:
        mu = math.log(mean) - LOGNORMAL_SIGMA**2 / 2
        lengths = tuple(max(1, round(rng.lognormvariate(mu, LOGNORMAL_SIGMA))) for _ in range(count))
    return _checked(lengths)


def _checked(lengths: tuple[int, ...]) -> tuple[int, ...]:
    if len(lengths) > MAX_SEQUENCES:
        raise ValueError(f"seq_lens has {len(lengths)} sequences, above {MAX_SEQUENCES}")
    if sum(lengths) > MAX_TOTAL_TOKENS:
        raise ValueError(f"seq_lens total {sum(lengths)} tokens is above {MAX_TOTAL_TOKENS}")
    return lengths


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value <= 0:
        raise ValueError(f"{what} must be positive integers (got {value!r})")
    return int(value)


def fit_problem(lengths: Sequence[int], seq: int | None, batch: int | None) -> str | None:
    """Why `seq_lens` contradicts a shape's `seq` (the longest a sequence may be) or `batch` (1: the packed
    batch, or the number of sequences: the padded one), or None."""
    if seq is not None and max(lengths) > seq:
        return f"seq_lens has a sequence of {max(lengths)} tokens, longer than seq {seq}"
    if batch is not None and batch not in (1, len(lengths)):
        return f"batch {batch} contradicts seq_lens' {len(lengths)} sequences (give batch 1, {len(lengths)} or none)"
    return None


def label(lengths: Sequence[int]) -> str:
    """The shape label's suffix: `varlen8x~512` (count × mean length, rounded)."""
    return f"varlen{len(lengths)}x~{round(sum(lengths) / len(lengths))}"


def summary(lengths: Sequence[int]) -> dict[str, float | int]:
    """count, total, min, mean and max of the lengths (a row's `seq_lens_*` fields)."""
    return {
        "count": len(lengths),
        "total": sum(lengths),
        "min": min(lengths),
        "mean": sum(lengths) / len(lengths),
        "max": max(lengths),
    }


def offsets(lengths: Sequence[int]) -> list[int]:
    """cu_seqlens: 0, then the running total of the lengths (len(lengths) + 1 entries)."""
    out = [0]
    for length in lengths:
        out.append(out[-1] + length)
    return out


def packed_pairs(lengths: Sequence[int], causal: bool) -> int:
    """The (query, key) pairs one head keeps: each sequence with itself only, L(L+1)/2 causal, else L²."""
    return sum(n * (n + 1) // 2 if causal else n * n for n in lengths)


def padded_pairs(lengths: Sequence[int], causal: bool) -> int:
    """The pairs one head of the padded dense batch computes: count sequences of the longest length each,
    padding included (what SDPA with a key-padding mask runs)."""
    return len(lengths) * packed_pairs([max(lengths)], causal)


def cu_seqlens_tensor(lengths: Sequence[int], device: Any) -> Any:
    """`offsets` as the int32 tensor flash-attn's varlen functions take."""
    import torch

    return torch.tensor(offsets(lengths), dtype=torch.int32, device=device)


def packed_dense_mask(lengths: Sequence[int], causal: bool, device: Any = "cpu") -> Any:
    """The [total, total] bool mask of the packed batch (True = may attend): block diagonal, each block
    causal or full."""
    import torch

    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(list(lengths), device=device))
    keep = doc[:, None] == doc[None, :]
    if causal:
        pos = torch.arange(len(doc), device=device)
        keep &= pos[None, :] <= pos[:, None]
    return keep


def pad_index(lengths: Sequence[int], device: Any) -> Any:
    """For each packed token, its flat position in a [count, max] padded layout."""
    import torch

    longest = max(lengths)
    return torch.cat([i * longest + torch.arange(n, device=device) for i, n in enumerate(lengths)])


def packed_problem(spec: Any) -> str | None:
    """Why a packed RunSpec is not one: batch 1 of the lengths' total, plain mask, square, no score mod."""
    if not spec.seq_lens or min(spec.seq_lens) <= 0:
        return "seq_lens must be positive lengths"
    if spec.batch != 1 or spec.seq != sum(spec.seq_lens):
        return f"a packed batch is batch 1 of seq {sum(spec.seq_lens)} (got {spec.batch}x{spec.seq})"
    if spec.mask.kind not in PLAIN_KINDS or spec.score_mod is not None:
        return "seq_lens takes the causal or none mask and no score_mod"
    if spec.q_len is not None or spec.kv_len is not None or spec.page_size is not None:
        return "seq_lens takes no q_len, kv_len or kv_cache"
    return None
