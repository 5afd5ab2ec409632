"""The article's limit 3 on hardware: compute-sanitizer's racecheck over the article's decode
kernel, once in the article's shared-memory layout and once in the port's.

The article's kernel (``kernels.cu:486-508``) keeps the warps' partial sums in the shared array
``dot_products`` and then writes the scaled score back into ``dot_products[0]``, where every
thread reads it after the second barrier.  Warp 0's lane 0 writes its next partial sum into the
same cell at the next token with no barrier in between (``attention.DEPARTURES``).  The port
gives the score its own shared cell.  ``attention.ARTICLE_LAYOUT_PARTS`` rebuilds the article's
layout (its ``token_score`` writes the score back into ``dot_products[0]``) to show the race.

    python benchmarks/racecheck.py             # on a GPU with compute-sanitizer: both layouts,
                                               # writes benchmarks/results/racecheck-<date>.json
    python benchmarks/racecheck.py --dry-run   # anywhere: both layouts in Numba's simulator at
                                               # a tiny size, no sanitizer; prints the JSON
    python benchmarks/racecheck.py --part mine.py:token_score
                                               # a third layout, "yours": the kernel with the
                                               # reader's token_score from mine.py (a file that
                                               # defines it, as written in notebook 04)

``paged_tutorial.measure.racecheck.run`` does the work: for each layout it starts a child
(``python -m paged_tutorial.measure.racecheck --child LAYOUT``) under
``compute-sanitizer --tool racecheck --racecheck-report all``; the child
launches the kernel once on the article's shapes (Llama-3.2-1B: head_dim 64 = two warps, 32 q
heads over 8 kv heads, bf16, a batch of two rows whose cache slots are 1 and 0), compiled with
line information, and checks its output against the torch oracle.  The parent reads the
sanitizer's report: its summary line, every race it analysed (the two accesses, their
``attention.py`` lines and the number of hazards) and every single hazard (kind, shared byte
offset, thread block, the two threads), and names the shared array (and, where the source line
says, the element) that each one is on.
"""

from __future__ import annotations

import argparse
import json
import sys

from common import RESULTS
from paged_tutorial.measure import racecheck


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None,
                   help="folder for racecheck-<date>.json (default benchmarks/results; a dry run "
                        "writes only when --out is given)")
    p.add_argument("--dry-run", action="store_true",
                   help="both layouts in Numba's CUDA simulator at a tiny size, no sanitizer")
    p.add_argument("--part", default=None, metavar="FILE.py:FUNCTION",
                   help="also check the kernel with a reader's part (the function FUNCTION of "
                        "FILE.py, e.g. mine.py:token_score) as layout \"yours\"")
    args = p.parse_args(argv)
    out = args.out or (None if args.dry_run else RESULTS)
    data = racecheck.run(dry_run=args.dry_run, part=args.part, out=out)
    if out is None:
        print(json.dumps(data, indent=1))
    failed = racecheck.failed_layouts(data)
    if failed:
        print(f"failed: {', '.join(failed)} (see the JSON)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
