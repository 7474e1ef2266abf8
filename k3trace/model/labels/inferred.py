"""Source `inferred`: layers found in the repeating kernel sequence of a replay no label
reached (METRICS.md, "Inferred layers").

1. Every decoder layer holds one attention. Attention kernels: those whose name rule gives an
   `attention_families` family, or that match `[labels.inference] attention_pattern`;
   attention kernels of one family less than `CORE_GAP` kernels apart are one attention
   (MLA: q_concat twice, two GEMM kernels, fmha, combine). Their count is the layer count.
2. The boundaries: an *anchor* is a kernel occurring once per layer, interleaved with the
   attentions (K3's residual add ends every layer); boundaries sit a fixed number of kernels
   after each anchor, or before it. With no such kernel (or as well), the attentions anchor
   the layers, each attention family with its own offset (the kernels before an attention
   are the same in every layer of its kind, whatever the layer before was). The first layer
   starts where the sequence starts most like the other layers, the last ends where it ends
   most like them. Among all anchors and offsets with exactly one attention per layer, the
   winner has every layer open with a kernel matching `layer_start_pattern` (a pre-norm
   layer opens with its norm), then the fewest distinct layer sequences, then the shortest
   prologue plus epilogue, then the earliest boundaries. Kernels are compared by signature
   (demangled name, grid, block) where they have one, else by name.
3. Segments: a layer's first kernels recur where its second half starts (K3: the attention
   residual pair before the attention and before the MoE; Llama: the RMSNorm before the
   attention and before the MLP), after the layer's attention (SGLang's Qwen3 runs its q and
   k head norms with the input norm's kernel before its attention: no segment starts there);
   a layer whose start does not recur (the first layer's norm adds no residual) splits where
   the most similar layer does. A segment holding an
   attention is that attention family (`attention` when only the pattern matched); another
   is `moe` when one of its kernel names, found in no other kind of MLP segment, matches the
   `moe` name rule, else `dense`. Kernels whose name rule gives a `kernel_families` family
   (`attn_res`) keep it.
4. Layers are numbered in order from `first_layer` (from 0 under an engine's convention).
   Confidence: the share of the replay's kernel time in layers whose kernel sequence
   another layer repeats; the report gives it with the layer and kind counts.
"""

from __future__ import annotations

import bisect
import difflib
import itertools
import math
from collections import Counter
from dataclasses import dataclass

import polars as pl

from k3trace.config import Config
from k3trace.model.labels import units
from k3trace.model.labels.rules import rule_family

MOE, DENSE, ATTENTION = "moe", "dense", "attention"
#: Most segments a layer splits into at the recurrences of its first kernels (attention
#: then MLP is two; a kernel recurring more often is no segment start).
MAX_PIECES = 4
#: Attention kernels of one family at most this many kernels apart belong to one attention.
CORE_GAP = 3
#: Most per-family offset combinations tried when the cores themselves anchor the layers.
MAX_OFFSET_COMBINATIONS = 20_000


@dataclass(frozen=True)
class Layering:
    bounds: tuple[tuple[int, int], ...]   # (start, end) of each layer in the sequence
    anchor: int                           # the anchor token
    score: tuple[int, int, int, int]


def attention_kinds(names: list[str], rules: list[str | None], cfg: Config) -> list[str | None]:
    """Per kernel: its attention family, or None."""
    generic = pl.Series(names, dtype=pl.String).str.contains(cfg.attention_pattern).to_list()
    out = []
    for rule, hit in zip(rules, generic):
        if rule in cfg.attention_families:
            out.append(rule)
        elif rule is None and hit:
            out.append(ATTENTION)
        else:
            out.append(None)
    return out


def cores(kinds: list[str | None]) -> list[int]:
    """Step 1: where each layer's attention starts. Attention kernels of one family less than
    `CORE_GAP` kernels apart are one attention (MLA: q_concat, q_concat, two GEMM kernels, fmha,
    combine); layers of one family may use different kernels (sliding-window and full layers)."""
    out: list[int] = []
    last: dict[str, int] = {}
    for i, kind in enumerate(kinds):
        if kind is None:
            continue
        if kind not in last or i - last[kind] > CORE_GAP:
            out.append(i)
        last[kind] = i
    return out


