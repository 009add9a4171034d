"""CPU checks of benchmarks/decode_graph.py's pure parts (the measurement itself needs CUDA and triton)."""

import importlib.util
import sys
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "decode_graph", Path(__file__).parents[1] / "benchmarks" / "decode_graph.py"
)
decode_graph = importlib.util.module_from_spec(SPEC)
sys.modules["decode_graph"] = decode_graph  # its dataclass looks its module up
SPEC.loader.exec_module(decode_graph)
Entry = decode_graph.Entry


def entry(latency=37.6, bench=37.0, problem=None, tolerance=0.10):
    ratio, within = decode_graph.compared(latency, bench, tolerance)
    return Entry("1x32x1/32768x128/kv8", "sdpa-cudnn", "cuda-graph replay", latency, 3622.0, 80.5, bench, ratio,
                 within, problem)


def test_arguments_default_to_the_h200_decode_config():
    args = decode_graph.parse_args([])
    assert args.config.name == "decode-h200.yaml" and args.config.is_file()
    assert args.tolerance == 0.10 and args.out is None
    assert decode_graph.parse_args(["--out", "x.json", "--tolerance", "0.05"]).out == Path("x.json")
    with pytest.raises(SystemExit):
        decode_graph.parse_args(["--tolerance", "2"])


def test_ratio_and_tolerance():
    assert decode_graph.compared(110.0, 100.0, 0.10) == (pytest.approx(1.1), True)
    assert decode_graph.compared(111.0, 100.0, 0.10)[1] is False
    assert decode_graph.compared(89.0, 100.0, 0.10)[1] is False
    assert decode_graph.compared(None, 100.0, 0.10) == (None, None)


def test_the_table_and_the_exit_code():
    good, bad = entry(), entry(latency=50.0)
    table = decode_graph.markdown_table([good, bad, entry(None, None, problem="failed: out of memory")], 4512.3)
    lines = table.splitlines()
    assert lines[0] == "read bandwidth measured in this run: 4,512 GB/s"
    assert lines[4] == "| 1x32x1/32768x128/kv8 | sdpa-cudnn | 37.6 | 3,622 | 80.5 | 37.0 | 1.016 | yes |"
    assert lines[5].endswith("| 50.0 | 3,622 | 80.5 | 37.0 | 1.351 | **no** |")
    assert lines[6].endswith("| n/a | n/a | n/a (failed: out of memory) |")
    assert decode_graph.exit_code([good]) == 0 and decode_graph.exit_code([good, bad]) == 1
    assert decode_graph.exit_code([entry(None, None, problem="skipped")]) == 0


def test_it_refuses_to_run_without_cuda(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the benchmark would run")
    assert decode_graph.main(["--out", str(tmp_path / "x.json")]) == 2
    assert "needs" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
