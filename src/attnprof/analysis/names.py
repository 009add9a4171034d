"""Decode GPU kernel names: which library wrote the kernel, what it does, and whether it runs
on tensor cores. The rules live in `kernel_names.yaml` (ordered regexes, easy to extend).

`explain_kernel(name)` never guesses: a name no rule matches is family "unknown" with
`tensor_cores` None. A fused-attention rule also names the implementation its kernel is part of (`impl`:
FA2, FA3, FA4, cuDNN's native SDPA engine with its knob, the memory-efficient kernel, flex's Triton template,
a Triton kernel); `attention_impl(names)` says which implementation served one attention call.
Short names (`short_kernel_name`) are in `analysis.short_names`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from attnprof.analysis.short_names import short_kernel_name

RULES_FILE = "kernel_names.yaml"

ARCH_NAMES = {
    "sm70": "Volta, compute capability 7.0: V100",
    "sm72": "Volta, compute capability 7.2: Xavier",
    "sm75": "Turing, compute capability 7.5: T4",
    "sm80": "Ampere, compute capability 8.0: A100",
    "sm86": "Ampere, compute capability 8.6: RTX 30, A10, A40",
    "sm87": "Ampere, compute capability 8.7: Orin",
    "sm89": "Ada Lovelace, compute capability 8.9: L4, L40, RTX 40",
    "sm90": "Hopper, compute capability 9.0: H100, H200",
    "sm100": "Blackwell, compute capability 10.0: B200",
    "sm103": "Blackwell, compute capability 10.3: B300",
    "sm120": "Blackwell, compute capability 12.0: RTX 50",
    "maxwell": "Maxwell",
    "pascal": "Pascal",
    "volta": "Volta",
    "turing": "Turing",
    "ampere": "Ampere",
    "hopper": "Hopper",
    "blackwell": "Blackwell",
}
DTYPE_NAMES = {
    "bf16": "bfloat16",
    "f16": "float16",
    "fp16": "float16",
    "f32": "float32",
    "fp32": "float32",
    "tf32": "TF32 (tensor-float 32)",
    "f64": "float64",
    "fp64": "float64",
    "fp8": "FP8",
    "f8": "FP8",
    "e4m3": "FP8 E4M3",
    "e5m2": "FP8 E5M2",
    "int8": "int8",
    "i8": "int8",
    "s8": "int8",
}
_DTYPE_TOKEN = re.compile(r"bf16|tf32|fp16|fp32|fp64|fp8|f16|f32|f64|f8|e4m3|e5m2|int8|i8|s8")


@dataclass(frozen=True)
class KernelExplanation:
    """What a kernel name says. `parts` are (token, meaning) pairs in name order."""

    name: str
    short_name: str
    family: str
    library: str | None
    meaning: str | None
    tensor_cores: bool | None
    parts: list[tuple[str, str]] = field(default_factory=list)
    rule: str | None = None
    backend: str | None = None  # the SDPA backend this kernel belongs to, when it tells
    impl: str | None = None  # the attention implementation it is part of (fused attention only)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `parts` as [{token, meaning}]."""
        data = asdict(self)
        data["parts"] = [{"token": t, "meaning": m} for t, m in self.parts]
        return data


@dataclass(frozen=True)
class _Part:
    literal: str | None
    group: str | None
    meaning: str
    values: dict[str, str] | None
    fmt: str | None


@dataclass(frozen=True)
class _Rule:
    id: str
    regex: re.Pattern[str]
    family: str
    library: str | None
    meaning: str | None
    tensor_cores: bool | None
    backend: str | None
    parts: tuple[_Part, ...]
    impl: str | None = None
    impl_detail: str | None = None


