"""Findings: one sentence each, with the numbers and op names that prove it.

Every finding is computed from evidence in the trace (or the dtype hint); when the evidence is
missing the finding is simply absent. Ids are a stable JSON contract:

- ``hidden-memcpy``          device-to-device memcpy inside the forward, with the op chain that caused it
- ``fp32-cuda-cores``        GEMMs on FP32 CUDA cores (no tensor cores) while the inputs are 16-bit
- ``mask-rebuilt``           the causal mask is built again in every forward (ones/tril/triu/where/scalar_tensor)
- ``safe-softmax``           ``aten::_safe_softmax`` and the kernels it launched
- ``single-fused-kernel``    exactly one kernel per forward, and it is a fused attention kernel
- ``low-occupancy-by-design``  theoretical occupancy <= 25% because of registers or shared memory
- ``occupancy-unreported``   a kernel whose reported occupancy is 0 or missing, with the likely cause
- ``cpu-bound``              CPU time per forward > GPU time per forward (the CPU time without the wait
                             inside the autograd engine, on a training step)
- ``metadata-transposes``    ``aten::transpose`` ops that launch no kernel
- ``comm-exposed``           communication time (NCCL kernels) that no compute hides exceeds
                             `COMM_EXPOSED_SHARE` of the forward's GPU time (see `analysis.comm`)

plus the backward findings of `analysis.backward_findings` (``bwd-dot-do-o``, ``bwd-dq-convert``,
``bwd-memsets``, ``grad-accumulation``) and the ledger's of `analysis.ledger_findings` (``host-sync``,
``gpu-idle``, ``attention-overhead``). ``single-fused-kernel`` counts both phases: a training
step with a backward is never one kernel.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from attnprof.analysis.findings.backward import BACKWARD_FINDING_IDS, backward_findings
from attnprof.analysis.findings.ledger import LEDGER_FINDING_IDS, ledger_findings
from attnprof.analysis.instance.ledger import AttentionLedger
from attnprof.analysis.instance.metrics import MASK_OPS, SAFE_SOFTMAX, SIXTEEN_BIT, ForwardMetrics, KernelStats
from attnprof.stats import median_count

FINDING_IDS = (
    "hidden-memcpy",
    "fp32-cuda-cores",
    "mask-rebuilt",
    "safe-softmax",
    "single-fused-kernel",
    "low-occupancy-by-design",
    "occupancy-unreported",
    "cpu-bound",
    "metadata-transposes",
    "comm-exposed",
    *BACKWARD_FINDING_IDS,
    *LEDGER_FINDING_IDS,
)
MASK_CORE = frozenset({"aten::tril", "aten::triu"})
LOW_OCCUPANCY_PCT = 25.0
#: `comm-exposed` fires when the exposed communication time per forward exceeds this share of its GPU time.
COMM_EXPOSED_SHARE = 0.10
DTYPE_LABEL = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64", "fp8": "fp8"}


@dataclass(frozen=True)
class Finding:
    """One finding: a stable id and the sentence that states it."""

    id: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        """{"id", "message"}."""
        return asdict(self)


@dataclass
class FindingContext:
    """What the findings read: per-forward metrics, per-kernel statistics and the analysis' totals."""

    per_forward: list[ForwardMetrics]
    kernels: list[KernelStats]
    dtype: str | None
    dtype_source: str | None
    cpu_time_us: float
    gpu_time_us: float | None
    cpu_work_us: float | None = None  # cpu_time_us without the wait inside the autograd engine
    comm: Any = None  # analysis.comm.CommStats, or None without communication
    attention: AttentionLedger | None = None  # the ledger over the instances (None: CPU-only trace)

    unit: str = "forward"  # what one instance is called: "step" with backward work (see phases.instance_unit)

    def every(self, k: int, n: int | None = None) -> str:
        """ "every step" when `k` is all `n` instances (default: all of them), else "k of n steps"."""
        n = len(self.per_forward) if n is None else n
        return f"every {self.unit}" if k == n else f"{k} of {n} {self.unit}s"


def _us(value: float) -> str:
    return f"{value:,.1f} us"


def _times(count: int) -> str:
    return f" x{count}" if count else ""


def _list(items: list[str], limit: int = 4) -> str:
    shown = items[:limit]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(shown) + more


