// The selection's dq of 64 query heads per kv head on Hopper's warpgroup MMA (sm_90a): kernels.WIDE's form on the
// hopper target. dq_tile.mlir over block lists: a workgroup of one warpgroup per (position, kv group g, b), its 64
// rows the position's heads (an m64 tile); each of the position's selected blocks staged once for all of them.
<% set selection = true %>
<% include "gpu/hopper/dq_tile.mlir" %>
