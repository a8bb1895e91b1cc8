// Dense dq: the compressed attention's and the sliding window's dq pass (KernelSpec.key_stride > 1, .window;
// kernels.DENSE) on the matrix units, with no block lists: the dense forward's rows and tiles (dense_forward.mlir, gpu/nvidia/dense_rows.mlir) with dq's
// arithmetic (gpu/nvidia/dq.mlir's step).
//
// One workgroup per (tile of DENSE_ROWS rows, g, b); subgroup w owns rows [16 w, 16 w + 16) of the tile: their q
// (registers), do (its own [16, Dv] tile in workgroup memory, read with ldmatrix), lse and delta, and a dq
// accumulator [16, D] in registers. The keys stream through workgroup memory in tiles of BS (the K/V pipeline,
// tile t, or the band's t-th, staged in iteration t), each staged once for all the workgroup's rows; a subgroup takes a tile 16 keys at
// a time up to its last row's position:
//   s = q k^T, dp = do v^T, p = exp(scale s - lse), ds = scale p (dp - delta) (0 where the row does not see the
//   key or is padding), dq += ds k
// and at the end writes its rows' dq (each row's keys summed in one fixed order: bitwise reproducible).
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "gpu/nvidia/kernel.mlir" as nv %>
<% import "gpu/nvidia/dq_step.mlir" as dq_step %>

// Push constants: B, M, N (i32; N is the number of keys, k's rows), then the bits of scale (f32). The block
// indices are bound (dq's ABI) but not read.
<% set inputs = ['q', 'k', 'v', 'block_indices', 'lse', 'delta', 'do'] %>
<% set outputs = ['dq'] %>
${ dispatch.layout("dense_dq_layout", 4, inputs, outputs) }

