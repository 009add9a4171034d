"""Attainable references: the best kernel rate known at an attention shape, from a table attnprof measured.

A finding's impact is the time above what the best implementation known at the call's shape takes, not
above the roofline (at 197 tokens and head dim 64 no kernel reaches the read bandwidth). The table,
`attnprof/data/attainable-<gpu>.json`, is written by `benchmarks/attainable_table.py` from attnprof's own
compare runs: per `ShapeKey` the best variant's kernel TFLOP/s and GB/s (the attention calls' FLOPs and
bytes over their device time; on a CPU run, by latency, `basis` says which), and a header naming the GPU,
its measured ceilings, torch and cuDNN, the date and the attnprof commit.

`lookup(table, key)` finds the entry of the same phase, mask kind and dtype nearest in log space over
q_len, kv_len, head dim and batch × heads, each within `MAX_LOG2_STEP` (2x) of the key; batch × heads is
part of the key because a short sequence fills an H200's 132 SMs only with enough (batch, head) pairs
(12 pairs at 197 tokens run at a fraction of the rate 384 do). `reference_for` picks the table of the
key's GPU, or scales the first table's figures by the ratio of this GPU's read bandwidth and matmul ceiling
to the table's, and says so. Where nothing applies it returns `NoReference` with the reason. No torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from attnprof.analysis.hardware import Peaks
from attnprof.errors import ConfigError

#: The table file's format (a reader refuses another).
TABLE_FORMAT = 1
#: The canonical mask kinds a key takes (`canonical_mask`).
MASK_KINDS = ("none", "causal", "window", "document", "other")
_MASKS = {"none": "none", "causal": "causal", "sliding_window": "window", "documents": "document"}
#: The nearest entry may differ from the key by at most this many factors of 2 on each sized axis.
MAX_LOG2_STEP = 1.0
#: A call at or above this share of the attainable rate is inside the band the best known reaches: `info`.
ATTAINABLE_BAND = 0.90
#: The command that writes the table (docs and the "no table" reason name it).
REGENERATE = "python3 benchmarks/attainable_table.py --out src/attnprof/data/attainable-h200.json"


class TableHeader(msgspec.Struct, frozen=True, kw_only=True):
    """What the table was measured on: the GPU (its deviceProperties name), its compute capability, its
    measured ceilings (matmul TFLOP/s in the table's dtype, read GB/s), torch and cuDNN, the date (YYYY-MM-DD),
    the attnprof commit, how long the grid took, and why it stopped short, if it did."""

    gpu: str
    sm: str | None = None
    matmul_tflops: float | None = None
    read_gbps: float | None = None
    torch: str | None = None
    cudnn: str | None = None
    date: str = ""
    commit: str | None = None
    seconds: float | None = None
    note: str | None = None  # why the grid is incomplete (a time budget), None when it ran whole


class TableEntry(msgspec.Struct, frozen=True, kw_only=True):
    """The best variant at one shape: its key (phase fwd or bwd, q_len, kv_len, head dim, canonical mask,
    dtype, batch × heads), its kernel TFLOP/s and GB/s (`basis` "kernel", or "latency" where the run had no
    device time), its latency, and how many variants ran there."""

    phase: str
    q_len: int
    kv_len: int
    head_dim: int
    mask: str
    dtype: str
    batch_heads: int
    variant: str
    tflops: float | None = None
    gbps: float | None = None
    latency_us: float | None = None
    basis: str = "kernel"
    variants: int = 1

    @classmethod
    def at(cls, key: ShapeKey, variant: str, **figures: Any) -> TableEntry:
        """The entry at `key` for `variant`, with its figures (tflops, gbps, latency_us, basis, variants)."""
        return cls(**dataclasses.asdict(key), variant=variant, **figures)

    @property
    def key(self) -> ShapeKey:
        """The shape this entry was measured at."""
        return ShapeKey(self.phase, self.q_len, self.kv_len, self.head_dim, self.mask, self.dtype, self.batch_heads)


class AttainableTable(msgspec.Struct, frozen=True, kw_only=True):
    """A reference table: its format, header and entries."""

    format: int = TABLE_FORMAT
    header: TableHeader
    entries: list[TableEntry] = []


@dataclass(frozen=True)
class ShapeKey:
    """What a reference is looked up by: phase ("fwd" or "bwd"), queries and keys per sequence, head dim,
    canonical mask kind (`MASK_KINDS`), dtype ("bf16", "fp16", "fp32") and batch × query heads."""

    phase: str
    q_len: int
    kv_len: int
    head_dim: int
    mask: str
    dtype: str
    batch_heads: int

    @property
    def text(self) -> str:
        """`fwd 197x197 d64 none bf16 bh384`."""
        return f"{self.phase} {self.q_len}x{self.kv_len} d{self.head_dim} {self.mask} {self.dtype} bh{self.batch_heads}"


@dataclass(frozen=True)
class Attainable:
    """The best known rate at a shape: kernel GB/s and TFLOP/s (None where unknown), the variant that reached
    them, and where they come from in words ("this run", "H200 table 2026-05-01", "... scaled from the H200's by
    read bandwidth 2,039/4,626 GB/s")."""

    gbps: float | None
    tflops: float | None
    variant: str
    source: str


@dataclass(frozen=True)
class NoReference:
    """Why no reference applies (one clause)."""

    reason: str


#: A reference for a call's key (None: the row's own shape, as in compare).
Reference = Callable[[ShapeKey | None], "Attainable | NoReference"]
#: The reference for a GPU (its deviceProperties name, its peaks): `table_reference`.
AttainableLookup = Callable[[str | None, Peaks | None], Reference]


def canonical_mask(mask: str | None, causal: bool | None = None) -> str:
    """The mask kind of a key: none, causal, window (sliding_window:W), document (documents:N) or other
    (prefix:P, a dense tensor of unknown pattern); without mask text, `causal` decides."""
    if not mask:
        return "causal" if causal else "none"
    kind = mask.split(":", 1)[0].strip()
    return _MASKS.get(kind, "other")


def bucket(n: int) -> int:
    """The power of two nearest `n` in log space (197 -> 256, 4000 -> 4096); 1 for n <= 1."""
    return 1 if n <= 1 else 2 ** round(math.log2(n))


def _distance(entry: TableEntry, key: ShapeKey) -> float | None:
    """The log2 distance of `entry` from `key` over the sized axes; None when one axis is too far."""
    total = 0.0
    for have, want in (
        (entry.q_len, key.q_len),
        (entry.kv_len, key.kv_len),
        (entry.head_dim, key.head_dim),
        (entry.batch_heads, key.batch_heads),
    ):
        step = abs(math.log2(max(have, 1)) - math.log2(max(want, 1)))
        if step > MAX_LOG2_STEP:
            return None
        total += step
    return total


def lookup(table: AttainableTable, key: ShapeKey) -> TableEntry | NoReference:
    """The entry nearest `key` in log space (see the module docstring), or why none is."""
    same = [e for e in table.entries if (e.phase, e.mask, e.dtype) == (key.phase, key.mask, key.dtype)]
    if not same:
        return NoReference(f"the {table.header.gpu} table has no {key.phase} {key.mask} {key.dtype} entry")
    near = [(d, e) for e in same if (d := _distance(e, key)) is not None]
    if not near:
        return NoReference(f"the {table.header.gpu} table has no entry within 2x of {key.text}")
    return min(near, key=lambda pair: pair[0])[1]


def load_table(path: Path) -> AttainableTable:
    """The table in `path`; ConfigError in one line when it cannot be read or is not a table."""
    try:
        table = msgspec.json.decode(path.read_bytes(), type=AttainableTable)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"attainable table {path}: {exc}") from None
    if table.format != TABLE_FORMAT:
        raise ConfigError(f"attainable table {path}: format {table.format}, this attnprof reads {TABLE_FORMAT}")
    return table


def shipped_tables() -> list[AttainableTable]:
    """The tables shipped with attnprof (`attnprof/data/attainable-*.json`), in name order; [] without any."""
    folder = resources.files("attnprof").joinpath("data")
    if not folder.is_dir():
        return []
    names = sorted(f.name for f in folder.iterdir() if f.name.startswith("attainable-") and f.name.endswith(".json"))
    return [load_table(Path(str(folder.joinpath(name)))) for name in names]


def _same_gpu(table: AttainableTable, gpu: str) -> bool:
    return table.header.gpu.lower() == gpu.lower()


def _rate(value: float | None) -> str:
    return f"{value:,.0f}"


def reference_for(
    key: ShapeKey | None, gpu: str | None, peaks: Peaks | None, tables: Sequence[AttainableTable] | None = None
) -> Attainable | NoReference:
    """The attainable rate at `key` on the GPU called `gpu`: the entry of its own table, or the first table's
    scaled by `peaks` (this GPU's read bandwidth and matmul figure against the table's measured ceilings);
    `NoReference` with the reason otherwise. `tables` defaults to the shipped ones."""
    if key is None:
        return NoReference("no shape key: the calls' shapes or dtype were not recorded, or the calls differ")
    if not gpu:
        return NoReference("the trace names no GPU")
    found = shipped_tables() if tables is None else list(tables)
    if not found:
        return NoReference(f"no attainable table is shipped with this attnprof (generate one: {REGENERATE})")
    own = next((t for t in found if _same_gpu(t, gpu)), None)
    table = own or found[0]
    entry = lookup(table, key)
    if isinstance(entry, NoReference):
        return entry
    head = table.header
    source = f"{head.gpu} table {head.date}".strip()
    if own is not None:
        return Attainable(entry.gbps, entry.tflops, entry.variant, source)
    if peaks is None or not head.read_gbps or not head.matmul_tflops:
        return NoReference(f"no ceilings of {gpu} to scale the {head.gpu} table by")
    read, matmul = peaks.read_gbps / head.read_gbps, peaks.tensor_tflops / head.matmul_tflops
    gbps = entry.gbps * read if entry.gbps is not None else None
    tflops = entry.tflops * matmul if entry.tflops is not None else None
    scaled = (
        f"{source}, scaled from the {head.gpu}'s by read bandwidth {_rate(peaks.read_gbps)}/{_rate(head.read_gbps)} "
        f"GB/s and matmul {_rate(peaks.tensor_tflops)}/{_rate(head.matmul_tflops)} TFLOP/s"
    )
    return Attainable(gbps, tflops, entry.variant, scaled)


def measured_at(key: ShapeKey | None, gpu: str | None) -> Attainable | None:
    """The entry of `gpu`'s own shipped table measured at exactly `key` (no neighbour, no scaling), as an
    `Attainable`; None without one. A run's cell weighs its fastest variant against it (`pipeline.best_known`)."""
    if key is None or not gpu:
        return None
    for table in shipped_tables():
        if not _same_gpu(table, gpu):
            continue
        for e in table.entries:
            if e.key == key:
                return Attainable(e.gbps, e.tflops, e.variant, f"{table.header.gpu} table {table.header.date}")
    return None


def table_reference(gpu: str | None, peaks: Peaks | None) -> Reference:
    """The shipped table's reference for calls on the GPU called `gpu` (see `reference_for`)."""

    tables = shipped_tables()  # read once per reference, not per call

    def reference(key: ShapeKey | None) -> Attainable | NoReference:
        return reference_for(key, gpu, peaks, tables)

    return reference
