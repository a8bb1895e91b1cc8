// The sliding window's dk/dv on Hopper's warpgroup MMA (sm_90a; kernels.DENSE): dkdv_tile.mlir over the key tiles,
// each against the rows whose window holds it (no block lists), in the backward's one call with dense_dq.mlir.
<% set dq_partials = false %>
<% set selection = false %>
<% include "gpu/hopper/dkdv_tile.mlir" %>
