"""The diff's validation table on real A/B pairs: measured deltas, noise band, what the
replay models, the residual, and the share the top edit holds.

    python bench/validate_diff.py OLD[,OLD2] NEW[,NEW2] [OLD NEW ...]

Each side is one export or a comma-separated list of repeated runs. Prints one row per pair
(no timing here: the truths per pair are asserted in tests/test_diff_pairs.py).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from k3trace.analyses import analyze_report
from k3trace.config import load_config
from k3trace.diff import diff


def main(argv: list[str]) -> None:
    if len(argv) < 2 or len(argv) % 2:
        raise SystemExit(__doc__)
    cfg = load_config()
    cache = Path(tempfile.mkdtemp(prefix="k3validate-"))

    def side(spec: str):
        return [analyze_report(Path(p), cfg, cache_dir=cache) for p in spec.split(",")]

    print(f"{'old -> new':58s} {'ITL':>8s} {'span':>8s} {'band':>6s} {'src':>5s} {'model':>8s} {'resid':>6s} "
          f"{'med-mean':>8s}  top edit (share of the mean step's change)")
    for old, new in zip(argv[::2], argv[1::2]):
        d = diff(side(old), side(new))
        top = d.attribution.row(0, named=True)
        share = top["contribution_us"] / d.mean_span_delta_us if d.mean_span_delta_us else float("nan")
        name = f"{Path(old.split(',')[0]).name.split('.')[0]} -> {Path(new.split(',')[0]).name.split('.')[0]}"
        print(f"{name:58s} {d.itl_delta_us:+8.2f} {d.span_delta_us:+8.2f} {d.span_noise_band_us or 0:6.2f} "
              f"{(d.noise_source or '-')[:5]:>5s} {d.modelled_us:+8.2f} {d.residual_us:+6.2f} {d.skew_us:+8.2f}  "
              f"{top['kind']}: {top['edit'][:60]} ({top['family']}) {top['contribution_us']:+.2f} = {share:.0%}")


if __name__ == "__main__":
    main(sys.argv[1:])
