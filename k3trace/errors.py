"""The one error type users see: a bad input, named with the fix, exit code 2."""

from __future__ import annotations


class ReportError(Exception):
    """A report k3trace cannot analyse: `problem` says what is wrong, `fix` what to do.

    The CLI prints ``k3trace: <problem>; <fix>`` on one line and exits with code 2.
    """

    exit_code = 2

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem, fix)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.problem}; {self.fix}"


class NoDecodeSteps(ReportError):
    """A report with no decode step in it (it may still hold a graph capture to lend labels)."""


def printable(text: str) -> str:
    """`text` with control characters escaped (\\n, \\x1b, ...): file names and trace
    strings are untrusted, and printed raw they could break the one-line message or drive
    the terminal."""
    out = []
    for ch in text:
        code = ord(ch)
        if code < 0x20 or 0x7F <= code < 0xA0 or ch in "\u2028\u2029":
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)
