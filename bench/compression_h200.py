"""The compression branch and the block selection on a GPU in the anchors layout: `nsa-iree bench --branch
compression` and `--branch select` (nsa_iree.benchmark: mean pooling + compressed attention, and select_blocks with
its compression's lse, against fla-core's mean_pooling + parallel_nsa_compression and parallel_nsa_topk in the same
process) at bench/compression_gpu_checks.py's TIMED_LENGTHS. bench/branches_h200.py runs every layout and length.

    python3 -m bench.compression_h200 OUT      (artifacts prebuilt: bench/run_compression_h200.sh)

Writes OUT/anchors_compression_H200.{json,md} and OUT/anchors_select_H200.{json,md}.
"""

from __future__ import annotations

import sys

from .branches_h200 import run
from .compression_gpu_checks import TIMED_LENGTHS

REPEATS = 10


def main(out: str) -> None:
    for branch in ("compression", "select"):
        run(out, branch, configs=("anchors",), lengths=TIMED_LENGTHS, repeats=REPEATS)


if __name__ == "__main__":
    main(sys.argv[1])
