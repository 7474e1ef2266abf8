"""Stream the event array of a Chrome-trace JSON document into polars frames, chunk by chunk.

A torch.profiler trace of a long decode run is one JSON object holding a `traceEvents` array
of millions of small objects. Loading it with `json.load` builds Python objects worth ~6x
the file; here no Python object is made per event. Each chunk of bytes is scanned with numpy
for its JSON structure (quotes, escapes and brackets, so braces inside kernel names do not
count), the complete events it holds are rewritten as newline-delimited JSON (raw newlines
are only ever whitespace in JSON, so they become spaces, and the commas between events
become newlines), and polars parses those lines with a fixed schema in Rust, keeping only
the fields and event kinds asked for. Memory stays at a few chunks plus the kept rows.

Both layouts seen in the wild parse the same way: Kineto's own writer (one field group per
line) and `json.dump` re-serialisations (the whole document on one line). A top-level array
of events (the other form the Chrome trace format allows) is read too.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from typing import BinaryIO, Callable

import numpy as np
import polars as pl

CHUNK = 16 << 20  # bytes scanned at a time: scratch arrays stay ~10x this

_QUOTE, _BACKSLASH, _OPEN, _CLOSE, _COMMA, _NEWLINE = 1, 2, 3, 4, 5, 6
_LUT = np.zeros(256, dtype=np.uint8)
_LUT[ord('"')] = _QUOTE
_LUT[ord("\\")] = _BACKSLASH
_LUT[[ord("{"), ord("[")]] = _OPEN
_LUT[[ord("}"), ord("]")]] = _CLOSE
_LUT[ord(",")] = _COMMA
_LUT[[ord("\n"), ord("\r")]] = _NEWLINE

_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*$')


class JsonError(ValueError):
    """The bytes are not the JSON document expected; the message says where."""


@dataclass(frozen=True)
class Structure:
    """Structural bytes of a buffer outside strings: position, kind and the depth after it."""

    pos: np.ndarray
    kind: np.ndarray
    depth: np.ndarray


def scan(buf: np.ndarray, depth0: int = 0) -> Structure:
    """Brackets, commas and newlines of `buf` that lie outside strings, with the bracket
    depth after each (`depth0` at the start). `buf` must start outside a string."""
    cls = _LUT[buf]
    pos = np.flatnonzero(cls)
    kind = cls[pos]
    if (kind == _BACKSLASH).any():
        # A quote is escaped when an odd run of backslashes precedes it.
        slashes = pos[kind == _BACKSLASH]
        breaks = np.flatnonzero(np.diff(slashes) != 1)
        starts = np.concatenate(([0], breaks + 1))
        ends = np.concatenate((breaks, [len(slashes) - 1]))
        escaped = slashes[ends[(ends - starts) % 2 == 0]] + 1
        keep = (kind != _BACKSLASH) & ~np.isin(pos, escaped)
        pos, kind = pos[keep], kind[keep]
    quote = kind == _QUOTE
    outside = np.bitwise_xor.accumulate(quote.view(np.uint8)) == 0
    keep = outside & ~quote
    pos, kind = pos[keep], kind[keep]
    steps = np.zeros(len(kind), dtype=np.int32)
    steps[kind == _OPEN] = 1
    steps[kind == _CLOSE] = -1
    return Structure(pos=pos, kind=kind, depth=depth0 + np.cumsum(steps, dtype=np.int32))


def _find_events_array(head: bytes, label: str) -> tuple[int, dict] | None:
    """(offset just after the `[` of the event array, top-level fields before it), or None
    when `head` does not reach it yet."""
    buf = np.frombuffer(head, dtype=np.uint8)
    start = len(head) - len(head.lstrip())
    if start == len(head):
        return None
    first = head[start:start + 1]
    if first == b"[":
        return start + 1, {}
    if first != b"{":
        raise JsonError(f"{label} is not JSON (it starts with {head[start:start + 12]!r})")
    st = scan(buf)
    opens = np.flatnonzero((st.kind == _OPEN) & (st.depth == 2) & (buf[st.pos] == ord("[")))
    for i in opens:
        p = int(st.pos[i])
        if _EVENTS_KEY.search(head, max(0, p - 64), p):
            key = head.rindex(b'"traceEvents"', 0, p)
            return p + 1, _header_fields(head[:key])
    if (st.depth <= 0).any():
        raise JsonError(f"{label} is a JSON object without a `traceEvents` array")
    return None


def _header_fields(text: bytes) -> dict:
    """The top-level fields written before `traceEvents` (device properties, versions)."""
    body = text.rstrip().rstrip(b",")
    try:
        fields = json.loads(body + b"}")
    except ValueError:
        return {}
    return fields if isinstance(fields, dict) else {}


def read_events(stream: BinaryIO, label: str, schema: pl.Schema,
                keep: Callable[[pl.DataFrame], pl.DataFrame], chunk: int = CHUNK) -> tuple[pl.DataFrame, dict]:
    """Every event of the trace's event array parsed with `schema` (missing fields null,
    unknown ones skipped) and filtered by `keep` chunk by chunk; plus the top-level fields
    written before the array. Raises JsonError on anything that is not such a document."""
    head = b""
    found = None
    while found is None:
        more = stream.read(chunk)
        if not more:
            raise JsonError(f"{label} ends before any `traceEvents` array" if head.strip()
                            else f"{label} is empty")
        head += more
        found = _find_events_array(head, label)
    offset, meta = found
    carry = head[offset:]
    del head
    frames: list[pl.DataFrame] = []
    events = 0
    done = False
    while not done:
        more = stream.read(chunk)
        buf = np.frombuffer(carry + more, dtype=np.uint8) if more else np.frombuffer(carry, dtype=np.uint8)
        st = scan(buf)
        closes = np.flatnonzero(st.depth < 0)
        if len(closes):  # the array's own `]`: nothing after it is read
            done = True
            cut = int(closes[0])
            st = Structure(st.pos[:cut], st.kind[:cut], st.depth[:cut])
        elif not more:
            raise JsonError(f"{label} is truncated: the `traceEvents` array never closes"
                            + (f" (after {events} events)" if events else ""))
        ends = np.flatnonzero((st.kind == _CLOSE) & (st.depth == 0))
        if not len(ends):
            if done:
                break
            carry = buf.tobytes()
            continue
        last = int(st.pos[ends[-1]])
        within = st.pos <= last
        frames.append(_parse_lines(buf, st, within, last, label, schema, keep, events))
        events += len(ends)
        carry = buf[last + 1:].tobytes()
    meta = dict(meta)
    return (pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=schema)), meta


def _parse_lines(buf: np.ndarray, st: Structure, within: np.ndarray, last: int, label: str,
                 schema: pl.Schema, keep: Callable[[pl.DataFrame], pl.DataFrame], before: int) -> pl.DataFrame:
    lines = buf[: last + 1].copy()
    lines[st.pos[within & (st.kind == _NEWLINE)]] = 32          # newlines are whitespace in JSON
    lines[st.pos[within & (st.kind == _COMMA) & (st.depth == 0)]] = 10  # one event per line
    try:
        frame = pl.read_ndjson(io.BytesIO(lines.data), schema=schema)
    except (pl.exceptions.PolarsError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise JsonError(f"{label}: event {before + 1} onwards is not valid trace JSON ({reason})") from None
    return keep(frame)
