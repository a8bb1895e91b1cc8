// dq pass as a hand-written matrix-unit kernel: one workgroup per (query row m, kv group g, batch b).
//
// The selected blocks' K and V rows are staged into workgroup memory with 16-byte asynchronous copies, read
// from global memory once per workgroup and double-buffered (${DQ_STAGES} buffers: the next slot's copies are
// in flight while this one is computed). Subgroup w owns keys [16 w, 16 w + 16) of every block: it computes
// s and dp for the 16 heads x its keys on the matrix units, p and ds in registers (masking invisible keys and
// padding heads), and adds ds k over its keys into a private dq accumulator [16 heads, D] kept in registers
// for the whole row. The subgroups' accumulators are summed in a fixed order at the end (bitwise
// reproducible) and dq written once.
//
//   s  = q k^T         lhs q [16 x D] (registers, loaded once)   rhs k^T (ldmatrix of the K rows)
//   dp = do v^T        lhs do (ldmatrix of a [16, Dv] tile)       rhs v^T (ldmatrix of the V rows)
//   p  = exp(scale s - lse), ds = scale p (dp - delta), 0 where the key is invisible or the head is padding
//   dq += ds k         lhs ds [16 x 16 keys] (the s accumulators, re-tiled in registers)
//                      rhs k [16 keys x D] (ldmatrix .trans of the same K rows: no second copy)
//
// Matrix operations are iree_codegen.inner_tiled on per-lane fragments of ${MMA_KIND} (${SUBGROUP_SIZE} lanes). The
// lane -> element placement of the fragments is IREE's layout for that intrinsic (nsa_iree/fragments.py,
// pinned by tests/test_fragments.py): lane l holds, with r = l / 4 and c = l % 4,
//   lhs  vector<4x2>: [2 i + k'][e] = X[8 i + r][8 k' + 2 c + e]        (16 x 16, rows x reduction)
//   rhs  vector<2x2>: [k'][e]       = Y[8 k' + 2 c + e][r]              (16 x 8, reduction x columns)
//   acc  vector<2x2>: [i][e]        = Z[8 i + r][2 c + e]               (16 x 8)
// An ldmatrix of four 8x8 matrices fills one lhs or two rhs fragments. The K/V tiles are unpadded with each
// row's 16-byte chunks XOR-swizzled by the row (kv_staging; fragments.swizzle_mask), the do tile padded by 8
// elements per row: either way the 8 rows of each matrix sit on different banks.
//
// Visibility (semantics.md): slot t of row m names block i; it is skipped when i < 0 or i * BS > pos(m),
// pos(m) = m + N - M (tested as i <= floor(pos / BS), which cannot overflow); key i * BS + j is visible
// when j < min(pos - i * BS + 1, BS). Keys past that are staged as zeros and their ds is 0, so a NaN in an
// unread key reaches nothing.
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "gpu/nvidia/kernel.mlir" as nv %>
<% import "common/rules.mlir" as rules %>
<% import "gpu/nvidia/dq_step.mlir" as dq_step %>

// Push constants: B, M, N (i32), then the bits of scale (f32).
<% set inputs = ['q', 'k', 'v', 'block_indices', 'lse', 'delta', 'do'] %>
<% set outputs = ['dq'] %>
${ dispatch.layout("dq_kernel_layout", 4, inputs, outputs) }

${ nv.kv_types(G_D, G_DV, DQ_STAGES) }
!dqk_do = memref<?x?x${H}x${DV}x${E}>
// Workgroup tiles besides the K and V rows: the dq sum and the do tile.
!dqk_dq_sum = memref<16x${D}xf32, #gpu.address_space<workgroup>>
!dqk_do_tile = memref<16x${DV_PADDED}x${E}, #gpu.address_space<workgroup>>
// Per-lane fragments (one subgroup's share of each product).
!dqk_lhs = vector<4x2x${E}>
!dqk_rhs = vector<2x2x${E}>
!dqk_acc = vector<2x2xf32>
${ nv.fragment_types(D_STEPS) }
<% set dqk = dict(nv.types, kind=MMA_KIND) %>
!dqk_ds_frags = vector<1x1x4x2x${E}>
!dqk_dq_acc = vector<1x${D_TILES}x2x2xf32>

