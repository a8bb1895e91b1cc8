"""Where one public forward call's wall time goes, on the GPU, as a timeline (64k tokens, realistic selection):

    python3 -m bench.call_trace OUT CONFIG [CONFIG ...]        # e.g. fla-d64-g1 fla-default
    python3 -m bench.call_trace --summary OUT/trace_CONFIG.json ...   # the medians of each trace's calls

torch.profiler (CPU and CUDA activities) over 10 calls of nsa_iree.selection_attention_fwd, each between two
synchronisations as nsa_iree.benchmark times it, with the library's layers marked (the public function,
api.forward_into, Module.call, the tensors' imports, the torch stream's wait and IREE's invoke). Per call one JSON
row of offsets in microseconds from the public function's start: where each layer begins and ends, the driver's
launches (whatever thread issued them, as CUPTI reports them) and the kernels' GPU spans; then the median call.
The chrome trace of the whole run is written to OUT/trace_CONFIG.json. First it asks IREE's CUDA semaphores for a
CUDA event (`export_timepoint`, `import_timepoint`): IREE 3.13 answers UNIMPLEMENTED for both.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
from pathlib import Path

import torch

import nsa_iree
from nsa_iree import api, runtime

from .bench import CONFIGS, _sync, make_problem

MARKS = ("public", "forward_into", "module.call", "import", "stream_wait", "invoke")


def _marked(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(f"nsa:{name}"):
            return fn(*args, **kwargs)
    return wrapper


class _InvokeMarked:
    """A VmContext whose invoke is marked (the C object's attribute cannot be patched)."""

    def __init__(self, context):
        self._context = context

    def invoke(self, *args):
        with torch.profiler.record_function("nsa:invoke"):
            return self._context.invoke(*args)

    def __getattr__(self, name):
        return getattr(self._context, name)


def _mark_layers(module) -> None:
    """Mark the library's layers (once per process) and module's invoke."""
    if not isinstance(module.context, _InvokeMarked):
        module.context = _InvokeMarked(module.context)
    if getattr(runtime.Module.call, "__wrapped__", None) is not None:
        return
    nsa_iree.selection_attention_fwd = _marked("public", nsa_iree.selection_attention_fwd)
    api.forward_into = _marked("forward_into", api.forward_into)
    runtime.Module.call = _marked("module.call", runtime.Module.call)
    runtime.Device.import_tensor = _marked("import", runtime.Device.import_tensor)
    if torch.cuda.is_available():
        stream_type = type(torch.cuda.current_stream())
        stream_type.synchronize = _marked("stream_wait", stream_type.synchronize)


def _rows(prof) -> list[dict]:
    events = prof.events()
    publics = sorted((e for e in events if e.name == "nsa:public"), key=lambda e: e.time_range.start)
    rows = []
    for index, call in enumerate(publics):
        t0, t1 = call.time_range.start, call.time_range.end
        end = publics[index + 1].time_range.start if index + 1 < len(publics) else float("inf")
        row = {"call_us": round(t1 - t0, 1)}
        for name in MARKS[1:]:
            spans = [e for e in events if e.name == f"nsa:{name}" and t0 <= e.time_range.start <= t1]
            if spans:
                row[f"{name}_us"] = [round(spans[0].time_range.start - t0, 1),
                                     round(spans[-1].time_range.end - t0, 1), len(spans)]
        launches = [e for e in events if "LaunchKernel" in e.name and t0 <= e.time_range.start < end]
        row["launches_us"] = [[round(e.time_range.start - t0, 1), round(e.time_range.end - t0, 1)] for e in launches]
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                   and t0 <= e.time_range.start < end]
        row["kernels_us"] = [[e.name[:40], round(e.time_range.start - t0, 1), round(e.time_range.end - t0, 1)]
                             for e in kernels]
        others = sorted({e.name for e in events if e.device_type == torch.autograd.DeviceType.CPU
                         and t0 <= e.time_range.start < t1 and not e.name.startswith("nsa:")})
        row["other_cpu_events"] = others[:20]
        rows.append(row)
    return rows


