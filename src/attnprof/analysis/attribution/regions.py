"""Which region of a trace marks one forward: the names `--region` accepts, glob patterns, and the
choice made when the user named none.

A string that is exactly a name in the trace selects that name; otherwise a string with `*`, `?` or `[`
selects every name it matches (fnmatch, case-sensitive), so `ProfilerStep#*` makes each profiler step one
forward. `choose_region` picks a region when the user named none; a trace with no annotation and no
profiler step is analysed as one window (`WHOLE_TRACE`).
"""

from __future__ import annotations

from collections import Counter
from fnmatch import fnmatchcase

from attnprof.analysis.trace.tables import ParsedTrace
from attnprof.errors import TraceError
from attnprof.registry import DEFAULT_REGION

STEP_PREFIX = "ProfilerStep#"
STEP_FAMILY = "ProfilerStep#*"  # the --region that makes each profiler step one forward
#: The region of a trace without annotations or profiler steps: one window over its busiest thread.
WHOLE_TRACE = "(whole trace)"
_GLOB_CHARS = frozenset("*?[")
_LISTED = 5  # names an error or note lists before "and N more"


def _step_like(name: str) -> str:
    return STEP_FAMILY if name.startswith(STEP_PREFIX) else name


def _listed(names: list[str]) -> str:
    """`'a', 'b', 'c'`, cut after _LISTED names with "and N more"."""
    text = ", ".join(repr(n) for n in names[:_LISTED])
    return text + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")


def region_counts(trace: ParsedTrace) -> Counter[str]:
    """The strings `--region` accepts, with how many CPU ranges each selects: every
    record_function name in the trace, with all `ProfilerStep#N` counted under `ProfilerStep#*`
    (also where an older profiler wrote the steps as cpu_ops)."""
    names = trace.names
    counts: Counter[str] = Counter(_step_like(names[n]) for n in trace.annotations.name)
    if STEP_FAMILY not in counts:
        steps = sum(1 for n in trace.cpu_ops.name if names[n].startswith(STEP_PREFIX))
        if steps:
            counts[STEP_FAMILY] = steps
    return counts


def resolve_region(trace: ParsedTrace, region: str) -> set[int]:
    """The ids (into `trace.names`) of the names `region` selects: itself when it is a name in the
    trace, else, when it holds `*`, `?` or `[`, every name the glob pattern matches."""
    names = trace.names
    if region in names or not _GLOB_CHARS.intersection(region):
        return {i for i, n in enumerate(names) if n == region}
    return {i for i, n in enumerate(names) if fnmatchcase(n, region)}


def choose_region(trace: ParsedTrace) -> tuple[str, str]:
    """The region to analyse when none was named, and why (one line, for the user).

    attnprof's own region when the trace has it; else the one user annotation (ignoring
    `ProfilerStep#N`) when there is exactly one name; else the profiler steps; else, when the trace
    has no annotation at all, the whole trace as one window (`WHOLE_TRACE`). Raises TraceError when
    there are several user annotations and no steps.
    """
    counts = region_counts(trace)
    names = trace.names
    if counts.get(DEFAULT_REGION) or any(names[n] == DEFAULT_REGION for n in set(trace.cpu_ops.name)):
        return DEFAULT_REGION, f"no --region: using {DEFAULT_REGION!r}, the region attnprof writes"
    users = [name for name, _ in counts.most_common() if name != STEP_FAMILY]
    if len(users) == 1:
        return users[0], f"no --region: using {users[0]!r}, the only user annotation"
    if STEP_FAMILY in counts:
        others = (
            f"{len(users)} user annotations: {_listed(users)}; pass one with --region"
            if users
            else "no user annotations"
        )
        return STEP_FAMILY, f"no --region: using the profiler steps {STEP_FAMILY!r} ({others})"
    if users:
        raise TraceError(
            f"no --region and no single region to choose: {len(users)} user annotations "
            f"({_listed(users)}) and no ProfilerStep#N ranges",
            hint=f"pass one of these with --region: {_listed(users)}",
        )
    return WHOLE_TRACE, (
        "no --region: the trace has no record_function annotations and no ProfilerStep#N ranges, so it is "
        "analysed as one window (wrap each forward in record_function(NAME), or call prof.step() after each, "
        "for per-forward figures)"
    )


def missing_region_error(trace: ParsedTrace, region: str) -> TraceError:
    """The one-line error for a region the trace lacks, with what `--region` would accept."""
    names = trace.names
    accepted = region_counts(trace)
    counts = Counter(accepted)
    gpu_only = Counter(_step_like(names[n]) for n in trace.gpu_annotations.name)
    for name, n in gpu_only.items():  # a name seen only on the GPU side still helps the user
        counts.setdefault(name, n)
    if counts:
        listed = ", ".join(f"{name!r} ({n})" for name, n in counts.most_common(_LISTED))
        more = f" and {len(counts) - _LISTED} more" if len(counts) > _LISTED else ""
        hint = (
            f"pass one of these with --region: {_listed([name for name, _ in accepted.most_common()])}"
            if accepted
            else "pass the record_function name that wraps one forward with --region"
        )
        return TraceError(f"region {region!r} not found in the trace; annotations present: {listed}{more}", hint=hint)
    return TraceError(
        f"region {region!r} not found: the trace has no record_function annotations",
        hint="wrap each forward in torch.profiler.record_function(NAME)",
    )
