// The selection's dk/dv on Hopper's warpgroup MMA with dq made from the same products (sm_90a; kernels.SMALL, for
// fewer heads per group than a 16-row tile): dkdv.mlir's kernel, which also writes each chunk's ds k as f32 dq
// partials per (piece row, head), then each row's partials summed in slot order (common/dq_sums.mlir). Each
// selected block's K and V are read once per piece, whatever the heads per group; the position-major dq (a block
// per position and kv head) is not run.
<% set dq_partials = true %>
<% set selection = true %>
<% include "gpu/hopper/dkdv_tile.mlir" %>
<% include "common/dq_sums.mlir" %>
