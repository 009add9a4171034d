"""A stand-in for nvidia-cudnn-frontend's `cudnn` module: the graph-API calls the plugin makes, recorded, and
`execute` computing what cuDNN's SDPA nodes compute with torch (float64), on any device. Enough for CPU tests
of registration, checks, graph building and the forward/backward data flow; never a cuDNN."""

from __future__ import annotations

import math
import types
from dataclasses import dataclass, field
from typing import Any

import torch

data_type = types.SimpleNamespace(
    BFLOAT16="BFLOAT16", HALF="HALF", FLOAT="FLOAT", FP8_E4M3="FP8_E4M3", FP8_E5M2="FP8_E5M2", INT32="INT32"
)
heur_mode = types.SimpleNamespace(A="A", B="B", FALLBACK="FALLBACK")
TORCH = {"BFLOAT16": torch.bfloat16, "HALF": torch.float16, "FLOAT": torch.float32, "FP8_E4M3": torch.float8_e4m3fn}

handles: list[Any] = []
streams: list[Any] = []
graphs: list[Graph] = []


def create_handle() -> object:
    handle = object()
    handles.append(handle)
    return handle


def set_stream(handle: Any, stream: Any) -> None:
    streams.append((handle, stream))


@dataclass(eq=False)
class Tensor:
    name: str
    dim: list[int] | None = None
    stride: list[int] | None = None
    data_type: str | None = None
    output: bool = False

    def set_output(self, value: bool) -> Tensor:
        self.output = value
        return self

    def set_dim(self, dim: list[int]) -> Tensor:
        self.dim = list(dim)
        return self

    def set_stride(self, stride: list[int]) -> Tensor:
        self.stride = list(stride)
        return self

    def set_data_type(self, value: str) -> Tensor:
        self.data_type = value
        return self


@dataclass(eq=False)
class Graph:
    io_data_type: str
    intermediate_data_type: str
    compute_data_type: str
    handle: Any = None
    calls: list[str] = field(default_factory=list)
    node: tuple[str, dict[str, Any], tuple[Tensor, ...]] | None = None
    executions: int = 0

    def tensor(self, name: str, dim: list[int], stride: list[int], data_type: str) -> Tensor:
        return Tensor(name, list(dim), list(stride), data_type)

    def _node(self, kind: str, outputs: int, kwargs: dict[str, Any]) -> tuple[Tensor, ...]:
        assert self.node is None, "one SDPA node per graph"
        made = tuple(Tensor(f"{kind}_out{i}") for i in range(outputs))
        self.node = (kind, kwargs, made)
        self.calls.append(kind)
        return made

    def sdpa(self, **kwargs: Any) -> tuple[Tensor, ...]:
        return self._node("sdpa", 2, kwargs)

    def sdpa_backward(self, **kwargs: Any) -> tuple[Tensor, ...]:
        return self._node("sdpa_backward", 3, kwargs)

    def sdpa_fp8(self, **kwargs: Any) -> tuple[Tensor, ...]:
        return self._node("sdpa_fp8", 4, kwargs)

    def sdpa_fp8_backward(self, **kwargs: Any) -> tuple[Tensor, ...]:
        return self._node("sdpa_fp8_backward", 7, kwargs)

    def validate(self) -> None:
        self.calls.append("validate")

    def build_operation_graph(self) -> None:
        self.calls.append("build_operation_graph")

    def create_execution_plans(self, modes: list[str]) -> None:
        self.calls.append(f"create_execution_plans({','.join(modes)})")

    def check_support(self) -> None:
        self.calls.append("check_support")

    def build_plans(self) -> None:
        self.calls.append("build_plans")

    def get_workspace_size(self) -> int:
        return 16

    def execute(self, pack: dict[Tensor, Any], workspace: Any, handle: Any = None) -> None:
        assert handle is self.handle and self.node is not None
        kind, kwargs, outputs = self.node
        inputs = {name: pack[t] for name, t in kwargs.items() if isinstance(t, Tensor)}
        for t in pack:
            assert t.dim is None or list(pack[t].shape) == t.dim, (t.name, pack[t].shape, t.dim)
            if t.data_type is not None and t.data_type in TORCH:
                assert pack[t].dtype == TORCH[t.data_type], (t.name, pack[t].dtype, t.data_type)
        results = _compute(kind, kwargs, inputs)
        for tensor, value in zip(outputs, results, strict=True):
            if tensor.output:
                out = pack[tensor]
                out.copy_(value.to(out.dtype) if out.dtype != torch.float8_e4m3fn else value.float().to(out.dtype))
        self.executions += 1


def pygraph(
    io_data_type: str, intermediate_data_type: str, compute_data_type: str, handle: Any = None
) -> Graph:
    graph = Graph(io_data_type, intermediate_data_type, compute_data_type, handle)
    graphs.append(graph)
    return graph


def _one(inputs: dict[str, Any], name: str) -> Any:
    return inputs[name].double().reshape(())


def _attention(q: Any, k: Any, v: Any, scale: float, causal: bool) -> tuple[Any, Any]:
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) * scale
    if causal:  # top-left, as cuDNN's use_causal_mask
        hidden = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(hidden, -math.inf)
    lse = torch.logsumexp(scores, -1, keepdim=True)
    return torch.exp(scores - lse) @ v, lse


def _grads(q: Any, k: Any, v: Any, do: Any, scale: float, causal: bool) -> tuple[Any, ...]:
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    with torch.enable_grad():
        out, _ = _attention(q, k, v, scale, causal)
        return (*torch.autograd.grad(out, (q, k, v), do), out)


def _compute(kind: str, kw: dict[str, Any], inputs: dict[str, Any]) -> tuple[Any, ...]:
    scale, causal = kw["attn_scale"], kw["use_causal_mask"]
    if kind == "sdpa":
        out, lse = _attention(inputs["q"].double(), inputs["k"].double(), inputs["v"].double(), scale, causal)
        return out, lse
    if kind == "sdpa_backward":
        dq, dk, dv, _ = _grads(*(inputs[n].double() for n in ("q", "k", "v", "dO")), scale, causal)
        return dq, dk, dv
    q, k, v = (inputs[n].double() * _one(inputs, f"descale_{n}") for n in ("q", "k", "v"))
    if kind == "sdpa_fp8":
        out, lse = _attention(q, k, v, scale, causal)
        return out * _one(inputs, "scale_o"), lse, torch.ones(1, 1, 1, 1), out.abs().amax().reshape(1, 1, 1, 1)
    do = inputs["dO"].double() * _one(inputs, "descale_dO")
    dq, dk, dv, _ = _grads(q, k, v, do, scale, causal)
    amax = [t.abs().amax().reshape(1, 1, 1, 1) for t in (dq, dk, dv)]
    scaled = (dq * _one(inputs, "scale_dQ"), dk * _one(inputs, "scale_dK"), dv * _one(inputs, "scale_dV"))
    return (*scaled, *amax, torch.ones(1, 1, 1, 1))
