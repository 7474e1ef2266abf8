"""One spelling of a demangled kernel name, whichever demangler wrote it.

nsys demangles EDG-style (`<unnamed>`, `(int)4`, `(unsigned long)2`,
`[lambda() (instance 2)]`, parameters in terms of `T1`, `T2`); torch.profiler (Kineto)
writes what the GNU demangler does (`(anonymous namespace)`, `4`, `2ul`, `{lambda()#2}`,
parameters spelled out in full). The same build, recorded with both, shared 6 of 44
distinct kernel names, so a diff across the two profilers matched no kernel. The signature
the diff aligns on is hashed from this spelling instead: casts and integer suffixes
dropped, lambdas as `lambda_<instance>`, parenthesised groups (parameter lists, GNU's
`(anonymous namespace)`) left out, then the identifiers and numbers in order, without
`void`, cv-qualifiers and `<unnamed>`. On every bundled and sample trace (1,442 distinct
names, nsys 2022.1-2026.2 and Kineto) no two names of one trace share a spelling; overloads
differing in their parameters alone (no template arguments) would, and none is there.
"""

from __future__ import annotations

import re

_EDG_CAST = re.compile(r"\((?:unsigned |signed )?(?:char|short|int|long|long long|unsigned)\)(-?\d+)")
_EDG_BOOL = re.compile(r"\(bool\)([01])")
_GNU_SUFFIX = re.compile(r"\b(\d+)(?:ull|ul|ll|u|l)\b", re.IGNORECASE)
#: A lambda's parameter list may hold one level of parentheses (a function type).
_PARAMS = r"\((?:[^()]|\([^()]*\))*\)"
_EDG_LAMBDA = re.compile(r"\[lambda" + _PARAMS + r" \(instance (\d+)\)\]")
_GNU_LAMBDA = re.compile(r"\{lambda" + _PARAMS + r"#(\d+)\}")
_TOKEN = re.compile(r"-?\d+|[A-Za-z_][A-Za-z0-9_]*")
_DROPPED = frozenset({"void", "const", "volatile", "unnamed", "struct", "class", "enum"})


def canonical(name: str) -> str:
    """`name`'s spelling shared by both demanglers (bare names come back as they are)."""
    if not any(c in name for c in "<(["):
        return name
    name = _EDG_CAST.sub(r"\1", name)
    name = _EDG_BOOL.sub(lambda m: "true" if m.group(1) == "1" else "false", name)
    name = _GNU_SUFFIX.sub(r"\1", name)
    name = _GNU_LAMBDA.sub(r" lambda_\1 ", _EDG_LAMBDA.sub(r" lambda_\1 ", name))
    return " ".join(t for t in _TOKEN.findall(_outside_parentheses(name)) if t not in _DROPPED)


def _outside_parentheses(name: str) -> str:
    kept, depth = [], 0
    for ch in name:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            kept.append(ch)
    return "".join(kept)
