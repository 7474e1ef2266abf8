"""The external programs ingest runs (nsys export, QdstrmImporter): resolved by the CLI,
which reads the environment, and passed down. Its own module, free of polars, so that the
CLI can name it without importing the data stack (start-up time)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Tools:
    """External programs, resolved by the CLI (the library reads no environment)."""

    nsys: str | None = None

    def qdstrm_importer(self) -> str | None:
        if self.nsys:
            # host-linux-x64/QdstrmImporter sits beside target-linux-x64/nsys in every layout.
            root = Path(self.nsys).resolve().parent.parent
            for candidate in (root / "host-linux-x64" / "QdstrmImporter", root / "QdstrmImporter"):
                if candidate.is_file():
                    return str(candidate)
        return shutil.which("QdstrmImporter")
