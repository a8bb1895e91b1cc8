// Forward for wide groups (more query heads per kv head than one 16-row tile: HPG a multiple of 16 up to 64,
// kernels.gpu.nvidia.WIDE_MAX_TILES tiles; kernels.WIDE) as a hand-written matrix-unit kernel: one workgroup per (query row m, kv group g, batch b), one
// pass over the row's selected blocks with an online softmax, each selected block's K and V staged once for all
// the group's heads.
//
// The workgroup's WIDE_TILES x WIDE_SPLITS subgroups: subgroup w owns heads [16 u, 16 u + 16) of the group
// (head tile u = w mod WIDE_TILES, one per 16 heads) and, of each staged block, the 16-key steps s, s + WIDE_SPLITS,
// ... (key split s = w div WIDE_TILES: where the head tiles are fewer than four, the keys are split so that four
// subgroups stay busy). It takes them with the forward's online-softmax step (gpu/nvidia/softmax.mlir), keeping
// its heads' running max, sum and o [16, Dv] in registers. The staging is the forward's (gpu/nvidia/kv_staging.mlir:
// double-buffered asynchronous copies of the block a slot names, swizzled rows). With one key split a subgroup
// sees all of its rows' keys and writes their o = o / sum and lse = max + log(sum) (natural log) itself, as the
// dense forward's subgroups do; with more, the splits' (max, sum, o) are combined in split order
// (gpu/forward_combine.mlir). Either way each head's keys go in one fixed order: bitwise reproducible.
// Skipped slots (-1, a future block) are never read; a block listed twice is taken twice (multiplicity); a row
// that sees no key gets o = 0 and lse = -inf. Fragments and visibility as the forward's (semantics.md).
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "gpu/nvidia/kernel.mlir" as nv %>
<% import "gpu/nvidia/softmax.mlir" as softmax %>

// Push constants: B, M, N (i32), then the bits of scale (f32).
<% set inputs = ['q', 'k', 'v', 'block_indices'] %>
<% set outputs = ['o', 'lse'] %>
${ dispatch.layout("wide_fwd_layout", 4, inputs, outputs) }

