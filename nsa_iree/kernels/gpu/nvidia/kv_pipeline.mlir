<# Macros of the nvidia dq and forward kernels, which share the K/V pipeline (gpu/nvidia/kv_staging.mlir), the
   q fragments and the s = q k^T step: their common types and constants. #>

<# The names of the s = q k^T step's types and contraction map (the `t` of gpu/nvidia/mma.mlir's macros, with the
   kernel's mma kind added). #>
<% set types = {"lhs": "!dqk_lhs_step", "rhs": "!dqk_rhs_step", "acc": "!dqk_scores", "contraction": "#dqk_contraction"} %>

<# q, K and V in global memory, a block's K and V rows as 2-d views (row strides g_d = G D, g_dv = G Dv) and the
   `stages` buffers of K and V rows in workgroup memory. #>
<% macro kv_types(g_d, g_dv, stages) %>
!dqk_q = memref<?x?x${H}x${D}x${E}>
!dqk_k = memref<?x?x${G}x${D}x${E}>
!dqk_v = memref<?x?x${G}x${DV}x${E}>
!dqk_k_block = memref<${BS}x${D}x${E}, strided<[${g_d}, 1], offset: ?>>
!dqk_v_block = memref<${BS}x${DV}x${E}, strided<[${g_dv}, 1], offset: ?>>
// Workgroup K and V rows of the blocks in flight (unpadded rows, 16-byte chunks XOR-swizzled by row:
// nsa_iree/fragments.py, swizzle_mask).
!dqk_k_rows = memref<${stages}x${BS}x${D}x${E}, #gpu.address_space<workgroup>>
!dqk_v_rows = memref<${stages}x${BS}x${DV}x${E}, #gpu.address_space<workgroup>>
<% endmacro %>

<# The per-lane fragments of s = q k^T: one 16-d step's lhs and rhs, the scores, q over all d_steps steps; the
   contraction map of every mma. #>
<% macro fragment_types(d_steps) %>
!dqk_lhs_step = vector<1x1x4x2x${E}>
!dqk_rhs_step = vector<1x2x2x2x${E}>
!dqk_scores = vector<1x2x2x2xf32>
!dqk_q_frags = vector<1x${d_steps}x4x2x${E}>

#dqk_contraction = [affine_map<(i, j, k) -> (i, k)>, affine_map<(i, j, k) -> (k, j)>, affine_map<(i, j, k) -> (i, j)>]
<% endmacro %>

<# The K/V pipeline's stage constants: `steps` iterations over `stages` buffers, `lag` = stages - 1 behind; the
   swizzle masks (k_mask, v_mask) and their high bits (k_high, v_high). #>
<% macro stage_constants(steps, stages, lag, k_mask, v_mask, k_high, v_high) %>
      %steps = arith.constant ${steps} : index
      %stages = arith.constant ${stages} : index
      %lag = arith.constant ${lag} : index
      %k_swizzle_mask = arith.constant ${k_mask} : index
      %v_swizzle_mask = arith.constant ${v_mask} : index
      %k_swizzle_high = arith.constant ${k_high} : index
      %v_swizzle_high = arith.constant ${v_high} : index
<% endmacro %>

<# The K/V copies' constants: `lanes` lanes in subgroups of subgroup_size; K (V) rows of d_chunks (dv_chunks)
   16-byte chunks, k_items (v_items) chunks a block, k_per_lane (v_per_lane) a lane. #>
<% macro copy_constants(lanes, subgroup_size, d_chunks, dv_chunks, k_items, v_items, k_per_lane, v_per_lane) %>
      %lanes = arith.constant ${lanes} : index
      %subgroup_size = arith.constant ${subgroup_size} : index
      %k_chunks = arith.constant ${d_chunks} : index
      %v_chunks = arith.constant ${dv_chunks} : index
      %k_items = arith.constant ${k_items} : index
      %v_items = arith.constant ${v_items} : index
      %k_per_lane = arith.constant ${k_per_lane} : index
      %v_per_lane = arith.constant ${v_per_lane} : index
<% endmacro %>
