"""What identifies a row's cell: `cell_key`, the key runs, sweeps and resumes match rows by (`RunSpec.cell_key`
of the spec that made the row), and `cell_label`, the words tables name the cell by."""

from __future__ import annotations

from typing import Any

from attnprof.results.schema import Row


def cell_key(row: Row) -> tuple[Any, ...]:
    """`RunSpec.cell_key` of the cell a row measured: every field of the cell, the device by its type only
    (`cuda:1` and `cuda:0` name the same cell on two ranks). Rows written before masks, decode or paged caches
    existed get the defaults their specs had: the mask from `causal`, q_len and kv_len None when they equal
    seq (or are missing), no page size, not packed."""
    return (
        str(row.device).split(":", 1)[0],
        row.dtype,
        row.batch,
        row.heads,
        row.kv_heads,
        row.seq,
        row.head_dim,
        row.causal,
        row.mode or "fwd",
        row.mask or ("causal" if row.causal else "none"),
        row.score_mod or None,
        _unless_seq(row.q_len, row.seq),
        _unless_seq(row.kv_len, row.seq),
        tuple(row.seq_lens) if row.seq_lens else None,
        row.page_size or None,
    )


def _unless_seq(value: int | None, seq: int | None) -> int | None:
    """A row's q_len or kv_len as `RunSpec` keeps it: None when missing or equal to seq."""
    return None if value is None or value == seq else value


def cell_label(row: Row) -> str:
    """`8x16x1024x64 bf16 causal fwd+bwd`: shape, dtype, masking and mode of a row. A sized mask is in the
    shape (`4x16x4096x64 sw256`), so its masking word is `masked`."""
    sized = row.mask not in (None, "", "causal", "none")
    masking = "masked" if sized else "causal" if row.causal else "full"
    return f"{row.shape} {row.dtype} {masking} {row.mode or 'fwd'}"