${ nv.kv_types(G_D, G_DV, DQ_STAGES) }
!fwk_o = memref<?x?x${H}x${DV}x${E}>
!fwk_smem = memref<${WIDE_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
<% if WIDE_SPLITS != "1" %>
// After the loop the K/V bytes hold each key split's partial o [HPG, Dv], max and sum.
!fwk_o_parts = memref<${WIDE_SPLITS}x${HPG}x${DV}xf32, #gpu.address_space<workgroup>>
!fwk_stats = memref<${WIDE_SPLITS}x${HPG}xf32, #gpu.address_space<workgroup>>
<% endif %>
// Per-lane fragments.
${ nv.fragment_types(D_STEPS) }
<% set dqk = dict(nv.types, kind=MMA_KIND) %>
!fwk_p_frags = vector<1x1x4x2x${E}>
!fwk_o_acc = vector<1x${DV_TILES}x2x2xf32>

<% call dispatch.executable("selection_attention_wide_fwd_exe", "selection_attention_wide_fwd_row", "wide_fwd_layout", ['m_rows', 'kv_heads', 'batch'], lanes=WIDE_LANES) %>
${ nv.func_open("selection_attention_wide_fwd_row", WIDE_LANES, SUBGROUP_SIZE, WIDE_FORWARD_MIN_WORKGROUPS_PER_SM) }
${ nv.constants(["c0", "c1", "c2", "c4", "c8", "c16", "c1_i32", "c2_i32", "c32_i32", "zero", "one", "minus_inf", "c0_i32", "log2e", "ln2"]) }
      %rescale_slack = arith.constant ${RESCALE_SLACK} : f32
      %zero_pair = arith.constant dense<0.0> : vector<2x${E}>
${ nv.constants([("heads_per_group", HPG), ("block_size", BS), ("slots", T), ("subtiles", DENSE_SUBTILES), ("head_tiles", WIDE_TILES), ("key_splits", WIDE_SPLITS), ("value_dim", DV)]) }
${ nv.copy_constants(WIDE_LANES, SUBGROUP_SIZE, D_CHUNKS, DV_CHUNKS, K_STAGE_ITEMS, V_STAGE_ITEMS, WIDE_K_STAGE_PER_LANE, WIDE_V_STAGE_PER_LANE) }
${ nv.constants([("d_steps", D_STEPS), ("dv_steps", DV_STEPS), ("dv_tiles", DV_TILES)]) }
${ nv.stage_constants(T_PLUS_DQ_LAG, DQ_STAGES, DQ_STAGES_MINUS_1, K_SWIZZLE_MASK, V_SWIZZLE_MASK, K_SWIZZLE_HIGH, V_SWIZZLE_HIGH) }

${ dispatch.ids(['m', 'g', 'b']) }
${ dispatch.push_constants("wide_fwd_layout", ['batch', 'm_rows', 'n', 'scale']) }
      %scale_log2 = arith.mulf %scale, %log2e : f32

${ dispatch.bindings("wide_fwd_layout", inputs, outputs) }

      %smem = memref.alloc() : !fwk_smem
      %v_offset = arith.constant ${DQ_K_BYTES} : index
      %k_rows = memref.view %smem[%c0][] : !fwk_smem to !dqk_k_rows
      %v_rows = memref.view %smem[%v_offset][] : !fwk_smem to !dqk_v_rows
<% if WIDE_SPLITS != "1" %>
      %max_offset = arith.constant ${WIDE_O_PARTS_BYTES} : index
      %sum_offset = arith.constant ${WIDE_O_PARTS_STATS_BYTES} : index
      %o_parts = memref.view %smem[%c0][] : !fwk_smem to !fwk_o_parts
      %max_parts = memref.view %smem[%max_offset][] : !fwk_smem to !fwk_stats
      %sum_parts = memref.view %smem[%sum_offset][] : !fwk_smem to !fwk_stats
<% endif %>

${ nv.lane_ids() }
      // The subgroup's head tile and key split; the lane's rows: heads 16 u + r and 16 u + r + 8 of the group,
      // both at row m.
      %head_tile = arith.remui %subgroup, %head_tiles : index
      %key_split = arith.divui %subgroup, %head_tiles : index
      %r8 = arith.addi %r, %c8 : index
      %h0 = arith.muli %g, %heads_per_group : index
      %subgroup_heads = arith.muli %head_tile, %c16 : index
<% for i, lane_row in [("0", "%r"), ("1", "%r8")] %>
      %head_in_group_${i} = arith.addi %subgroup_heads, ${lane_row} : index
      %head_${i} = arith.addi %h0, %head_in_group_${i} : index
      // (always true: HPG is a multiple of 16; the q loads and the stores test it as the other kernels do)
      %head_valid_${i} = arith.cmpi ult, %head_in_group_${i}, %heads_per_group : index
<% endfor %>

      // q as lhs fragments over all of D, loaded once: element [2 i + k'][e] of step s is row 8 i + r,
      // column 16 s + 8 k' + 2 c + e.
      <% set q_rows = ("%m", "%m") %>
      <% include "gpu/nvidia/q_fragments.mlir" %>

      // pos(m) = m + N - M: the positions the causal test uses.
${ nv.positions() }

      // ldmatrix: lanes 8 q .. 8 q + 7 give the row addresses of 8x8 matrix q of the four; the lane's rows in a
      // 16-key step for s (matrix q = (key tile q / 2, d half q mod 2)) and for p v (v read transposed: matrix
      // q = (e tile q / 2, key half q mod 2)).
${ nv.ldmatrix_lanes() }
      %score_lane_row = arith.addi %hi8, %matrix_row : index
      %pv_lane_row = arith.addi %lo8, %matrix_row : index

      // Iteration t stages slot t into buffer t mod STAGES and computes slot t - STAGES + 1 meanwhile. Carried
      // per lane: o for its fragment elements, the running max of its two heads, and its part of their sums.
      %o_init = arith.constant dense<0.0> : !fwk_o_acc
      %o_acc, %max_0, %max_1, %sum_0, %sum_1 = scf.for %t = %c0 to %steps step %c1
          iter_args(%o_tile = %o_init, %mx0_tile = %minus_inf, %mx1_tile = %minus_inf, %l0_tile = %zero, %l1_tile = %zero)
          -> (!fwk_o_acc, f32, f32, f32, f32) {
        <% set staged_block, staged_values = nv.selected_block, true %>
        <% include "gpu/nvidia/kv_staging.mlir" %>
${ nv.previous("%slot") }
${ nv.selected_block("%slot", "%selected_now") }
        %compute = arith.andi %selected_now, %has_previous : i1
        %o_next, %mx0_next, %mx1_next, %l0_next, %l1_next = scf.if %compute -> (!fwk_o_acc, f32, f32, f32, f32) {
          // The block's keys up to pos(m), the same for every head of the row.
          %key0 = arith.muli %block, %block_size : index
          %to_pos = arith.subi %pos, %key0 : index
          %visible = arith.addi %to_pos, %c1 : index
${ softmax.tile_steps("%visible", dqk, EX2, PACK_PAIR, VOTE_ANY, first="%key_split", stride="%key_splits") }
          scf.yield %o_j, %mx0_j, %mx1_j, %l0_j, %l1_j : !fwk_o_acc, f32, f32, f32, f32
        } else {
          scf.yield %o_tile, %mx0_tile, %mx1_tile, %l0_tile, %l1_tile : !fwk_o_acc, f32, f32, f32, f32
        }
        // The next iteration stages into the buffer just read.
        gpu.barrier
        scf.yield %o_next, %mx0_next, %mx1_next, %l0_next, %l1_next : !fwk_o_acc, f32, f32, f32, f32
      }

<% if WIDE_SPLITS == "1" %>
${ softmax.rows_out(rows=("%m", "%m")) }
<% else %>
${ softmax.parts_out("%key_split", "%head_in_group_0", "%head_in_group_1") }

      <% set combined_parts = "%key_splits" %>
      <% include "gpu/forward_combine.mlir" %>
<% endif %>
      return
    }
<% endcall %>

// Host side: one dispatch, o and lse written into the caller's tensors.
${ host.forward("selection_attention_wide_fwd_exe", "selection_attention_wide_fwd_row") }