def build_findings(ctx: FindingContext) -> list[Finding]:
    """All findings the evidence supports, in a stable order."""
    found = []
    for rule in (
        _hidden_memcpy,
        _fp32_cuda_cores,
        _mask_rebuilt,
        _safe_softmax,
        _single_fused_kernel,
        _low_occupancy,
        _occupancy_unreported,
        _cpu_bound,
        _metadata_transposes,
        _comm_exposed,
    ):
        finding = rule(ctx)
        if finding is not None:
            found.append(finding)
    found += [Finding(fid, message) for fid, message in backward_findings(ctx)]
    found += [Finding(fid, message) for fid, message in ledger_findings(ctx)]
    return found


def _hidden_memcpy(ctx: FindingContext) -> Finding | None:
    counts = [m.dtod_memcpy or 0 for m in ctx.per_forward]
    with_copy = sum(1 for c in counts if c)
    if not with_copy:
        return None
    copies = [k for k in ctx.kernels if k.is_dtod_memcpy]
    if not copies:
        return None
    copy = max(copies, key=lambda k: k.time_us)
    per_forward = max(median_count([c for c in counts if c]), 1)
    chain = copy.launch_ops[0] if copy.launch_ops else None
    if chain:
        cause = f"caused by {chain}"
        ops = chain.split(" → ")
        out_of_place = not ops[0].endswith("_") and not ops[0].startswith("autograd::")  # not a backward op
        if out_of_place and any(op in ("aten::clone", "aten::copy_") for op in ops[1:]):
            cause += f" (the out-of-place {ops[0]} copies its input before writing)"
    else:
        cause = "launched directly inside the region, under no ATen op"
    who = ctx.every(with_copy, len(counts)).capitalize() + (" runs" if with_copy == len(counts) else " run")
    return Finding(
        "hidden-memcpy",
        f"{who} {per_forward} device-to-device memcpy ({copy.short_name}, {_us(copy.time_us)}), {cause}.",
    )


def _fp32_cuda_cores(ctx: FindingContext) -> Finding | None:
    if ctx.dtype not in SIXTEEN_BIT:
        return None
    gemms = [k for k in ctx.kernels if k.kind == "kernel" and k.family == "gemm" and k.tensor_cores is False]
    if not gemms:
        return None
    n = sum(k.count_per_forward for k in gemms)
    placed = _gemm_placement(ctx, gemms)
    inside = {backend for _, backend, _ in placed or () if backend}
    if placed is not None and len(inside) == 1 and all(where == "inside" for where, _, _ in placed):
        shown = f"{_list([k.short_name for k in gemms], 2)}; all inside the attention calls ({inside.pop()})"
    elif placed is not None:
        pairs = zip(gemms, placed, strict=True)
        shown = _list([f"{k.short_name}{_times(k.count_per_forward)} {text}" for k, (_, _, text) in pairs], 2)
    else:
        shown = _list([k.short_name for k in gemms], 2)
    if n:
        lead = f"{n} GEMM kernel(s) per {ctx.unit} run"
    else:  # each ran in fewer than half of the forwards: their counts per forward are 0
        lead = f"In {ctx.every(max(k.forwards_run for k in gemms))}, GEMM kernels ran"
    message = (
        f"{lead} in FP32 on CUDA cores, without tensor cores ({shown}), although "
        f"the inputs are {DTYPE_LABEL.get(ctx.dtype, ctx.dtype)} ({ctx.dtype_source})"
    )
    upcasts = _upcasts_per_forward(ctx)
    if upcasts:
        count, how = upcasts
        message += (
            f"; {count} upcast cop{'y' if count == 1 else 'ies'} per {ctx.unit} ({how}) turn 16-bit tensors into FP32"
        )
    return Finding("fp32-cuda-cores", message + ".")