def _interleaved(anchors: list[int], core: list[int]) -> bool:
    n = len(core)
    after = all(anchors[j] <= core[j] and (j + 1 == n or core[j] < anchors[j + 1]) for j in range(n))
    before = all(core[j] <= anchors[j] and (j + 1 == n or anchors[j] < core[j + 1]) for j in range(n))
    return after or before


def _common_prefix(a: tuple, b: tuple) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _first_start(tokens: list[int], limit: int, end: int, others: set[tuple]) -> int:
    """Where the first layer starts in [0, limit]: where the sequence starts most like the
    other layers (the earliest such place)."""
    best, at = -1, 0
    for p in range(limit + 1):
        head = tuple(tokens[p:end])
        match = max((_common_prefix(head, o) for o in others), default=0)
        if match > best:
            best, at = match, p
    return at


def _last_end(tokens: list[int], start: int, lo: int, others: set[tuple], typical: float) -> int:
    """Where the last layer ends in [lo, len]: where it ends most like the other layers."""
    best, at = None, len(tokens)
    for e in range(lo, len(tokens) + 1):
        tail = tuple(reversed(tokens[start:e]))
        match = max((_common_prefix(tail, tuple(reversed(o))) for o in others), default=0)
        key = (match, -abs((e - start) - typical), e)
        if best is None or key > best:
            best, at = key, e
    return at


def _after(tokens: list[int], anchors: list[int], offset: int) -> tuple[list[int], int] | None:
    """Boundaries `offset` kernels after each anchor (the anchor ends its layer when 0)."""
    count = len(anchors)
    starts: list[int] = [0] + [a + 1 + offset for a in anchors[:-1]]
    last_end = anchors[-1] + 1 + offset
    if last_end > len(tokens):
        return None
    inner = {tuple(tokens[starts[j]:(starts[j + 1] if j + 1 < count else last_end)]) for j in range(1, count)}
    starts[0] = _first_start(tokens, anchors[0], starts[1] if count > 1 else last_end, inner)
    return starts, last_end


def _before(tokens: list[int], anchors: list[int], offsets: list[int]) -> tuple[list[int], int] | None:
    """Boundaries `offsets[j]` kernels before anchor j."""
    count = len(anchors)
    starts = [a - q for a, q in zip(anchors, offsets)]
    if starts[0] < 0 or any(starts[j] <= anchors[j - 1] for j in range(1, count)):
        return None
    inner = {tuple(tokens[starts[j]:starts[j + 1]]) for j in range(count - 1)}
    typical = sum(starts[j + 1] - starts[j] for j in range(count - 1)) / max(count - 1, 1)
    return starts, _last_end(tokens, starts[-1], anchors[-1] + 1, inner, typical)


def _evaluate(tokens: list[int], cut: tuple[list[int], int] | None, core: list[int], anchor: int,
              starters: list[bool]) -> Layering | None:
    if cut is None:
        return None
    starts, last_end = cut
    count = len(starts)
    bounds = tuple((starts[j], starts[j + 1] if j + 1 < count else last_end) for j in range(count))
    for s, e in bounds:  # exactly one attention core per layer
        if bisect.bisect_left(core, e) - bisect.bisect_left(core, s) != 1:
            return None
    kinds = len({tuple(tokens[s:e]) for s, e in bounds})
    normed = all(starters[s] for s, e in bounds if e > s)
    return Layering(bounds, anchor, (0 if normed else 1, kinds, bounds[0][0] + len(tokens) - bounds[-1][1],
                                     sum(starts)))


