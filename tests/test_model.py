"""`attnprof model`: config, implementation names, the attention-interface bridge, and the command end to end
on CPU with a tiny Llama (transformers comes with the test extra) and with factory models."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest
import yaml
from conftest import TINY_LLAMA

from attnprof.errors import ConfigError, UnknownVariantError, VariantUnavailableError
from attnprof.model_config import ModelConfig, apply_model_overrides, load_model_config
from attnprof.models.implementations import resolve_implementation
from attnprof.plugins import load_variants
from attnprof.registry import Variant

ROOT = Path(__file__).resolve().parents[1]
ROW_KEYS = {
    "variant", "model", "batch", "seq", "dtype", "device", "mode", "status", "reason", "latency_us", "latency_iqr_us",
    "kernels_per_forward", "gpu_time_us", "peak_memory_mib", "attention", "attention_gpu_pct",
    "attention_calls_per_forward", "attention_backends", "findings", "trace",
}  # fmt: skip


def rows_of(result) -> dict[str, dict]:
    """The JSON document's rows by implementation (one seq and mode)."""
    return {row["variant"]: row for row in json.loads(result.stdout)["results"]}


def assert_one_line_error(result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


# --------------------------------------------------------------------------- config and names


def test_config_seq_accepts_one_number_and_defaults_the_baseline(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"hf": "llama", "seq": 64, "implementations": ["sdpa", "eager"]}))
    config = load_model_config(path)
    assert config.seq == [64]
    assert config.baseline_name == "sdpa"
    assert config.region == "model_forward"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"seq": [16]}, "exactly one model source"),
        ({"hf": "llama", "factory": "pkg.mod:fn"}, "exactly one model source"),
        ({"factory": "pkg.mod"}, "package.module:callable"),
        ({"hf": "llama", "baseline": "flex_attention"}, "not among the implementations"),
        ({"hf": "llama", "seq": [0]}, "positive"),
        ({"hf": "llama", "implementations": ["sdpa", "sdpa"]}, "more than once"),
        ({"hf": "llama", "modes": ["bwd"]}, "modes.0"),
        ({"hf": "llama", "shapes": []}, "shapes: unknown key"),
    ],
)
def test_invalid_model_configs(tmp_path: Path, data: dict, message: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as caught:
        load_model_config(path)
    assert message in caught.value.message


def test_overrides_switch_the_model_source() -> None:
    config = ModelConfig(hf="llama", hf_config={"hidden_size": 64}, implementations=["eager", "sdpa"], baseline="sdpa")
    switched = apply_model_overrides(config, factory="pkg.mod:make", implementations=["eager"])
    assert (switched.hf, switched.hf_config, switched.factory) == (None, {}, "pkg.mod:make")
    assert switched.baseline_name == "eager"


def test_implementation_names() -> None:
    registry = load_variants(no_plugins=True).registry
    assert resolve_implementation("sdpa", registry).variant is None  # transformers' own comes first
    explicit = resolve_implementation("attnprof:sdpa", registry)
    assert (explicit.attn_implementation, explicit.variant.name) == ("attnprof:SDPA", "sdpa")
    naive = resolve_implementation("naive", registry)
    assert (naive.attn_implementation, naive.source) == ("attnprof:naive", "built-in")
    assert resolve_implementation("my_kernel", registry, passthrough=True).source == "model"
    # a row labels a variant by its own name, not the upper-cased name transformers is given
    assert (explicit.label, naive.label, resolve_implementation("sdpa", registry).label) == (
        "attnprof:sdpa", "attnprof:naive", "sdpa")
    with pytest.raises(UnknownVariantError) as caught:
        resolve_implementation("sdpa-mth", registry)
    assert "did you mean sdpa-math" in caught.value.message


@pytest.mark.parametrize("name", ["sdpa-flash", "sdpa-math", "sdpa-efficient", "flex", "naive"])
def test_bridge_names_stay_clear_of_the_words_transformers_dispatches_on(name: str) -> None:
    """transformers sends any `attn_implementation` containing "flash" to its FlashAttention loader (which
    looks the name up on the Hub: "Could not find the currently requested flash attention implementation"),
    and treats names containing "sdpa" or "flex_attention" as its own; a bridge name contains none of them."""
    pytest.importorskip("transformers")
    from transformers.utils.generic import is_flash_attention_requested

    registry = load_variants(no_plugins=True).registry
    implementation = resolve_implementation(name, registry)
    key = implementation.attn_implementation
    assert not is_flash_attention_requested(requested_attention_implementation=key)
    assert "sdpa" not in key and "flex_attention" not in key and key.lower() == f"attnprof:{name}"
    assert resolve_implementation(key, registry).variant.name == name  # the registered name resolves back


def test_a_plugin_variant_is_labelled_by_its_variant_name_not_the_name_transformers_is_given() -> None:
    from attnprof.models.implementations import Implementation, bridge_name
    from attnprof.registry import Variant

    variant = Variant("triton-flash", "a plugin's kernel", forward=lambda q, k, v, spec, state: q)
    implementation = Implementation("triton-flash", bridge_name(variant), variant)
    assert implementation.attn_implementation == "attnprof:triton-FLASH"  # what transformers dispatches on
    assert implementation.label == "attnprof:triton-flash"  # what the row and its tables say


# --------------------------------------------------------------------------- the bridge


def _qkv(heads: int = 4, kv_heads: int = 2, seq: int = 8, head_dim: int = 16):
    import torch

    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, seq, head_dim, generator=generator)
    k = torch.randn(2, kv_heads, seq, head_dim, generator=generator)
    v = torch.randn(2, kv_heads, seq, head_dim, generator=generator)
    return q, k, v


