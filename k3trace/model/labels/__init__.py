"""Layer and family labels from a chain of sources, one module each (METRICS.md, "Labels"):

1. `nvtx` (own.py): k3trace's `layer.<index>.<family>` range around an eager launch;
2. `module` (modules.py): a serving engine's layerwise module-path range around it;
3. `graph_capture` (chain.py): either kind, open when a replayed node was created;
4. `aligned_eager` (aligned.py): a labelled eager run in the report, aligned with a replay;
5. `donor` (donor.py): another report's labelled step (`--labels-from`), aligned likewise;
6. `inferred` (inferred.py): the repeating per-layer blocks of the replay's kernel sequence;
7. `name_rule` (rules.py): kernel-name patterns (family only).
Kernels none of them labels are `unlabelled`.
"""

from k3trace.model.labels.chain import Labelling, label, label_kernels
from k3trace.model.labels.donor import LabelDonor
from k3trace.model.labels.own import layer_ranges
from k3trace.model.labels.segments import with_segments
from k3trace.model.labels.summary import (
    ALIGNED_SOURCE, DONOR_SOURCE, GRAPH_SOURCE, INFERRED_SOURCE, MODULE_SOURCE, NVTX_SOURCE, RULE_SOURCE, SOURCES,
    UNLABELLED, LabelSummary, source_counts, source_time_share,
)

__all__ = [
    "ALIGNED_SOURCE", "DONOR_SOURCE", "GRAPH_SOURCE", "INFERRED_SOURCE", "MODULE_SOURCE", "NVTX_SOURCE", "RULE_SOURCE",
    "SOURCES", "UNLABELLED", "LabelDonor", "LabelSummary", "Labelling", "label", "label_kernels", "layer_ranges",
    "source_counts", "source_time_share", "with_segments",
]
