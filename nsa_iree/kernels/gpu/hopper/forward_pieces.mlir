// The selection forward of fewer query heads per kv head than a 16-row tile, on Hopper's warpgroup MMA (sm_90a;
// kernels.SMALL): over the block lists' inversion (common/inversion.mlir), as the dk/dv kernel (dkdv_tile.mlir)
// walks it, so that each selected block's K and V are read once per piece of the rows that chose it, whatever the
// heads per group (the position-major forward reads them once per position and kv head, its 16-row tile mostly
// padding).
//
// One workgroup of one warpgroup per piece (a block of 64 keys and up to ROWS_PER_PIECE query rows that selected it,
// gpu/piece_rows.mlir). K and V of the block are staged once; the piece's rows stream through two buffers of q in
// chunks of 64 rows, row R of chunk c being piece row c 64 / HPG + R / HPG, head R mod HPG (chunk c staged while
// chunk c - 1 is computed). Per chunk, for its 64 rows (an m64 tile, subgroup w rows 16 w .. 16 w + 15):
//   s = q k^T                        (wgmma, A = q and B = k from workgroup memory, both K-major)
//   x = scale log2(e) s, -inf past the row's last visible key of the block (the rule, common/rules.mlir)
//   m2 = max x over the row's 4 lanes; p = 2^(x - m2) w (w: how often the row lists the block, as log2 w added)
//   l = sum p over the row's 4 lanes; o_t = p v (wgmma, A = p from registers, B = v MN-major)
// and writes the row's partials at the first of its slots naming the block (common/forward_sums.mlir's contract):
// o_slots[b, m, g, t, h mod HPG, :] = o_t, stats_slots[b, m, g, t, h mod HPG] = (m2 ln 2, l). A padding row (m -1)
// writes nothing. o_t goes through the chunk's q buffer, free once every subgroup's s is made, as whole 16-byte pieces
// of its rows (pieces.staged_stores: the partials are most of the kernel's traffic). @forward_partial_sums then
// combines a row's counted slots in slot order. No atomics; each row's partial made in one fixed order (bitwise
// reproducible).
//
// Workgroup memory (bytes, from the allocation's first 1024-byte boundary): K [64, D] at 0, V [64, Dv] at
// HOPPER_FWP_V_OFFSET, q chunks [2][64, D] at HOPPER_FWP_Q_OFFSET, in wgmma.mlir's swizzled layout (the computed
// chunk's buffer staging o_t, f32, a subgroup's quarter each); the piece's rows [ROWS_PER_PIECE][4] i32 at
// HOPPER_FWP_ROWS_OFFSET and their count after them.
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/rules.mlir" as rules %>
<% import "gpu/nvidia/kernel.mlir" as nv %>
<% import "gpu/nvidia/softmax.mlir" as softmax %>
<% import "gpu/hopper/wgmma.mlir" as wg %>
<% import "gpu/hopper/pieces.mlir" as pieces %>

<% set exe, function, layout = "hopper_selection_fwd_pieces_exe", "selection_attention_fwd_piece", "hopper_fwd_pieces_layout" %>
<% set inputs = ['q', 'k', 'v', 'block_indices', 'entries'] %>
<% set outputs = ['o_slots', 'stats_slots'] %>
<% set constants = ['batch', 'm_rows', 'n', 'scale', 'pieces'] %>
<% set piece_rows_per_chunk = 64 // (HPG | int) %>
<# o_t's columns a round: a subgroup's quarter of a q buffer holds 16 rows of them in f32 #>
<% set stage_cols = (D | int) // 2 %>
// Push constants: B, M, N (i32), the bits of scale (f32), and the number of pieces.
${ dispatch.layout(layout, constants | length, inputs, outputs) }

