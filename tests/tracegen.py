"""Build small Kineto-style Chrome traces for tests, shaped like real torch.profiler exports.

The layout follows traces exported by torch 2.11 on an H200 (see tests/data/synthetic/real_h200):
CPU events on one pid/tid, `ProfilerStep#N` and the region as `user_annotation`, ATen ops as
`cpu_op` with `External id` (and `Input type` with record_shapes), launches as `cuda_runtime` /
`cuda_driver` with `correlation` and `cbid`, device work on pid = device, tid = stream with the
same `correlation`, `ac2g` flow events, one `gpu_user_annotation` per stream and forward, and a
top-level `deviceProperties` list.

    b = TraceBuilder()
    with b.step():
        with b.region():
            with b.op("aten::bmm", ["c10::BFloat16", "c10::BFloat16"]):
                b.kernel("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", gpu_us=20)
    trace = b.to_dict()
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REAL_TRACES = Path(__file__).parent / "data" / "synthetic" / "real_h200"

H200 = {"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320, "computeMajor": 9, "computeMinor": 0,
        "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
        "sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536,
        "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472}
A100 = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85100068864, "computeMajor": 8,
        "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
        "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 108, "regsPerMultiprocessor": 65536,
        "sharedMemPerBlockOptin": 166912, "sharedMemPerMultiprocessor": 167936}

CBID = {"cudaLaunchKernel": 211, "cudaLaunchKernelExC": 430, "cudaMemcpyAsync": 41, "cudaMemsetAsync": 51,
        "cudaDeviceSynchronize": 165, "cudaStreamSynchronize": 131, "cudaEventRecord": 135,
        "cudaStreamIsCapturing": 317, "cudaGraphLaunch": 311, "cuLaunchKernel": 307, "cuLaunchKernelEx": 652}
DRIVER_APIS = frozenset({"cuLaunchKernel", "cuLaunchKernelEx"})

FLASH = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
         "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, true, false, false, "
         "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)")
EFFICIENT = ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
             "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)")
CUDNN = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0"
GEMM_BF16 = "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn"
GEMM_FP32 = "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas"  # noqa: E501
MUL = ("void at::native::vectorized_elementwise_kernel<8, at::native::AUnaryFunctor<c10::BFloat16, c10::BFloat16, "
       "c10::BFloat16, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul> >(int, "
       "at::native::AUnaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
       "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul>)")
SOFTMAX = ("void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, false, false>"
           "(c10::BFloat16*, c10::BFloat16 const*, int, int, int, bool const*, int, bool)")
MASKED_FILL = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16, bool)#1}>(at::TensorIteratorBase&, at::native::(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16, bool)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16, bool)#1}>(at::TensorIteratorBase&, at::native::(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16, bool)#1} const&)::{lambda(int)#1})"  # noqa: E501
TRIU = "void at::native::triu_tril_kernel<bool, int, false, 8, false>(at::cuda::detail::TensorInfo<bool, int>, at::cuda::detail::TensorInfo<bool const, int>, long, long, int)"  # noqa: E501
FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<bool>, std::array<char*, 1ul> >(int, at::native::FillFunctor<bool>, std::array<char*, 1ul>)"  # noqa: E501
WHERE = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::(anonymous namespace)::where_kernel_impl(at::TensorIterator&)::{lambda()#1}::operator()() const::{lambda()#11}::operator()() const::{lambda(bool, float, float)#1}>(at::TensorIteratorBase&, at::native::(anonymous namespace)::where_kernel_impl(at::TensorIterator&)::{lambda()#1}::operator()() const::{lambda()#11}::operator()() const::{lambda(bool, float, float)#1} const&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::(anonymous namespace)::where_kernel_impl(at::TensorIterator&)::{lambda()#1}::operator()() const::{lambda()#11}::operator()() const::{lambda(bool, float, float)#1}>(at::TensorIteratorBase&, at::native::(anonymous namespace)::where_kernel_impl(at::TensorIterator&)::{lambda()#1}::operator()() const::{lambda()#11}::operator()() const::{lambda(bool, float, float)#1} const&)::{lambda(int)#1})"  # noqa: E501
ISNEGINF = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::isneginf_kernel_impl(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::(anonymous namespace)::isneginf_kernel_impl(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)"  # noqa: E501
COPY = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)"  # noqa: E501

BF16 = "c10::BFloat16"


class TraceBuilder:
    """Emits events on a simulated CPU clock (one thread) and per-stream GPU clocks."""

    def __init__(self, device_properties: list[dict[str, Any]] | None = None, pid: int = 4242, tid: int = 4242,
                 start_us: float = 5_000_000_000.0, launch_latency_us: float = 6.0,
                 gpu_annotations: bool = True, flows: bool = True) -> None:
        self.events: list[dict[str, Any]] = []
        self.device_properties = [dict(H200)] if device_properties is None else device_properties
        self.pid, self.tid = pid, tid
        self.now = start_us
        self.latency = launch_latency_us
        self.stream_clock: dict[int, float] = {}
        self.ext = 0
        self.corr = 1000
        self.step_no = 0
        self.gpu_annotations = gpu_annotations
        self.flows = flows
        self._stack: list[int] = []  # External ids of the open cpu ops
        self._region: dict[str, Any] | None = None
        self.last_device_event: dict[str, Any] | None = None

    # ------------------------------------------------------------------ clock
    def advance(self, us: float) -> None:
        self.now += us

    def _next_ext(self) -> int:
        self.ext += 1
        return self.ext

    def _next_corr(self) -> int:
        self.corr += 7
        return self.corr

    # ------------------------------------------------------------------ CPU ranges
    @contextmanager
    def _range(self, cat: str, name: str, args: dict[str, Any], pad: float = 1.0) -> Iterator[dict[str, Any]]:
        ext = self._next_ext()
        event = {"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": self.tid, "ts": self.now, "dur": 0.0,
                 "args": {"External id": ext, **args}}
        self.events.append(event)
        self.advance(pad)
        self._stack.append(ext)
        try:
            yield event
        finally:
            self._stack.pop()
            self.advance(pad)
            event["dur"] = round(self.now - event["ts"], 3)

    @contextmanager
    def step(self, number: int | None = None) -> Iterator[dict[str, Any]]:
        """A `ProfilerStep#N` range (what prof.step() marks)."""
        self.step_no = self.step_no + 1 if number is None else number
        with self._range("user_annotation", f"ProfilerStep#{self.step_no}", {"Record function id": 0}) as ev:
            yield ev

    @contextmanager
    def region(self, name: str = "attnprof", gpu_annotation: bool | None = None) -> Iterator[dict[str, Any]]:
        """A record_function range; on exit, one gpu_user_annotation per stream it used."""
        outer = self._region
        self._region = {"gpu": {}}
        try:
            with self._range("user_annotation", name, {"Record function id": 0}) as ev:
                yield ev
            wanted = self.gpu_annotations if gpu_annotation is None else gpu_annotation
            if wanted:
                for (device, stream), (lo, hi) in self._region["gpu"].items():
                    self.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": device,
                                        "tid": stream, "ts": round(lo - 0.001, 3), "dur": round(hi - lo + 0.002, 3),
                                        "args": {"External id": ev["args"]["External id"]}})
        finally:
            self._region = outer

    @contextmanager
    def op(self, name: str, input_types: list[str] | None = None, pad: float = 1.0, seq: int | None = None,
           fwd_tid: int = 0) -> Iterator[dict[str, Any]]:
        """An ATen op (`cpu_op`); nest ops and launches inside it. `seq`: its autograd `Sequence number`
        (with `Fwd thread id` = `fwd_tid`: 0 on a forward op, > 0 on a backward op)."""
        args: dict[str, Any] = {"Record function id": 0}
        if seq is not None:
            args.update({"Sequence number": seq, "Fwd thread id": fwd_tid})
        if input_types is not None:
            args["Input type"] = list(input_types)
            args["Input Dims"] = [[] for _ in input_types]
        with self._range("cpu_op", name, args, pad) as ev:
            yield ev

    @contextmanager
    def thread(self, tid: int) -> Iterator[None]:
        """Emit the CPU events inside on thread `tid` of the same process (same clock)."""
        saved, self.tid = self.tid, tid
        try:
            yield
        finally:
            self.tid = saved

    def leaf(self, name: str, input_types: list[str] | None = None, dur: float = 2.0) -> None:
        with self.op(name, input_types, pad=dur / 2):
            pass

    # ------------------------------------------------------------------ runtime calls and device work
    def call(self, api: str, dur: float = 3.0, correlation: int | None = None) -> dict[str, Any]:
        """A runtime/driver call with nothing on the device (sync, event record, ...)."""
        corr = self._next_corr() if correlation is None else correlation
        cat = "cuda_driver" if api in DRIVER_APIS else "cuda_runtime"
        args = {"cbid": CBID.get(api, 1), "correlation": corr}
        if self._stack:
            args = {"External id": self._stack[-1], **args}
        event = {"ph": "X", "cat": cat, "name": api, "pid": self.pid, "tid": self.tid, "ts": self.now, "dur": dur,
                 "args": args}
        self.events.append(event)
        self.advance(dur)
        return event

    def _device_event(self, cat: str, name: str, corr: int, launch_ts: float, gpu_us: float, stream: int,
                      device: int, args: dict[str, Any]) -> dict[str, Any]:
        start = max(self.stream_clock.get(stream, 0.0), launch_ts + self.latency)
        end = start + gpu_us
        self.stream_clock[stream] = end
        ev_args = {"External id": self._stack[-1] if self._stack else 0, "device": device, "context": 1,
                   "stream": stream, "correlation": corr, **args}
        event = {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": round(start, 3),
                 "dur": gpu_us, "args": ev_args}
        self.events.append(event)
        self.last_device_event = event
        if self._region is not None:
            key = (device, stream)
            lo, hi = self._region["gpu"].get(key, (start, end))
            self._region["gpu"][key] = (min(lo, start), max(hi, end))
        if self.flows:
            self.events.append({"ph": "f", "id": corr, "pid": device, "tid": stream, "ts": round(start, 3),
                                "cat": "ac2g", "name": "ac2g", "bp": "e"})
        return event

    def kernel(self, name: str, gpu_us: float = 10.0, api: str = "cudaLaunchKernel", stream: int = 7,
               device: int = 0, grid: tuple[int, int, int] = (128, 1, 1), block: tuple[int, int, int] = (128, 1, 1),
               regs: int = 32, smem: int = 0, occupancy: float | None = None, launch_us: float = 4.0,
               shared_memory_key: str = "shared memory", extra_args: dict[str, Any] | None = None,
               launch: bool = True, correlation: int | None = None) -> dict[str, Any]:
        """A launch call and its kernel. `occupancy` None: the Kineto-like estimate; `launch=False`
        writes only the kernel (its launch is not in the trace)."""
        corr = self._next_corr() if correlation is None else correlation
        launch_ts = self.now
        if launch:
            call = self.call(api, dur=launch_us, correlation=corr)
            if self.flows:
                self.events.append({"ph": "s", "id": corr, "pid": self.pid, "tid": self.tid, "ts": call["ts"],
                                    "cat": "ac2g", "name": "ac2g"})
        threads = block[0] * block[1] * block[2]
        blocks = grid[0] * grid[1] * grid[2]
        if occupancy is None:
            occupancy = min(100.0, round(100.0 * min(blocks / 132, 2048 // threads) * threads / 2048))
        args = {"queued": 0, "registers per thread": regs, shared_memory_key: smem,
                "blocks per SM": round(blocks / 132, 6), "warps per SM": round(blocks / 132 * threads / 32, 6),
                "grid": list(grid), "block": list(block), "est. achieved occupancy %": occupancy,
                **(extra_args or {})}
        return self._device_event("kernel", name, corr, launch_ts, gpu_us, stream, device, args)

    def graph(self, names: list[str], gpu_us: float = 5.0, stream: int = 7) -> list[dict[str, Any]]:
        """One cudaGraphLaunch whose kernels all carry its correlation id."""
        corr = self._next_corr()
        launch_ts = self.now
        self.call("cudaGraphLaunch", dur=5.0, correlation=corr)
        return [self._device_event("kernel", name, corr, launch_ts, gpu_us, stream, 0,
                                   {"registers per thread": 32, "shared memory": 0, "grid": [64, 1, 1],
                                    "block": [128, 1, 1], "est. achieved occupancy %": 24, "graph id": 1,
                                    "graph node id": i}) for i, name in enumerate(names)]

    def memcpy(self, kind: str = "DtoD", gpu_us: float = 6.0, api: str = "cudaMemcpyAsync", stream: int = 7,
               nbytes: int = 1 << 20) -> dict[str, Any]:
        corr = self._next_corr()
        launch_ts = self.now
        self.call(api, dur=5.0, correlation=corr)
        where = {"DtoD": ("Device", "Device"), "HtoD": ("Pinned", "Device"), "DtoH": ("Device", "Pageable")}[kind]
        return self._device_event("gpu_memcpy", f"Memcpy {kind} ({where[0]} -> {where[1]})", corr, launch_ts, gpu_us,
                                  stream, 0, {"bytes": nbytes, "memory bandwidth (GB/s)": 100.0})

    def memset(self, gpu_us: float = 0.8, api: str = "cudaMemsetAsync", stream: int = 7) -> dict[str, Any]:
        corr = self._next_corr()
        launch_ts = self.now
        self.call(api, dur=4.0, correlation=corr)
        return self._device_event("gpu_memset", "Memset (Device)", corr, launch_ts, gpu_us, stream, 0,
                                  {"bytes": 4, "memory bandwidth (GB/s)": 0.005})

    def overhead(self, name: str = "Activity Buffer Request", dur: float = 900.0, cat: str = "overhead") -> None:
        """Profiler bookkeeping (Kineto writes it with pid -1)."""
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": -1 if cat == "overhead" else self.pid,
                            "tid": 0 if cat == "overhead" else self.tid, "ts": self.now, "dur": dur, "args": {}})

    def synchronize(self) -> None:
        """cudaDeviceSynchronize: the CPU waits for every stream."""
        end = max(self.stream_clock.values(), default=self.now)
        self.call("cudaDeviceSynchronize", dur=max(end - self.now, 0.0) + 2.0)

    # ------------------------------------------------------------------ output
    def to_dict(self) -> dict[str, Any]:
        meta = [{"ph": "M", "name": "process_name", "pid": self.pid, "tid": 0, "ts": 0.0, "args": {"name": "python3"}},
                {"ph": "M", "name": "thread_name", "pid": self.pid, "tid": self.tid, "ts": 0.0,
                 "args": {"name": f"thread {self.tid} (python3)"}}]
        tail = [{"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": self.now + 10}]
        return {"schemaVersion": 1, "deviceProperties": self.device_properties, "record_shapes": 1,
                "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000,
                "traceEvents": meta + self.events + tail, "traceName": "synthetic"}

    def write(self, path: Path, indent: int | None = None) -> Path:
        text = json.dumps(self.to_dict(), indent=indent)
        if str(path).endswith(".gz"):
            with gzip.open(path, "wt", encoding="utf-8") as fh:
                fh.write(text)
        else:
            Path(path).write_text(text, encoding="utf-8")
        return Path(path)


# ---------------------------------------------------------------------- ready-made forwards

def naive_forward(b: TraceBuilder, inplace: bool = False) -> None:
    """matmul, mul, masked_fill (out of place: clone + DtoD copy), softmax, matmul: 5 kernels."""
    b.leaf("aten::transpose", [BF16, "Scalar", "Scalar"])
    with b.op("aten::matmul", [BF16, BF16]):
        with b.op("aten::bmm", [BF16, BF16]):
            b.kernel(GEMM_BF16, gpu_us=7.4, regs=168, block=(256, 1, 1), grid=(8, 16, 1))
    with b.op("aten::mul", [BF16, "double"]):
        b.kernel(MUL, gpu_us=6.9, grid=(8192, 1, 1))
    if inplace:
        with b.op("aten::masked_fill_", [BF16, "bool", "Scalar"]):
            b.kernel(MASKED_FILL, gpu_us=19.2, regs=18, grid=(16384, 1, 1))
    else:
        with b.op("aten::masked_fill", [BF16, "bool", "Scalar"]):
            with b.op("aten::clone", [BF16, "Scalar"]):
                b.leaf("aten::empty_like", [BF16])
                with b.op("aten::copy_", [BF16, BF16, "Scalar"]):
                    b.memcpy("DtoD", gpu_us=6.9)
            with b.op("aten::masked_fill_", [BF16, "bool", "Scalar"]):
                b.kernel(MASKED_FILL, gpu_us=19.2, regs=18, grid=(16384, 1, 1))
    with b.op("aten::softmax", [BF16, "Scalar", ""]):
        with b.op("aten::_softmax", [BF16, "Scalar", "Scalar"]):
            b.kernel(SOFTMAX, gpu_us=22.1, regs=48, block=(32, 4, 1), grid=(2048, 1, 1))
    with b.op("aten::matmul", [BF16, BF16]):
        with b.op("aten::bmm", [BF16, BF16]):
            b.kernel(GEMM_BF16, gpu_us=6.2, regs=168, block=(256, 1, 1), grid=(8, 16, 1))


def fused_forward(b: TraceBuilder, backend: str = "flash") -> None:
    """SDPA with one fused kernel: flash, efficient or cudnn (driver launch, occupancy 0, memset)."""
    op = {"flash": "aten::_scaled_dot_product_flash_attention",
          "efficient": "aten::_scaled_dot_product_efficient_attention",
          "cudnn": "aten::_scaled_dot_product_cudnn_attention"}[backend]
    with b.op("aten::scaled_dot_product_attention", [BF16, BF16, BF16, "", "Scalar"]):
        with b.op(op, [BF16, BF16, BF16]):
            if backend != "cudnn":
                for _ in range(3):
                    b.leaf("aten::transpose", [BF16, "Scalar", "Scalar"])
            if backend == "flash":
                b.kernel(FLASH, gpu_us=146.8, regs=255, smem=49152, block=(128, 1, 1), grid=(16, 32, 1))
            elif backend == "efficient":
                b.kernel(EFFICIENT, gpu_us=277.9, regs=128, smem=18944, block=(32, 4, 1), grid=(16, 64, 1))
            else:
                with b.op("aten::_cudnn_attention_forward", [BF16, BF16, BF16]):
                    b.memset()
                    b.kernel(CUDNN, gpu_us=186.3, api="cuLaunchKernelEx", regs=240, smem=134144,
                             block=(256, 1, 1), grid=(64, 1, 1), occupancy=0)
            if backend != "cudnn":
                b.leaf("aten::transpose", [BF16, "Scalar", "Scalar"])


def math_forward(b: TraceBuilder, input_types: bool = True) -> None:
    """SDPA math backend: fp32 upcasts, mask rebuilt, FP32 CUDA-core GEMMs, _safe_softmax."""
    t = (lambda *ts: list(ts)) if input_types else (lambda *ts: None)
    with b.op("aten::scaled_dot_product_attention", t(BF16, BF16, BF16, "", "Scalar")):
        with b.op("aten::_scaled_dot_product_attention_math", t(BF16, BF16, BF16)):
            for _ in range(3):
                with b.op("aten::to", t(BF16, "Scalar")):
                    with b.op("aten::_to_copy", t(BF16, "Scalar")):
                        with b.op("aten::copy_", t("float", BF16)):
                            b.kernel(COPY, gpu_us=4.1, grid=(1024, 1, 1))
            with b.op("aten::ones", t("ScalarList")):
                with b.op("aten::fill_", t("bool", "Scalar")):
                    b.kernel(FILL, gpu_us=1.2)
            with b.op("aten::tril", t("bool", "Scalar")):
                b.kernel(TRIU, gpu_us=4.5)
            with b.op("aten::scalar_tensor", t("Scalar")):
                with b.op("aten::fill_", t("float", "Scalar")):
                    b.kernel(FILL, gpu_us=0.8, grid=(1, 1, 1))
            with b.op("aten::where", t("bool", "Scalar", "float")):
                b.kernel(WHERE, gpu_us=4.0)
            with b.op("aten::matmul", t("float", "float")):
                with b.op("aten::bmm", t("float", "float")):
                    b.kernel(GEMM_FP32, gpu_us=39.6, api="cudaLaunchKernelExC", regs=128, smem=13056, occupancy=25)
            with b.op("aten::_safe_softmax", t("float", "Scalar", "")):
                with b.op("aten::softmax", t("float", "Scalar", "")):
                    with b.op("aten::_softmax", t("float", "Scalar", "Scalar")):
                        b.kernel(SOFTMAX.replace("c10::BFloat16", "float"), gpu_us=23.0, regs=48, block=(32, 4, 1))
                with b.op("aten::isneginf", t("float")):
                    b.kernel(ISNEGINF, gpu_us=13.1)
                with b.op("aten::where", t("bool", "float", "float")):
                    b.kernel(WHERE, gpu_us=26.9)
            with b.op("aten::matmul", t("float", "float")):
                with b.op("aten::bmm", t("float", "float")):
                    b.kernel(GEMM_FP32, gpu_us=51.8, api="cudaLaunchKernelExC", regs=121, smem=12672, occupancy=6)
            with b.op("aten::to", t("float", "Scalar")):
                with b.op("aten::_to_copy", t("float", "Scalar")):
                    with b.op("aten::copy_", t(BF16, "float")):
                        b.kernel(COPY, gpu_us=1.6)


def build(forward, steps: int = 3, region: str = "attnprof", builder: TraceBuilder | None = None,
          sync: bool = True, between_us: float = 20.0, **kwargs: Any) -> dict[str, Any]:
    """A trace of `steps` ProfilerSteps, each with one forward inside the region."""
    b = builder or TraceBuilder()
    for _ in range(steps):
        with b.step():
            b.advance(5.0)
            with b.region(region):
                forward(b, **kwargs)
            b.advance(between_us)
    if sync:
        b.synchronize()
    return b.to_dict()


def parsed_contents(trace: Any) -> tuple[Any, ...]:
    """Every table column and interned list of a ParsedTrace (not its source), for exact comparison (the raw
    JSON lists by value: a trace read from a dict re-encodes them without the file's spaces)."""
    from dataclasses import fields

    tables = {}
    for name in ("cpu_ops", "annotations", "runtime", "device", "gpu_annotations"):
        table = getattr(trace, name)
        tables[name] = {f.name: list(getattr(table, f.name)) for f in fields(table)}
    raw_lists = [[json.loads(text) for text in texts] for texts in (trace.input_dims, trace.concrete_inputs)]
    return (tables, trace.names, trace.threads, trace.input_types, raw_lists, trace.concrete_inputs_at,
            trace.kernel_infos,
            trace.device_properties, trace.metadata, trace.event_count, trace.overhead_count,
            trace.python_function_count)


def real_trace(name: str = "sdpa_cudnn") -> dict[str, Any]:
    """One of the real H200 traces in tests/data/synthetic/real_h200, loaded."""
    with gzip.open(REAL_TRACES / f"{name}.json.gz", "rt", encoding="utf-8") as fh:
        return json.load(fh)


def large_trace(directory: Path, form: str = "json", copies: int = 60, name: str = "twostream") -> Path:
    """A real trace's events (`name`'s) repeated `copies` times (60: about 2 MB), as Kineto lays them out
    (one key per line), written to `directory` as `form`: "json", "gz" or "bare" (a bare event list)."""
    data = real_trace(name)
    data["traceEvents"] = data["traceEvents"] * copies
    if form == "bare":
        data = data["traceEvents"]
    path = directory / ("t.json.gz" if form == "gz" else "t.json")
    text = json.dumps(data, indent=1)
    if form == "gz":
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path
