"""The measured alternative to a dense mask: when a cell's trace shows `dense-mask` (SDPA was given the mask
as a tensor), its finding says what the way that skips the masked blocks took at the same shape.

Which alternative (`wanted`):

- a sized mask that keeps exactly the causal pairs (`prefix:1`, a window as long as the keys, one
  document): SDPA told `is_causal` at the plain causal cell of the same shape, run by the same variant
  if it is an SDPA one, else by `sdpa`, else by a pinned backend; and, when the run holds it, flex's
  BlockMask at the cell itself;
- any other mask (a sliding window, documents, a prefix; causal given as a dense bias, as a chunk of
  queries against a longer cache gets it): flex's BlockMask at the cell itself.

Where it comes from: a cell of the same run (this rank's, another rank's or a resumed one) is joined
after the run, on the rows, where the speed-ups are computed (`attach_row_alternatives`). An alternative
the plan does not hold is timed right after the dense cell (`Alternatives.measure`): the same timing
method and options as the cells, at most `SHORT_S` of timed calls, outside every profiled region, with
no trace and no correctness check (its own cells check that variant); a variant that cannot run here
gives its reason instead. Either way the numbers go into the row's `mask_alternatives`, and the judge
(`analysis.findings.judge.weigh_dense_mask`) puts them into its dense-mask finding's message and impact:
through `CellResult.findings` for those measured here, through `judge_alternatives` (`rows.join_alternatives`)
for those joined after the run.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from attnprof.analysis.findings.judge import BLOCK_MASK, DENSE_MASK, IS_CAUSAL, THIS_RUN
from attnprof.errors import VariantFailure, VariantUnavailableError
from attnprof.masks import SIZED_KINDS, Mask, parse_mask
from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.rows import join_alternatives
from attnprof.pipeline.stages import guard, phase, warning_lines
from attnprof.registry import RunSpec, Variant
from attnprof.results.parts import MaskAlternative
from attnprof.results.schema import Row

if TYPE_CHECKING:
    from attnprof.config import Config, MeasureOptions

#: Who runs `is_causal`, after the dense cell's own variant when it is one of them.
IS_CAUSAL_VARIANTS = ("sdpa", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math")
BLOCK_MASK_VARIANT = "flex"
MEASURED = "measured for comparison"
#: At most this much timed time for an alternative measured for comparison (less when the cells use less).
SHORT_S = 0.1
_CAUSAL, _MASK = 7, 9  # the places of `causal` and `mask` in `RunSpec.cell_key`


@dataclass(frozen=True)
class Wanted:
    """One alternative to look for: its kind, the cell key it runs at, who may run it (in order of
    preference), and whether to time it here when the run has none."""

    kind: str
    key: tuple[Any, ...]
    variants: tuple[str, ...]
    measure: bool


def wanted(variant: str, mask: Mask | str, kv_len: int, key: tuple[Any, ...]) -> list[Wanted]:
    """The alternatives of a dense-mask cell of `variant` with `mask` at `kv_len` keys (see the module
    docstring); `key` is the cell's `RunSpec.cell_key`."""
    parsed = parse_mask(mask)
    if parsed.kind == "none":
        return []
    block = Wanted(BLOCK_MASK, key, (BLOCK_MASK_VARIANT,), measure=True)
    if parsed.kind not in SIZED_KINDS or not parsed.same_as_causal(kv_len):
        return [block]
    causal_key = list(key)
    causal_key[_CAUSAL], causal_key[_MASK] = True, "causal"
    first = (variant,) if variant in IS_CAUSAL_VARIANTS else ()
    runners = tuple(dict.fromkeys(first + IS_CAUSAL_VARIANTS))
    return [Wanted(IS_CAUSAL, tuple(causal_key), runners, measure=True), replace(block, measure=False)]


def alternative_spec(kind: str, spec: RunSpec) -> RunSpec:
    """The spec an alternative of `kind` runs at: the plain causal mask of the same shape for `is_causal`,
    the cell itself for the block mask."""
    return replace(spec, mask=Mask("causal")) if kind == IS_CAUSAL else spec


def dense_mask_latency(result: CellResult) -> float | None:
    """The latency of an ok cell whose findings show `dense-mask`, else None."""
    if not result.ok or result.analysis is None or all(f.id != DENSE_MASK for f in result.findings):
        return None
    return result.latency_us


class Alternatives:
    """The alternatives a run's dense cells must time themselves: those its plan (every rank's cells,
    the resumed ones too) does not hold."""

    def __init__(self, cells: list[tuple[Variant, RunSpec]]) -> None:
        self.planned = {(variant.name, spec.cell_key) for variant, spec in cells}

    def missing(self, result: CellResult) -> list[Wanted]:
        """The alternatives of `result` to time here: none unless its trace shows `dense-mask`."""
        if dense_mask_latency(result) is None:
            return []
        spec = result.spec
        return [
            w
            for w in wanted(result.variant, spec.mask, spec.n_keys, spec.cell_key)
            if w.measure and not any((name, w.key) in self.planned for name in w.variants)
        ]

    def measure(self, result: CellResult, config: Config, measure: MeasureOptions) -> None:
        """Time each missing alternative of `result` (or say why it cannot run here) into
        `result.mask_alternatives`, which the judge weighs its dense-mask finding with."""
        dense = dense_mask_latency(result)
        todo = self.missing(result)
        if dense is None or not todo or not measure.timing:
            return
        with phase(result, "mask_alternative"), warnings.catch_warnings(record=True) as caught:
            found = [_measured(w, result.spec, dense, config, measure) for w in todo]
        result.warnings += [line for line in warning_lines(caught) if line not in result.warnings]
        result.mask_alternatives += found


