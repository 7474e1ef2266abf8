"""Cut the bundled Kineto fixture out of an H200 torch.profiler trace of kernels/hf_llama.py.

    python kernels/scripts/kineto_fixture.py hf_base_kineto.pt.trace.json k3trace/data/hf_base_kineto.pt.trace.json.gz

Keeps, byte for byte as torch.profiler wrote them, the GPU activity (kernels, memcpy, memset),
the CUDA runtime and driver calls and the process/thread names of the CUDA process and GPU 0,
from the start up to the end of the first `--replays` graph replays (launch calls whose GPU
work lies past that are dropped too); drops CPU-op, Python and flow events. `--annotations`
keeps the CUDA process's record_function ranges too (the layer and step labels). The header keeps only what is not host- or run-specific: the schema version,
each device's id, name, compute capability and SM count, and the CUDA/CUPTI versions (no
trace id, wall-clock base time or file path).
"""

from __future__ import annotations

import argparse
import gzip
import json

KEEP = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver"}
DEVICE_FIELDS = ("id", "name", "computeMajor", "computeMinor", "numSms")
HEADER_FIELDS = ("schemaVersion", "cuda_driver_version", "cuda_runtime_version", "cupti_version", "displayTimeUnit")


def blocks(text: str) -> list[str]:
    """The event objects of a trace in Kineto's own layout (`  {` ... `  }`), verbatim."""
    body = text[text.index('"traceEvents": [') + len('"traceEvents": ['):]
    out, current = [], None
    for line in body.splitlines():
        if line == "  {":
            current = [line]
        elif current is not None:
            current.append(line)
            if line in ("  }", "  },"):
                out.append("\n".join(current[:-1] + ["  }"]))
                current = None
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("source")
    p.add_argument("output")
    p.add_argument("--replays", type=int, default=8)
    p.add_argument("--annotations", action="store_true",
                   help="also keep the CUDA process's record_function ranges (layer and step labels)")
    args = p.parse_args()
    text = open(args.source).read()
    doc = json.loads(text)
    events = [(b, json.loads(b)) for b in blocks(text)]
    assert len(events) == len(doc["traceEvents"]), "not Kineto's own layout"
    cuda_pids = {e["pid"] for _, e in events if e.get("cat") == "cuda_runtime"}
    launches = sorted(e["ts"] for _, e in events if e.get("name") == "cudaGraphLaunch")
    kept_corr = {e["args"]["correlation"] for _, e in events if e.get("name") == "cudaGraphLaunch"
                 and e["ts"] <= launches[args.replays - 1]}
    replay_end = max(e["ts"] + e["dur"] for _, e in events if e.get("cat") == "kernel"
                     and e["args"]["correlation"] in kept_corr)
    gpu_corr = {e["args"]["correlation"] for _, e in events if e.get("cat") in KEEP - {"cuda_runtime", "cuda_driver"}}
    kept_gpu = {e["args"]["correlation"] for _, e in events if e.get("cat") in KEEP - {"cuda_runtime", "cuda_driver"}
                and e["ts"] + e.get("dur", 0) <= replay_end}
    out = []
    for block, e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["args"]["correlation"] in gpu_corr - kept_gpu:
            continue  # a launch whose GPU work lies past the cut
        if e.get("ph") == "M":
            if e["pid"] in cuda_pids or e["pid"] == 0:
                out.append(block)
        elif (args.annotations and e.get("cat") == "user_annotation" and e["pid"] in cuda_pids
              and e["ts"] + e["dur"] <= replay_end):
            out.append(block)
        elif e.get("cat") in KEEP and e["ts"] <= replay_end:
            if e.get("cat") not in ("cuda_runtime", "cuda_driver") and e["ts"] + e["dur"] > replay_end:
                continue
            out.append(block)
    header = {k: doc[k] for k in HEADER_FIELDS if k in doc}
    header["deviceProperties"] = [{k: d[k] for k in DEVICE_FIELDS} for d in doc["deviceProperties"]]
    head = json.dumps(header, indent=2)[:-2]
    with gzip.open(args.output, "wt", compresslevel=9) as fh:
        fh.write(head + ',\n  "traceEvents": [\n' + ",\n".join(out) + "\n  ]\n}\n")


if __name__ == "__main__":
    main()
