"""Compare the printed outputs of two report builds, chapter by chapter and cell by cell: what a refactor must not
change. Usage: ``python scripts/report_diff.py OLD/reports/build NEW/reports/build [--lines N]``.

Each executed chapter (``build/NN_topic/NN_topic.ipynb``) is read as the text of its code cells' outputs; the two
builds' folders, object addresses and profiler lines are normalised away; every cell whose text still differs is
printed with its first differing lines. Measured cells (timings, throughputs, RSS, bandwidth on this machine)
differ from run to run by nature: read them as such; a predicted or counted number that differs is a change of
results.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
from pathlib import Path


def cell_outputs(notebook: Path, root: Path) -> list[tuple[int, str, list[str]]]:
    """(cell index, the first line of its source, its output lines) of every code cell, normalised."""
    out = []
    for i, cell in enumerate(json.loads(notebook.read_text())["cells"]):
        if cell["cell_type"] != "code":
            continue
        text = []
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                text.append("".join(o["text"]))
            elif "text/plain" in o.get("data", {}):
                text.append("".join(o["data"]["text/plain"]))
        joined = re.sub(r"0x[0-9a-f]+", "0x", "\n".join(text).replace(str(root.parents[1]), "<report>"))
        lines = [line for line in joined.splitlines() if "USDT:" not in line]
        out.append((i, "".join(cell["source"]).split("\n")[0][:70], lines))
    return out


def main(argv: list[str] | None = None) -> int:
    """Print each differing cell; the count of differing cells last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--lines", type=int, default=4, help="differing lines shown per cell")
    args = parser.parse_args(argv)
    differing = 0
    for chapter in sorted(p for p in args.old.iterdir() if p.is_dir()):
        for old_nb in chapter.glob("*.ipynb"):
            new_nb = args.new / chapter.name / old_nb.name
            if not new_nb.exists():
                print(f"{chapter.name}: missing from {args.new}")
                continue
            old, new = cell_outputs(old_nb, args.old), cell_outputs(new_nb, args.new)
            for (i, source, a), (_, _, b) in zip(old, new, strict=False):
                if a == b:
                    continue
                differing += 1
                lines = [x for x in difflib.unified_diff(a, b, lineterm="", n=0) if x[:1] in "+-" and x[:3] not in
                         ("+++", "---")]
                print(f"{chapter.name} cell {i} [{source}]")
                for line in lines[:args.lines]:
                    print(f"    {line[:160]}")
    print(f"{differing} cell(s) differ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