def find_layers(tokens: list[int], core: list[int], starters: list[bool]) -> Layering | None:
    """Step 2: the best layering over every anchor and offset: a kernel once per layer with
    one offset after or before it; else the cores, each attention family with its own
    offset before its core (the kernels before an attention are the same in every layer of
    that kind, whatever the layer before it was)."""
    count = len(core)
    if count < 2:
        return None
    occurrences: dict[int, list[int]] = {}
    for i, t in enumerate(tokens):
        occurrences.setdefault(t, []).append(i)
    best = None

    def consider(layering: Layering | None) -> None:
        nonlocal best
        if layering is not None and (best is None or layering.score < best.score):
            best = layering

    for token, anchors in occurrences.items():
        if len(anchors) != count or not _interleaved(anchors, core):
            continue
        gap = min(b - a for a, b in zip(anchors, anchors[1:]))
        for offset in range(gap):
            consider(_evaluate(tokens, _after(tokens, anchors, offset), core, token, starters))
            consider(_evaluate(tokens, _before(tokens, anchors, [offset] * count), core, token, starters))
    kinds = [tokens[c] for c in core]
    classes = sorted(set(kinds))
    room = {k: min([core[0]] * (kinds[0] == k) + [core[j] - core[j - 1] - 1 for j in range(1, count)
                                                  if kinds[j] == k]) for k in classes}
    if len(classes) > 1 and math.prod(room[k] + 1 for k in classes) <= MAX_OFFSET_COMBINATIONS:
        for offsets in itertools.product(*(range(room[k] + 1) for k in classes)):
            by_class = dict(zip(classes, offsets))
            consider(_evaluate(tokens, _before(tokens, core, [by_class[k] for k in kinds]), core, kinds[0],
                               starters))
    return best


