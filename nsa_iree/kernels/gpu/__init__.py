"""The GPU kernel families (nvidia/, portable/) and the text they share."""

from __future__ import annotations

from ...spec import KernelSpec


def combine_values(spec: KernelSpec) -> dict[str, int]:
    """The values gpu/forward_combine.mlir takes (the part every forward of both families includes): o written four
    columns a lane, one store of 4 elements (Dv is a multiple of 16 wherever the families serve)."""
    return {"FWD_O_QUADS": spec.heads_per_group * spec.value_dim // 4,
            "FWD_O_STORE_ALIGNMENT": 4 * (4 if spec.dtype == "f32" else 2)}