def _load_rules(text: str | None = None) -> tuple[_Rule, ...]:
    import yaml  # deferred: only `explain` and analysis need it

    if text is None:
        text = resources.files("attnprof.analysis").joinpath(RULES_FILE).read_text(encoding="utf-8")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when present: 10x faster, same objects
    data = yaml.load(text, Loader=loader) or {}
    rules = []
    for raw in data.get("rules", []):
        try:
            regex = re.compile(raw["pattern"])
        except (KeyError, re.error) as exc:
            raise ValueError(f"kernel-name rule {raw.get('id', '?')!r} has a bad pattern: {exc}") from None
        parts = tuple(
            _Part(
                literal=p.get("literal"),
                group=p.get("group"),
                meaning=str(p.get("meaning", "{decoded}")),
                values={str(k): str(v) for k, v in (p.get("values") or {}).items()} or None,
                fmt=p.get("format"),
            )
            for p in raw.get("parts") or ()
        )
        for part in parts:
            if part.group and part.group not in regex.groupindex:
                raise ValueError(f"kernel-name rule {raw['id']!r} names group {part.group!r} that its pattern lacks")
        rules.append(
            _Rule(
                id=str(raw["id"]),
                regex=regex,
                family=str(raw.get("family", "unknown")),
                library=raw.get("library"),
                meaning=raw.get("meaning"),
                tensor_cores=raw.get("tensor_cores"),
                backend=raw.get("backend"),
                parts=parts,
                impl=raw.get("impl"),
                impl_detail=raw.get("impl_detail"),
            )
        )
    return tuple(rules)


@lru_cache(maxsize=1)
def rules() -> tuple[_Rule, ...]:
    """The decoder rules from the packaged YAML file, compiled once."""
    return _load_rules()


def _format(kind: str | None, value: str) -> str:
    if kind == "arch":
        arch = value.lower()
        described = ARCH_NAMES.get(arch)
        if arch.startswith("sm"):
            return f"compiled for {arch}" + (f" ({described})" if described else "")
        return f"{described or value} architecture kernel"
    if kind == "dtype":
        names: list[str] = []
        for token in _DTYPE_TOKEN.findall(value.lower()):
            name = DTYPE_NAMES.get(token, token)
            if not names or names[-1] != name:
                names.append(name)
        return " / ".join(names) if names else value
    if kind == "ops":
        ops = [op for op in value.split("_") if op]
        return "fused ops: " + ", ".join(ops) if ops else "no op names in the kernel name"
    if kind == "words":
        return " ".join(word for word in value.split("_") if word) or value
    if kind == "nvjet-types":
        return _nvjet_types(value)
    if kind == "xmma-types":
        return _xmma_types(value)
    if kind == "cutlass-types":
        return _cutlass_types(value)
    return value


#: nvjet's one-letter element types, as seen in cuBLASLt's names (bf16 GEMMs run `tst` on the H200).
NVJET_TYPES = {"h": "float16", "s": "float32", "t": "bfloat16", "d": "float64"}


def _nvjet_types(value: str) -> str:
    """`tst`: A and B, then the accumulator, then the output (letters not in NVJET_TYPES: not decoded)."""
    if len(value) != 3 or any(ch not in NVJET_TYPES for ch in value):
        return "not decoded"
    a, acc, out = (NVJET_TYPES[ch] for ch in value)
    return f"inputs {a}, accumulated in {acc}, output {out}"


def _dtype_list(token: str) -> list[str]:
    return [DTYPE_NAMES.get(t, t) for t in _DTYPE_TOKEN.findall(token)]


def _xmma_types(value: str) -> str:
    """`bf16bf16_bf16f32_f32`: A and B, then the output and the accumulator, then the epilogue's scale type."""
    groups = [_dtype_list(part) for part in value.split("_")]
    if len(groups) != 3 or len(groups[0]) != 2 or len(groups[1]) != 2 or len(groups[2]) != 1:
        return _format("dtype", value)
    (a, b), (out, acc), (scale,) = groups
    inputs = a if a == b else f"{a} and {b}"
    return f"inputs {inputs}, output {out}, accumulated in {acc}, alpha/beta in {scale}"


def _cutlass_types(value: str) -> str:
    """`bf16_bf16_f32_bf16_bf16_`: the element types of A, B, the accumulator, C and D (`void`: no C)."""
    names = [p for p in value.split("_") if p]
    if len(names) != 5:
        return _format("dtype", value)
    labels = ("A", "B", "accumulator", "C", "D")
    return ", ".join(
        f"{label} {DTYPE_NAMES.get(n, 'none' if n == 'void' else n)}" for label, n in zip(labels, names, strict=True)
    )


