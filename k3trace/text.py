"""Small text forms shared by the renderers and by the names the diff and whatif give to
the changes they describe (no layer imports, so every layer may use them)."""

from __future__ import annotations

from typing import Sequence


def layer_text(layers: Sequence[int] | None) -> str:
    """[1, 2, 3, 5, 6, 7] -> `1-3, 5-7`; [] -> `-`."""
    known = sorted({int(x) for x in layers or () if x is not None})
    if not known:
        return "-"
    def run(a: int, b: int) -> str:
        return str(a) if a == b else f"{a}-{b}"

    runs, start, prev = [], known[0], known[0]
    for x in known[1:]:
        if x != prev + 1:
            runs.append(run(start, prev))
            start = x
        prev = x
    runs.append(run(start, prev))
    return ", ".join(runs)