def _gemm_placement(ctx: FindingContext, gemms: list[KernelStats]) -> list[tuple[str, str, str]] | None:
    """For each GEMM: where its launches ran with respect to the attention calls the ledger found
    ("inside", "outside" or "partly", over all instances), their backends, and that said in words
    with the op chain that launched it most often; None without the ledger."""
    if ctx.attention is None:
        return None
    wanted = {k.name for k in gemms}
    backends: dict[str, Counter] = {name: Counter() for name in wanted}
    wanted_ids: set[int] | None = None  # their name ids in the trace's names (the calls' `names`)
    for m in ctx.per_forward:
        for call in m.attention.calls if m.attention is not None else ():
            if wanted_ids is None:
                wanted_ids = {n for n, name in enumerate(call.names) if name in wanted}
            if wanted_ids.isdisjoint(call.kernel_ids):
                continue
            for nid in call.kernel_ids:
                if nid in wanted_ids:
                    backends[call.names[nid]][call.backend] += 1
    placed = []
    for k in gemms:
        ran_inside = sum(backends[k.name].values())
        backend = ", ".join(sorted(backends[k.name], key=lambda b: -backends[k.name][b]))
        chain = f", launched by {k.launch_ops[0]}" if k.launch_ops else ""
        if ran_inside == 0:
            placed.append(("outside", backend, f"outside the attention calls{chain}"))
        elif ran_inside >= k.total_count:
            placed.append(("inside", backend, f"inside the attention calls ({backend})"))
        else:
            text = f"{ran_inside} of its {k.total_count} runs inside the attention calls ({backend}), the rest outside"
            placed.append(("partly", backend, text + chain))
    return placed


def _upcasts_per_forward(ctx: FindingContext) -> tuple[int, str] | None:
    count = median_count([m.upcasts for m in ctx.per_forward])
    if not count:
        return None
    typed = any(m.upcast_types_known for m in ctx.per_forward)
    return count, ("aten::to → aten::_to_copy from 16-bit" if typed else "aten::to/aten::_to_copy")


def _mask_rebuilt(ctx: FindingContext) -> Finding | None:
    if not ctx.per_forward or any(not any(m.mask_ops[name] for name in MASK_CORE) for m in ctx.per_forward):
        return None  # the mask is not built in every forward
    kernel_counts: list[int] = []
    kernel_names: Counter[str] = Counter()
    for m in ctx.per_forward:
        if m.mask_kernels is not None:
            kernel_counts.append(len(m.mask_kernels))
            kernel_names.update(m.mask_kernels)
    per_op = {name: median_count([m.mask_ops[name] for m in ctx.per_forward]) for name in MASK_OPS}
    listed = ", ".join(f"{name} x{n}" for name, n in per_op.items() if n)
    message = f"Every {ctx.unit} builds the attention mask again: {listed} per {ctx.unit}"
    if kernel_counts and median_count(kernel_counts):
        message += (
            f", launching {median_count(kernel_counts)} kernels "
            f"({_list(sorted(kernel_names, key=lambda k: -kernel_names[k]), 4)})"
        )
    return Finding("mask-rebuilt", message + ".")


def _safe_softmax(ctx: FindingContext) -> Finding | None:
    with_op, kernel_counts, kernel_names = 0, [], []
    for m in ctx.per_forward:
        if not m.op_counts.get(SAFE_SOFTMAX):
            continue
        with_op += 1
        if m.safe_softmax_kernels is not None:
            kernel_counts.append(len(m.safe_softmax_kernels))
            for name in m.safe_softmax_kernels:
                if name not in kernel_names:
                    kernel_names.append(name)
    if not with_op:
        return None
    message = f"aten::_safe_softmax runs in {ctx.every(with_op)}"
    if kernel_counts and median_count(kernel_counts):
        message += (
            f" and launches {median_count(kernel_counts)} kernels ({_list(kernel_names, 5)}); "
            "beyond the softmax itself they find fully masked rows and write 0 there instead of NaN"
        )
    else:
        message += ", guarding fully masked rows against NaN with extra ops"
    return Finding("safe-softmax", message + ".")


def _single_fused_kernel(ctx: FindingContext) -> Finding | None:
    counts = [m.kernels for m in ctx.per_forward]
    if not counts or any(c != 1 for c in counts):
        return None
    kernels = [k for k in ctx.kernels if k.kind == "kernel"]
    if len(kernels) != 1:
        return None
    kernel = kernels[0]
    if kernel.family != "fused-attention":
        return None
    library = f", {kernel.library}" if kernel.library else ""
    return Finding(
        "single-fused-kernel",
        f"Each {ctx.unit} runs exactly one kernel, the fused attention kernel {kernel.short_name} "
        f"({_us(kernel.time_us)}{library}).",
    )