!hfwp_q = memref<?x?x${H}x${D}x${E}>
!hfwp_k = memref<?x?x${G}x${D}x${E}>
!hfwp_v = memref<?x?x${G}x${DV}x${E}>
!hfwp_smem = memref<${HOPPER_FWP_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
!hfwp_elements = memref<${ (HOPPER_FWP_SMEM_BYTES | int) // 2 - 512 }x${E}, #gpu.address_space<workgroup>>
!hfwp_words = memref<${ (HOPPER_FWP_SMEM_BYTES | int) // 4 - 256 }xi32, #gpu.address_space<workgroup>>
// the inversion's pieces (gpu/piece_rows.mlir's names) and the piece's rows: [m, last, first slot, log2 weight]
!dkv_entries = memref<?x${ROWS_PER_PIECE}x2xi32>
!dkv_row_info = memref<${ROWS_PER_PIECE}x4xi32, #gpu.address_space<workgroup>>
!hfwp_s = ${ wg.acc_type(32) }
!hfwp_o = ${ wg.acc_type(HOPPER_O_VALUES) }
// the q chunks' buffers as f32, each subgroup's quarter staging 16 rows of o's partials, D / 2 columns at a time
!hfwp_stage = memref<2x4x${ 16 * stage_cols }xf32, #gpu.address_space<workgroup>>

<% set rows = 64 %>
<# The k16 steps' byte offsets (wgmma.mlir's swizzled layout): K-major q [64, D] and k [64, D] (32 bytes a step in
   a column block, 64 x 128 a block); MN-major v [64, Dv] (two 8-key groups, 2048 bytes, a step). #>
<% set steps = namespace(d=[], v=[]) %>
<% for s in range((D | int) // 16) %>
<% set steps.d = steps.d + [(s // 4) * rows * 128 + (s % 4) * 32] %>
<% endfor %>
<% for s in range(rows // 16) %>
<% set steps.v = steps.v + [s * 2048] %>
<% endfor %>
<% set o_values = HOPPER_O_VALUES | int %>
<% call dispatch.executable(exe, function, layout, ['pieces'], lanes=128) %>
${ nv.func_open(function, 128, 32, HOPPER_FWP_MIN_WORKGROUPS_PER_SM) }
${ nv.constants(["c0", "c1", "c2", "c4", "c8", "c16", "c32", "c64", "c128", "c0_i32", "c1_i32", "c2_i32", "c32_i32", "zero", "one", "minus_inf", "log2e", "ln2"]) }
      %c4_i64 = arith.constant 4 : i64
      %c16383_i64 = arith.constant 16383 : i64
      %subgroup_size = arith.constant 32 : index
      %lanes = arith.constant 128 : index
${ nv.constants([("heads_per_group", HPG), ("block_size", 64)]) }
      %stages = arith.constant 2 : index
      %lag = arith.constant 1 : index

${ dispatch.ids(['piece']) }
${ dispatch.push_constants(layout, constants) }
      %scale_log2 = arith.mulf %scale, %log2e : f32

${ dispatch.bindings(layout, inputs, outputs) }

      // A padding piece (no rows) holds no row's block: nothing to do. Uniform per workgroup.
      %first_entry = memref.load %entries[%piece, %c0, %c0] : !dkv_entries
      %piece_used = arith.cmpi sge, %first_entry, %c0_i32 : i32
      scf.if %piece_used {

${ wg.aligned_allocation("!hfwp_smem", [("elements", "!hfwp_elements"), ("words", "!hfwp_words")]) }

${ nv.lane_ids() }
      %rows = arith.constant ${ROWS_PER_PIECE} : index
      %slots = arith.constant ${T} : index
      %kv_heads = arith.constant ${G} : index
      %minus_one = arith.constant -1 : i32
      %c3 = arith.constant 3 : index
      %rows_region = arith.constant ${HOPPER_FWP_ROWS_OFFSET} : index
      %rows_at = arith.addi %smem_pad, %rows_region : index
      %row_info = memref.view %smem[%rows_at][] : !hfwp_smem to !dkv_row_info
      %q_region_at = arith.constant ${HOPPER_FWP_Q_OFFSET} : index
      %o_stage_at = arith.addi %smem_pad, %q_region_at : index
      %o_stage = memref.view %smem[%o_stage_at][] : !hfwp_smem to !hfwp_stage
      %count_word = arith.constant ${ ((HOPPER_FWP_ROWS_OFFSET | int) + (ROWS_PER_PIECE | int) * 16) // 4 } : index
      <% include "gpu/piece_rows.mlir" %>
        gpu.barrier
${ pieces.row_words(true, "!hfwp_words") }
        gpu.barrier
        // The piece's rows in %chunks chunks of 64 / HPG positions (64 rows).
        %count_i32 = memref.load %words[%count_word] : !hfwp_words
        %count = arith.index_castui %count_i32 : i32 to index
        %chunk_positions = arith.constant ${piece_rows_per_chunk} : index
        %chunks = arith.ceildivui %count, %chunk_positions : index
        %keys_left = arith.subi %n, %key0 : index
        %keys_staged = arith.minsi %keys_left, %block_size : index
      %steps = arith.addi %chunks, %lag : index

      // K and V of the block, once.
      %v_region = arith.constant ${ (HOPPER_FWP_V_OFFSET | int) // 2 } : index
${ wg.stage_keys("k", "!hfwp_k", "%key0", "%keys_staged", 64, D, "%c0", 128, "!hfwp_elements", ASYNC_COPY_HINT) }
${ wg.stage_keys("v", "!hfwp_v", "%key0", "%keys_staged", 64, DV, "%v_region", 128, "!hfwp_elements", ASYNC_COPY_HINT) }
      nvvm.cp.async.commit.group
${ wg.descriptor("k_desc", "%c0", 16, 1024) }
      %v_offset = arith.constant ${HOPPER_FWP_V_OFFSET} : index
${ wg.descriptor("v_desc", "%v_offset", rows * 128, 1024) }
      // The lane's rows of a chunk: 16 w + r + 8 h.
      %w16 = arith.muli %subgroup, %c16 : index
      %lane_row_0 = arith.addi %w16, %r : index
      %c8_rows = arith.constant 8 : index
      %lane_row_1 = arith.addi %lane_row_0, %c8_rows : index
      %s_zero = llvm.mlir.zero : !hfwp_s
      %o_zero = llvm.mlir.zero : !hfwp_o

      scf.for %t = %c0 to %steps step %c1 {
        // Stage chunk t's q (padding rows as zeros) into buffer t mod 2.
        %stage_buffer = arith.remui %t, %stages : index
        %t_in_range = arith.cmpi ult, %t, %chunks : index
        scf.if %t_in_range {
          %stage_row0 = arith.muli %t, %chunk_positions : index
          %q_chunk_elements = arith.constant ${ rows * (D | int) } : index
          %q_buffer_elements = arith.muli %stage_buffer, %q_chunk_elements : index
          %q_region = arith.constant ${ (HOPPER_FWP_Q_OFFSET | int) // 2 } : index
          %q_base = arith.addi %q_region, %q_buffer_elements : index
${ wg.stage_rows("q", "!hfwp_q", "%stage_row0", rows, D, "%q_base", 128, "!hfwp_elements", ASYNC_COPY_HINT, listed=true) }
        }
        nvvm.cp.async.commit.group
        nvvm.cp.async.wait.group 1
        // The copies (generic proxy) made visible to wgmma's reads (async proxy), then to the whole warpgroup.
        llvm.inline_asm has_side_effects "fence.proxy.async.shared::cta;", "" : () -> ()
        gpu.barrier
${ nv.previous("%chunk") }
        scf.if %has_previous {
          %chunk_row0 = arith.muli %chunk, %chunk_positions : index
          %q_region_bytes = arith.constant ${HOPPER_FWP_Q_OFFSET} : index
          %q_chunk_bytes = arith.constant ${ rows * (D | int) * 2 } : index
          %q_buffer_bytes = arith.muli %buffer, %q_chunk_bytes : index
          %q_offset = arith.addi %q_region_bytes, %q_buffer_bytes : index
${ wg.descriptor("q_desc", "%q_offset", 16, 1024) }
          // s = q k^T over D; meanwhile the lane's rows (16 w + r + 8 h of the chunk: piece row chunk_row0 + that
          // / HPG, head that mod HPG): query row m (-1: padding), the last key of the block each sees, the first
          // slot naming the block, and the log2 weight (gpu/piece_rows.mlir's words, pieces.row_words').
<% call wg.chains([("s", none, "%q_desc", steps.d, "%k_desc", steps.d, 64, "col", "!hfwp_s")], E) %>
<% for h in range(2) %>
          %piece_row_${h}_in = arith.divui %lane_row_${h}, %heads_per_group : index
          %piece_row_${h} = arith.addi %chunk_row0, %piece_row_${h}_in : index
          %head_${h} = arith.remui %lane_row_${h}, %heads_per_group : index
          %info_${h} = vector.load %row_info[%piece_row_${h}, %c0] : !dkv_row_info, vector<4xi32>
          %m_${h}_i32 = vector.extract %info_${h}[0] : i32 from vector<4xi32>
          %last_${h}_i32 = vector.extract %info_${h}[1] : i32 from vector<4xi32>
          %last_${h} = arith.index_cast %last_${h}_i32 : i32 to index
          %slot_${h}_i32 = vector.extract %info_${h}[2] : i32 from vector<4xi32>
          %log2_weight_${h}_bits = vector.extract %info_${h}[3] : i32 from vector<4xi32>
          %log2_weight_${h} = arith.bitcast %log2_weight_${h}_bits : i32 to f32
          %real_${h} = arith.cmpi sge, %m_${h}_i32, %c0_i32 : i32
<% endfor %>
<% endcall %>
${ wg.values("sv", "%s", 32, "!hfwp_s") }
          // x = s scale log2(e), -inf past the row's last key: value 4 i + 2 h + e is row 16 w + r + 8 h, key 8 i + 2 c
          // + e of the block.
<% for v in range(32) %>
<% set i, h, e = v // 4, (v // 2) % 2, v % 2 %>
          %j_${v}_base = arith.constant ${ 8 * i + e } : index
          %j_${v} = arith.addi %c2x, %j_${v}_base : index
          ${ rules.key_in_range("live_" ~ v, "j_" ~ v, "sle", "last_" ~ h, none) }
          %scaled_${v} = arith.mulf %sv_${v}, %scale_log2 : f32
          %x_${v} = arith.select %live_${v}, %scaled_${v}, %minus_inf : f32
<% endfor %>
          // Each row's max over the block (its 4 lanes), p = 2^(x - max + log2 w), and the row's sum of p.
<% for h in [0, 1] %>
          %lane_max_${h}_0 = arith.maximumf %x_${h * 2}, %x_${h * 2 + 1} : f32
<% for i in range(1, 8) %>
          %lane_max_${h}_${i}_a = arith.maximumf %x_${4 * i + 2 * h}, %x_${4 * i + 2 * h + 1} : f32
          %lane_max_${h}_${i} = arith.maximumf %lane_max_${h}_${i - 1}, %lane_max_${h}_${i}_a : f32
<% endfor %>
${ softmax.quad_reduce("%row_max_" ~ h, "%lane_max_" ~ h ~ "_7", "arith.maximumf") }
          // (a padding row sees no key: its max -inf, taken as 0, and its log2 weight -inf make p 0)
          %row_empty_${h} = arith.cmpf oeq, %row_max_${h}, %minus_inf : f32
          %safe_max_${h} = arith.select %row_empty_${h}, %zero, %row_max_${h} : f32
          %shift_${h} = arith.subf %log2_weight_${h}, %safe_max_${h} : f32
<% endfor %>
<% for v in range(0, 32, 2) %>
<% set h = (v // 2) % 2 %>
          %shifted_${v} = arith.addf %x_${v}, %shift_${h} : f32
          %shifted_${v + 1} = arith.addf %x_${v + 1}, %shift_${h} : f32
          %p_${v} = ${EX2} %shifted_${v} : (f32) -> f32
          %p_${v + 1} = ${EX2} %shifted_${v + 1} : (f32) -> f32
          %pair_sum_${v} = arith.addf %p_${v}, %p_${v + 1} : f32
          %packed_${v} = ${PACK_PAIR} %p_${v + 1}, %p_${v} : (f32, f32) -> i32
<% endfor %>
<% for h in [0, 1] %>
          %lane_sum_${h}_0 = arith.addf %pair_sum_${2 * h}, %pair_sum_${4 + 2 * h} : f32
<% for i in range(2, 8) %>
          %lane_sum_${h}_${i - 1} = arith.addf %lane_sum_${h}_${i - 2}, %pair_sum_${4 * i + 2 * h} : f32
<% endfor %>
${ softmax.quad_reduce("%row_sum_" ~ h, "%lane_sum_" ~ h ~ "_6", "arith.addf") }
<% endfor %>
          // o_t = p v over the block's keys in 16-key steps (v MN-major: its rows are the product's K).
${ wg.chain_registers("o_t", "%o_zero", "%packed_", "%v_desc", steps.v, DV, E, "row", "!hfwp_o") }
          // The lane's rows' stats at [b, m, g, first slot naming the block, head] (max in natural units, sum), by
          // the row's lane c = 0.
          %stats_lane = arith.cmpi eq, %c, %c0 : index
<% for h in range(2) %>
          %stats_here_${h} = arith.andi %real_${h}, %stats_lane : i1
          scf.if %stats_here_${h} {
            %m_${h} = arith.index_castui %m_${h}_i32 : i32 to index
            %slot_${h} = arith.index_castui %slot_${h}_i32 : i32 to index
            %max_natural_${h} = arith.mulf %safe_max_${h}, %ln2 : f32
            %stats_${h} = vector.from_elements %max_natural_${h}, %row_sum_${h} : vector<2xf32>
            vector.store %stats_${h}, %stats_slots[%b, %m_${h}, %g, %slot_${h}, %head_${h}, %c0] alignment = 8 : memref<?x?x${G}x${T}x${HPG}x2xf32>, vector<2xf32>
          }
<% endfor %>
          // o_t at the same place of o_slots, through the chunk's q buffer: every subgroup's s = q k^T has read it.
          gpu.barrier
${ pieces.staged_stores("o", "%o_t", "!hfwp_o", o_values, stage_cols, "%o_stage", "!hfwp_stage", "%buffer", "%o_slots", "memref<?x?x" ~ G ~ "x" ~ T ~ "x" ~ HPG ~ "x" ~ DV ~ "xf32>", "%chunk_row0") }
        }
        // The next iteration stages into the buffer just read.
        gpu.barrier
      }
      }   // (the piece is used)
      return
    }
<% endcall %>

<% include "common/inversion.mlir" %>
<% include "common/forward_sums.mlir" %>

// Host side: the block lists inverted (and written out, for the backward), one dispatch per piece writing each row's
// partials per slot, then each row's counted slots combined in slot order (common/forward_sums.mlir).
${ host.forward_pieces(exe, function) }