<% call dispatch.executable("selection_attention_dq_kernel_exe", "selection_attention_dq_row", "dq_kernel_layout", ['m_rows', 'kv_heads', 'batch'], lanes=LANES) %>
${ nv.func_open("selection_attention_dq_row", LANES, SUBGROUP_SIZE, DQ_MIN_WORKGROUPS_PER_SM) }
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c2 = arith.constant 2 : index
      %c4 = arith.constant 4 : index
      %c8 = arith.constant 8 : index
      %c16 = arith.constant 16 : index
      %zero = arith.constant 0.0 : f32
      %log2e = arith.constant 1.44269504 : f32      // exp(x) = 2^(x log2 e), 2^ by the hardware's approximation
      %zero_e = arith.constant 0.0 : ${E}
      %zero_pair = arith.constant dense<0.0> : vector<2x${E}>
      %zero_f32_pair = arith.constant dense<0.0> : vector<2xf32>
      %zero_chunk = arith.constant dense<0.0> : vector<8x${E}>
      %heads_per_group = arith.constant ${HPG} : index
      %block_size = arith.constant ${BS} : index
      %slots = arith.constant ${T} : index
${ nv.stage_constants(T_PLUS_DQ_LAG, DQ_STAGES, DQ_STAGES_MINUS_1, K_SWIZZLE_MASK, V_SWIZZLE_MASK, K_SWIZZLE_HIGH, V_SWIZZLE_HIGH) }
${ nv.copy_constants(LANES, SUBGROUP_SIZE, D_CHUNKS, DV_CHUNKS, K_STAGE_ITEMS, V_STAGE_ITEMS, K_STAGE_PER_LANE, V_STAGE_PER_LANE) }
      %do_items = arith.constant ${DO_STAGE_ITEMS} : index
      %d_steps = arith.constant ${D_STEPS} : index
      %dv_steps = arith.constant ${DV_STEPS} : index
      %d_tiles = arith.constant ${D_TILES} : index
      %subgroups = arith.constant ${SUBGROUPS} : index
      %head_dim = arith.constant ${D} : index

${ dispatch.ids(['m', 'g', 'b']) }
${ dispatch.push_constants("dq_kernel_layout", ['batch', 'm_rows', 'n', 'scale']) }
${ nv.p_and_ds_constants() }

