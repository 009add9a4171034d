"""Match the region's `gpu_user_annotation` ranges (Kineto writes one per stream) to each forward,
and count where they disagree with the device work correlated to it.

A forward's annotations are those with its `External id`; without ids, per stream, the unused
annotation that overlaps the forward's work most. Disagreements are counted, never fatal.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from itertools import compress
from operator import add
from typing import TYPE_CHECKING

from attnprof.analysis.base import EPS

if TYPE_CHECKING:
    from attnprof.analysis.attribution.forward import Forward
    from attnprof.analysis.trace.tables import DeviceTable, ParsedTrace


def attach_gpu_annotations(trace: ParsedTrace, forwards: list[Forward], name_ids: set[int]) -> bool:
    """Set `gpu_annotations` and `annotation_mismatches` of each forward; False when the trace has
    no GPU annotation of the region (the forwards are left as they are)."""
    gann, dev = trace.gpu_annotations, trace.device
    rows = [i for i, n in enumerate(gann.name) if n in name_ids]
    if not rows:
        return False
    by_ext: dict[int, list[int]] = defaultdict(list)
    for i in rows:
        if gann.ext[i] >= 0:
            by_ext[gann.ext[i]].append(i)
    # Without External ids: per stream, the unused annotation that overlaps the forward's work most.
    ann_by_stream: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i in rows:
        ann_by_stream[(gann.device[i], gann.stream[i])].append(i)
    for idx in ann_by_stream.values():
        idx.sort(key=gann.ts.__getitem__)
    ann_starts = {key: [gann.ts[i] for i in idx] for key, idx in ann_by_stream.items()}
    used: set[int] = set()
    for fwd in forwards:
        matched = by_ext.get(fwd.ext, []) if fwd.ext >= 0 else []
        if not matched and fwd.device:
            spans: dict[tuple[int, int], tuple[float, float]] = {}
            for e in fwd.device:
                key = (dev.device[e], dev.stream[e])
                lo, hi = spans.get(key, (dev.ts[e], dev.ts[e] + dev.dur[e]))
                spans[key] = (min(lo, dev.ts[e]), max(hi, dev.ts[e] + dev.dur[e]))
            matched = []
            for key, (lo, hi) in spans.items():
                idx, st = ann_by_stream.get(key, []), ann_starts.get(key, [])
                best, best_overlap = None, EPS
                for i in idx[max(bisect_left(st, lo) - 2, 0) : bisect_right(st, hi + EPS)]:
                    overlap = min(hi, gann.ts[i] + gann.dur[i]) - max(lo, gann.ts[i])
                    if i not in used and overlap > best_overlap:
                        best, best_overlap = i, overlap
                if best is not None:
                    matched.append(best)
        fwd.gpu_annotations = sorted(matched, key=gann.ts.__getitem__)
        used.update(matched)

    # Cross-check: the device work inside a forward's GPU annotations (on their streams)
    # against the work correlated to the forward.
    streams = _streams(dev)
    for fwd in forwards:
        if not fwd.gpu_annotations:
            fwd.annotation_mismatches = len(fwd.device) - len(fwd.backward_device)
            continue
        inside: set[int] = set()
        for a in fwd.gpu_annotations:
            idx, starts, ends = streams.get((gann.device[a], gann.stream[a]), ([], [], []))
            end = gann.ts[a] + gann.dur[a] + EPS
            lo, hi = bisect_left(starts, gann.ts[a] - EPS), bisect_right(starts, end)
            if lo < hi and max(ends[lo:hi]) <= end:  # all of them (the common case)
                inside.update(idx[lo:hi])
            else:
                inside.update([i for i, e in zip(idx[lo:hi], ends[lo:hi], strict=True) if e <= end])
        if fwd.backward_device:  # Kineto's annotation covers the forward phase only
            inside -= fwd.backward_device
            fwd.annotation_mismatches = len(inside.symmetric_difference(set(fwd.device) - fwd.backward_device))
        else:
            fwd.annotation_mismatches = len(inside.symmetric_difference(fwd.device))
    return True


def _streams(dev: DeviceTable) -> dict[tuple[int, int], tuple[list[int], list[float], list[float]]]:
    """Per (device, stream): its device events by start, with their starts and ends."""
    keys = set(zip(dev.device, dev.stream, strict=True))
    rows: dict[tuple[int, int], list[int]] = defaultdict(list)
    if len(keys) <= 8:  # a few streams: one C-level pass each
        for key in keys:
            rows[key] = list(compress(range(len(dev)), map(key.__eq__, zip(dev.device, dev.stream, strict=True))))
    else:
        for i, key in enumerate(zip(dev.device, dev.stream, strict=True)):
            rows[key].append(i)
    streams = {}
    for key, idx in rows.items():
        idx.sort(key=dev.ts.__getitem__)
        starts = list(map(dev.ts.__getitem__, idx))
        streams[key] = (idx, starts, list(map(add, starts, map(dev.dur.__getitem__, idx))))
    return streams
