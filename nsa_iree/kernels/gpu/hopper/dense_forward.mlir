// The sliding window's forward on Hopper's warpgroup MMA (sm_90a; kernels.DENSE): forward.mlir over the band's key
// tiles.
<% set selection = false %>
<% include "gpu/hopper/forward.mlir" %>
