// Forward as a hand-written matrix-unit kernel: one workgroup per (query row m, kv group g, batch b), one
// pass over the selected blocks with an online softmax (dq_kernel.mlir's staging and fragments).
//
// Each selected block's K and V rows are staged once into workgroup memory (double-buffered, asynchronous
// copies). Subgroup w owns keys [16 w, 16 w + 16) of every block and keeps, for the 16 heads, a running
// max, a running sum of exp (per lane, over its columns) and an o accumulator [16 heads, Dv] in registers;
// scores are kept in base-2 units (x = s scale log2 e; 2^x by the recipe's `ex2` instruction):
//   s  = q k^T              lhs q [16 x D] (registers)   rhs k^T (ldmatrix)
//   m' = max(m, rowmax(x)), l = l 2^(m - m'), o = o 2^(m - m') when some head's block max passes
//        m + RESCALE_SLACK (one decision for the subgroup), else m' = m (then p <= 2^RESCALE_SLACK)
//   p = 2^(x - m'), l += rowsum(p)
//   o += p v                lhs p [16 x 16 keys] (the s accumulators re-tiled in registers)  rhs v (ldmatrix .trans)
// Invisible keys and padding heads take no part (p = 0). At the end the subgroups' (max, sum, o) are
// combined in subgroup order (fixed: bitwise reproducible): M = max_w m_w, L = sum_w l_w exp(m_w - M),
// o = sum_w o_w exp(m_w - M) / L, lse = M + log(L) (natural log); a row that sees no key gets o = 0 and
// lse = -inf. p is rounded to the input type for the matrix units, as in the linalg forward.
//
// Fragments and visibility as in dq_kernel.mlir (${MMA_KIND}, nsa_iree/fragments.py; semantics.md).
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "gpu/nvidia/kernel.mlir" as nv %>
<% import "common/rules.mlir" as rules %>
<% import "gpu/nvidia/softmax.mlir" as softmax %>

// Push constants: B, M, N (i32), then the bits of scale (f32).
<% set inputs = ['q', 'k', 'v', 'block_indices'] %>
<% set outputs = ['o', 'lse'] %>
${ dispatch.layout("fwd_kernel_layout", 4, inputs, outputs) }