${ dispatch.bindings("dq_kernel_layout", inputs, outputs) }

      // One workgroup allocation: K rows, V rows, the do tile; the dq sum reuses the K rows after the loop.
      %smem = memref.alloc() : memref<${DQ_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
      %v_offset = arith.constant ${DQ_K_BYTES} : index
      %do_offset = arith.constant ${DQ_KV_BYTES} : index
      %k_rows = memref.view %smem[%c0][] : memref<${DQ_SMEM_BYTES}xi8, #gpu.address_space<workgroup>> to !dqk_k_rows
      %v_rows = memref.view %smem[%v_offset][] : memref<${DQ_SMEM_BYTES}xi8, #gpu.address_space<workgroup>> to !dqk_v_rows
      %do_tile = memref.view %smem[%do_offset][] : memref<${DQ_SMEM_BYTES}xi8, #gpu.address_space<workgroup>> to !dqk_do_tile
      %dq_sum = memref.view %smem[%c0][] : memref<${DQ_SMEM_BYTES}xi8, #gpu.address_space<workgroup>> to !dqk_dq_sum

${ nv.lane_ids() }
      %r8 = arith.addi %r, %c8 : index
      %key_base = arith.muli %subgroup, %c16 : index
      %h0 = arith.muli %g, %heads_per_group : index

      // This lane's two heads (rows r and r + 8 of every 16-row fragment): padding rows past HPG read
      // nothing and contribute nothing.
      %head_valid_0 = arith.cmpi ult, %r, %heads_per_group : index
      %head_valid_1 = arith.cmpi ult, %r8, %heads_per_group : index
      %head_0 = arith.addi %h0, %r : index
      %head_1 = arith.addi %h0, %r8 : index
      %lse_0 = scf.if %head_valid_0 -> (f32) {
        %x = memref.load %lse[%b, %head_0, %m] : memref<?x${H}x?xf32>
        scf.yield %x : f32
      } else {
        scf.yield %zero : f32
      }
      %lse_1 = scf.if %head_valid_1 -> (f32) {
        %x = memref.load %lse[%b, %head_1, %m] : memref<?x${H}x?xf32>
        scf.yield %x : f32
      } else {
        scf.yield %zero : f32
      }
      %delta_0 = scf.if %head_valid_0 -> (f32) {
        %x = memref.load %delta[%b, %m, %head_0] : memref<?x?x${H}xf32>
        scf.yield %x : f32
      } else {
        scf.yield %zero : f32
      }
      %delta_1 = scf.if %head_valid_1 -> (f32) {
        %x = memref.load %delta[%b, %m, %head_1] : memref<?x?x${H}xf32>
        scf.yield %x : f32
      } else {
        scf.yield %zero : f32
      }
${ nv.p_and_ds_row("row_0", "lse_0", "delta_0") }
${ nv.p_and_ds_row("row_1", "lse_1", "delta_1") }

      // q and do as lhs fragments over all of D (Dv), loaded once: element [2 i + k'][e] of step s is
      // row 8 i + r, column 16 s + 8 k' + 2 c + e.
      <% set q_rows = ("%m", "%m") %>
      <% include "gpu/nvidia/q_fragments.mlir" %>
      // do as a [16 heads, Dv] tile in workgroup memory (padding heads zero), read with ldmatrix per block:
      // keeping it in registers like q would leave too few registers for 3 workgroups per multiprocessor.
      scf.for %item = %tid to %do_items step %lanes {
        %chunk = arith.remui %item, %v_chunks : index
        %h = arith.divui %item, %v_chunks : index
        %e0 = arith.muli %chunk, %c8 : index
        %real = arith.cmpi ult, %h, %heads_per_group : index
        %row = scf.if %real -> (vector<8x${E}>) {
          %head = arith.addi %h0, %h : index
          %x = vector.load %do[%b, %m, %head, %e0] : !dqk_do, vector<8x${E}>
          scf.yield %x : vector<8x${E}>
        } else {
          scf.yield %zero_chunk : vector<8x${E}>
        }
        vector.store %row, %do_tile[%h, %e0] : !dqk_do_tile, vector<8x${E}>
      }

      // pos(m) = m + N - M: the positions the causal test uses.
${ nv.positions() }

      // ldmatrix: lanes 8 q .. 8 q + 7 give the row addresses of 8x8 matrix q of the four.
${ nv.ldmatrix_lanes() }
      // s, dp: matrix q = (key tile q / 2, d half q mod 2) of a 16-key x 16-d step.
      %do_lane_row = arith.addi %lo8, %matrix_row : index
      %sd_row = arith.addi %key_base, %hi8 : index
      %score_row = arith.addi %sd_row, %matrix_row : index
      // dq (transposed): matrix q = (d tile q / 2, key half q mod 2).
      %dq_row0 = arith.addi %key_base, %lo8 : index
      %dq_row = arith.addi %dq_row0, %matrix_row : index
      // K and V chunks are stored XOR-swizzled by row (kv_staging): column c of row j at c ^ 8 (j & mask).
      %score_row_bits_k = arith.andi %score_row, %k_swizzle_mask : index
      %score_swizzle_k = arith.muli %score_row_bits_k, %c8 : index
      %score_row_bits_v = arith.andi %score_row, %v_swizzle_mask : index
      %score_swizzle_v = arith.muli %score_row_bits_v, %c8 : index
      %dq_row_bits = arith.andi %dq_row, %k_swizzle_mask : index
      %dq_swizzle_k = arith.muli %dq_row_bits, %c8 : index

      // Iteration t stages slot t into buffer t mod STAGES (asynchronous 16-byte copies, one commit group per
      // iteration, empty for a skipped slot or t >= T), then computes slot t - STAGES + 1 from its buffer
      // while those copies are in flight.
      %dq_init = arith.constant dense<0.0> : !dqk_dq_acc
      %dq_acc = scf.for %t = %c0 to %steps step %c1 iter_args(%dq_iter = %dq_init) -> (!dqk_dq_acc) {
        <% set staged_block, staged_values = nv.selected_block, true %>
        <% include "gpu/nvidia/kv_staging.mlir" %>
${ nv.previous("%slot") }
${ nv.selected_block("%slot", "%selected_now") }
        %compute = arith.andi %selected_now, %has_previous : i1
        %dq_next = scf.if %compute -> (!dqk_dq_acc) {
          %key0 = arith.muli %block, %block_size : index
          %to_pos = arith.subi %pos, %key0 : index
          %visible = arith.addi %to_pos, %c1 : index
          ${ rules.first_key("first_visible") }

${ dq_step.step(dqk, EX2, PACK_PAIR) }
          scf.yield %dq_new : !dqk_dq_acc
        } else {
          scf.yield %dq_iter : !dqk_dq_acc
        }
        // The next iteration stages into the buffer just read.
        gpu.barrier
        scf.yield %dq_next : !dqk_dq_acc
      }

      // Sum the subgroups' accumulators in subgroup order (fixed: bitwise reproducible), then write dq.
      // Accumulator element [0][tile][i][e] is head 8 i + r, d = 8 tile + 2 c + e.
      scf.for %turn = %c0 to %subgroups step %c1 {
        %mine = arith.cmpi eq, %turn, %subgroup : index
        %first = arith.cmpi eq, %turn, %c0 : index
        scf.if %mine {
          scf.for %tile = %c0 to %d_tiles step %c1 {
            scf.for %i = %c0 to %c2 step %c1 {
              %i8 = arith.muli %i, %c8 : index
              %h = arith.addi %i8, %r : index
              %tile8 = arith.muli %tile, %c8 : index
              %d = arith.addi %tile8, %c2x : index
              %part = vector.extract %dq_acc[0, %tile, %i] : vector<2xf32> from !dqk_dq_acc
              %sum = scf.if %first -> (vector<2xf32>) {
                scf.yield %part : vector<2xf32>
              } else {
                %old = vector.load %dq_sum[%h, %d] : !dqk_dq_sum, vector<2xf32>
                %s = arith.addf %old, %part : vector<2xf32>
                scf.yield %s : vector<2xf32>
              }
              vector.store %sum, %dq_sum[%h, %d] : !dqk_dq_sum, vector<2xf32>
            } {unroll_loop}
          } {unroll_loop}
        }
        gpu.barrier
      }
      %dq_items = arith.constant ${DQ_ITEMS} : index
      scf.for %item = %tid to %dq_items step %lanes {
        %h = arith.divui %item, %head_dim : index
        %d = arith.remui %item, %head_dim : index
        %x = memref.load %dq_sum[%h, %d] : !dqk_dq_sum
        %x_e = ${TRUNCF} %x : f32 to ${E}
        %head = arith.addi %h0, %h : index
        memref.store %x_e, %dq[%b, %m, %head, %d] : !dqk_q
      }
      return
    }
<% endcall %>

// Host side: one dispatch, dq written into the caller's tensor.
${ host.dq("selection_attention_dq_kernel_exe") }
