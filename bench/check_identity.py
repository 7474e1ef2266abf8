"""Every number identical: the JSON of `analyze` on every bundled recording (k3trace/data)
and every public sample (../shared/samples/nsys-public) against that of the code before the
speed work (harness.BASELINE, or --reference REV); a bad input must fail with the same line.

    python bench/check_identity.py [--reference REV]
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness import BASELINE, ROOT, first_difference, reference_tree, temp_folder

RUN = """
import json, sys
from pathlib import Path
from k3trace.analyses import analyze_report
from k3trace.config import load_config
from k3trace.errors import ReportError
out = {}
for p in sys.argv[1:]:
    try:
        out[Path(p).name] = analyze_report(Path(p), load_config()).to_json()
    except ReportError as exc:
        out[Path(p).name] = f"ReportError: {exc}"
print(json.dumps(out))
"""


def analyses(files: list[Path], pythonpath: Path | None) -> dict:
    env = dict(os.environ, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {}))
    done = subprocess.run([sys.executable, "-c", RUN, *map(str, files)], capture_output=True, text=True, env=env,
                          check=True)
    return json.loads(done.stdout)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reference", default=BASELINE)
    args = p.parse_args()
    work = temp_folder("k3bench-identity-")
    try:
        files = []
        for packed in sorted((ROOT / "k3trace" / "data").glob("*.sqlite.xz")):
            files.append(work / packed.stem)
            with lzma.open(packed) as src, open(files[-1], "wb") as dst:
                shutil.copyfileobj(src, dst)
        files += sorted((ROOT.parent / "shared" / "samples" / "nsys-public").glob("*.sqlite"))
        mine = analyses(files, None)
        ref = analyses(files, reference_tree(args.reference, work / "reference"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    different = {name: first_difference(mine[name], ref[name]) for name in ref}
    for name, where in different.items():
        if where:
            print(f"DIFFERENT {name}: {where}")
    print(f"{len(ref)} traces, {sum(map(bool, different.values()))} different from {args.reference}")


if __name__ == "__main__":
    main()
