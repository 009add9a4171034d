"""`attnprof sweep` on CPU: axis expansion and order, the OOM rule, the stream, resume after Ctrl-C, the ETA."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import msgspec
import pytest

from attnprof.config import load_config, parse_config
from attnprof.errors import ConfigError, OutputError, ResultsFileError
from attnprof.pipeline.eta import Eta, fit
from attnprof.pipeline.measured import CellResult
from attnprof.pipeline.resume import kept_rows
from attnprof.pipeline.sweep import OomRule, cell_key, plan_sweep, row_key, sweep_specs, without_axes
from attnprof.plugins import load_variants
from attnprof.registry import RunSpec
from attnprof.results.files import ResultsFile, ResultsStream, load_results, stream_header
from attnprof.results.schema import Document, Row

REPO = Path(__file__).resolve().parents[1]
QUICK = ("--no-timing",)
BASE = {"device": "cpu", "dtype": "fp32", "shapes": [{"batch": 1, "heads": 4}], "causal": True}


def registry():
    return load_variants(no_plugins=True).registry


def sweep_config(**sweep):
    return parse_config(BASE | {"sweep": sweep, "variants": ["naive", "sdpa-math"], "baseline": "sdpa-math"})


def test_axes_expand_to_the_cross_product_and_invalid_gqa_is_left_out() -> None:
    config = sweep_config(seq=[64, 32], head_dim=[16, 32], kv_heads=[None, 2, 3], mode=["fwd", "bwd"])
    specs, left_out = sweep_specs(config, "cpu")
    assert len(specs) == 2 * 2 * 2 * 2  # kv_heads 3 does not divide 4 heads
    assert left_out == ["heads (4) must be a multiple of kv_heads (3)"]
    assert {(s.seq, s.head_dim, s.n_kv_heads, s.mode) for s in specs} == {
        (seq, d, kv, mode) for seq in (32, 64) for d in (16, 32) for kv in (4, 2) for mode in ("fwd", "bwd")
    }
    assert all(s.batch == 1 and s.heads == 4 and s.dtype == "fp32" and s.causal for s in specs)


def test_the_plan_runs_dtype_by_dtype_seq_ascending_and_the_baseline_first() -> None:
    config = sweep_config(seq=[128, 32, 64], head_dim=[16, 32], dtype=["fp32", "bf16"], causal=[True, False])
    cells, _ = plan_sweep(config, registry().select(["naive", "sdpa-math"]), "cpu")
    assert len(cells) == 3 * 2 * 2 * 2 * 2
    dtypes = [spec.dtype for _, spec in cells]
    assert dtypes == sorted(dtypes, key=["fp32", "bf16"].index)  # one dtype after the other
    for start in range(0, len(cells), 2):  # at each point the baseline runs first
        assert [v.name for v, _ in cells[start : start + 2]] == ["sdpa-math", "naive"]
        assert cells[start][1] == cells[start + 1][1]
    for dtype in ("fp32", "bf16"):
        seqs = [spec.seq for _, spec in cells if spec.dtype == dtype]
        assert seqs == sorted(seqs)  # hence ascending for each variant at each other-axes point


def test_a_sweep_without_axes_is_the_configured_shapes() -> None:
    config = parse_config(BASE | {"shapes": [{"batch": 1, "heads": 2, "seq": 64, "head_dim": 16}], "modes": ["fwd"]})
    specs, left_out = sweep_specs(config, "cpu")
    assert [s.shape_label for s in specs] == ["1x2x64x16"] and left_out == []


def test_no_valid_point_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no valid point"):
        plan_sweep(sweep_config(seq=[32], head_dim=[16], kv_heads=[3]), registry().select(["naive"]), "cpu")


def test_an_option_fixes_its_axis() -> None:
    config = sweep_config(seq=[32, 64], head_dim=[16, 32])
    fixed = without_axes(config, ["seq"])
    assert fixed.sweep.seq is None and fixed.sweep.head_dim == [16, 32]
    assert without_axes(config, ["batch"]) is config


@pytest.mark.parametrize(
    "sweep, message",
    [
        ({"seq": []}, "sweep.seq: List should have at least 1 item"),
        ({"seq": [32], "colour": [1]}, "sweep.colour: unknown key"),
        ({"seq": [32, 32]}, "sweep.seq: 32 given more than once"),
        ({"seq": 32}, "sweep.seq: Input should be a valid list"),
        ({"mode": ["sideways"]}, "sweep.mode.0: Input should be"),
    ],
)
def test_bad_axes_are_one_line_errors(cli, write_config, sweep, message) -> None:
    result = cli("sweep", str(write_config(sweep={"head_dim": [16]} | sweep)))
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_compare_refuses_a_config_with_sweep_axes(cli, write_config) -> None:
    result = cli("compare", str(write_config(sweep={"seq": [32, 64]})))
    assert result.exit_code == 2
    assert "declares sweep axes (seq)" in result.output and "attnprof sweep" in result.output


def stream_rows(folder: Path) -> list[Row]:
    return load_results(folder / "results.jsonl").rows


def printed(stdout: str) -> Document:
    """The results document `--format json` printed, typed."""
    return msgspec.json.decode(stdout, type=Document)


def test_sweep_streams_every_cell_and_an_option_fixes_an_axis(cli, write_config, tmp_path) -> None:
    config = write_config(sweep={"seq": [48, 32], "head_dim": [16, 32]}, variants=["naive", "sdpa-math"])
    result = cli("sweep", str(config), "--head-dim", "16", "--format", "json", *QUICK)
    assert result.exit_code == 0, result.output
    document = printed(result.stdout)
    cells = [(r.variant, r.seq, r.head_dim) for r in document.results]
    assert cells == [("sdpa-math", 32, 16), ("naive", 32, 16), ("sdpa-math", 48, 16), ("naive", 48, 16)]
    [folder] = (tmp_path / "out").glob("*-sweep")
    streamed = load_results(folder / "results.jsonl")
    assert streamed.command == "sweep" and not streamed.truncated
    assert [row_key(r) for r in streamed.rows] == [row_key(r) for r in document.results]
    assert streamed.rows[1].speedup_vs_baseline is not None  # the baseline ran first at that point
    assert document.files is not None and document.files["results_jsonl"] == str(folder / "results.jsonl")
    assert (folder / "results.csv").read_text().count("\n") == 5


def out_of_memory_from(seq: int, monkeypatch) -> None:
    """naive runs out of memory at sequence length `seq` and above (for this test only)."""
    from oom_worker import out_of_memory_from as patch_naive

    patch_naive(seq, monkeypatch.setattr, no_plugins=False)


def test_the_oom_rule_skips_larger_sequences_of_that_variant(cli, write_config, tmp_path, monkeypatch) -> None:
    out_of_memory_from(48, monkeypatch)
    config = write_config(sweep={"seq": [32, 48, 64], "head_dim": [16, 32]}, variants=["naive", "inplace"])
    result = cli("sweep", str(config), *QUICK)
    assert result.exit_code == 0, result.output  # out of memory is recorded, not a failure of the sweep
    [folder] = (tmp_path / "out").glob("*-sweep")
    rows = {(r.variant, r.seq, r.head_dim): r for r in stream_rows(folder)}
    assert len(rows) == 12
    for head_dim in (16, 32):
        assert rows["naive", 32, head_dim].status == "ok"
        assert rows["naive", 48, head_dim].status.startswith("failed: out of memory")
        assert rows["naive", 64, head_dim].status == "skipped: OOM at smaller size (seq 48)"
        assert rows["naive", 64, head_dim].forwards is None  # not run at all
        assert all(rows["inplace", seq, head_dim].status == "ok" for seq in (32, 48, 64))


def test_the_oom_rule_groups_by_every_other_axis() -> None:
    rule = OomRule()
    spec = RunSpec("cpu", "fp32", 1, 4, 64, 16)
    naive = registry().get("naive")
    rule.note_result(CellResult("naive", "built-in", spec, status="failed", reason="out of memory: 8 GiB"))
    assert rule.skip_reason(naive, RunSpec("cpu", "fp32", 1, 4, 128, 16)) == "OOM at smaller size (seq 64)"
    assert rule.skip_reason(naive, RunSpec("cpu", "fp32", 1, 4, 64, 16)) is None  # not larger
    assert rule.skip_reason(naive, RunSpec("cpu", "fp32", 1, 4, 128, 32)) is None  # another head_dim
    assert rule.skip_reason(naive, RunSpec("cpu", "fp32", 1, 4, 128, 16, mode="bwd")) is None
    assert rule.skip_reason(registry().get("inplace"), RunSpec("cpu", "fp32", 1, 4, 128, 16)) is None
    rule.note_result(CellResult("naive", "built-in", spec, status="failed", reason="NaN in output"))
    rule.note_row(
        Row(
            variant="inplace",
            batch=1,
            heads=4,
            kv_heads=4,
            seq=32,
            head_dim=16,
            dtype="fp32",
            causal=True,
            mode="fwd",
            device="cpu",
            status="failed: out of memory: x",
            reason="out of memory: x",
        )
    )
    assert rule.skip_reason(registry().get("inplace"), RunSpec("cpu", "fp32", 1, 4, 64, 16)) is not None


def test_cell_and_row_keys_agree() -> None:
    from attnprof.pipeline.rows import cell_row

    spec = RunSpec("cpu", "bf16", 2, 8, 64, 32, kv_heads=2, causal=False, mode="fwd+bwd")
    assert cell_key("naive", spec) == row_key(cell_row(CellResult("naive", "built-in", spec)))


def interrupt_at(seq: int, monkeypatch) -> None:
    """inplace is interrupted (Ctrl-C) at sequence length `seq`."""
    variant = load_variants(no_plugins=False).registry.get("inplace")
    original = variant.forward

    def forward(q, k, v, causal, state):
        if q.shape[2] == seq:
            raise KeyboardInterrupt
        return original(q, k, v, causal, state)

    monkeypatch.setattr(variant, "forward", forward)


def test_resume_after_ctrl_c_runs_only_the_unfinished_cells(cli, write_config, tmp_path, monkeypatch) -> None:
    config = write_config(sweep={"seq": [32, 48, 64]}, variants=["naive", "inplace", "sdpa-math"])
    with monkeypatch.context() as patch:
        interrupt_at(48, patch)
        first = cli("sweep", str(config), *QUICK)
    assert first.exit_code == 130, first.output
    [folder] = (tmp_path / "out").glob("*-sweep")
    done = stream_rows(folder)
    assert [(r.variant, r.seq) for r in done] == [
        ("sdpa-math", 32),
        ("naive", 32),
        ("inplace", 32),
        ("sdpa-math", 48),
        ("naive", 48),
    ]
    assert json.loads((folder / "results.json").read_text())["interrupted"] is True
    assert f"--resume {folder}" in first.stderr

    again = cli("sweep", "--resume", str(folder), "--format", "json", *QUICK)
    assert again.exit_code == 0, again.output
    assert "5 finished cell(s) kept, 4 of 9 to run" in again.stderr
    document = printed(again.stdout)
    keys = [row_key(r) for r in document.results]
    assert len(keys) == len(set(keys)) == 9 and all(r.status == "ok" for r in document.results)
    assert document.resumed_from == str(folder / "results.jsonl")
    [resumed] = [f for f in (tmp_path / "out").glob("*-sweep*") if f != folder]
    assert len(stream_rows(resumed)) == 9
    assert len(list((resumed / "traces").glob("*.json.gz"))) == 4  # only the cells it ran
    assert len(stream_rows(folder)) == 5  # the earlier sweep's files are left as they were


def test_resume_refuses_other_settings_and_other_files(cli, write_config, tmp_path) -> None:
    config = write_config(sweep={"seq": [32]}, variants=["naive"])
    assert cli("sweep", str(config), *QUICK).exit_code == 0
    [folder] = (tmp_path / "out").glob("*-sweep")
    other_seed = cli("sweep", "--resume", str(folder), "--seed", "7", *QUICK)
    assert other_seed.exit_code == 2
    assert "cannot resume" in other_seed.output and "seed 0 (now 7)" in other_seed.output
    longer = cli("sweep", "--resume", str(folder), "--min-time", "0.5")
    assert longer.exit_code == 2 and "min_time_s 0.25 (now 0.5)" in longer.output
    inherited = cli("sweep", "--resume", str(folder))  # --no-timing is taken from the sweep it continues
    assert inherited.exit_code == 0 and "1 finished cell(s) kept, 0 of 1 to run" in inherited.stderr
    compared = cli("compare", str(write_config()), *QUICK)
    [compare_results] = (tmp_path / "out").glob("*-compare/results.json")
    assert compared.exit_code == 0
    wrong = cli("sweep", "--resume", str(compare_results))
    assert wrong.exit_code == 2 and "not the results stream of a sweep" in wrong.output
    assert cli("sweep", "--resume", str(tmp_path / "nowhere")).exit_code == 2


def test_resume_keeps_finished_and_out_of_memory_rows_and_redoes_other_failures() -> None:
    rows = [
        Row(variant="a", status="ok"),
        Row(variant="b", status="skipped: needs CUDA", reason="needs CUDA"),
        Row(variant="c", status="skipped: OOM at smaller size (seq 64)", reason="OOM at smaller size (seq 64)"),
        Row(variant="d", status="failed: out of memory: 2 GiB", reason="out of memory: 2 GiB"),
        Row(variant="e", status="failed: NaN in output", reason="NaN in output"),
    ]
    kept = kept_rows(ResultsFile(Path("s.jsonl"), Document(command="sweep"), rows))
    assert [r.variant for r in kept] == ["a", "b", "c", "d"]


def test_the_stream_is_created_once_and_read_back_line_by_line(tmp_path) -> None:
    path = tmp_path / "results.jsonl"
    stream = ResultsStream(path, stream_header(Document(command="sweep")))
    assert stream_header(Document(command="sweep")).format == "attnprof-results-jsonl"
    stream.append(Row(variant="a", latency_us=float("nan")))
    stream.close()
    with pytest.raises(OutputError):
        ResultsStream(path, Document())
    with path.open("a") as handle:
        handle.write('{"variant": "b", "lat')  # a crash in the middle of a line
    loaded = load_results(path)
    assert loaded.rows == [Row(variant="a", latency_us=None)] and loaded.truncated
    with pytest.raises(ResultsFileError):
        load_results(tmp_path / "missing.jsonl")


def test_the_eta_fits_each_variant_by_flops() -> None:
    assert fit([(1.0, 3.0), (2.0, 5.0), (4.0, 9.0)]) == pytest.approx((1.0, 2.0))
    assert fit([(1.0, 2.0), (1.0, 4.0)]) == (3.0, 0.0)  # one cost: the mean time
    assert fit([(1.0, 1.0), (2.0, 10.0)])[0] == 0.0  # no negative fixed cost
    eta = Eta()
    first = RunSpec("cpu", "fp32", 1, 1, 64, 16, causal=False)
    assert eta.remaining([("a", first)]) is None
    small, large = first, RunSpec("cpu", "fp32", 1, 1, 128, 16, causal=False)
    eta.add("slow", small, 1.0)
    eta.add("slow", large, 4.0)  # 4x the FLOPs (no mask: exactly S²): a = 0, 4x the time
    eta.add("fast", small, 0.5)
    assert eta.remaining([("slow", RunSpec("cpu", "fp32", 1, 1, 256, 16, causal=False))]) == pytest.approx(16.0)
    assert eta.remaining([("fast", large)]) == pytest.approx(0.5)  # one cost so far: its mean
    assert eta.remaining([("new", large)]) == pytest.approx(eta.remaining([("slow", large)]), rel=0.5)


def test_the_eta_fits_on_the_split_s_cost_so_a_decode_cell_is_costed_by_its_bytes() -> None:
    # A variant's prefill cells (compute-bound) fix its rate; a decode cell still to come (one query
    # against 128k keys, memory-bound) is then estimated by the cache it reads (`call_seconds`, the
    # sharding cost), not by its FLOPs, which would take it for ~15x quicker.
    from attnprof.analysis.roofline import step_flops
    from attnprof.pipeline.sharding import NOMINAL_FLOP_RATE, call_seconds

    eta = Eta()
    for seq in (4096, 8192):
        prefill = RunSpec("cuda", "bf16", 1, 32, seq, 128, kv_heads=8)
        eta.add("v", prefill, 1.0 + 40 * call_seconds(prefill))
    decode = RunSpec("cuda", "bf16", 8, 32, 131072, 128, kv_heads=8, q_len=1)
    assert eta.remaining([("v", decode)]) == pytest.approx(1.0 + 40 * call_seconds(decode))
    by_flops = 1.0 + 40 * step_flops(decode) / NOMINAL_FLOP_RATE[("cuda", "bf16")]
    assert eta.remaining([("v", decode)]) - 1.0 > 10 * (by_flops - 1.0)


def test_the_clock_is_read_while_sampling_without_moving_the_writer(monkeypatch) -> None:
    from attnprof.profiling.clocks import ClockSampler

    sampler = ClockSampler("cuda:0")
    handle = tempfile.TemporaryFile("w+")
    handle.write("2026/12/01 10:00:00.000, 1980, 1980, 0x0000000000000000\n2026/12/01 10:00:00.025, 1650, 1980, 0x4\n")
    handle.flush()
    sampler._file, sampler._proc = handle, object()
    samples = sampler.samples_so_far()
    assert [s.sm_mhz for s in samples] == [1980, 1650]
    assert handle.tell() == handle.seek(0, 2)  # the offset nvidia-smi writes at is where it was
    handle.close()


def test_shipped_sweep_configs() -> None:
    cpu = load_config(REPO / "configs" / "sweep-cpu.yaml")
    cells, left_out = plan_sweep(cpu, registry().select(cpu.variants), "cpu")
    assert cpu.device == "cpu" and len(cells) == 24 and not left_out
    h200 = load_config(REPO / "configs" / "sweep-h200.yaml")
    assert h200.device == "cuda" and h200.dtype == "bf16" and h200.causal and h200.variants == ["*"]
    assert h200.sweep.seq == [512 * 2**i for i in range(7)] and h200.sweep.head_dim == [64, 128]
    specs, _ = sweep_specs(h200, "cuda:0")
    assert len(specs) == 14