def _expected(q, k, v):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)


@pytest.mark.parametrize("name", ["naive", "sdpa-math"])
def test_bridge_matches_causal_gqa_attention_in_transformers_layout(name: str) -> None:
    import torch

    from attnprof.models.bridge import attention_function

    q, k, v = _qkv()
    out, weights = attention_function(load_variants(no_plugins=True).registry.get(name))(
        SimpleNamespace(is_causal=True), q, k, v, None, scaling=16**-0.5
    )
    assert weights is None and out.shape == (2, 8, 4, 16)  # [b, s, h, d]
    torch.testing.assert_close(out, _expected(q, k, v))


def test_bridge_repeats_kv_heads_for_a_variant_without_gqa_and_feeds_bshd() -> None:
    import torch

    from attnprof.models.bridge import attention_function

    seen = []

    def forward(q, k, v, causal, state):
        seen.append((tuple(q.shape), tuple(k.shape), causal, state))
        return _expected(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # bshd out

    variant = Variant(
        name="no-gqa",
        description="refuses grouped-query attention",
        forward=forward,
        layout="bshd",
        check=lambda spec: "no GQA" if spec.kv_heads else None,
        setup=lambda spec: f"set up for {spec.shape_label}",
    )
    q, k, v = _qkv()
    out, _ = attention_function(variant)(SimpleNamespace(is_causal=True), q, k, v, None)
    assert seen == [((2, 8, 4, 16), (2, 8, 4, 16), True, "set up for 2x4x8x16")]
    torch.testing.assert_close(out, _expected(q, k, v))


@pytest.mark.parametrize(
    ("mask", "kwargs", "message"),
    [
        ("mask", {}, "explicit attention mask"),
        (None, {"scaling": 0.5}, "scales scores by 0.5"),
        (None, {"dropout": 0.1}, "dropout"),
        (None, {"sliding_window": 4}, "sliding-window"),
    ],
)
def test_bridge_refuses_what_variants_cannot_compute(mask, kwargs: dict, message: str) -> None:
    import torch

    from attnprof.models.bridge import attention_function

    q, k, v = _qkv()
    attention_mask = torch.ones(2, 1, 8, 8, dtype=torch.bool) if mask else None
    attention = attention_function(load_variants(no_plugins=True).registry.get("naive"))
    with pytest.raises(VariantUnavailableError) as caught:
        attention(SimpleNamespace(is_causal=True), q, k, v, attention_mask, **kwargs)
    assert message in caught.value.message and "attnprof:naive" in caught.value.message


OVERHEAD = [{"kind": "copy", "ops": ["aten::contiguous"], "count_per_forward": 2, "time_us": 5.5}]


def test_the_ledger_is_read_into_the_row_and_the_table_when_the_analysis_has_one() -> None:
    from tracegen import build, fused_forward

    from attnprof.analysis import analyze_trace
    from attnprof.analysis.instance.ledger_summary import AttentionLedger
    from attnprof.model_spec import ModelSpec
    from attnprof.pipeline.measured import CellResult
    from attnprof.pipeline.rows import cell_row
    from attnprof.results.files import to_builtins
    from attnprof.results.records import attention_record

    ledger = {"calls_per_forward": 2, "backends": {"flash": 2, "math": 1}, "kernel_time_us": 3.0, "gpu_time_pct": 40.0}
    analysis = analyze_trace(build(fused_forward, backend="cudnn"))
    analysis.attention = AttentionLedger(**ledger, backward_kernel_time_us=None, overhead_us=0.0)
    subject = ModelSpec("llama", "sdpa", 1, 16, "fwd", "fp32", "cpu")
    result = CellResult("sdpa", "transformers", subject, analysis=analysis)
    entry = cell_row(result)
    assert (entry.subject, entry.model, entry.implementation, entry.shape) == ("model", "llama", "sdpa", "1x16")
    assert entry.attention == attention_record(analysis.attention)
    assert {k: v for k, v in to_builtins(entry.attention).items() if k in ledger} == ledger
    assert entry.attention_backends == "flash:2 math:1"  # as compare's rows
    assert (entry.attention_gpu_pct, entry.attention_calls_per_forward, entry.attention_time_us) == (40, 2, 3)
    assert cell_row(result).attention_backends == "flash:2 math:1"
    bare = cell_row(CellResult("sdpa", "transformers", subject))
    assert bare.attention is None and bare.attention_gpu_pct is None


def test_the_table_shows_the_ledger_of_the_row() -> None:
    from attnprof.report.model_tables import model_table
    from attnprof.results.parts import AttentionRecord, OverheadRecord
    from attnprof.results.schema import Row

    overhead = [msgspec.convert(o, OverheadRecord) for o in OVERHEAD]
    ledger = AttentionRecord(
        calls_per_forward=2, backends={"flash": 2, "math": 1}, kernel_time_us=3.0, gpu_time_pct=40.0, overhead=overhead
    )
    row = Row(subject="model", variant="sdpa", model="llama", seq=16, forwards=3, attention=ledger)
    row = msgspec.structs.replace(row, attention_backends=ledger.backends_text, attention_gpu_pct=ledger.gpu_time_pct)
    table = model_table([row], "table", "sdpa", width=None)
    assert "flash ×2, math ×1" in table and "copy ×2 5.5 µs" in table and "40" in table


def test_the_table_shows_the_attention_kernels_gbps_and_gives_it_up_first() -> None:
    from attnprof.report.model_tables import model_table
    from attnprof.results.schema import Row

    common = {"subject": "model", "model": "llama", "seq": 16, "forwards": 3, "latency_iqr_us": 2.0}
    rows = [
        Row(variant="sdpa", latency_us=100.0, attention_gpu_pct=40.0, kernels_per_forward=12, kernel_gbps=4321.5),
        Row(variant="eager", latency_us=200.0, attention_gpu_pct=60.0, kernels_per_forward=30),
    ]
    rows = [msgspec.structs.replace(r, **common) for r in rows]
    wide = model_table(rows, "table", "sdpa", None).splitlines()
    column = wide[0].index("kernel GB/s")
    assert wide[2][column:].startswith("4,322") and wide[3][column:].startswith("n/a")  # n/a without bytes
    fitted = " ".join(model_table(rows, "table", "sdpa", 110).split())
    assert "(n/a throughout); kernel GB/s (no room at 110 columns)" in fitted  # the first to go


# --------------------------------------------------------------------------- the command, end to end


@pytest.mark.slow
def test_cpu_config_end_to_end(cli, tmp_path: Path) -> None:
    """configs/model-cpu.yaml as shipped: transformers' eager, sdpa and flex_attention, and attnprof's naive and
    sdpa-math inside the model, at two seqs; JSON, CSV and a trace per row, readable by load_results."""
    from attnprof.results.files import load_results

    result = cli("model", str(ROOT / "configs" / "model-cpu.yaml"), "-o", str(tmp_path), "--format", "json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["command"] == "model" and document["environment"]["transformers"]
    rows = document["results"]
    assert [(r["variant"], r["seq"]) for r in rows] == [
        (name, seq) for name in ("eager", "sdpa", "flex_attention", "naive", "sdpa-math") for seq in (64, 256)
    ]
    for row in rows:
        assert ROW_KEYS <= set(row)
        if row["variant"] == "flex_attention" and row["status"] != "ok":  # torch's CPU flex may refuse: say why
            assert row["status"].startswith("skipped: ") and row["reason"]
            continue
        assert row["status"] == "ok", row["status"]
        assert row["latency_us"] > 0 and row["forwards"] == 2 and Path(row["trace"]).is_file()
        assert (row["heads"], row["kv_heads"], row["head_dim"], row["params"]) == (4, 2, 32, 557_696)
        assert (row["shape"], row["causal"]) == (f"2x4x{row['seq']}x32/kv2", True)  # as compare labels it
        if row["variant"] != "eager":
            assert row["logits_baseline"] == "eager" and row["logits_rel_diff"] < 1e-5
    assert rows[6]["implementation"] == "attnprof:naive" and rows[6]["source"] == "built-in"
    loaded = load_results(document["files"]["results_json"])
    assert loaded.command == "model" and len(loaded.rows) == 10
    with open(document["files"]["results_csv"], newline="") as handle:
        assert [r["variant"] for r in csv.DictReader(handle)] == [r["variant"] for r in rows]


def test_table_names_every_implementation_and_the_baseline(cli, model_config) -> None:
    result = cli("model", str(model_config()), "--attn", "sdpa,eager,naive,sdpa-cudnn")
    assert result.exit_code == 0, result.output
    out = " ".join(result.stdout.split())  # the title wraps where the terminal is narrow
    assert "llama (" in out and "speed-ups and logits vs sdpa" in out
    for name in ("sdpa", "eager", "naive", "sdpa-cudnn", "baseline"):
        assert name in out
    assert "sdpa-cudnn: skipped: attnprof:sdpa-cudnn: needs CUDA" in out
    assert "results:" in result.stderr and "traces:" in result.stderr


def test_training_step_rows_compare_logits_too(cli, model_config) -> None:
    result = cli("model", str(model_config()), "--mode", "fwd,fwd+bwd", "--attn", "sdpa,naive", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["results"]
    assert [(r["variant"], r["mode"], r["status"]) for r in rows] == [
        ("sdpa", "fwd", "ok"), ("sdpa", "fwd+bwd", "ok"), ("naive", "fwd", "ok"), ("naive", "fwd+bwd", "ok")
    ]  # fmt: skip
    assert all(r["logits_rel_diff"] < 1e-5 for r in rows[2:])
    assert rows[1]["latency_us"] > 0 and rows[1]["speedup_vs_baseline"] == 1.0


def test_the_shared_measurement_options_apply_to_a_model(cli, model_config) -> None:
    """`model` takes compare's option block where it applies: --min-time and the profiler schedule map onto the
    model config, --no-timing leaves latency and memory out (speed-ups then come from the profiled times)."""
    args = ("--attn", "sdpa,naive", "--no-timing", "--active", "3", "--min-time", "0.05", "--format", "json")
    result = cli("model", str(model_config()), *args)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["config"]["schedule"]["active"], document["config"]["timing"]["min_time_s"]) == (3, 0.05)
    assert (document["measure"]["timing"], document["measure"]["min_time_s"]) == (False, 0.05)
    for row in document["results"]:
        assert row["status"] == "ok" and row["forwards"] == 3
        assert row["latency_us"] is None and row["peak_memory_mib"] is None and row["retimed"] is None
        assert "timing" not in row["phases_s"] and "warmup" in row["phases_s"]
    assert document["results"][0]["speedup_vs_baseline"] == 1.0


def test_model_help_lists_the_shared_options_and_a_bad_value_names_its_flag(cli, model_config) -> None:
    out = cli("model", "--help").stdout
    for flag in ("--seq", "--mode", "--attn", "--batch", "--no-timing", "--min-time", "--flush-l2", "--wait",
                 "--with-stack", "--ncu-launches"):  # fmt: skip
        assert flag in out
    for flag in ("--heads", "--head-dim", "--causal", "--cuda-graph", "--check-masking"):  # a model states its own
        assert flag not in out
    assert_one_line_error(cli("model", str(model_config()), "--min-time", "0"), 2, "--min-time")
    assert_one_line_error(cli("model", str(model_config()), "--mode", "bwd"), 2, "--mode")


def test_an_implementation_transformers_rejects_is_a_skipped_row(cli, model_config) -> None:
    result = cli("model", str(model_config()), "--attn", "sdpa,flash_attention_2", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = rows_of(result)
    assert rows["sdpa"]["status"] == "ok"
    assert rows["flash_attention_2"]["status"].startswith("skipped: transformers rejects attn_implementation")


def test_nan_logits_fail_the_row_and_keep_the_others(cli, model_config, monkeypatch) -> None:
    import torch

    def nan_forward(q, k, v, causal, state):
        return torch.full_like(q, float("nan"))

    monkeypatch.setattr(load_variants(no_plugins=False).registry.get("naive"), "forward", nan_forward)
    result = cli("model", str(model_config()), "--format", "json")
    assert result.exit_code == 1
    rows = rows_of(result)
    assert rows["naive"]["status"] == "failed: NaN in the logits"
    assert rows["eager"]["status"] == rows["sdpa"]["status"] == "ok"


def test_ctrl_c_keeps_the_finished_rows(cli, model_config, monkeypatch, tmp_path: Path) -> None:
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(load_variants(no_plugins=False).registry.get("naive"), "forward", interrupt)
    result = cli("model", str(model_config()))
    assert result.exit_code == 130
    [json_file] = (tmp_path / "out").glob("*-model/results.json")
    document = json.loads(json_file.read_text())
    assert document["interrupted"] is True
    assert [r["variant"] for r in document["results"]] == ["eager", "sdpa"]


@pytest.mark.parametrize(
    ("args", "code", "fragments"),
    [
        (("--hf", "lama"), 2, ("unknown transformers model type 'lama'", "did you mean llama")),
        (("--attn", "sdpa,tritn-flash"), 2, ("unknown attention implementation 'tritn-flash'", "triton-flash")),
        (("--seq", "16,x"), 2, ("--seq",)),
        (("--seq", "512"), 2, ("longer than hf_config.max_position_embeddings (128)",)),
        (("--model", "no_such_module:make"), 2, ("cannot import no_such_module",)),
        (("--baseline", "flex_attention"), 2, ("not among the implementations",)),
    ],
)
def test_bad_input_is_one_line(cli, model_config, args: tuple, code: int, fragments: tuple) -> None:
    assert_one_line_error(cli("model", str(model_config()), *args), code, *fragments)


def test_an_unknown_hf_config_field_is_named(cli, model_config) -> None:
    result = cli("model", str(model_config(hf_config={**TINY_LLAMA, "hiden_size": 32})))
    assert_one_line_error(result, 2, "hf_config.hiden_size: not a field of LlamaConfig", "did you mean hidden_size")


def test_no_model_given(cli) -> None:
    assert_one_line_error(cli("model"), 2, "no model given")


def test_missing_transformers_is_one_line_with_the_install_hint(cli, model_config, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    result = cli("model", str(model_config()))
    assert_one_line_error(result, 2, "transformers is not installed", "pip install 'attnprof[hf]'")


# --------------------------------------------------------------------------- factory models

FACTORY_ARGS = ("--device", "cpu", "--seq", "16", "--min-time", "0.01", "--format", "json")


@pytest.mark.parametrize("factory", ["llama_keyword", "llama_settable"])
def test_a_factory_model_takes_the_implementations(cli, tmp_path: Path, factory: str) -> None:
    result = cli(
        "model", "--model", f"model_factories:{factory}", "--attn", "sdpa,eager,naive", "-o", str(tmp_path),
        *FACTORY_ARGS,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = rows_of(result)
    assert [r["status"] for r in rows.values()] == ["ok", "ok", "ok"]
    assert rows["naive"]["implementation"] == "attnprof:naive" and rows["naive"]["logits_rel_diff"] < 1e-5
    assert rows["sdpa"]["model"] == f"model_factories:{factory}" and rows["sdpa"]["seq"] == 16


def test_a_factory_model_without_a_way_to_swap_is_profiled_as_built(cli, tmp_path: Path) -> None:
    result = cli("model", "--model", "model_factories:as_built", "--attn", "sdpa,eager", "-o", str(tmp_path),
                 *FACTORY_ARGS)  # fmt: skip
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)["results"]
    assert (row["variant"], row["implementation"], row["status"], row["source"]) == ("as-built", None, "ok", "model")
    assert (row["shape"], row["causal"], row["heads"]) == ("1x16", None, None)  # the model does not state them
    assert "profiled as built, not under sdpa, eager" in result.stderr


@pytest.mark.parametrize(
    ("factory", "fragment"),
    [("raises", "the factory raised RuntimeError: no weights here"), ("not_a_pair", "not (model, example_inputs)")],
)
def test_a_broken_factory_is_one_line(cli, tmp_path: Path, factory: str, fragment: str) -> None:
    result = cli("model", "--model", f"model_factories:{factory}", "-o", str(tmp_path), *FACTORY_ARGS)
    assert_one_line_error(result, 1, fragment)


def test_the_h200_config_is_a_1b_gqa_llama_in_bf16() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from attnprof.models.built import AttentionShape
    from attnprof.models.hf import attention_shape, hf_config

    config = load_model_config(ROOT / "configs" / "model-h200.yaml")
    assert (config.seq, config.dtype, config.device) == ([2048, 8192], "bf16", "cuda")
    assert config.implementations == ["eager", "sdpa", "flex_attention", "triton-flash"]
    llama = hf_config(str(config.hf), config.hf_config, config.seq)
    assert attention_shape(llama) == AttentionShape(heads=32, kv_heads=8, head_dim=64, causal=True)
    with torch.device("meta"):  # sizes only, no memory
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(llama).parameters())
    assert 1.0e9 < params < 1.2e9
