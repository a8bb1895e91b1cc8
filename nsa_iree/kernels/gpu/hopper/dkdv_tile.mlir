<# part: takes ASYNC_COPY_HINT, EX2, HOPPER_DKDV_DO_OFFSET, HOPPER_DKDV_MIN_WORKGROUPS_PER_SM, HOPPER_DKDV_PT_OFFSET, HOPPER_DKDV_Q_OFFSET, HOPPER_DKDV_ROWS_OFFSET, HOPPER_DKDV_SMEM_BYTES, HOPPER_DKDV_STATS_OFFSET, HOPPER_DKDV_V_OFFSET, HOPPER_DQ_ROWS, HOPPER_DQ_VALUES, HOPPER_O_VALUES, PACK_PAIR, dq_partials, selection #>
// dk/dv on Hopper's warpgroup MMA (sm_90a), a part of dense_dkdv.mlir (the sliding window's dk/dv:
// KernelSpec.window, kernels.DENSE) and dkdv.mlir (the selection's dk/dv over the block lists' inversion): one key
// tile of 64 keys against a stream of chunks of 64 query rows, dk and dv of the tile accumulated in registers.
//
// One workgroup of one warpgroup per key tile; subgroup w holds keys 16 w .. 16 w + 15 of the tile in its
// accumulators (dk [64, D] and dv [64, Dv] in registers). K and V of the tile are staged once. The rows stream
// through two buffers of q and do in chunks of 64 with their lse and delta (chunk c staged while chunk c - 1 is
// computed). Per chunk:
//   s^T = k q^T and dp^T = v do^T   (two wgmma chains, one wait; which keys each row sees found meanwhile)
//   p^T = exp(scale s^T - lse)      (0 where the row does not see the key, or is padding), written to workgroup
//                                   memory in the input type, then dv += p^T do   (B = do MN-major)
//   ds^T = scale p^T (dp^T - delta) while dv's product runs, written over p^T once it is done, then
//   dk += ds^T q                    (B = q MN-major)
// Each key's rows are summed in one fixed order (bitwise reproducible); keys past N are staged as zeros.
//
// Without `selection` (dense_dkdv.mlir) a workgroup per (tile of 64 keys, kv group g, b): the rows are the group's
// rows whose window holds a key of the tile (positions key0 .. key0 + 63 + WINDOW - 1; row R of the group is
// position R / HPG, head R mod HPG as in gpu/nvidia/dense_rows.mlir), in order; the tile writes dk and dv (keys
// below N) once, zeros where no row sees it.
// With `selection` (dkdv.mlir) a workgroup per piece of the block lists' inversion (common/inversion.mlir: a block
// of 64 keys and up to ROWS_PER_PIECE query rows that selected it, gpu/piece_rows.mlir): row R of chunk c is the
// piece's row c 64 / HPG + R / HPG, head R mod HPG, so a chunk holds 64 / HPG positions and the work follows the
// heads, not a 16-row tile. A row sees the block's keys up to its last (the rule, common/rules.mlir) and counts the
// block as often as it lists it (its weight, folded into the exponent as log2 of it); the piece writes its f32
// partials [64, D] and [64, Dv] once, and @dkdv_piece_sums adds a block's pieces in piece order.
// With `dq_partials` too (dkdv_dq.mlir, fewer heads per group than 16) each chunk also makes its rows' dq from the
// block, ds k, and writes it as f32 partials in each row's place of dq_slots [B, M, G, T, HPG, D] (the first of the
// row's slots naming the block); common/dq_sums.mlir adds a row's partials in slot order.
//
// Workgroup memory (bytes, from the allocation's first 1024-byte boundary): K [64, D] at 0, V [64, Dv] at
// HOPPER_DKDV_V_OFFSET, q chunks [2][64, D] at HOPPER_DKDV_Q_OFFSET, do chunks [2][64, Dv] at HOPPER_DKDV_DO_OFFSET,
// p^T, then ds^T [64, 64] at HOPPER_DKDV_PT_OFFSET, in wgmma.mlir's swizzled layout; the chunks' lse and delta
// [2][2][64] f32 at HOPPER_DKDV_STATS_OFFSET; with `selection`, the piece's rows [ROWS_PER_PIECE][4] i32 at
// HOPPER_DKDV_ROWS_OFFSET and their count after them.
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/rules.mlir" as rules %>
<% import "gpu/nvidia/kernel.mlir" as nv %>
<% import "gpu/hopper/wgmma.mlir" as wg %>
<% import "gpu/hopper/pieces.mlir" as pieces %>