def _explain_with(name: str, rule_set: tuple[_Rule, ...]) -> KernelExplanation:
    text = name.strip()
    short = short_kernel_name(text)
    for rule in rule_set:
        match = rule.regex.search(text)
        if match is None:
            continue
        parts: list[tuple[str, str]] = []
        for part in rule.parts:
            if part.literal is not None:
                if part.literal in text:
                    parts.append((part.literal, part.meaning.replace("{value}", part.literal)))
                continue
            value = match.group(part.group) if part.group else None
            if not value:
                continue
            if part.values and value in part.values:
                decoded = part.values[value]
            else:
                decoded = _format(part.fmt, value)
            parts.append((value, part.meaning.replace("{value}", value).replace("{decoded}", decoded)))
        return KernelExplanation(
            name=name,
            short_name=short,
            family=rule.family,
            library=rule.library,
            meaning=rule.meaning,
            tensor_cores=rule.tensor_cores,
            parts=parts,
            rule=rule.id,
            backend=rule.backend,
            impl=_impl(rule, match),
        )
    return KernelExplanation(
        name=name,
        short_name=short,
        family="unknown",
        library=None,
        meaning=None,
        tensor_cores=None,
        parts=[],
        rule=None,
        backend=None,
    )


_DETAIL_GROUP = re.compile(r"\{(\w+)\}")


def _impl(rule: _Rule, match: re.Match[str]) -> str | None:
    """The rule's `impl`, followed by its `impl_detail` with its groups filled when every one matched."""
    if rule.impl is None or rule.impl_detail is None:
        return rule.impl
    values = {g: match.group(g) for g in _DETAIL_GROUP.findall(rule.impl_detail) if g in rule.regex.groupindex}
    if any(not v for v in values.values()) or len(values) < len(_DETAIL_GROUP.findall(rule.impl_detail)):
        return rule.impl
    return f"{rule.impl} {_DETAIL_GROUP.sub(lambda m: values[m.group(1)], rule.impl_detail)}"


#: An attention call with no fused-attention kernel but a GEMM and a softmax: matmul, softmax, matmul.
UNFUSED = "unfused"
CUDNN_IMPL = "cuDNN"


def cudnn_version_text(raw: object) -> str | None:
    """cuDNN's version as `torch.backends.cudnn.version()` gives it (91002, or its text) written as
    `9.10.2` (8907 as `8.9.7`: cuDNN 8 had one digit less for the minor version); text already dotted is
    kept; None for anything else."""
    text = str(raw).strip() if raw is not None else ""
    if re.fullmatch(r"\d+(\.\d+){1,2}", text):
        return text
    if not text.isdigit() or int(text) <= 0:
        return None
    value = int(text)
    if value >= 90000:
        return f"{value // 10000}.{value // 100 % 100}.{value % 100}"
    return f"{value // 1000}.{value // 100 % 10}.{value % 100}"


def attention_impl(kernels: Iterable[str], cudnn_version: str | None = None) -> str | None:
    """The implementation that served one attention call, from its kernels' names (as the trace gives them):
    the `impl` of its first fused-attention kernel, cuDNN's with `cudnn_version` (e.g. "9.10.2") after
    "cuDNN" when known; else `UNFUSED` when a GEMM and a softmax ran (eager or SDPA's math backend); else
    None (no kernels, as in a CPU-only trace, or none that tells)."""
    gemm = softmax = False
    for name in kernels:
        expl = explain_kernel(name)
        if expl.impl is not None:
            if cudnn_version and expl.impl.startswith(CUDNN_IMPL + " "):
                return f"{CUDNN_IMPL} {cudnn_version}{expl.impl[len(CUDNN_IMPL) :]}"
            return expl.impl
        gemm = gemm or expl.family == "gemm"
        softmax = softmax or expl.family == "softmax" or "softmax" in expl.short_name
    return UNFUSED if gemm and softmax else None


@lru_cache(maxsize=4096)
def explain_kernel(name: str) -> KernelExplanation:
    """Decode one kernel (or memcpy/memset) name as the trace shows it."""
    return _explain_with(name, rules())