def _runner(w: Wanted, spec: RunSpec) -> tuple[Variant | None, str | None]:
    """The first built-in variant of `w.variants` that can run the alternative here, or None and the
    reason the first one gives."""
    from attnprof.plugins import load_variants

    registry = load_variants(no_plugins=True).registry
    reasons = []
    for name in w.variants:
        if name not in registry:
            continue
        variant = registry.get(name)
        reason = variant.unavailable_reason(spec)
        if reason is None:
            return variant, None
        reasons.append(f"{name}: {reason}")
    return None, reasons[0] if reasons else f"no variant among {', '.join(w.variants)}"


def _measured(w: Wanted, dense_spec: RunSpec, dense: float, config: Config, measure: MeasureOptions) -> MaskAlternative:
    spec = alternative_spec(w.kind, dense_spec)
    variant, reason = _runner(w, spec)
    who = variant.name if variant is not None else w.variants[0]
    if variant is None:
        return MaskAlternative(w.kind, who, spec.cell_label, MEASURED, reason=reason)
    try:
        latency = time_alternative(variant, spec, config, measure)
    except (VariantFailure, VariantUnavailableError) as exc:
        return MaskAlternative(w.kind, who, spec.cell_label, MEASURED, reason=exc.message)
    return MaskAlternative(w.kind, who, spec.cell_label, MEASURED, latency, dense / latency)


def time_alternative(variant: Variant, spec: RunSpec, config: Config, measure: MeasureOptions) -> float:
    """The median latency (µs) of `variant` at `spec`, timed as the cells are (`TimingOptions.from_measure`)
    with at most SHORT_S of timed calls (under `--cold-l2 rotate`, with the L2 flushed instead: no input copies
    are made for it); nothing profiled. Raises VariantFailure or VariantUnavailableError."""
    import torch

    from attnprof.profiling.inputs import make_inputs, make_sinks
    from attnprof.profiling.steps import bound_forward, build_step, graph_retention
    from attnprof.profiling.timing import TimingOptions, time_forward

    options = TimingOptions.from_measure(measure, spec)
    options = replace(options, min_time_s=min(options.min_time_s, SHORT_S), gpu_health=False)
    if options.rotate:
        options = replace(options, rotate=False, flush_l2=True)
    with guard("the dense mask's alternative", variant):
        q, k, v = make_inputs(spec, config.seed, variant.layout)
        sinks = make_sinks(spec, config.seed)
        state = variant.setup(spec) if variant.setup is not None else None
        forward = bound_forward(variant, spec, state, sinks)
        with torch.no_grad(), graph_retention(spec.mode):
            step = build_step(spec, forward, (q, k, v), config.seed, variant.repeatable_backward, sinks)
            return time_forward(step.call, spec.device, options, prepare=step.prepare).median_us


def _row_latency(row: Row) -> float | None:
    value = row.latency_us
    return float(value) if row.ok and value is not None and value > 0 else None


def _from_row(kind: str, row: Row, dense: float) -> MaskAlternative:
    latency = _row_latency(row)
    if latency is None:
        return MaskAlternative(kind, row.variant, str(row.shape), THIS_RUN, reason=row.reason or row.status)
    return MaskAlternative(kind, row.variant, str(row.shape), THIS_RUN, latency, dense / latency)


def attach_row_alternatives(rows: list[Row]) -> None:
    """Join each dense-mask row with its alternatives among `rows` (the whole run's, after it): their
    numbers go into its `mask_alternatives`, and the judge weighs its dense-mask finding with them
    (`rows.join_alternatives`). An ok
    alternative row is preferred; one that was skipped or failed is named with its reason. A row joined
    before (a resumed one) is left as it is."""
    from attnprof.results.keys import cell_key

    index: dict[tuple[Any, ...], Row] = {}
    for row in rows:
        index.setdefault((row.variant, cell_key(row)), row)
    for row in rows:
        dense = _row_latency(row)
        if row.finding(DENSE_MASK) is None or dense is None or any(a.source == THIS_RUN for a in row.mask_alternatives):
            continue
        found = []
        for w in wanted(row.variant, row.mask or "causal", row.kv_len or 0, cell_key(row)):
            hits = [hit for name in w.variants if (hit := index.get((name, w.key))) is not None]
            if hits:
                best = next((hit for hit in hits if _row_latency(hit) is not None), hits[0])
                found.append(_from_row(w.kind, best, dense))
        if found:
            join_alternatives(row, found, dense)