${ nv.kv_types(G_D, G_DV, DQ_STAGES) }
!dqk_do = memref<?x?x${H}x${DV}x${E}>
// Each subgroup's do tile (rows padded by 8 elements: the 8 rows of an ldmatrix matrix on different banks).
!dqk_do_tile = memref<${DENSE_SUBGROUPS}x16x${DV_PADDED}x${E}, #gpu.address_space<workgroup>>
!dqk_smem = memref<${DENSE_DQ_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
// Per-lane fragments.
${ nv.fragment_types(D_STEPS) }
<% set dqk = dict(nv.types, kind=MMA_KIND) %>
!dqk_ds_frags = vector<1x1x4x2x${E}>
!dqk_dq_acc = vector<1x${D_TILES}x2x2xf32>

<% call dispatch.executable("dense_attention_dq_exe", "dense_attention_dq_tile", "dense_dq_layout", ['row_tiles', 'kv_heads', 'batch'], lanes=DENSE_LANES) %>
${ nv.func_open("dense_attention_dq_tile", DENSE_LANES, SUBGROUP_SIZE, DENSE_DQ_MIN_WORKGROUPS_PER_SM) }
${ nv.constants(["c0", "c1", "c2", "c4", "c8", "c15", "c16", "zero", "log2e"]) }
      %zero_pair = arith.constant dense<0.0> : vector<2x${E}>
      %zero_f32_pair = arith.constant dense<0.0> : vector<2xf32>
      %zero_chunk = arith.constant dense<0.0> : vector<8x${E}>
${ nv.constants([("heads_per_group", HPG), ("block_size", BS), ("rows_per_workgroup", DENSE_ROWS), ("subtiles", DENSE_SUBTILES)]) }
${ nv.stage_constants(none, DQ_STAGES, DQ_STAGES_MINUS_1, K_SWIZZLE_MASK, V_SWIZZLE_MASK, K_SWIZZLE_HIGH, V_SWIZZLE_HIGH) }
${ nv.copy_constants(DENSE_LANES, SUBGROUP_SIZE, D_CHUNKS, DV_CHUNKS, K_STAGE_ITEMS, V_STAGE_ITEMS, DENSE_K_STAGE_PER_LANE, DENSE_V_STAGE_PER_LANE) }
${ nv.constants([("do_items", DO_STAGE_ITEMS), ("d_steps", D_STEPS), ("dv_steps", DV_STEPS), ("d_tiles", D_TILES)]) }

${ dispatch.ids(['row_tile', 'g', 'b']) }
${ dispatch.push_constants("dense_dq_layout", ['batch', 'm_rows', 'n', 'scale']) }
${ nv.p_and_ds_constants() }

${ dispatch.bindings("dense_dq_layout", inputs, outputs) }

      // One workgroup allocation: K rows, V rows, the subgroups' do tiles.
      %smem = memref.alloc() : !dqk_smem
${ nv.constants([("v_offset", DQ_K_BYTES), ("do_offset", DQ_KV_BYTES)]) }
      %k_rows = memref.view %smem[%c0][] : !dqk_smem to !dqk_k_rows
      %v_rows = memref.view %smem[%v_offset][] : !dqk_smem to !dqk_v_rows
      %do_tile = memref.view %smem[%do_offset][] : !dqk_smem to !dqk_do_tile

${ nv.lane_ids() }
      <% include "gpu/nvidia/dense_rows.mlir" %>

      // The lane's rows' lse and delta (0 for padding rows, which take no part).
<% for i in ["0", "1"] %>
      %lse_${i}, %delta_${i} = scf.if %head_valid_${i} -> (f32, f32) {
        %x = memref.load %lse[%b, %head_${i}, %m_${i}] : memref<?x${H}x?xf32>
        %y = memref.load %delta[%b, %m_${i}, %head_${i}] : memref<?x?x${H}xf32>
        scf.yield %x, %y : f32, f32
      } else {
        scf.yield %zero, %zero : f32, f32
      }
${ nv.p_and_ds_row("row_" ~ i, "lse_" ~ i, "delta_" ~ i) }
<% endfor %>

      // q as lhs fragments over all of D, loaded once: element [2 i + k'][e] of step s is row 8 i + r,
      // column 16 s + 8 k' + 2 c + e.
      <% set q_rows = ("%m_0", "%m_1") %>
      <% include "gpu/nvidia/q_fragments.mlir" %>
      // do of the subgroup's rows into its tile (padding rows zero), by its own lanes; the pipeline's first
      // barrier (kv_staging) orders these stores before the first read.
      scf.for %item = %lane to %do_items step %subgroup_size {
        %chunk = arith.remui %item, %v_chunks : index
        %tile_row = arith.divui %item, %v_chunks : index
        %e0 = arith.muli %chunk, %c8 : index
        %row = arith.addi %subgroup_row0, %tile_row : index
        %real = arith.cmpi ult, %row, %group_rows : index
        %chunk_e = scf.if %real -> (vector<8x${E}>) {
          %m = arith.divui %row, %heads_per_group : index
          %head_in_group = arith.remui %row, %heads_per_group : index
          %head = arith.addi %h0, %head_in_group : index
          %x = vector.load %do[%b, %m, %head, %e0] : !dqk_do, vector<8x${E}>
          scf.yield %x : vector<8x${E}>
        } else {
          scf.yield %zero_chunk : vector<8x${E}>
        }
        vector.store %chunk_e, %do_tile[%subgroup, %tile_row, %e0] : !dqk_do_tile, vector<8x${E}>
      }

      // ldmatrix: lanes 8 q .. 8 q + 7 give the row addresses of 8x8 matrix q of the four; the lane's rows in a
      // 16-key step for s and dp (matrix q = (key tile q / 2, d half q mod 2); the do tile's rows alike) and for
      // dq (k read transposed: matrix q = (d tile q / 2, key half q mod 2)).
${ nv.ldmatrix_lanes() }
      %lhs_row = arith.addi %hi8, %matrix_row : index
      // (the lane's row of dq's transposed k read and of do's read, gpu/nvidia/dq_step.mlir)
      %do_lane_row = arith.addi %lo8, %matrix_row : index

      // Iteration t stages tile t into buffer t mod STAGES and computes tile t - STAGES + 1 meanwhile.
      %dq_init = arith.constant dense<0.0> : !dqk_dq_acc
      %dq_acc = scf.for %t = %c0 to %steps step %c1 iter_args(%dq_tile = %dq_init) -> (!dqk_dq_acc) {
        <% set staged_block, staged_values = nv.next_tile, true %>
        <% include "gpu/nvidia/kv_staging.mlir" %>
${ nv.previous("%slot") }
${ nv.dense_tile() }
        %dq_next = scf.if %compute -> (!dqk_dq_acc) {
          // Keys of the tile below visible_i are row i's; the subgroup's 16-key steps up to its last key.
${ nv.dense_row_bounds() }
          %subgroup_to_pos = arith.subi %subgroup_pos, %key0 : index
          %subgroup_keys = arith.addi %subgroup_to_pos, %c1 : index
          %key_steps0 = arith.ceildivui %subgroup_keys, %c16 : index
          %key_steps = arith.minui %key_steps0, %subtiles : index
          %dq_j = scf.for %key_step = %c0 to %key_steps step %c1 iter_args(%dq_iter = %dq_tile) -> (!dqk_dq_acc) {
            %key_base = arith.muli %key_step, %c16 : index
            // K and V chunks are stored XOR-swizzled by row (kv_staging): column c of row j at c ^ 8 (j & mask).
            %score_row = arith.addi %key_base, %lhs_row : index
            %score_row_bits_k = arith.andi %score_row, %k_swizzle_mask : index
            %score_swizzle_k = arith.muli %score_row_bits_k, %c8 : index
            %score_row_bits_v = arith.andi %score_row, %v_swizzle_mask : index
            %score_swizzle_v = arith.muli %score_row_bits_v, %c8 : index
            %dq_row = arith.addi %key_base, %do_lane_row : index
            %dq_row_bits = arith.andi %dq_row, %k_swizzle_mask : index
            %dq_swizzle_k = arith.muli %dq_row_bits, %c8 : index
${ dq_step.step(dqk, EX2, PACK_PAIR, "%subgroup, ", per_row=true) }
            scf.yield %dq_new : !dqk_dq_acc
          }
          scf.yield %dq_j : !dqk_dq_acc
        } else {
          scf.yield %dq_tile : !dqk_dq_acc
        }
        // The next iteration stages into the buffer just read.
        gpu.barrier
        scf.yield %dq_next : !dqk_dq_acc
      }

      // dq of the lane's rows: accumulator element [0][tile][i] holds row 8 i + r, columns 8 tile + 2 c and + 1.
${ nv.store_rows("%dq_acc", "!dqk_dq_acc", "%d_tiles", "%dq", "!dqk_q") }
      return
    }
<% endcall %>

// Host side: one dispatch over the row tiles, dq written into the caller's tensor.
${ host.dq("dense_attention_dq_exe", "dense_attention_dq_tile", DENSE_ROWS) }
