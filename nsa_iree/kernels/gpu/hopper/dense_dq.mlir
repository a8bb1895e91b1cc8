// The sliding window's dq on Hopper's warpgroup MMA (sm_90a; kernels.DENSE): dq_tile.mlir over the band's key tiles
// (where the backward is one call, it makes delta too).
<% set selection = false %>
<% include "gpu/hopper/dq_tile.mlir" %>
