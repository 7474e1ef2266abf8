"""Source `aligned_eager`: a replay whose capture left no labels in the report (the graph was
captured before the window opened, as engines do) takes them from an eager run of the same
code in the window, found by content: eager launches some range labelled, grouped by the
step range they sat in whatever it is called, or, outside any step range, taken as one run.
The replay's kernels in capture order are aligned by name with the eager launch order and
each matched kernel copies its eager twin's label."""

from __future__ import annotations

import difflib

import polars as pl

from k3trace.model.labels import units

#: Least share of a replay's kernels an eager run must match, in order, to lend its labels.
MIN_COVERAGE = 0.5
#: An eager run longer than this many replays is cut to a window around its first match
#: (difflib's cost grows with the length of what it searches).
MAX_RUN = 3


def align(names: list[str], donor: list[str]) -> tuple[float, list[tuple[int, int]]]:
    """Share of `names` matched in order within `donor`, and the matched index pairs."""
    matcher = difflib.SequenceMatcher(a=names, b=donor, autojunk=False)
    pairs = [(i + k, j + k) for i, j, n in matcher.get_matching_blocks() for k in range(n)]
    return (len(pairs) / len(names) if names else 0.0), pairs


def window(run: pl.DataFrame, names: list[str]) -> pl.DataFrame:
    """At most two replays' worth of a long eager run, from where the replay's first
    kernels first appear in it."""
    if run.height <= MAX_RUN * len(names):
        return run
    run_names = run["name"].to_list()
    head = names[: min(8, len(names))]
    start = next((i for i in range(len(run_names) - len(head) + 1) if run_names[i:i + len(head)] == head), 0)
    return run.slice(start, 2 * len(names))


def eager_runs(kernels: pl.DataFrame, labelled_by: tuple[str, ...]) -> list[pl.DataFrame]:
    """Eager kernels in launch order, one run per step range (and one of those outside any),
    keeping runs in which some source of `labelled_by` put a label."""
    eager = kernels.filter(pl.col("graph_node_id").is_null(), pl.col("launch_start").is_not_null())
    runs = []
    for _, run in eager.group_by("eager_step", maintain_order=True):
        if run.filter(pl.col("label_source").is_in(list(labelled_by))).height:
            runs.append(run.sort("launch_start", "kernel_id"))
    return runs


def aligned_eager(kernels: pl.DataFrame, reps: dict[str, pl.DataFrame], wanted: set[str],
                  labelled_by: tuple[str, ...]) -> pl.DataFrame:
    """Labels for the replay units in `wanted`, from the best-aligned labelled eager run."""
    runs = eager_runs(kernels, labelled_by)
    out = [pl.DataFrame(schema=units.mapping_schema())]
    for unit in sorted(wanted):
        rep = reps[unit]
        names = rep["name"].to_list()
        best = None
        for run in runs:
            run = window(run, names)
            coverage, pairs = align(names, run["name"].to_list())
            if coverage >= MIN_COVERAGE and (best is None or coverage > best[0]):
                best = (coverage, pairs, run)
        if best is None:
            continue
        _, pairs, run = best
        layers: list = [None] * rep.height
        families: list = [None] * rep.height
        run_layers, run_families = run["layer"].to_list(), run["family"].to_list()
        for i, j in pairs:
            layers[i], families[i] = run_layers[j], run_families[j]
        out.append(units.mapping(rep, layers, families))
    return pl.concat(out)