${ nv.kv_types(G_D, G_DV, DQ_STAGES) }
!fwk_o = memref<?x?x${H}x${DV}x${E}>
// Workgroup memory: K and V rows of the blocks in flight; after the loop the same bytes hold the
// subgroups' partial o, max and sum.
!fwk_o_parts = memref<${SUBGROUPS}x16x${DV}xf32, #gpu.address_space<workgroup>>
!fwk_stats = memref<${SUBGROUPS}x16xf32, #gpu.address_space<workgroup>>
!fwk_smem = memref<${FWD_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
// Per-lane fragments.
${ nv.fragment_types(D_STEPS) }
<% set dqk = dict(nv.types, kind=MMA_KIND) %>
!fwk_p_frags = vector<1x1x4x2x${E}>
!fwk_o_acc = vector<1x${DV_TILES}x2x2xf32>

<% call dispatch.executable("selection_attention_fwd_kernel_exe", "selection_attention_fwd_row", "fwd_kernel_layout", ['m_rows', 'kv_heads', 'batch'], lanes=LANES) %>
${ nv.func_open("selection_attention_fwd_row", LANES, SUBGROUP_SIZE, FORWARD_MIN_WORKGROUPS_PER_SM) }
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c2 = arith.constant 2 : index
      %c4 = arith.constant 4 : index
      %c8 = arith.constant 8 : index
      %c16 = arith.constant 16 : index
      %c1_i32 = arith.constant 1 : i32
      %c2_i32 = arith.constant 2 : i32
      %c32_i32 = arith.constant 32 : i32
      %zero = arith.constant 0.0 : f32
      %one = arith.constant 1.0 : f32
      %minus_inf = arith.constant 0xFF800000 : f32
      %c0_i32 = arith.constant 0 : i32
      %log2e = arith.constant 1.44269504 : f32      // exp(x) = 2^(x log2 e), 2^ by the hardware's approximation
      %ln2 = arith.constant 0.693147182 : f32
      %rescale_slack = arith.constant ${RESCALE_SLACK} : f32
      %zero_pair = arith.constant dense<0.0> : vector<2x${E}>
      %heads_per_group = arith.constant ${HPG} : index
      %block_size = arith.constant ${BS} : index
      %slots = arith.constant ${T} : index
${ nv.copy_constants(LANES, SUBGROUP_SIZE, D_CHUNKS, DV_CHUNKS, K_STAGE_ITEMS, V_STAGE_ITEMS, K_STAGE_PER_LANE, V_STAGE_PER_LANE) }
      %d_steps = arith.constant ${D_STEPS} : index
      %dv_steps = arith.constant ${DV_STEPS} : index
      %subgroups = arith.constant ${SUBGROUPS} : index
      %value_dim = arith.constant ${DV} : index
      %dv_tiles = arith.constant ${DV_TILES} : index
${ nv.stage_constants(T_PLUS_DQ_LAG, DQ_STAGES, DQ_STAGES_MINUS_1, K_SWIZZLE_MASK, V_SWIZZLE_MASK, K_SWIZZLE_HIGH, V_SWIZZLE_HIGH) }

${ dispatch.ids(['m', 'g', 'b']) }
${ dispatch.push_constants("fwd_kernel_layout", ['batch', 'm_rows', 'n', 'scale']) }
      %scale_log2 = arith.mulf %scale, %log2e : f32

${ dispatch.bindings("fwd_kernel_layout", inputs, outputs) }

      %smem = memref.alloc() : !fwk_smem
      %v_offset = arith.constant ${DQ_K_BYTES} : index
      %max_offset = arith.constant ${FWD_O_PARTS_BYTES} : index
      %sum_offset = arith.constant ${FWD_O_PARTS_STATS_BYTES} : index
      %k_rows = memref.view %smem[%c0][] : !fwk_smem to !dqk_k_rows
      %v_rows = memref.view %smem[%v_offset][] : !fwk_smem to !dqk_v_rows
      %o_parts = memref.view %smem[%c0][] : !fwk_smem to !fwk_o_parts
      %max_parts = memref.view %smem[%max_offset][] : !fwk_smem to !fwk_stats
      %sum_parts = memref.view %smem[%sum_offset][] : !fwk_smem to !fwk_stats

${ nv.lane_ids() }
      %r8 = arith.addi %r, %c8 : index
      %key_base = arith.muli %subgroup, %c16 : index
      %h0 = arith.muli %g, %heads_per_group : index
      %head_valid_0 = arith.cmpi ult, %r, %heads_per_group : index
      %head_valid_1 = arith.cmpi ult, %r8, %heads_per_group : index
      %head_0 = arith.addi %h0, %r : index
      %head_1 = arith.addi %h0, %r8 : index

      // q as lhs fragments over all of D, loaded once: element [2 i + k'][e] of step s is row 8 i + r,
      // column 16 s + 8 k' + 2 c + e.
      <% set q_rows = ("%m", "%m") %>
      <% include "gpu/nvidia/q_fragments.mlir" %>

      // pos(m) = m + N - M: the positions the causal test uses.
${ nv.positions() }

      // ldmatrix: lanes 8 q .. 8 q + 7 give the row addresses of 8x8 matrix q of the four.
${ nv.ldmatrix_lanes() }
      // s: matrix q = (key tile q / 2, d half q mod 2) of a 16-key x 16-d step.
      %sd_row = arith.addi %key_base, %hi8 : index
      %score_row = arith.addi %sd_row, %matrix_row : index
      // p v (v read transposed): matrix q = (e tile q / 2, key half q mod 2).
      %pv_row0 = arith.addi %key_base, %lo8 : index
      %pv_row = arith.addi %pv_row0, %matrix_row : index
      // K and V chunks are stored XOR-swizzled by row (kv_staging): column c of row j at c ^ 8 (j & mask).
      %score_row_bits = arith.andi %score_row, %k_swizzle_mask : index
      %score_swizzle_k = arith.muli %score_row_bits, %c8 : index
      %pv_row_bits = arith.andi %pv_row, %v_swizzle_mask : index
      %pv_swizzle_v = arith.muli %pv_row_bits, %c8 : index

      // Iteration t stages slot t into buffer t mod STAGES and computes slot t - STAGES + 1 meanwhile.
      // Carried per lane: o for its fragment elements, the running max of its two heads, and its part of
      // their running sums.
      %o_init = arith.constant dense<0.0> : !fwk_o_acc
      %o_acc, %max_0, %max_1, %sum_0, %sum_1 = scf.for %t = %c0 to %steps step %c1
          iter_args(%o_iter = %o_init, %mx0 = %minus_inf, %mx1 = %minus_inf, %l0 = %zero, %l1 = %zero)
          -> (!fwk_o_acc, f32, f32, f32, f32) {
        <% set staged_block, staged_values = nv.selected_block, true %>
        <% include "gpu/nvidia/kv_staging.mlir" %>
${ nv.previous("%slot") }
${ nv.selected_block("%slot", "%selected_now") }
        %compute = arith.andi %selected_now, %has_previous : i1
        %o_next, %mx0_next, %mx1_next, %l0_next, %l1_next = scf.if %compute -> (!fwk_o_acc, f32, f32, f32, f32) {
          %key0 = arith.muli %block, %block_size : index
          %to_pos = arith.subi %pos, %key0 : index
          %visible = arith.addi %to_pos, %c1 : index
          ${ rules.first_key("first_visible") }

${ softmax.checked_step(dqk, EX2, PACK_PAIR, VOTE_ANY) }
          scf.yield %o_new, %max_ref_0, %max_ref_1, %l0_new, %l1_new : !fwk_o_acc, f32, f32, f32, f32
        } else {
          scf.yield %o_iter, %mx0, %mx1, %l0, %l1 : !fwk_o_acc, f32, f32, f32, f32
        }
        // The next iteration stages into the buffer just read.
        gpu.barrier
        scf.yield %o_next, %mx0_next, %mx1_next, %l0_next, %l1_next : !fwk_o_acc, f32, f32, f32, f32
      }

${ softmax.parts_out("%subgroup", "%r", "%r8") }

      <% set combined_parts = "%subgroups" %>
      <% include "gpu/forward_combine.mlir" %>
      return
    }
<% endcall %>

// Host side: one dispatch, o and lse written into the caller's tensors.
${ host.forward("selection_attention_fwd_kernel_exe") }
