"""A pinned SDPA backend that refuses its inputs: the skip reason is one line, the pinned backend's
own reasons from torch's warnings, each its first sentence (the text simulated on CPU as torch 2.11
gives it on CUDA)."""

from __future__ import annotations

import warnings

import pytest

from attnprof.errors import VariantUnavailableError
from attnprof.variants.sdpa import pinned_forward, refusal_line

TAIL = " (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:859.)"
GQA = (
    "For dense input, both fused kernels require query, key and value to have the same num_heads. "
    "Query.sizes(): [1, 64, 8192, 128], Key sizes(): [1, 8, 8192, 128], Value sizes(): [1, 8, 8192, 128] "
    "instead. To broadcast dense inputs, try using unsqueeze and expand_to before passing them into the kernel."
)
GQA_RULE = "For dense input, both fused kernels require query, key and value to have the same num_heads."
#: torch's warnings for SDPA pinned to the efficient backend with fewer K/V heads (an H200 run's text).
CUDA_WARNINGS = [
    "Memory efficient kernel not used because:" + TAIL,
    GQA + TAIL,
    "Flash attention kernel not used because:" + TAIL,
    "Flash attention has been runtime disabled." + TAIL,
    "cuDNN attention kernel not used because:" + TAIL,
    "cuDNN attention has been runtime disabled." + TAIL,
]


def test_the_reason_is_the_pinned_backends_own_in_one_line():
    line = refusal_line(CUDA_WARNINGS, "efficient")
    assert line == f"Memory efficient kernel not used because: {GQA_RULE}"
    assert "runtime disabled" not in line and "Triggered" not in line and "\n" not in line


def test_repeated_and_multi_line_warnings_are_said_once():
    split = GQA.replace(". ", ".\n", 2)
    twice = CUDA_WARNINGS + ["Memory efficient kernel not used because:\n" + split + TAIL]
    assert refusal_line(twice, "efficient") == f"Memory efficient kernel not used because: {GQA_RULE}"


def test_other_backends_groups_are_left_out():
    messages = [
        "Flash attention kernel not used because:",
        "Flash attention requires q,k,v to have the same last dimension and to be less than or equal to 256.",
        "Memory efficient kernel not used because:",
        "Memory Efficient attention has been runtime disabled.",
    ]
    assert refusal_line(messages, "flash") == (
        "Flash attention kernel not used because: Flash attention requires q,k,v to have the same last "
        "dimension and to be less than or equal to 256."
    )
    assert refusal_line(["cuDNN attention kernel not used because:", "head_dim 72 is unsupported"], "cudnn") == (
        "cuDNN attention kernel not used because: head_dim 72 is unsupported."
    )


def test_without_the_backends_group_every_distinct_line_is_kept():
    assert refusal_line(["something else went wrong" + TAIL, "something else went wrong"], "flash") == (
        "something else went wrong."
    )
    assert refusal_line([], "flash") is None
    assert refusal_line(["Flash attention kernel not used because:" + TAIL], "flash") is None


def test_a_pinned_forward_that_refuses_raises_the_one_line(monkeypatch):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    def refuse(*args, **kwargs):
        for message in CUDA_WARNINGS:
            warnings.warn(message, UserWarning, stacklevel=2)
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse)
    q = torch.zeros(1, 2, 4, 8)
    with warnings.catch_warnings(record=True), pytest.raises(VariantUnavailableError) as raised:
        warnings.simplefilter("always")
        pinned_forward("efficient")(q, q, q, True, None)
    assert raised.value.message == f"Memory efficient kernel not used because: {GQA_RULE}"
