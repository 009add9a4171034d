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
gives its reason instead. Either way the numbers go into the dense-mask finding's message and the row's
`mask_alternatives`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from attnprof.errors import VariantFailure, VariantUnavailableError
from attnprof.masks import SIZED_KINDS, Mask, parse_mask
from attnprof.pipeline.cell import guard, phase, warning_lines
from attnprof.registry import RunSpec, Variant
from attnprof.results import CellResult, MaskAlternative

if TYPE_CHECKING:
    from attnprof.config import Config, MeasureOptions

DENSE_MASK = "dense-mask"  # the finding whose message names the alternative
IS_CAUSAL = "is_causal"
BLOCK_MASK = "block-mask"
#: Who runs `is_causal`, after the dense cell's own variant when it is one of them.
IS_CAUSAL_VARIANTS = ("sdpa", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math")
BLOCK_MASK_VARIANT = "flex"
THIS_RUN = "this run"
MEASURED = "measured for comparison"
#: At most this much timed time for an alternative measured for comparison (less when the cells use less).
SHORT_S = 0.1
KIND_TEXT = {IS_CAUSAL: "SDPA with is_causal=True", BLOCK_MASK: "FlexAttention with a BlockMask"}
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
    """The latency of an ok cell whose trace shows `dense-mask`, else None."""
    if not result.ok or result.analysis is None or result.analysis.finding(DENSE_MASK) is None:
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
        `result.mask_alternatives` and its dense-mask finding."""
        dense = dense_mask_latency(result)
        todo = self.missing(result)
        if dense is None or not todo or not measure.timing:
            return
        with phase(result, "mask_alternative"), warnings.catch_warnings(record=True) as caught:
            found = [_measured(w, result.spec, dense, config, measure) for w in todo]
        result.warnings += [line for line in warning_lines(caught) if line not in result.warnings]
        result.mask_alternatives += found
        _amend_result(result, found, dense)


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
    with at most SHORT_S of timed calls; nothing profiled. Raises VariantFailure or VariantUnavailableError."""
    import torch

    from attnprof.profiling.inputs import make_inputs
    from attnprof.profiling.steps import build_step, graph_retention
    from attnprof.profiling.timing import TimingOptions, time_forward

    options = TimingOptions.from_measure(measure)
    options = replace(options, min_time_s=min(options.min_time_s, SHORT_S))
    with guard("the dense mask's alternative", variant):
        q, k, v = make_inputs(spec, config.seed, variant.layout)
        state = variant.setup(spec) if variant.setup is not None else None

        def forward(q: Any, k: Any, v: Any) -> Any:
            return variant.forward(q, k, v, spec.causal, state)

        with torch.no_grad(), graph_retention(spec.mode):
            step = build_step(spec, forward, (q, k, v), config.seed, variant.repeatable_backward)
            return time_forward(step.call, spec.device, options, prepare=step.prepare).median_us


def sentence(alt: MaskAlternative, dense_us: float) -> str:
    """What the alternative took, against the dense cell's `dense_us`, in one sentence."""
    from attnprof.analysis.findings.registry import us

    what = f"{KIND_TEXT[alt.kind]} ({alt.variant} at {alt.cell})"
    if alt.latency_us is None or alt.latency_us <= 0:
        if alt.source == THIS_RUN:
            return f"{what} did not run in this run: {alt.reason}."
        return f"{what} could not be measured for comparison here: {alt.reason}."
    how = "a cell of this run" if alt.source == THIS_RUN else "measured for comparison, outside the profiled region"
    ratio = dense_us / alt.latency_us
    relative = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
    return f"{what} takes {us(alt.latency_us)} ({how}) against this cell's {us(dense_us)}: {relative}."


def amended(message: str, alternatives: list[MaskAlternative], dense_us: float) -> str:
    """The dense-mask message with a sentence per alternative after it."""
    return " ".join([message, *(sentence(a, dense_us) for a in alternatives)])


def saved_by(alternatives: list[MaskAlternative], dense_us: float) -> tuple[float, float] | None:
    """What the fastest measured alternative would save per call: (µs, % of the dense cell's latency);
    None when none ran, or none is faster."""
    times = [a.latency_us for a in alternatives if a.latency_us is not None]
    if not times or min(times) >= dense_us:
        return None
    saved = dense_us - min(times)
    return saved, 100.0 * saved / dense_us


def _measured_impact(finding: Any, alternatives: list[MaskAlternative], dense_us: float) -> dict[str, Any]:
    """The dense-mask finding's message with the alternatives' sentences and, where one is faster, the
    time it would save as its impact (the conversion kernels' time is only part of what the mask costs)."""
    fields: dict[str, Any] = {"message": amended(finding.message, alternatives, dense_us)}
    saved = saved_by(alternatives, dense_us)
    if saved is not None:
        fields["impact_us"], fields["impact_pct"] = saved
    return fields


def _amend_result(result: CellResult, found: list[MaskAlternative], dense: float) -> None:
    analysis = result.analysis
    if analysis is None or not found:
        return
    analysis.findings = [
        replace(f, **_measured_impact(f, found, dense)) if f.id == DENSE_MASK else f for f in analysis.findings
    ]


def _row_finding(row: dict[str, Any]) -> dict[str, Any] | None:
    return next((f for f in row.get("findings") or [] if isinstance(f, dict) and f.get("id") == DENSE_MASK), None)


def _row_latency(row: dict[str, Any]) -> float | None:
    value = row.get("latency_us")
    if row.get("status") != "ok" or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


def _from_row(kind: str, row: dict[str, Any], dense: float) -> MaskAlternative:
    latency = _row_latency(row)
    if latency is None:
        reason = row.get("reason") or str(row.get("status"))
        return MaskAlternative(kind, str(row["variant"]), str(row.get("shape")), THIS_RUN, reason=reason)
    return MaskAlternative(kind, str(row["variant"]), str(row.get("shape")), THIS_RUN, latency, dense / latency)


def attach_row_alternatives(rows: list[dict[str, Any]], results: list[CellResult] | None = None) -> None:
    """Join each dense-mask row with its alternatives among `rows` (the whole run's, after it): their
    numbers go into its `mask_alternatives` and its dense-mask finding's message, and into that finding
    on the matching `results` (this process's cells, which `run` prints). An ok alternative row is
    preferred; one that was skipped or failed is named with its reason. A row joined before (a resumed
    one) is left as it is."""
    from attnprof.report.serialize import row_cell_key

    index: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        index.setdefault((row.get("variant"), row_cell_key(row)), row)
    for row in rows:
        finding, dense = _row_finding(row), _row_latency(row)
        known = row.get("mask_alternatives") or []
        if finding is None or dense is None or any(a.get("source") == THIS_RUN for a in known):
            continue
        key = row_cell_key(row)
        found = []
        for w in wanted(str(row["variant"]), str(row.get("mask") or "causal"), int(row.get("kv_len") or 0), key):
            hits = [hit for name in w.variants if (hit := index.get((name, w.key))) is not None]
            if hits:
                best = next((hit for hit in hits if _row_latency(hit) is not None), hits[0])
                found.append(_from_row(w.kind, best, dense))
        if found:
            row["mask_alternatives"] = known + [a.to_dict() for a in found]
            finding["message"] = amended(str(finding["message"]), found, dense)
            saved = saved_by(found, dense)
            if saved is not None:
                finding["impact_us"], finding["impact_pct"] = round(saved[0], 3), round(saved[1], 2)
            _sync(results or [], row, key, finding)


def _sync(results: list[CellResult], row: dict[str, Any], key: tuple[Any, ...], finding: dict[str, Any]) -> None:
    """Give this process's result of `row` the row's dense-mask finding (message and impact)."""
    for result in results:
        rank = result.placement.rank if result.placement is not None else None
        if (result.variant, result.spec.cell_key, rank) != (row.get("variant"), key, row.get("rank")):
            continue
        if result.analysis is not None:
            fields = {k: finding[k] for k in ("message", "impact_us", "impact_pct") if k in finding}
            result.analysis.findings = [
                replace(f, **fields) if f.id == DENSE_MASK else f for f in result.analysis.findings
            ]
