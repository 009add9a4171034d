"""The registry: built-ins, duplicates, close matches, patterns, availability reasons."""

from __future__ import annotations

import pytest

from attnprof.errors import DuplicateVariantError, UnknownVariantError
from attnprof.plugins import load_variants
from attnprof.registry import RunSpec, Variant
from attnprof.variant_registry import Registry
from attnprof.variants import builtin_variants, compiled

COMPILED = {v.name for v in compiled.variants()}  # torch.compile'd: their checks depend on the installed torch
CPU = RunSpec(device="cpu", dtype="fp32", batch=1, heads=2, seq=16, head_dim=16)


def _noop(q, k, v, causal, state):
    return q


def test_builtins_come_through_the_entry_point() -> None:
    expected = [v.name for v in builtin_variants()]
    loaded = load_variants(no_plugins=True, refresh=True)
    assert expected and loaded.registry.names() == expected
    builtin = [p for p in loaded.plugins if p.package == "built-in"]
    assert len(builtin) == 1 and builtin[0].entry_point == "builtin" and builtin[0].ok
    assert all(loaded.registry.get(n).source == "built-in" for n in expected)


def test_duplicate_names_raise() -> None:
    registry = Registry()
    registry.register(Variant("a", "first", _noop))
    with pytest.raises(DuplicateVariantError, match="'a'.*already registered"):
        registry.register(Variant("a", "second", _noop))


def test_unknown_name_suggests_close_matches() -> None:
    registry = load_variants(no_plugins=True).registry
    with pytest.raises(UnknownVariantError, match="did you mean sdpa-flash"):
        registry.get("sdpa-flsh")
    with pytest.raises(UnknownVariantError, match="known variants: naive"):
        registry.get("zzzzzz")


def test_patterns_include_and_exclude() -> None:
    registry = load_variants(no_plugins=True).registry
    pinned = [n for n in registry.names() if n.startswith("sdpa-")]
    assert len(pinned) >= 2 and [v.name for v in registry.select(["sdpa-*"])] == pinned
    names = [v.name for v in registry.select(["sdpa*"], ["sdpa-cudnn", "sdpa-eff*"])]
    assert names == [n for n in registry.names()
                     if n.startswith("sdpa") and n != "sdpa-cudnn" and not n.startswith("sdpa-eff")]
    assert [v.name for v in registry.select(["inplace", "naive"])] == ["inplace", "naive"]
    with pytest.raises(UnknownVariantError, match="no variant matches"):
        registry.select(["nothing-*"])
    with pytest.raises(UnknownVariantError, match="unknown variant 'naiv'"):
        registry.select(["naiv"])


def test_availability_reasons_on_cpu() -> None:
    cuda_only, on_cpu = [], []
    for variant in load_variants(no_plugins=True).registry.all():
        reason = variant.unavailable_reason(CPU)
        if "cpu" not in variant.devices:
            assert reason == "needs CUDA", variant.name
            cuda_only.append(variant.name)
        elif variant.collective:  # one forward across the ranks of a torchrun group
            assert reason == "needs torchrun (WORLD_SIZE>=1 with a process group)", variant.name
        elif variant.varlen_only:  # packed seq_lens only (padded-sdpa, nested-sdpa)
            assert reason == "runs packed seq_lens only (a shape's seq_lens)", variant.name
        elif variant.name not in COMPILED:
            assert reason is None, (variant.name, reason)
            on_cpu.append(variant.name)
    assert cuda_only and on_cpu


def test_variant_declares_what_it_supports() -> None:
    variant = Variant("x", "test", _noop, devices=("cuda",), dtypes=("bf16",),
                      check=lambda s: "too long" if s.seq > 8 else None)
    assert variant.unavailable_reason(CPU) == "needs CUDA"
    cuda = RunSpec(device="cuda:0", dtype="fp32", batch=1, heads=1, seq=16, head_dim=16)
    assert variant.unavailable_reason(cuda) == "needs dtype bf16 (got fp32)"
    cuda_bf16 = RunSpec(device="cuda:0", dtype="bf16", batch=1, heads=1, seq=16, head_dim=16)
    assert variant.unavailable_reason(cuda_bf16) == "too long"


def test_a_raising_check_is_a_reason_not_a_crash() -> None:
    def broken(spec: RunSpec) -> str:
        raise ValueError("bad")

    assert Variant("x", "t", _noop, check=broken).unavailable_reason(CPU) == "check raised ValueError: bad"


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "Bad Name"}, "variant name"),
    ({"layout": "sbhd"}, "layout"),
    ({"devices": ("tpu",)}, "unknown devices"),
    ({"dtypes": ("fp4",)}, "unknown dtypes"),
])
def test_variant_fields_are_validated(kwargs: dict, message: str) -> None:
    fields = {"name": "ok", "description": "d", "forward": _noop} | kwargs
    with pytest.raises(ValueError, match=message):
        Variant(**fields)


def test_spec_labels() -> None:
    assert CPU.shape_label == "1x2x16x16" and CPU.device_type == "cpu" and CPU.n_kv_heads == 2
    gqa = RunSpec(device="cuda:1", dtype="bf16", batch=2, heads=8, kv_heads=2, seq=16, head_dim=64)
    assert gqa.shape_label == "2x8x16x64/kv2" and gqa.device_type == "cuda"


def test_spec_mask_is_parsed_once_and_causal_follows_it() -> None:
    from dataclasses import replace

    from attnprof.masks import Mask

    assert CPU.mask == Mask("causal") and CPU.causal
    window = RunSpec("cpu", "fp32", 1, 2, 64, 16, mask="sliding_window:8")
    assert window.mask == Mask("sliding_window", 8) and not window.causal
    assert RunSpec("cpu", "fp32", 1, 2, 64, 16, mask=Mask("sliding_window", 8)) == window
    # the causal flag chooses between the plain masks; a sized mask overrides it
    assert RunSpec("cpu", "fp32", 1, 2, 64, 16, causal=False).mask == Mask("none")
    assert RunSpec("cpu", "fp32", 1, 2, 64, 16, causal=False, mask="causal").mask == Mask("none")
    assert RunSpec("cpu", "fp32", 1, 2, 64, 16, causal=True, mask="sliding_window:8") == window
    assert RunSpec("cpu", "fp32", 1, 2, 64, 16, mask="none").causal is False
    # replace keeps the Mask (and may set another, or the flag)
    moved = replace(window, seq=128)
    assert moved.mask is window.mask and moved.shape_label == "1x2x128x16 sw8"
    assert replace(window, mask=Mask("none")).causal is False
    assert replace(CPU, causal=False).mask == Mask("none")
    # the cell key and the label keep the mask's text
    assert window.cell_key[7:10] == (False, "fwd", "sliding_window:8")
    with pytest.raises(ValueError, match="unknown mask"):
        RunSpec("cpu", "fp32", 1, 2, 64, 16, mask="sliding")