def main(out: str, config: str, seq: int = 65536) -> None:
    cfg = CONFIGS[config]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")     # (the CPU: to try the script)
    q, k, v, _, idx = make_problem(cfg, seq, "realistic", device, generate_on_device=device.type == "cuda")
    bs = cfg["block_size"]
    nsa_iree.selection_attention_fwd(q, k, v, idx, bs)
    idx32 = api.effective_block_indices(idx, None)
    spec, _ = api.loaded_spec(api.describe(q, k, v, idx32, bs), "forward")
    _mark_layers(api.kernels(spec, "forward", q.device))
    public = nsa_iree.selection_attention_fwd
    for _ in range(3):
        public(q, k, v, idx, bs)
    _sync(device)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(10):
            _sync(device)
            public(q, k, v, idx, bs)
            _sync(device)
    prof.export_chrome_trace(str(Path(out) / f"trace_{config}.json"))
    rows = _rows(prof)
    for row in rows:
        print(json.dumps({"config": config, **row}), flush=True)
    median = statistics.median(r["call_us"] for r in rows)
    print(json.dumps({"config": config, "median_call_us": median}), flush=True)


def ask_event_export() -> None:
    """Whether IREE 3.13's CUDA semaphores export a timepoint as a CUDA event (and import one)."""
    from iree.runtime import _binding as b

    device = runtime.device_for(torch.device("cuda")).hal_device
    semaphore = device.create_semaphore(0)
    for kind in ("CUDA_EVENT", "ASYNC_PRIMITIVE"):
        timepoint = b.HalExternalTimepoint()
        try:
            semaphore.export_timepoint(1, getattr(b.ExternalTimepointType, kind), 0, timepoint)
            print(json.dumps({"export_timepoint": kind, "result": "ok", "type": str(timepoint.type)}), flush=True)
        except Exception as err:  # noqa: BLE001 - the question is which error
            print(json.dumps({"export_timepoint": kind, "result": f"{type(err).__name__}: {err}"}), flush=True)
    try:
        semaphore.import_timepoint(1, b.HalExternalTimepoint())
        print(json.dumps({"import_timepoint": "ok"}), flush=True)
    except Exception as err:  # noqa: BLE001
        print(json.dumps({"import_timepoint": f"{type(err).__name__}: {err}"}), flush=True)


def summarise(paths) -> None:
    """Per chrome trace of this script, the medians over its calls (µs): the public call, the host before IREE's
    invoke, the invoke to the driver's first launch (IREE's worker thread), the kernels (first start to last end), and
    the last kernel's end to Module.call's return (the wait): python3 -m bench.call_trace --summary TRACE.json ..."""
    for path in paths:
        events = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e.get("ph") == "X"]

        def first(name, t0, t1):
            return next(e for e in sorted(events, key=lambda e: e["ts"]) if name(e) and t0 <= e["ts"] <= t1)

        rows = []
        for call in (e for e in events if e["name"] == "nsa:public"):
            t0, t1 = call["ts"], call["ts"] + call["dur"]
            invoke = first(lambda e: e["name"] == "nsa:invoke", t0, t1)
            launch = first(lambda e: "LaunchKernel" in e["name"], t0, t1)
            kernels = [e for e in events if e.get("cat") == "kernel" and t0 <= e["ts"] <= t1]
            kernel = {"ts": min(e["ts"] for e in kernels),
                      "dur": max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)}
            module_call = first(lambda e: e["name"] == "nsa:module.call", t0, t1)
            rows.append({"call": call["dur"], "before_invoke": invoke["ts"] - t0,
                         "invoke_to_launch": launch["ts"] - invoke["ts"], "kernel": kernel["dur"],
                         "kernel_end_to_return": module_call["ts"] + module_call["dur"] - kernel["ts"] - kernel["dur"]})
        print(path, json.dumps({k: round(statistics.median(r[k] for r in rows), 1) for k in rows[0]}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summarise(sys.argv[2:])
        sys.exit()
    if torch.cuda.is_available():
        ask_event_export()
    for name in sys.argv[2:]:
        main(sys.argv[1], name, int(__import__("os").environ.get("SEQ", 65536)))
