// Dense forward: the compressed attention's forward (KernelSpec.key_stride > 1) and the sliding window's
// (KernelSpec.window; kernels.DENSE) as flash attention on the matrix units, with no block lists.
//
// The rows of kv group g are its M x HPG (position, head) pairs, row R = m HPG + h (any HPG: a tile of 16 rows
// holds one position's heads, or several positions'); row R sees the keys up to pos(m) (common/rules.mlir), a
// staircase over the keys, and with a window only the last WINDOW of them, a band (from the band's first tile
// on, gpu/nvidia/dense_rows.mlir's %first_tile). One workgroup per (tile of DENSE_ROWS rows, g, b): subgroup w owns rows
// [16 w, 16 w + 16) of the tile and keeps their running max, sum and o [16, Dv] in registers, as the forward's
// subgroups do for their keys (gpu/nvidia/forward.mlir). The keys stream through workgroup memory in tiles of BS
// with the forward's K/V pipeline (gpu/nvidia/kv_staging.mlir; tile t staged in iteration t, or the band's
// t-th, up to the last tile the workgroup's last row sees), each tile staged once for all the workgroup's rows. A subgroup takes a staged
// tile 16 keys at a time with the forward's online-softmax step (gpu/nvidia/softmax.mlir), up to its last row's
// position, and at the end writes its rows' o = o / sum and lse = max + log(sum) (natural log) itself: no combine
// across subgroups, each row's keys in one fixed order. A row that sees no key gets o = 0 and lse = -inf. Rows
// past M x HPG are padding: they load nothing and write nothing.
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "gpu/nvidia/kernel.mlir" as nv %>
<% import "gpu/nvidia/softmax.mlir" as softmax %>

// Push constants: B, M, N (i32; N is the number of keys, k's rows), then the bits of scale (f32). The block
// indices are bound (the forward's ABI) but not read.
<% set inputs = ['q', 'k', 'v', 'block_indices'] %>
<% set outputs = ['o', 'lse'] %>
${ dispatch.layout("dense_fwd_layout", 4, inputs, outputs) }

