"""The benchmark, for the lab scripts here and `python -m bench.bench` (the H200 runs): nsa_iree.benchmark, which
is installed with the package (`nsa-iree bench`). bench/ builds on the package, never the other way round."""

from nsa_iree.benchmark import (CONFIGS, DOC_LENGTHS, DTYPES, PeakMemory, _sync, _versions, fla_function, fla_impl,
                                main, make_packed_problem, make_problem, torch_eager_selection_attention)

__all__ = ["CONFIGS", "DOC_LENGTHS", "DTYPES", "PeakMemory", "_sync", "_versions", "fla_function", "fla_impl", "main",
           "make_packed_problem", "make_problem", "torch_eager_selection_attention"]

if __name__ == "__main__":
    main()
