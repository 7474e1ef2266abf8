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

_QUOTE, _BACKSLASH, _OPEN, _CLOSE, _COMMA = 1, 2, 3, 4, 5
_LUT = np.zeros(256, dtype=np.uint8)
_LUT[ord('"')] = _QUOTE
_LUT[ord("\\")] = _BACKSLASH
_LUT[[ord("{"), ord("[")]] = _OPEN
_LUT[[ord("}"), ord("]")]] = _CLOSE
_LUT[ord(",")] = _COMMA

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
    """Brackets and commas of `buf` that lie outside strings, with the bracket depth after
    each (`depth0` at the start). `buf` must start outside a string."""
    cls = np.take(_LUT, buf)
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
    start = len(head) - len(head.lstrip())
    if start == len(head):
        return None
    first = head[start:start + 1]
    if first == b"[":
        return start + 1, {}
    if first != b"{":
        raise JsonError(f"{label} is not JSON (it starts with {head[start:start + 12]!r})")
    # The array usually opens within the first kilobytes: scan growing prefixes, not all of `head`.
    window = 1 << 16
    while True:
        part = head[:window]
        buf = np.frombuffer(part, dtype=np.uint8)
        st = scan(buf)
        opens = np.flatnonzero((st.kind == _OPEN) & (st.depth == 2) & (buf[st.pos] == ord("[")))
        for i in opens:
            p = int(st.pos[i])
            if _EVENTS_KEY.search(head, max(0, p - 64), p):
                key = head.rindex(b'"traceEvents"', 0, p)
                return p + 1, _header_fields(head[:key])
        if (st.depth <= 0).any():
            raise JsonError(f"{label} is a JSON object without a `traceEvents` array")
        if window >= len(head):
            return None
        window *= 8


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
    parser = _Lines(label, schema, keep)
    # Kineto's own writer puts every event between a `  {` and a `  }` line: then the
    # separators are found by byte search. Anything else (or a parse failure there, which a
    # wrong cut always causes: it leaves an object open) goes through the structure scan.
    fast = carry.lstrip(b" \t\r").startswith(b"\n  {\n") or carry.startswith(b"\n  {\n")
    while True:
        more = stream.read(chunk)
        data = carry + more if more else carry
        if fast and more:
            cut = data.rfind(_KINETO_SEPARATOR)
            if cut < 0:
                carry = data
                continue
            if parser.kineto_layout(data[: cut + 4]):
                carry = data[cut + 6:]
                continue
            fast = False
        carry, done = _scan_cut(data, final=not more, parser=parser)
        if done:
            break
    return parser.frame(), dict(meta)


#: Between two events in Kineto's own layout: the `  }` line closing one, `  {` opening the next.
_KINETO_SEPARATOR = b"\n  },\n  {\n"
_BLANK_NEWLINES = bytes.maketrans(b"\n\r", b"  ")
_KINETO_SEPARATOR_BLANKED = _KINETO_SEPARATOR.translate(_BLANK_NEWLINES)


class _Lines:
    """Turns runs of complete events into NDJSON and parses them with polars."""

    def __init__(self, label: str, schema: pl.Schema, keep: Callable[[pl.DataFrame], pl.DataFrame]) -> None:
        self.label, self.schema, self.keep = label, schema, keep
        self.frames: list[pl.DataFrame] = []
        self.events = 0

    def kineto_layout(self, body: bytes) -> bool:
        """Parse `body` (events in Kineto's layout, the last one closed); False when it
        does not parse, leaving nothing behind."""
        # Newlines become spaces (one pass), then each separator, now `   },   {  `, a line
        # break. Should a string hold that text, the cut leaves an object open and the
        # parse fails: the caller then scans the structure instead.
        text = body.translate(_BLANK_NEWLINES).replace(_KINETO_SEPARATOR_BLANKED, b"}\n{")
        try:
            frame = pl.read_ndjson(io.BytesIO(text), schema=self.schema)
        except (pl.exceptions.PolarsError, ValueError):
            return False
        self.frames.append(self.keep(frame))
        self.events += frame.height
        return True

    def structured(self, lines: bytes | bytearray, count: int) -> None:
        try:
            frame = pl.read_ndjson(io.BytesIO(lines), schema=self.schema)
        except (pl.exceptions.PolarsError, ValueError) as exc:
            reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
            raise JsonError(f"{self.label}: event {self.events + 1} onwards is not valid trace JSON ({reason})") from None
        self.frames.append(self.keep(frame))
        self.events += count

    def frame(self) -> pl.DataFrame:
        if not self.frames:
            return self.keep(pl.DataFrame(schema=self.schema))
        return pl.concat(self.frames, how="vertical", rechunk=False)


def _scan_cut(data: bytes, *, final: bool, parser: _Lines) -> tuple[bytes, bool]:
    """Parse the complete events at the front of `data` (which starts between events);
    return (the bytes left over, whether the event array closed)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    st = scan(buf)
    closes = np.flatnonzero(st.depth < 0)
    done = bool(len(closes))
    if done:  # the array's own `]`: nothing after it is read
        cut = int(closes[0])
        st = Structure(st.pos[:cut], st.kind[:cut], st.depth[:cut])
    elif final:
        raise JsonError(f"{parser.label} is truncated: the `traceEvents` array never closes"
                        + (f" (after {parser.events} events)" if parser.events else ""))
    ends = np.flatnonzero((st.kind == _CLOSE) & (st.depth == 0))
    if not len(ends):
        return data, done
    last = int(st.pos[ends[-1]])
    # Raw newlines are only ever whitespace in JSON: blank them, then end each event's line
    # at the comma after it.
    text = bytearray(data[: last + 1].translate(_BLANK_NEWLINES))
    lines = np.frombuffer(text, dtype=np.uint8)
    lines[st.pos[(st.pos <= last) & (st.kind == _COMMA) & (st.depth == 0)]] = 10
    parser.structured(text, len(ends))
    return data[last + 1:], done
