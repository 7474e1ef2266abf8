"""moe_weights_ahead's reference failure (kernels/README.md, round twenty-one), part by part on
the GPU: c72, the variant, and the variant with its early weight loads off, its early triggers
off, and both off (its block configs alone), each replayed three times against the float64
reference with the routing tolerance opened, printing each MoE layer's routing margin and the
hidden state's error, and each build's hidden state against c72's.

    PYTHONPATH=. python3 kernels/scripts/ahead_parts.py
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, "tests/kernels")
import test_k3_model as T  # noqa: E402 - the model tests' builds and helpers

from kernels.k3 import model as M  # noqa: E402
from kernels.k3.ops import common, moe  # noqa: E402
from kernels.k3.reference_step import ReferenceDecode, rel_err  # noqa: E402

C72 = f"{T.C69}+{T.MLA_COPIES}"
AHEAD_CONFIGS = dict(moe.AHEAD_CONFIGS)
TRIGGER_FIRST = M.trigger_first


def run(tag: str, name: str, preload: bool = True, trigger: bool = True, replays: int = 3) -> torch.Tensor:
    """One build replayed `replays` times against the reference; its final hidden state."""
    moe.AHEAD_CONFIGS.clear()  # preload off: the same blocks, nothing loaded before the wait
    moe.AHEAD_CONFIGS.update({k: (v if preload else (*v[:4], 0)) for k, v in AHEAD_CONFIGS.items()})
    M.trigger_first = TRIGGER_FIRST if trigger else (lambda enabled=True: common.trigger_first(False))
    model = T.gpu_model(1, name)
    start = model.snapshot()
    graph = T.capture(model)
    model.restore(start)
    ref = ReferenceDecode(model, route_tol=1.0)
    for i in range(replays):
        graph.replay()
        torch.cuda.synchronize()
        r = ref.step(routing=model.routing)
        routing = [(c.layer, c.differing_tokens, round(c.worst_margin, 4)) for c in r.routing]
        print(f"{tag:28s} replay {i}: hidden rel err {rel_err(model.hidden(), r.hidden):.3e}  routing {routing}",
              flush=True)
    return model.hidden().clone().cpu()


def main() -> None:
    base = run("c72", C72)
    for tag, kw in [("ahead_moe", {}), ("ahead_moe preload=0", dict(preload=False)),
                    ("ahead_moe no trigger_first", dict(trigger=False)),
                    ("ahead_moe blocks only", dict(preload=False, trigger=False)), ("c72 again", {})]:
        h = run(tag, C72 if tag == "c72 again" else T.C72_AHEAD_MOE, **kw)
        print(f"{tag:28s} hidden against c72's after 3 replays: rel {rel_err(h, base):.3e}", flush=True)


if __name__ == "__main__":
    main()
