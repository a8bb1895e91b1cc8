"""One build's times on a GPU for an A/B of two checkouts (run from each in turn, alternating, in one device call):
bench.window_h200's and bench.layer_h200's rows without their baselines (64k tokens, anchors layout, bf16), and with
`--profile OUT` one layer step with the window branch under torch.profiler (its kernels by device time).

    python3 -m bench.ab_step NAME [--profile OUT]     (NAME labels the JSON row)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench import layer_h200, window_h200

N = 65536


def main(argv: list[str]) -> None:
    row = {"build": argv[0], "window": window_h200.timing(N, baselines=False),
           "layer": layer_h200.timing(N, baselines=False)}
    print(json.dumps(row), flush=True)
    if "--profile" in argv:
        layer_h200.profile(Path(argv[argv.index("--profile") + 1]), N, window=layer_h200.WINDOW)


if __name__ == "__main__":
    main(sys.argv[1:])
