"""Speed of `diff` on two large exports against one cold analyze, measured side by side in
one run; and a check that the diff's JSON equals that of the code before the speed work.

    python bench/bench_diff.py OLD.sqlite NEW.sqlite [--repeat 3] [--reference REV]

Each run is a fresh process with empty caches, measured two ways: the work inside the
process (bench/child.py), imports excluded; and whole commands, `k3trace analyze OLD
--json` against `k3trace diff OLD NEW --json` from start to exit, as the issue measured and
as a user waits for them (each command's start-up is paid once by the diff). Target
(issue 13): diff of two full-depth exports (~430k kernels each) within 1.6x one cold
analyze, Shapley sampling included. The exports: full-depth K3 decode at B=1,
~175 steps each (kernels/scripts/h200_k3.sh `long`: k3_full_bs1_base and
k3_full_bs1_router_multipass), not committed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

from harness import BASELINE, reference_tree, run_child, run_command, same_json, temp_folder, waited_note


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--reference", default=BASELINE, help="commit whose JSON must be matched ('none': skip)")
    args = p.parse_args()
    work = temp_folder("k3bench-diff-")
    pair = [str(args.old), str(args.new)]
    try:
        check = "not checked"
        if args.reference != "none":
            reference = reference_tree(args.reference, work / "reference")
            run_child(["diff", *pair, "--json-out", str(work / "reference.json")], pythonpath=reference)
            run_child(["diff", *pair, "--json-out", str(work / "mine.json")])
            check = same_json(work / "mine.json", work / "reference.json")
        analyze_s, diff_s, children, analyze_cmd, diff_cmd = [], [], [], [], []
        for i in range(args.repeat):  # interleaved: noise hits both alike
            children.append(run_child(["analyze", pair[0], "--cache-dir", str(work / f"a{i}")]))
            analyze_s.append(children[-1].seconds)
            children.append(run_child(["diff", *pair, "--cache-dir", str(work / f"d{i}")]))
            diff_s.append(children[-1].seconds)
            analyze_cmd.append(run_command(["analyze", pair[0]], work / f"ac{i}"))
            diff_cmd.append(run_command(["diff", *pair], work / f"dc{i}", analyses=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    a, d = statistics.median(analyze_s), statistics.median(diff_s)
    print(f"old: {args.old.name}, new: {args.new.name}; medians of {args.repeat}; JSON vs {args.reference}: {check}")
    print(waited_note(children))
    print("inside the process, imports excluded:")
    print(f"  analyze, cold (one export)      : {a:7.3f} s")
    print(f"  diff, cold (both exports)       : {d:7.3f} s   ratio {d / a:5.2f}  (target <= 1.6)")
    a, d = statistics.median(analyze_cmd), statistics.median(diff_cmd)
    print("whole commands, start to exit:")
    print(f"  analyze, cold (one export)      : {a:7.3f} s")
    print(f"  diff, cold (both exports)       : {d:7.3f} s   ratio {d / a:5.2f}  (target <= 1.6)")


if __name__ == "__main__":
    main()
