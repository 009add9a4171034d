"""Large Kineto traces for the analysis benchmark, made from the real H200 traces in the tests.

The seven traces in tests/data/synthetic/real_h200 (naive, inplace, the four SDPA backends,
two streams; torch 2.11 on an H200) are replicated one after another until the trace holds
the requested number of events. Each copy keeps every event of its source (cpu ops with
`Input type`/`Input Dims`, runtime and driver calls, kernels with launch facts, memcpys,
memsets, `ac2g` flows, `gpu_user_annotation`s) and gets:

- timestamps shifted past the end of the previous copy,
- new correlation ids (runtime call, device event and flow ids move together),
- new `External id`s, and `ProfilerStep#N` renumbered so steps stay unique.

The metadata events (`ph: M`) and top-level keys of the first source are written once. The
file is written as a stream, so generating 5M events needs little memory.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REAL_TRACES = Path(__file__).resolve().parent.parent / "tests" / "data" / "synthetic" / "real_h200"
SOURCES = ("naive", "inplace", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "twostream")
GAP_US = 50.0

try:
    from orjson import dumps as _orjson_dumps

    def _dumps(obj: Any) -> str:
        return _orjson_dumps(obj).decode()
except ImportError:  # pragma: no cover - depends on the environment
    _dumps = json.dumps


class _Template:
    """One source trace's events, with what must change from copy to copy."""

    def __init__(self, data: dict[str, Any]) -> None:
        body = [e for e in data["traceEvents"] if e.get("ph") in ("X", "s", "f") and e.get("cat") != "Trace"]
        self.events = body
        self.start = min(e["ts"] for e in body)
        self.end = max(e["ts"] + e.get("dur", 0.0) for e in body)
        corrs = [e["args"]["correlation"] for e in body if "correlation" in e.get("args", {})]
        corrs += [e["id"] for e in body if e.get("cat") == "ac2g"]
        self.corr_lo, self.corr_span = min(corrs), max(corrs) - min(corrs) + 1
        exts = [e["args"]["External id"] for e in body if "External id" in e.get("args", {})]
        self.ext_lo, self.ext_span = min(exts), max(exts) - min(exts) + 1
        self.steps = sorted(int(e["name"].split("#")[1]) for e in body if e["name"].startswith("ProfilerStep#"))

    def copy(self, t0: float, corr0: int, ext0: int, step0: int) -> Iterator[dict[str, Any]]:
        """The events moved to start at `t0`, with ids from `corr0`/`ext0` and steps from `step0`."""
        dt, dc, de = t0 - self.start, corr0 - self.corr_lo, ext0 - self.ext_lo
        first_step = self.steps[0]
        for e in self.events:
            e = dict(e)
            e["ts"] = round(e["ts"] + dt, 3)
            if e.get("cat") == "ac2g":
                e["id"] += dc
            else:
                args = e.get("args")
                if args:
                    args = e["args"] = dict(args)
                    if "correlation" in args:
                        args["correlation"] += dc
                    if "External id" in args:
                        args["External id"] += de
                name = e["name"]
                if name.startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(name[13:]) - first_step + step0}"
            yield e


def _load(name: str) -> dict[str, Any]:
    with gzip.open(REAL_TRACES / f"{name}.json.gz", "rt", encoding="utf-8") as fh:
        return json.load(fh)


def write_trace(path: Path, n_events: int, on_progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Write a trace of at least `n_events` events (whole copies of the sources) to `path`.

    `.json.gz` paths are gzipped. Returns {events, copies, forwards, bytes_uncompressed}.
    """
    sources = [_load(n) for n in SOURCES]
    templates = [_Template(d) for d in sources]
    head = sources[0]
    meta = [e for e in head["traceEvents"] if e.get("ph") == "M"]
    opener = gzip.open if str(path).endswith(".gz") else open
    written = len(meta)
    copies = forwards = 0
    uncompressed = 0
    t, corr, ext, step = templates[0].start, 1, 1, 1
    with opener(path, "wt", encoding="utf-8") as fh:
        def out(text: str) -> None:
            nonlocal uncompressed
            fh.write(text)
            uncompressed += len(text)  # the text is ASCII: characters are bytes

        out("{")
        for key, value in head.items():
            if key != "traceEvents" and key != "traceName":
                out(f"{json.dumps(key)}: {_dumps(value)}, ")
        out('"traceEvents": [\n')
        out(",\n".join(_dumps(e) for e in meta))
        while written < n_events:
            tpl = templates[copies % len(templates)]
            chunk = [_dumps(e) for e in tpl.copy(t, corr, ext, step)]
            out(",\n" + ",\n".join(chunk))
            written += len(chunk)
            forwards += len(tpl.steps)
            copies += 1
            t += tpl.end - tpl.start + GAP_US
            corr += tpl.corr_span + 10
            ext += tpl.ext_span + 10
            step += len(tpl.steps)
            if on_progress and copies % 1000 == 0:
                on_progress(written)
        out('\n], "traceName": "attnprof-scale"}\n')
    return {"events": written, "copies": copies, "forwards": forwards, "bytes_uncompressed": uncompressed}
