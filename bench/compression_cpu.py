"""The compression branch and the block selection on the CPU against torch-eager versions of the same math:
`nsa-iree bench --device cpu --config cpu --branch compression` (mean pooling + compressed attention, forward and
forward + backward) and `--branch select` (select_blocks, lse given, S 16), one after the other in one process.

    python3 -m bench.compression_cpu [--seq 4096] [--repeats 5] [--out DIR]

Layout: the benchmark's "cpu" configuration (H 16, G 1, D = Dv = 64, BS 64, f32). Writes DIR/cpu_compression_cpu.md
and DIR/cpu_select_cpu.md (and their JSON records); each is checked against the f64 oracle first.
"""

from __future__ import annotations

import argparse

from nsa_iree import benchmark


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=benchmark.DEFAULT_OUT)
    args = parser.parse_args(argv)
    return [benchmark.main(["--device", "cpu", "--config", "cpu", "--branch", branch, "--seq", *map(str, args.seq),
                            "--repeats", str(args.repeats), "--out", args.out]) for branch in ("compression", "select")]


if __name__ == "__main__":
    main()