def _low_occupancy(ctx: FindingContext) -> Finding | None:
    low = [
        k
        for k in ctx.kernels
        if k.theoretical_occupancy_pct is not None
        and k.theoretical_occupancy_pct <= LOW_OCCUPANCY_PCT
        and k.occupancy_limiter in ("registers", "shared memory")
        and k.family in ("fused-attention", "gemm")
    ]
    if not low:
        return None
    low.sort(key=lambda k: -k.time_us)
    top = low[0]
    message = (
        f"{top.short_name} has {top.theoretical_occupancy_pct:g}% theoretical occupancy, limited by "
        f"{top.occupancy_limiter} ({top.occupancy_arithmetic}): heavy blocks that keep tiles on chip, by design"
    )
    if len(low) > 1:
        message += f"; {_list([f'{k.short_name} {k.theoretical_occupancy_pct:g}%' for k in low[1:]], 2)} likewise"
    return Finding("low-occupancy-by-design", message + ".")


def _occupancy_unreported(ctx: FindingContext) -> Finding | None:
    flagged = [
        k
        for k in ctx.kernels
        if k.kind == "kernel"
        and k.achieved_occupancy_pct is None
        and k.occupancy_note
        and not k.occupancy_note.startswith(("its grid", "the trace has no occupancy"))
    ]
    if not flagged:
        return None
    flagged.sort(key=lambda k: -k.time_us)
    top = flagged[0]
    message = f"{top.short_name} reports 0% achieved occupancy; likely cause: {top.occupancy_note}"
    if top.theoretical_occupancy_pct is not None:
        message += f"; its theoretical occupancy is {top.theoretical_occupancy_pct:g}% ({top.occupancy_arithmetic})"
    if len(flagged) > 1:
        message += f"; {_list([k.short_name for k in flagged[1:]], 3)} too"
    return Finding("occupancy-unreported", message + ".")


def _cpu_bound(ctx: FindingContext) -> Finding | None:
    cpu = ctx.cpu_time_us if ctx.cpu_work_us is None else ctx.cpu_work_us
    if ctx.gpu_time_us is None or cpu <= ctx.gpu_time_us:
        return None
    launches = median_count([sum(m.launch_apis.values()) for m in ctx.per_forward])
    ops = median_count([m.cpu_ops for m in ctx.per_forward])
    unit = ctx.unit
    what = f"CPU time per {unit}"
    if abs(cpu - ctx.cpu_time_us) > 1e-6:
        what += (
            f" ({_us(cpu)}: the region's {_us(ctx.cpu_time_us)} without its wait inside the autograd engine, "
            "plus the backward ops' CPU time)"
        )
    else:
        what += f" ({_us(cpu)})"
    return Finding(
        "cpu-bound",
        f"{what} exceeds GPU time per {unit} ({_us(ctx.gpu_time_us)}, {cpu / ctx.gpu_time_us:.1f}x): "
        + (
            f"the GPU waits while the CPU runs {ops} ops and {launches} launch calls."
            if ops
            else f"the GPU waits while the CPU makes {launches} launch calls (its ops ran on other threads)."
        ),
    )


def _metadata_transposes(ctx: FindingContext) -> Finding | None:
    if any(m.metadata_transposes is None for m in ctx.per_forward):
        return None  # no CUDA trace: launching or not is unknown
    n = median_count([m.metadata_transposes or 0 for m in ctx.per_forward])
    if not n:
        return None
    parents: Counter = Counter()
    for m in ctx.per_forward:
        if m.metadata_transpose_parents:
            parents.update(m.metadata_transpose_parents)
    where = parents.most_common(1)[0][0] if parents else "the region"
    return Finding(
        "metadata-transposes",
        f"{n} aten::transpose op{'s' if n != 1 else ''} per {ctx.unit} launch no kernel (they only "
        f"rewrite strides, mostly under {where}).",
    )


def _comm_exposed(ctx: FindingContext) -> Finding | None:
    comm = ctx.comm
    if comm is None or comm.exposed_us is None or not ctx.gpu_time_us:
        return None
    share = comm.exposed_us / ctx.gpu_time_us
    if share <= COMM_EXPOSED_SHARE:
        return None
    hidden = "n/a" if comm.overlap_pct is None else f"{comm.overlap_pct:.0f}%"
    return Finding(
        "comm-exposed",
        f"{comm.kernels_per_forward} communication kernel(s) per {ctx.unit} ({_list(comm.kernels, 2)}) run for "
        f"{_us(comm.comm_time_us or 0.0)}, {hidden} of it under compute on another stream: {_us(comm.exposed_us)} "
        f"exposed, {100 * share:.0f}% of the {ctx.unit}'s {_us(ctx.gpu_time_us)} GPU time "
        f"(limit {100 * COMM_EXPOSED_SHARE:.0f}%).",
    )