${ nv.kv_types(G_D, G_DV, DQ_STAGES) }
!fwk_o = memref<?x?x${H}x${DV}x${E}>
!fwk_smem = memref<${DENSE_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
// Per-lane fragments.
${ nv.fragment_types(D_STEPS) }
<% set dqk = dict(nv.types, kind=MMA_KIND) %>
!fwk_p_frags = vector<1x1x4x2x${E}>
!fwk_o_acc = vector<1x${DV_TILES}x2x2xf32>

<% call dispatch.executable("dense_attention_fwd_exe", "dense_attention_fwd_tile", "dense_fwd_layout", ['row_tiles', 'kv_heads', 'batch'], lanes=DENSE_LANES) %>
${ nv.func_open("dense_attention_fwd_tile", DENSE_LANES, SUBGROUP_SIZE, DENSE_FORWARD_MIN_WORKGROUPS_PER_SM) }
${ nv.constants(["c0", "c1", "c2", "c4", "c8", "c15", "c16", "c1_i32", "c2_i32", "c32_i32", "zero", "one", "minus_inf", "c0_i32", "log2e", "ln2"]) }
      %rescale_slack = arith.constant ${RESCALE_SLACK} : f32
      %zero_pair = arith.constant dense<0.0> : vector<2x${E}>
${ nv.constants([("heads_per_group", HPG), ("block_size", BS), ("rows_per_workgroup", DENSE_ROWS), ("subtiles", DENSE_SUBTILES)]) }
${ nv.copy_constants(DENSE_LANES, SUBGROUP_SIZE, D_CHUNKS, DV_CHUNKS, K_STAGE_ITEMS, V_STAGE_ITEMS, DENSE_K_STAGE_PER_LANE, DENSE_V_STAGE_PER_LANE) }
${ nv.constants([("d_steps", D_STEPS), ("dv_steps", DV_STEPS), ("dv_tiles", DV_TILES)]) }
${ nv.stage_constants(none, DQ_STAGES, DQ_STAGES_MINUS_1, K_SWIZZLE_MASK, V_SWIZZLE_MASK, K_SWIZZLE_HIGH, V_SWIZZLE_HIGH) }

${ dispatch.ids(['row_tile', 'g', 'b']) }
${ dispatch.push_constants("dense_fwd_layout", ['batch', 'm_rows', 'n', 'scale']) }
      %scale_log2 = arith.mulf %scale, %log2e : f32

${ dispatch.bindings("dense_fwd_layout", inputs, outputs) }

      %smem = memref.alloc() : !fwk_smem
      %v_offset = arith.constant ${DQ_K_BYTES} : index
      %k_rows = memref.view %smem[%c0][] : !fwk_smem to !dqk_k_rows
      %v_rows = memref.view %smem[%v_offset][] : !fwk_smem to !dqk_v_rows

${ nv.lane_ids() }
      <% include "gpu/nvidia/dense_rows.mlir" %>

      // q as lhs fragments over all of D, loaded once: element [2 i + k'][e] of step s is row 8 i + r,
      // column 16 s + 8 k' + 2 c + e.
      <% set q_rows = ("%m_0", "%m_1") %>
      <% include "gpu/nvidia/q_fragments.mlir" %>

      // ldmatrix: lanes 8 q .. 8 q + 7 give the row addresses of 8x8 matrix q of the four; the lane's rows in a
      // 16-key step for s (matrix q = (key tile q / 2, d half q mod 2)) and for p v (v read transposed: matrix
      // q = (e tile q / 2, key half q mod 2)).
${ nv.ldmatrix_lanes() }
      %score_lane_row = arith.addi %hi8, %matrix_row : index
      %pv_lane_row = arith.addi %lo8, %matrix_row : index

      // Iteration t stages tile t into buffer t mod STAGES and computes tile t - STAGES + 1 meanwhile. Carried
      // per lane: o for its fragment elements, the running max of its two rows, and its part of their sums.
      %o_init = arith.constant dense<0.0> : !fwk_o_acc
      %o_acc, %max_0, %max_1, %sum_0, %sum_1 = scf.for %t = %c0 to %steps step %c1
          iter_args(%o_tile = %o_init, %mx0_tile = %minus_inf, %mx1_tile = %minus_inf, %l0_tile = %zero, %l1_tile = %zero)
          -> (!fwk_o_acc, f32, f32, f32, f32) {
        <% set staged_block, staged_values = nv.next_tile, true %>
        <% include "gpu/nvidia/kv_staging.mlir" %>
${ nv.previous("%slot") }
${ nv.dense_tile() }
        %o_next, %mx0_next, %mx1_next, %l0_next, %l1_next = scf.if %compute -> (!fwk_o_acc, f32, f32, f32, f32) {
          // Keys of the tile below visible_i are row i's; the subgroup's 16-key steps up to its last key.
${ nv.dense_row_bounds() }
          %subgroup_to_pos = arith.subi %subgroup_pos, %key0 : index
          %subgroup_keys = arith.addi %subgroup_to_pos, %c1 : index
${ softmax.tile_steps("%subgroup_keys", dqk, EX2, PACK_PAIR, VOTE_ANY, per_row=true) }
          scf.yield %o_j, %mx0_j, %mx1_j, %l0_j, %l1_j : !fwk_o_acc, f32, f32, f32, f32
        } else {
          scf.yield %o_tile, %mx0_tile, %mx1_tile, %l0_tile, %l1_tile : !fwk_o_acc, f32, f32, f32, f32
        }
        // The next iteration stages into the buffer just read.
        gpu.barrier
        scf.yield %o_next, %mx0_next, %mx1_next, %l0_next, %l1_next : !fwk_o_acc, f32, f32, f32, f32
      }

${ softmax.rows_out() }
      return
    }
<% endcall %>

// Host side: one dispatch over the row tiles, o and lse written into the caller's tensors.
${ host.forward("dense_attention_fwd_exe", "dense_attention_fwd_tile", DENSE_ROWS) }