def piece_starts(tokens: tuple) -> list[int]:
    """Step 3: where a layer's segments start: the recurrences of its longest recurring
    prefix (a fused RMSNorm is one kernel, the eager one eight), at most `MAX_PIECES`."""
    for k in range(len(tokens) // 2, 0, -1):
        prefix = tokens[:k]
        starts, p = [0], k
        while p + k <= len(tokens):
            if tokens[p:p + k] == prefix:
                starts.append(p)
                p += k
            else:
                p += 1
        if 1 < len(starts) <= MAX_PIECES:
            return starts
    return [0]


def _split_like(tokens: tuple, kinds: dict[tuple, list[int]]) -> list[int]:
    """A layer whose start does not recur (the first layer's norm has no residual to add)
    splits where the most similar layer that does split splits, through their alignment."""
    best, starts = 0.0, [0]
    for other, other_starts in kinds.items():
        if len(other_starts) < 2:
            continue
        matcher = difflib.SequenceMatcher(a=other, b=tokens, autojunk=False)
        if matcher.ratio() <= best:
            continue
        pairs = dict((i + k, j + k) for i, j, n in matcher.get_matching_blocks() for k in range(n))
        mapped = [0]
        for p in other_starts[1:]:  # the aligned position of the split, else of the next matched kernel
            at = next((pairs[q] for q in range(p, len(other)) if q in pairs), None)
            if at is not None and at > mapped[-1]:
                mapped.append(at)
        if len(mapped) == len(other_starts):
            best, starts = matcher.ratio(), mapped
    return starts


def _after_attention_start(starts: list[int], attention: list[int]) -> list[int]:
    """A recurrence of the layer's first kernel before its attention starts no segment: it is
    the attention's own input work (Qwen3's per-head q and k RMSNorms run the input norm's
    kernel between the QKV GEMM and the attention), and the MLP half starts after it."""
    if not attention:
        return starts
    return [0] + [p for p in starts[1:] if p > attention[0]]


def _segment_families(layers: list[tuple[int, int]], names: list[str], kinds: list[str | None],
                      rules: list[str | None], tokens: list[int], cfg: Config) -> list[str | None]:
    """Step 3: every kernel's family from its layer's segments."""
    attention_at = {tuple(tokens[s:e]): [i - s for i in range(s, e) if kinds[i] is not None] for s, e in layers}
    splits = {kind: _after_attention_start(piece_starts(kind), attention_at[kind]) for kind in attention_at}
    splits = {kind: starts if len(starts) > 1 else _after_attention_start(_split_like(kind, splits), attention_at[kind])
              for kind, starts in splits.items()}
    pieces: list[tuple[int, int]] = []
    for s, e in layers:
        starts = splits[tuple(tokens[s:e])]
        pieces.extend((s + a, s + b) for a, b in zip(starts, starts[1:] + [e - s]))
    kind_of = [tuple(tokens[s:e]) for s, e in pieces]
    attention_of = {kind: Counter(k for k in kinds[s:e] if k is not None) for (s, e), kind in zip(pieces, kind_of)}
    # A name tells an MLP segment's kind only if no other kind of MLP segment has it (K3's
    # dense MLP and its MoE both run situ_mul).
    ffn_names: dict[tuple, set[str]] = {}
    for (s, e), kind in zip(pieces, kind_of):
        if not attention_of[kind]:
            ffn_names.setdefault(kind, set()).update(names[s:e])
    seen = Counter(name for kind_names in ffn_names.values() for name in kind_names)
    order = list(cfg.attention_families) + [ATTENTION]
    family_of: dict[tuple, str] = {}
    for (s, e), kind in zip(pieces, kind_of):
        attention = attention_of[kind]
        if attention:
            family_of[kind] = max(attention, key=lambda f: (attention[f], -order.index(f)))
        else:
            unique_rules = {rules[i] for i in range(s, e) if seen[names[i]] == 1}
            family_of[kind] = MOE if MOE in unique_rules else DENSE
    out: list[str | None] = [None] * len(names)
    for (s, e), kind in zip(pieces, kind_of):
        for i in range(s, e):
            out[i] = rules[i] if rules[i] in cfg.kernel_families else family_of[kind]
    return out


def infer_step(rep: pl.DataFrame, cfg: Config, first_layer: int) -> tuple[list, list, dict] | None:
    """Layers and families of one representative step (kernels in launch order), with what
    was found; None when no layer structure is found."""
    names = rep["name"].to_list()
    rules = rep.select(rule_family(pl.col("name"), cfg).alias("r"))["r"].to_list()
    kinds = attention_kinds(names, rules, cfg)
    starters = pl.Series(names, dtype=pl.String).str.contains(cfg.layer_start_pattern).to_list()
    core = cores(kinds)
    by_name = rep["name"].cast(pl.Categorical).to_physical().cast(pl.Int64).to_list()
    by_signature = rep["signature"].fill_null("").cast(pl.Categorical).to_physical().cast(pl.Int64).to_list() \
        if "signature" in rep.columns and rep["signature"].null_count() == 0 else None
    found = None
    for tokens in (t for t in (by_signature, by_name) if t is not None):
        layering = find_layers(tokens, core, starters)
        if layering is not None and (found is None or layering.score[:2] < found[1].score[:2]):
            found = (tokens, layering)
    if found is None:
        return None
    tokens, layering = found
    families = _segment_families(list(layering.bounds), names, kinds, rules, tokens, cfg)
    layers: list = [None] * len(names)
    for index, (s, e) in enumerate(layering.bounds):
        for i in range(s, e):
            layers[i] = first_layer + index
    for i in range(len(names)):
        if layers[i] is None:
            families[i] = None
    sequences = Counter(tuple(tokens[s:e]) for s, e in layering.bounds)
    durations = (rep["end"] - rep["start"]).to_list()
    total = sum(durations) or 1
    repeated = sum(sum(durations[s:e]) for s, e in layering.bounds if sequences[tuple(tokens[s:e])] > 1)
    anchor = names[tokens.index(layering.anchor)]  # the first layer's, when the cores anchor them
    info = {"layers": len(layering.bounds), "kinds": len(sequences), "anchor": anchor,
            "confidence": repeated / total,
            "prologue_kernels": layering.bounds[0][0], "epilogue_kernels": len(names) - layering.bounds[-1][1]}
    return layers, families, info


def inferred(reps: dict[str, pl.DataFrame], wanted: set[str], cfg: Config,
             first_layer: int) -> tuple[pl.DataFrame, list[dict]]:
    """Labels for the units in `wanted`, and what was inferred for each (never silently)."""
    out = [pl.DataFrame(schema=units.mapping_schema())]
    found = []
    for unit in sorted(wanted):
        rep = reps[unit]
        result = infer_step(rep, cfg, first_layer)
        if result is None:
            found.append({"unit": unit, "kernels": rep.height, "layers": 0, "kinds": 0, "anchor": None,
                          "confidence": 0.0, "prologue_kernels": rep.height, "epilogue_kernels": 0})
            continue
        layers, families, info = result
        found.append({"unit": unit, "kernels": rep.height, **info})
        out.append(units.mapping(rep, layers, families))
    return pl.concat(out), found
