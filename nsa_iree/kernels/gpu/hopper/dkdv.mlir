// The selection's dk/dv on Hopper's warpgroup MMA (sm_90a): dkdv_tile.mlir over the pieces of the block lists'
// inversion, a workgroup per (block, up to ROWS_PER_PIECE rows that selected it), its rows' heads in chunks of 64
// (64 / HPG positions): every group size that divides 64.
<% set dq_partials = false %>
<% set selection = true %>
<% include "gpu/hopper/dkdv_tile.mlir" %>