<% set exe, function, layout = ("hopper_selection_dkdv_exe", "selection_attention_dkdv_piece", "hopper_dkdv_layout") if selection else ("hopper_dense_attention_dkdv_exe", "dense_attention_dkdv_tile", "hopper_dense_dkdv_layout") %>
<% set inputs = ['q', 'k', 'v', 'block_indices', 'lse', 'delta', 'do'] + (['entries'] if selection else []) %>
<% set outputs = (['dk_pieces', 'dv_pieces'] + (['dq_slots'] if dq_partials else [])) if selection else ['dk', 'dv'] %>
<% set constants = ['batch', 'm_rows', 'n', 'scale'] + (['pieces'] if selection else []) %>
<% set ids = ['piece'] if selection else ['key_tile', 'g', 'b'] %>
<% set piece_rows_per_chunk = 64 // (HPG | int) %>
<% if selection %>
// Push constants: B, M, N (i32), the bits of scale (f32), and the number of pieces.
<% else %>
// Push constants: B, M, N (i32), then the bits of scale (f32). The block indices are bound but not read.
<% endif %>
${ dispatch.layout(layout, constants | length, inputs, outputs) }

!hdkv_q = memref<?x?x${H}x${D}x${E}>
!hdkv_k = memref<?x?x${G}x${D}x${E}>
!hdkv_v = memref<?x?x${G}x${DV}x${E}>
!hdkv_do = memref<?x?x${H}x${DV}x${E}>
!hdkv_smem = memref<${HOPPER_DKDV_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
!hdkv_elements = memref<${ (HOPPER_DKDV_SMEM_BYTES | int) // 2 - 512 }x${E}, #gpu.address_space<workgroup>>
!hdkv_words = memref<${ (HOPPER_DKDV_SMEM_BYTES | int) // 4 - 256 }xi32, #gpu.address_space<workgroup>>
!hdkv_floats = memref<${ (HOPPER_DKDV_SMEM_BYTES | int) // 4 - 256 }xf32, #gpu.address_space<workgroup>>
<% if selection %>
// the inversion's pieces (gpu/piece_rows.mlir's names) and the piece's rows: [m, last, weight bits, log2 weight]
!dkv_entries = memref<?x${ROWS_PER_PIECE}x2xi32>
!dkv_row_info = memref<${ROWS_PER_PIECE}x4xi32, #gpu.address_space<workgroup>>
<% endif %>
!hdkv_s = ${ wg.acc_type(32) }
!hdkv_dk = ${ wg.acc_type(HOPPER_DQ_VALUES) }
!hdkv_dv = ${ wg.acc_type(HOPPER_O_VALUES) }

<% set rows = 64 %>
<# The k16 steps' byte offsets (wgmma.mlir's swizzled layout): K-major k, q [64, D] and v, do [64, Dv] (32 bytes a
   step in a column block, 64 x 128 a block), p^T and ds^T [64, 64] (32 bytes a step); MN-major q and do as dk's
   and dv's B (16 rows, 2048 bytes, a step). #>
<% set steps = namespace(d=[], dv=[], rows=[], mn=[]) %>
<% for s in range((D | int) // 16) %>
<% set steps.d = steps.d + [(s // 4) * rows * 128 + (s % 4) * 32] %>
<% endfor %>
<% for s in range((DV | int) // 16) %>
<% set steps.dv = steps.dv + [(s // 4) * rows * 128 + (s % 4) * 32] %>
<% endfor %>
<% for s in range(rows // 16) %>
<% set steps.rows = steps.rows + [s * 32] %>
<% set steps.mn = steps.mn + [s * 2048] %>
<% endfor %>
<% set dk_values, dv_values = HOPPER_DQ_VALUES | int, HOPPER_O_VALUES | int %>
<% call dispatch.executable(exe, function, layout, ['pieces'] if selection else ['key_tiles', 'kv_heads', 'batch'], lanes=128) %>
${ nv.func_open(function, 128, 32, HOPPER_DKDV_MIN_WORKGROUPS_PER_SM) }
${ nv.constants(["c0", "c1", "c2", "c4", "c8", "c16", "c32", "c63", "c64", "c128"] + (["c0_i32"] if selection else []) + ["zero"] + (["one", "minus_inf"] if selection else []) + ["log2e"]) }
      %c4_i64 = arith.constant 4 : i64
      %c16383_i64 = arith.constant 16383 : i64
      %subgroup_size = arith.constant 32 : index
      %lanes = arith.constant 128 : index
${ nv.constants([("heads_per_group", HPG), ("block_size", 64)]) }
      %stages = arith.constant 2 : index
      %lag = arith.constant 1 : index

${ dispatch.ids(ids) }
${ dispatch.push_constants(layout, constants) }
${ nv.p_and_ds_constants() }

${ dispatch.bindings(layout, inputs, outputs) }
<% if selection %>

      // A padding piece (no rows) is never read by the piece sums: nothing to do. Uniform per workgroup.
      %first_entry = memref.load %entries[%piece, %c0, %c0] : !dkv_entries
      %piece_used = arith.cmpi sge, %first_entry, %c0_i32 : i32
      scf.if %piece_used {
<% endif %>

${ wg.aligned_allocation("!hdkv_smem", [("elements", "!hdkv_elements"), ("words", "!hdkv_words"), ("floats", "!hdkv_floats")]) }

${ nv.lane_ids() }
<% if selection %>
      %rows = arith.constant ${ROWS_PER_PIECE} : index
      %slots = arith.constant ${T} : index
      %kv_heads = arith.constant ${G} : index
      %minus_one = arith.constant -1 : i32
      %c3 = arith.constant 3 : index
      %rows_region = arith.constant ${HOPPER_DKDV_ROWS_OFFSET} : index
      %rows_at = arith.addi %smem_pad, %rows_region : index
      %row_info = memref.view %smem[%rows_at][] : !hdkv_smem to !dkv_row_info
      %count_word = arith.constant ${ ((HOPPER_DKDV_ROWS_OFFSET | int) + (ROWS_PER_PIECE | int) * 16) // 4 } : index
      <% include "gpu/piece_rows.mlir" %>
        gpu.barrier
${ pieces.row_words(dq_partials, "!hdkv_words") }
        gpu.barrier
        // The piece's rows in %chunks chunks of 64 / HPG positions (64 rows).
        %count_i32 = memref.load %words[%count_word] : !hdkv_words
        %count = arith.index_castui %count_i32 : i32 to index
        %chunk_positions = arith.constant ${piece_rows_per_chunk} : index
        %chunks = arith.ceildivui %count, %chunk_positions : index
        %keys_left = arith.subi %n, %key0 : index
        %keys_staged = arith.minsi %keys_left, %block_size : index
<% else %>
      ${ rules.offset() }
      %h0 = arith.muli %g, %heads_per_group : index
      %group_rows = arith.muli %m_rows, %heads_per_group : index
      // The tile's keys key0 .. key0 + 63 (those below N staged) and the rows whose window holds one of them:
      // positions key0 .. key0 + 63 + WINDOW - 1, rows first_m .. last_m (none where last_m < first_m), in
      // %chunks chunks of 64 of the group's rows from %first_row.
      %key0 = arith.muli %key_tile, %block_size : index
      %keys_left = arith.subi %n, %key0 : index
      %keys_staged = arith.minsi %keys_left, %block_size : index
      %reach = arith.constant ${ 64 + (WINDOW | int) - 2 } : index
      %first_m0 = arith.subi %key0, %offset : index
      %first_m = arith.maxsi %first_m0, %c0 : index
      %last_pos = arith.addi %key0, %reach : index
      %last_m0 = arith.subi %last_pos, %offset : index
      %last_row_m = arith.subi %m_rows, %c1 : index
      %last_m = arith.minsi %last_m0, %last_row_m : index
      %band_m0 = arith.subi %last_m, %first_m : index
      %band_m1 = arith.addi %band_m0, %c1 : index
      %band_m = arith.maxsi %band_m1, %c0 : index
      %band_rows = arith.muli %band_m, %heads_per_group : index
      %chunks = arith.ceildivui %band_rows, %c64 : index
      %first_row = arith.muli %first_m, %heads_per_group : index
<% endif %>
      %steps = arith.addi %chunks, %lag : index

      // K and V of the tile, once.
      %v_region = arith.constant ${ (HOPPER_DKDV_V_OFFSET | int) // 2 } : index
${ wg.stage_keys("k", "!hdkv_k", "%key0", "%keys_staged", 64, D, "%c0", 128, "!hdkv_elements", ASYNC_COPY_HINT) }
${ wg.stage_keys("v", "!hdkv_v", "%key0", "%keys_staged", 64, DV, "%v_region", 128, "!hdkv_elements", ASYNC_COPY_HINT) }
      nvvm.cp.async.commit.group
${ wg.descriptor("k_desc", "%c0", 16, 1024) }
      %v_offset = arith.constant ${HOPPER_DKDV_V_OFFSET} : index
${ wg.descriptor("v_desc", "%v_offset", 16, 1024) }
      %pt_offset = arith.constant ${HOPPER_DKDV_PT_OFFSET} : index
${ wg.descriptor("pt_desc", "%pt_offset", 16, 1024) }
<% if dq_partials %>
${ wg.descriptor("pt_mn_desc", "%pt_offset", rows * 128, 1024) }
${ wg.descriptor("k_mn_desc", "%c0", rows * 128, 1024) }
<% endif %>
      %pt_region = arith.constant ${ (HOPPER_DKDV_PT_OFFSET | int) // 4 } : index
${ wg.pair_words("pt", "%pt_region", rows, rows) }
      // A chunk's lse and delta: f32 [2][64] per buffer; the lane's columns 8 i + 2 c (+ 1) read as pairs.
      %stats_region = arith.constant ${ (HOPPER_DKDV_STATS_OFFSET | int) // 4 } : index
      %stats_lane = arith.addi %stats_region, %c2x : index
      // The lane's keys (offsets in the tile): 16 w + r + 8 h.
      %lane_key_0 = arith.addi %pt_w16, %r : index
      %c8_keys = arith.constant 8 : index
      %lane_key_1 = arith.addi %lane_key_0, %c8_keys : index
      %dk_zero = llvm.mlir.zero : !hdkv_dk
      %dv_zero = llvm.mlir.zero : !hdkv_dv

      %dk_struct, %dv_struct = scf.for %t = %c0 to %steps step %c1 iter_args(%dk_tile = %dk_zero, %dv_tile = %dv_zero)
          -> (!hdkv_dk, !hdkv_dv) {
        // Stage chunk t's q and do (padding rows as zeros) into buffer t mod 2.
        %stage_buffer = arith.remui %t, %stages : index
        %t_in_range = arith.cmpi ult, %t, %chunks : index
        scf.if %t_in_range {
<% if selection %>
          %stage_row0 = arith.muli %t, %chunk_positions : index
<% else %>
          %stage_rows0 = arith.muli %t, %c64 : index
          %stage_row0 = arith.addi %first_row, %stage_rows0 : index
<% endif %>
<% for x, width, offset in [("q", D, HOPPER_DKDV_Q_OFFSET), ("do", DV, HOPPER_DKDV_DO_OFFSET)] %>
          %${x}_chunk_elements = arith.constant ${ rows * (width | int) } : index
          %${x}_buffer_elements = arith.muli %stage_buffer, %${x}_chunk_elements : index
          %${x}_region = arith.constant ${ (offset | int) // 2 } : index
          %${x}_base = arith.addi %${x}_region, %${x}_buffer_elements : index
${ wg.stage_rows(x, "!hdkv_" ~ x, "%stage_row0", rows, width, "%" ~ x ~ "_base", 128, "!hdkv_elements", ASYNC_COPY_HINT, listed=selection) }
<% endfor %>
          // lse (lanes 0 .. 63) and delta (lanes 64 .. 127) of the chunk's rows: 0 for padding rows.
          %stat_row = arith.remui %tid, %c64 : index
          %stat_kind = arith.divui %tid, %c64 : index
<% if selection %>
          %stat_piece_row0 = arith.divui %stat_row, %heads_per_group : index
          %stat_piece_row = arith.addi %stage_row0, %stat_piece_row0 : index
          %stat_m_i32 = memref.load %row_info[%stat_piece_row, %c0] : !dkv_row_info
          %stat_real = arith.cmpi sge, %stat_m_i32, %c0_i32 : i32
          %stat_m_safe = arith.maxsi %stat_m_i32, %c0_i32 : i32
          %stat_m = arith.index_castui %stat_m_safe : i32 to index
          %stat_h = arith.remui %stat_row, %heads_per_group : index
<% else %>
          %stat_group_row = arith.addi %stage_row0, %stat_row : index
          %stat_real = arith.cmpi ult, %stat_group_row, %group_rows : index
          %stat_read_row = arith.select %stat_real, %stat_group_row, %c0 : index
          %stat_m = arith.divui %stat_read_row, %heads_per_group : index
          %stat_h = arith.remui %stat_read_row, %heads_per_group : index
<% endif %>
          %stat_head = arith.addi %h0, %stat_h : index
          %stat_count = arith.select %stat_real, %c1, %c0 : index
          %stat_buffer_floats = arith.muli %stage_buffer, %c128 : index
          %stat_kind_floats = arith.muli %stat_kind, %c64 : index
          %stat_at0 = arith.addi %stats_region, %stat_buffer_floats : index
          %stat_at1 = arith.addi %stat_at0, %stat_kind_floats : index
          %stat_at = arith.addi %stat_at1, %stat_row : index
          %stat_is_lse = arith.cmpi eq, %stat_kind, %c0 : index
          scf.if %stat_is_lse {
            %lse_copy = nvgpu.device_async_copy %lse[%b, %stat_head, %stat_m], %floats[%stat_at], 1, %stat_count
                : memref<?x${H}x?xf32> to !hdkv_floats
          } else {
            %delta_copy = nvgpu.device_async_copy %delta[%b, %stat_m, %stat_head], %floats[%stat_at], 1, %stat_count
                : memref<?x?x${H}xf32> to !hdkv_floats
          }
        }
        nvvm.cp.async.commit.group
        nvvm.cp.async.wait.group 1
        // The copies (generic proxy) made visible to wgmma's reads (async proxy), then to the whole warpgroup.
        llvm.inline_asm has_side_effects "fence.proxy.async.shared::cta;", "" : () -> ()
        gpu.barrier
${ nv.previous("%chunk") }
        %dk_next, %dv_next = scf.if %has_previous -> (!hdkv_dk, !hdkv_dv) {
<% if selection %>
          %chunk_row0 = arith.muli %chunk, %chunk_positions : index
<% else %>
          %chunk_rows0 = arith.muli %chunk, %c64 : index
          %chunk_row0 = arith.addi %first_row, %chunk_rows0 : index
<% endif %>
<% for x, width, offset in [("q", D, HOPPER_DKDV_Q_OFFSET), ("do", DV, HOPPER_DKDV_DO_OFFSET)] %>
          %${x}_region_bytes = arith.constant ${offset} : index
          %${x}_chunk_bytes = arith.constant ${ rows * (width | int) * 2 } : index
          %${x}_buffer_bytes = arith.muli %buffer, %${x}_chunk_bytes : index
          %${x}_offset = arith.addi %${x}_region_bytes, %${x}_buffer_bytes : index
${ wg.descriptor(x ~ "_desc", "%" ~ x ~ "_offset", 16, 1024) }
${ wg.descriptor(x ~ "_mn_desc", "%" ~ x ~ "_offset", rows * 128, 1024) }
<% endfor %>
          // s^T = k q^T over D and dp^T = v do^T over Dv; meanwhile the terms of the lane's rows (the accumulators'
          // columns 8 i + 2 c + e: row chunk_row0 + that) and which of the lane's keys each sees.
          %stats_buffer_floats = arith.muli %buffer, %c128 : index
          %stats_at = arith.addi %stats_lane, %stats_buffer_floats : index
<% set live = namespace(masks=[]) %>
<% set emitted = namespace(rows=[]) %>
<% for i in range(8) %><% for e in range(2) %><% for h in range(2) %>
<% set live.masks = live.masks + ["%live_" ~ i ~ "_" ~ e ~ "_" ~ h] %>
<% endfor %><% endfor %><% endfor %>
<% call wg.chains([("st", none, "%k_desc", steps.d, "%q_desc", steps.d, 64, "col", "!hdkv_s"), ("dpt", none, "%v_desc", steps.dv, "%do_desc", steps.dv, 64, "col", "!hdkv_s")], E) %>
<% if selection %>
          // The lane's rows (column 8 i + 2 c + e of the chunk: its piece row chunk_row0 + column / HPG): the last key
          // of the block each sees and its log2 weight (gpu/piece_rows.mlir's words 1 and 3).
<% for i in range(8) %><% for e in range(2) %>
<% set col = i ~ "_" ~ e %>
<% set key = ("q" ~ (8 * i) // (HPG | int)) if (HPG | int) >= 8 else col %>
<% if key not in emitted.rows %>
<% set emitted.rows = emitted.rows + [key] %>
<% if (HPG | int) >= 8 %>
          %piece_row_${key}_const = arith.constant ${ (8 * i) // (HPG | int) } : index
          %piece_row_${key} = arith.addi %chunk_row0, %piece_row_${key}_const : index
<% else %>
          %column_${key}_const = arith.constant ${ 8 * i + e } : index
          %column_${key} = arith.addi %c2x, %column_${key}_const : index
          %piece_row_${key}_in = arith.divui %column_${key}, %heads_per_group : index
          %piece_row_${key} = arith.addi %chunk_row0, %piece_row_${key}_in : index
<% endif %>
          %info_${key} = vector.load %row_info[%piece_row_${key}, %c0] : !dkv_row_info, vector<4xi32>
          %last_${key}_i32 = vector.extract %info_${key}[1] : i32 from vector<4xi32>
          %last_${key} = arith.index_cast %last_${key}_i32 : i32 to index
          %log2_weight_${key}_bits = vector.extract %info_${key}[3] : i32 from vector<4xi32>
          %log2_weight_${key} = arith.bitcast %log2_weight_${key}_bits : i32 to f32
<% endif %>
<% endfor %><% endfor %>
<% else %>
          // A chunk whose every row sees every key of the tile (its first row the tile's last key, its last row,
          // not padding, the tile's first key) needs no mask.
          %chunk_end_row = arith.addi %chunk_row0, %c63 : index
          %chunk_end_real = arith.cmpi ult, %chunk_end_row, %group_rows : index
          %chunk_m_first = arith.divui %chunk_row0, %heads_per_group : index
          %chunk_m_last = arith.divui %chunk_end_row, %heads_per_group : index
          ${ rules.position("chunk_pos_first", "chunk_m_first") }
          ${ rules.position("chunk_pos_last", "chunk_m_last") }
          %chunk_first_last_key = arith.subi %chunk_pos_first, %key0 : index
          %chunk_sees_end = arith.cmpi sge, %chunk_first_last_key, %c63 : index
          ${ rules.first_key("chunk_last_first", "chunk_pos_last", "key0") }
          %chunk_sees_start = arith.cmpi sle, %chunk_last_first, %c0 : index
          %chunk_sees_all = arith.andi %chunk_sees_end, %chunk_sees_start : i1
          %interior = arith.andi %chunk_sees_all, %chunk_end_real : i1
<% endif %>
<% for i in range(8) %>
          %pair_at_${i}_const = arith.constant ${ 8 * i } : index
          %lse_at_${i} = arith.addi %stats_at, %pair_at_${i}_const : index
          %delta_at_${i}_const = arith.constant ${ 8 * i + 64 } : index
          %delta_at_${i} = arith.addi %stats_at, %delta_at_${i}_const : index
          %lse_pair_${i} = vector.load %floats[%lse_at_${i}] : !hdkv_floats, vector<2xf32>
          %delta_pair_${i} = vector.load %floats[%delta_at_${i}] : !hdkv_floats, vector<2xf32>
<% for e in range(2) %>
<% set col = i ~ "_" ~ e %>
          %lse_${col} = vector.extract %lse_pair_${i}[${e}] : f32 from vector<2xf32>
          %delta_${col} = vector.extract %delta_pair_${i}[${e}] : f32 from vector<2xf32>
${ nv.p_and_ds_row("t_" ~ col, "lse_" ~ col, "delta_" ~ col) }
<% set key = ("q" ~ (8 * i) // (HPG | int)) if (HPG | int) >= 8 else col %>
<% if selection %>
          %t_${col}_lse2w = arith.addf %t_${col}_lse2, %log2_weight_${key} : f32
<% for h in range(2) %>
          ${ rules.key_in_range("live_" ~ col ~ "_" ~ h, "lane_key_" ~ h, "sle", "last_" ~ key, none) }
<% endfor %>
<% endif %>
<% endfor %>
<% endfor %>
<% if not selection %>
          ${ live.masks | join(", ") } = scf.if %interior -> (${ (["i1"] * 32) | join(", ") }) {
            %all = arith.constant true
            scf.yield ${ (["%all"] * 32) | join(", ") } : ${ (["i1"] * 32) | join(", ") }
          } else {
<% for i in range(8) %>
<% for e in range(2) %>
<% set col = i ~ "_" ~ e %>
            %col_${col}_const = arith.constant ${ 8 * i + e } : index
            %col_${col}_in = arith.addi %c2x, %col_${col}_const : index
            %row_${col} = arith.addi %chunk_row0, %col_${col}_in : index
            %real_${col} = arith.cmpi ult, %row_${col}, %group_rows : index
            %m_${col} = arith.divui %row_${col}, %heads_per_group : index
            ${ rules.position("pos_" ~ col, "m_" ~ col) }
            %last_${col} = arith.subi %pos_${col}, %key0 : index
            ${ rules.first_key("first_" ~ col, "pos_" ~ col, "key0") }
<% for h in range(2) %>
            ${ rules.key_in_range("in_" ~ col ~ "_" ~ h, "lane_key_" ~ h, "sle", "last_" ~ col, "first_" ~ col) }
            %edge_${col}_${h} = arith.andi %in_${col}_${h}, %real_${col} : i1
<% endfor %>
<% endfor %>
<% endfor %>
            scf.yield ${ live.masks | join(", ") | replace("%live_", "%edge_") } : ${ (["i1"] * 32) | join(", ") }
          }
<% endif %>
<% endcall %>
${ wg.values("stv", "%st", 32, "!hdkv_s") }
${ wg.values("dptv", "%dpt", 32, "!hdkv_s") }
          // p^T of value 4 i + 2 h + e: key 16 w + 8 h + r, row column 8 i + 2 c + e; each pair into workgroup
          // memory in the input type (the previous chunk's products have read that: their wait).
<% for v in range(32) %>
<% set i, h, e = v // 4, (v // 2) % 2, v % 2 %>
<% set col = i ~ "_" ~ e %>
          %exponent_${v} = math.fma %stv_${v}, %scale_log2, %t_${col}_${ "lse2w" if selection else "lse2" } : f32
          %p_all_${v} = ${EX2} %exponent_${v} : (f32) -> f32
          %p_${v} = arith.select %live_${col}_${h}, %p_all_${v}, %zero : f32
<% if e == 1 %>
          %p_pair_${v} = ${PACK_PAIR} %p_${v}, %p_${v - 1} : (f32, f32) -> i32
          memref.store %p_pair_${v}, %words[%pt_at_${i}_${h}] : !hdkv_words
<% endif %>
<% endfor %>
          llvm.inline_asm has_side_effects "fence.proxy.async.shared::cta;", "" : () -> ()
          gpu.barrier
          // dv += p^T do over the chunk's rows in 16-row steps (do MN-major), while ds^T is made.
<% set dv_chain = [("dv_new", "%dv_tile", "%pt_desc", steps.rows, "%do_mn_desc", steps.mn, DV, "row", "!hdkv_dv")] %>
${ wg.issue(dv_chain, E) }
<% for v in range(32) %>
<% set col = (v // 4) ~ "_" ~ (v % 2) %>
          %dp_scaled_${v} = math.fma %dptv_${v}, %scale, %t_${col}_delta : f32
          %ds_${v} = arith.mulf %p_${v}, %dp_scaled_${v} : f32
<% if v % 2 == 1 %>
          %ds_pair_${v} = ${PACK_PAIR} %ds_${v}, %ds_${v - 1} : (f32, f32) -> i32
<% endif %>
<% endfor %>
${ wg.settle(dv_chain) }
          // ds^T over p^T once every subgroup's product has read it, then dk += ds^T q (q MN-major).
          gpu.barrier
<% for v in range(1, 32, 2) %>
          memref.store %ds_pair_${v}, %words[%pt_at_${v // 4}_${(v // 2) % 2}] : !hdkv_words
<% endfor %>
          llvm.inline_asm has_side_effects "fence.proxy.async.shared::cta;", "" : () -> ()
          gpu.barrier
<% set dk_chain = ("dk_new", "%dk_tile", "%pt_desc", steps.rows, "%q_mn_desc", steps.mn, D, "row", "!hdkv_dk") %>
<% set dq_chain = ("dq_part", none, "%pt_mn_desc", steps.mn, "%k_mn_desc", steps.mn, D, "row", "!hdkv_dk", "col") %>
<% if dq_partials %>
          // and the chunk rows' dq from this block in the same group, ds k (A: ds^T MN-major, B: K MN-major), as f32
          // partials: value 4 i + 2 h + e is chunk row 16 w + r + 8 h, column 8 i + 2 c + e, stored in the row's
          // place of dq_slots [B, M, G, T, HPG, D] (its first slot naming the block; common/dq_sums.mlir).
${ wg.chains([dk_chain, dq_chain], E) }
          // Row R of the chunk (the lane's rows lane_key_h) is the piece's row chunk_row0 + R / HPG, head R mod HPG;
          // a padding row (m -1) stores nothing.
<% for h in range(2) %>
          %dq_piece_row_${h}_in = arith.divui %lane_key_${h}, %heads_per_group : index
          %dq_piece_row_${h} = arith.addi %chunk_row0, %dq_piece_row_${h}_in : index
          %dq_head_${h} = arith.remui %lane_key_${h}, %heads_per_group : index
          %dq_info_${h} = vector.load %row_info[%dq_piece_row_${h}, %c0] : !dkv_row_info, vector<4xi32>
          %dq_m_${h}_i32 = vector.extract %dq_info_${h}[0] : i32 from vector<4xi32>
          %dq_slot_${h}_i32 = vector.extract %dq_info_${h}[2] : i32 from vector<4xi32>
          %dq_real_${h} = arith.cmpi sge, %dq_m_${h}_i32, %c0_i32 : i32
          scf.if %dq_real_${h} {
            %dq_m_${h} = arith.index_castui %dq_m_${h}_i32 : i32 to index
            %dq_slot_${h} = arith.index_castui %dq_slot_${h}_i32 : i32 to index
${ pieces.pair_stores("dq", "%dq_part", "!hdkv_dk", dk_values, h, "%dq_slots", "memref<?x?x" ~ G ~ "x" ~ T ~ "x" ~ HPG ~ "x" ~ D ~ "xf32>", "%dq_m_" ~ h, "%dq_slot_" ~ h, "%dq_head_" ~ h) }
          }
<% endfor %>
<% else %>
${ wg.chain("dk_new", "%dk_tile", "%pt_desc", steps.rows, "%q_mn_desc", steps.mn, D, E, "row", "!hdkv_dk") }
<% endif %>
          scf.yield %dk_new, %dv_new : !hdkv_dk, !hdkv_dv
        } else {
          scf.yield %dk_tile, %dv_tile : !hdkv_dk, !hdkv_dv
        }
        // The next iteration stages into the buffers just read.
        gpu.barrier
        scf.yield %dk_next, %dv_next : !hdkv_dk, !hdkv_dv
      }

      // dk and dv of the lane's keys (value 4 i + 2 h + e: key 16 w + 8 h + r, column 8 i + 2 c + e): with `selection`
      // the piece's f32 partials, every key; else dk and dv in DKV_E, keys past N not written.
<% for h in range(2) %>
<% if not selection %>
      %out_key_${h} = arith.addi %key0, %lane_key_${h} : index
      %out_real_${h} = arith.cmpi slt, %out_key_${h}, %n : index
      scf.if %out_real_${h} {
<% endif %>
<% for x, struct, type, count in [("dk", "%dk_struct", "!hdkv_dk", dk_values), ("dv", "%dv_struct", "!hdkv_dv", dv_values)] %>
<% set width = D if x == "dk" else DV %>
<% for i in range(count // 4) %>
        %${x}_${h}_${i}_lo = llvm.extractvalue ${struct}[${ 4 * i + 2 * h }] : ${type}
        %${x}_${h}_${i}_hi = llvm.extractvalue ${struct}[${ 4 * i + 2 * h + 1 }] : ${type}
        %${x}_${h}_${i}_pair0 = vector.from_elements %${x}_${h}_${i}_lo, %${x}_${h}_${i}_hi : vector<2xf32>
<% if not selection %>
        %${x}_${h}_${i}_pair = ${DKV_TRUNCF} %${x}_${h}_${i}_pair0 : vector<2xf32> to vector<2x${DKV_E}>
<% endif %>
        %${x}_${h}_${i}_col0 = arith.constant ${ 8 * i } : index
        %${x}_${h}_${i}_col = arith.addi %${x}_${h}_${i}_col0, %c2x : index
<% if selection %>
        vector.store %${x}_${h}_${i}_pair0, %${x}_pieces[%piece, %lane_key_${h}, %${x}_${h}_${i}_col] : memref<?x${BS}x${width}xf32>, vector<2xf32>
<% else %>
        vector.store %${x}_${h}_${i}_pair, %${x}[%b, %out_key_${h}, %g, %${x}_${h}_${i}_col] : memref<?x?x${G}x${width}x${DKV_E}>, vector<2x${DKV_E}>
<% endif %>
<% endfor %>
<% endfor %>
<% if not selection %>
      }
<% endif %>
<% endfor %>
<% if selection %>
      }   // (the piece is used)
<% endif %>
      return
    }
<% endcall %>

<% if selection %>
// Host side: the kernel writes every used piece's partials, @dkdv_piece_sums adds them per block (and with
// dq_partials, @dq_partial_sums each row's dq partials).
${ host.dkdv(exe, dq_partials) }
<% else %>
// Host side: the backward in one function: dq's dispatch (delta made there), then this one over the key tiles.
${ host.dense_backward(("hopper_dense_attention_dq_exe", "dense_attention_dq_tile"), HOPPER_DQ_ROWS, ("hopper_dense_attention_dkdv_exe", "dense_attention_dkdv_tile"), 64) }
<% endif %>
