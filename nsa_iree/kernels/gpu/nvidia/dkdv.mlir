// dk/dv pass as one hand-written matrix-unit kernel: one workgroup per piece of @invert_block_indices
// (up to ROWS_PER_PIECE query rows that selected one kv block), dk and dv of the piece accumulated together.
//
// The block's K and V rows are staged once into workgroup memory; the piece's rows follow one at a time
// (their HPG heads of q and do, lse and delta), double-buffered with asynchronous copies so that the next
// row loads while this one is computed. Subgroup w owns keys [16 w, 16 w + 16) of the block; for each row,
// on the matrix units, with the 16 heads of the row as the 16 "query vectors":
//   s^T  = k q^T        lhs k [16 keys x D]        rhs q^T [D x 16 heads]   (ldmatrix from the tiles)
//   dp^T = v do^T       lhs v [16 keys x Dv]       rhs do^T [Dv x 16 heads]
//   p^T  = w exp(scale s^T - lse), ds^T = scale p^T (dp^T - delta)   (w: how often the row lists the block;
//          0 for keys past the row's last visible key and for padding heads past HPG)
//   dv  += p^T do       lhs p^T [16 keys x 16 heads] (the s^T accumulators re-tiled in registers)
//   dk  += ds^T q       lhs ds^T                       rhs q [16 heads x D] (ldmatrix .trans)
// 4 products per row instead of the 5 of the two linalg regions (which each recomputed s). Each subgroup
// writes its [16 keys, D] and [16 keys, Dv] f32 partials of the piece once; @dkdv_piece_sums adds the
// pieces of a block in piece order, so dk and dv stay bitwise reproducible.
//
// Fragments are those of dq_kernel.mlir (${MMA_KIND}, IREE's placement, nsa_iree/fragments.py): the
// accumulator element [tile][o][e] of s^T is (key 8 o + r, head 8 tile + 2 c + e) with r = lane / 4,
// c = lane % 4, which is element [2 o + tile][e] of the lhs fragment of p^T do and ds^T q.
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "gpu/nvidia/kernel.mlir" as nv %>
<% import "common/rules.mlir" as rules %>
<# The mma operands' types, contraction map and kind (the macros of gpu/nvidia/kernel.mlir take them). #>
<% set dkv = {"lhs": "!dkv_lhs", "rhs": "!dkv_rhs_step", "acc": "!dkv_scores", "contraction": "#dkv_contraction", "kind": MMA_KIND} %>

// Push constants: B, M, N (i32), the bits of scale (f32), and the number of pieces.
<% set inputs = ['q', 'k', 'v', 'block_indices', 'lse', 'delta', 'do', 'entries'] %>
<% set outputs = ['dk_pieces', 'dv_pieces'] %>
${ dispatch.layout("dkdv_kernel_layout", 5, inputs, outputs) }

!dkv_q = memref<?x?x${H}x${D}x${E}>
!dkv_k = memref<?x?x${G}x${D}x${E}>
!dkv_v = memref<?x?x${G}x${DV}x${E}>
!dkv_do = memref<?x?x${H}x${DV}x${E}>
!dkv_entries = memref<?x${ROWS_PER_PIECE}x2xi32>
!dkv_dk_pieces = memref<?x${BS}x${D}xf32>
!dkv_dv_pieces = memref<?x${BS}x${DV}xf32>
// Workgroup tiles: the block's K and V rows, two row buffers of q and do heads (16 rows each, padding heads
// zero-filled), the rows' lse and delta, and per piece row: its query row, last visible key and weight.
!dkv_k_tile = memref<${BS}x${D_PADDED}x${E}, #gpu.address_space<workgroup>>
!dkv_v_tile = memref<${BS}x${DV_PADDED}x${E}, #gpu.address_space<workgroup>>
// q and do rows of a piece row: unpadded, 16-byte chunks XOR-swizzled by head (nsa_iree/fragments.py, swizzle_mask)
!dkv_q_rows = memref<${DKDV_STAGES}x16x${D}x${E}, #gpu.address_space<workgroup>>
!dkv_do_rows = memref<${DKDV_STAGES}x16x${DV}x${E}, #gpu.address_space<workgroup>>
!dkv_stats = memref<${DKDV_STAGES}x16xf32, #gpu.address_space<workgroup>>
!dkv_row_info = memref<${ROWS_PER_PIECE}x4xi32, #gpu.address_space<workgroup>>
// Per-lane fragments.
!dkv_k_frags = vector<1x${D_STEPS}x4x2x${E}>
!dkv_v_frags = vector<1x${DV_STEPS}x4x2x${E}>
!dkv_rhs_step = vector<1x2x2x2x${E}>
!dkv_scores = vector<1x2x2x2xf32>
!dkv_lhs = vector<1x1x4x2x${E}>
!dkv_dk_acc = vector<1x${D_TILES}x2x2xf32>
!dkv_dv_acc = vector<1x${DV_TILES}x2x2xf32>

#dkv_contraction = [affine_map<(i, j, k) -> (i, k)>, affine_map<(i, j, k) -> (k, j)>, affine_map<(i, j, k) -> (i, j)>]

<# p^T and ds^T of a piece row as the lhs fragments %pt and %dst of dv += p^T do and dk += ds^T q, from the s^T and
   dp^T accumulators %st, %dpt; with `masked`, 0 for keys past the row's %last (or before its %first) and padding
   heads. #>
<% macro p_and_ds_fragments(masked) %>
            %lhs_zero = arith.constant dense<0.0> : !dkv_lhs
            %zero_f32_pair = arith.constant dense<0.0> : vector<2xf32>
            %pt, %dst = scf.for %tile = %c0 to %c2 step %c1 iter_args(%p_acc = %lhs_zero, %ds_acc = %lhs_zero)
                -> (!dkv_lhs, !dkv_lhs) {
              %p_o, %ds_o = scf.for %o = %c0 to %c2 step %c1 iter_args(%p_acc2 = %p_acc, %ds_acc2 = %ds_acc)
                  -> (!dkv_lhs, !dkv_lhs) {
                %o8 = arith.muli %o, %c8 : index
                %j0 = arith.addi %key_base, %o8 : index
                %j = arith.addi %j0, %r : index
<% if masked %>
                ${ rules.key_in_range("key_visible", "j", "sle", "last", "first") }
<% endif %>
                %p_f32, %ds_f32 = scf.for %e = %c0 to %c2 step %c1 iter_args(%pp = %zero_f32_pair, %dd = %zero_f32_pair)
                    -> (vector<2xf32>, vector<2xf32>) {
                  %tile8 = arith.muli %tile, %c8 : index
                  %h1 = arith.addi %tile8, %c2x : index
                  %h = arith.addi %h1, %e : index
<% if masked %>
                  %head_real = arith.cmpi ult, %h, %heads_per_group : index
                  %live = arith.andi %key_visible, %head_real : i1
<% else %>
                  %live = arith.constant true
<% endif %>
                  %lse_h = memref.load %lse_rows[%buffer, %h] : !dkv_stats
                  %delta_h = memref.load %delta_rows[%buffer, %h] : !dkv_stats
${ nv.p_and_ds_row("head", "lse_h", "delta_h") }
                  %sv = vector.extract %st[0, %tile, %o, %e] : f32 from !dkv_scores
                  %dpv = vector.extract %dpt[0, %tile, %o, %e] : f32 from !dkv_scores
${ nv.p_and_ds("sv", "dpv", "head_lse2", "head_delta", EX2, "p_raw", weight="weight") }
                  %p_live = arith.select %live, %p_raw, %zero : f32
                  %ds_live = arith.select %live, %ds_scaled, %zero : f32
                  %pp_next = vector.insert %p_live, %pp[%e] : f32 into vector<2xf32>
                  %dd_next = vector.insert %ds_live, %dd[%e] : f32 into vector<2xf32>
                  scf.yield %pp_next, %dd_next : vector<2xf32>, vector<2xf32>
                } {unroll_loop}
                // each pair to the input type in one instruction (element 0 in the low half)
                %p0 = vector.extract %p_f32[0] : f32 from vector<2xf32>
                %p1 = vector.extract %p_f32[1] : f32 from vector<2xf32>
                %ds0 = vector.extract %ds_f32[0] : f32 from vector<2xf32>
                %ds1 = vector.extract %ds_f32[1] : f32 from vector<2xf32>
                %p_packed = ${PACK_PAIR} %p1, %p0 : (f32, f32) -> i32
                %ds_packed = ${PACK_PAIR} %ds1, %ds0 : (f32, f32) -> i32
                %p_packed_v = vector.broadcast %p_packed : i32 to vector<1xi32>
                %ds_packed_v = vector.broadcast %ds_packed : i32 to vector<1xi32>
                %p_pair = vector.bitcast %p_packed_v : vector<1xi32> to vector<2x${E}>
                %ds_pair = vector.bitcast %ds_packed_v : vector<1xi32> to vector<2x${E}>
                %o2 = arith.muli %o, %c2 : index
                %frag_row = arith.addi %o2, %tile : index
                %p_next = vector.insert %p_pair, %p_acc2[0, 0, %frag_row] : vector<2x${E}> into !dkv_lhs
                %ds_next = vector.insert %ds_pair, %ds_acc2[0, 0, %frag_row] : vector<2x${E}> into !dkv_lhs
                scf.yield %p_next, %ds_next : !dkv_lhs, !dkv_lhs
              } {unroll_loop}
              scf.yield %p_o, %ds_o : !dkv_lhs, !dkv_lhs
            } {unroll_loop}
<% endmacro %>

<% call dispatch.executable("selection_attention_dkdv_kernel_exe", "selection_attention_dkdv_piece", "dkdv_kernel_layout", ['pieces'], lanes=LANES) %>
${ nv.func_open("selection_attention_dkdv_piece", LANES, SUBGROUP_SIZE, DKDV_MIN_WORKGROUPS_PER_SM) }
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c2 = arith.constant 2 : index
      %c4 = arith.constant 4 : index
      %c8 = arith.constant 8 : index
      %c16 = arith.constant 16 : index
      %c0_i32 = arith.constant 0 : i32
      %minus_one = arith.constant -1 : i32
      %zero = arith.constant 0.0 : f32
      %log2e = arith.constant 1.44269504 : f32      // exp(x) = 2^(x log2 e), 2^ by the hardware's approximation
      %one = arith.constant 1.0 : f32
      %heads_per_group = arith.constant ${HPG} : index
      %block_size = arith.constant ${BS} : index
      %kv_heads = arith.constant ${G} : index
      %slots = arith.constant ${T} : index
      %rows = arith.constant ${ROWS_PER_PIECE} : index
      %steps = arith.constant ${ROWS_PER_PIECE_PLUS_DKDV_LAG} : index
      %stages = arith.constant ${DKDV_STAGES} : index
      %lag = arith.constant ${DKDV_STAGES_MINUS_1} : index
      %lanes = arith.constant ${LANES} : index
      %k_swizzle_mask = arith.constant ${K_SWIZZLE_MASK} : index
      %v_swizzle_mask = arith.constant ${V_SWIZZLE_MASK} : index
      %k_swizzle_high = arith.constant ${K_SWIZZLE_HIGH} : index
      %v_swizzle_high = arith.constant ${V_SWIZZLE_HIGH} : index
      %subgroup_size = arith.constant ${SUBGROUP_SIZE} : index
      %k_chunks = arith.constant ${D_CHUNKS} : index
      %v_chunks = arith.constant ${DV_CHUNKS} : index
      %k_items = arith.constant ${K_STAGE_ITEMS} : index
      %v_items = arith.constant ${V_STAGE_ITEMS} : index
      %q_items = arith.constant ${Q_STAGE_ITEMS} : index
      %do_items = arith.constant ${DO_STAGE_ITEMS} : index
      %d_steps = arith.constant ${D_STEPS} : index
      %dv_steps = arith.constant ${DV_STEPS} : index
      %d_tiles = arith.constant ${D_TILES} : index
      %dv_tiles = arith.constant ${DV_TILES} : index

${ dispatch.ids(['piece']) }
${ dispatch.push_constants("dkdv_kernel_layout", ['batch', 'm_rows', 'n', 'scale', 'pieces']) }
${ nv.p_and_ds_constants() }

${ dispatch.bindings("dkdv_kernel_layout", inputs, outputs) }

      // A padding piece (no rows) is never read by the piece sums: nothing to do. Uniform per workgroup.
      %first_row_i32 = memref.load %entries[%piece, %c0, %c0] : !dkv_entries
      %piece_used = arith.cmpi sge, %first_row_i32, %c0_i32 : i32
      scf.if %piece_used {
        %k_tile = memref.alloc() : !dkv_k_tile
        %v_tile = memref.alloc() : !dkv_v_tile
        %q_rows = memref.alloc() : !dkv_q_rows
        %do_rows = memref.alloc() : !dkv_do_rows
        %lse_rows = memref.alloc() : !dkv_stats
        %delta_rows = memref.alloc() : !dkv_stats
        %row_info = memref.alloc() : !dkv_row_info

${ nv.lane_ids() }
        %key_base = arith.muli %subgroup, %c16 : index

        <% include "gpu/piece_rows.mlir" %>

        // The block's K and V rows (keys past N zero-filled, never read).
        %in_range = arith.subi %n, %key0 : index
        <% for x, col in [("k", "%d0"), ("v", "%e0")] %>
        scf.for %item = %tid to %${x}_items step %lanes {
          %chunk = arith.remui %item, %${x}_chunks : index
          %j = arith.divui %item, %${x}_chunks : index
          ${col} = arith.muli %chunk, %c8 : index
          %exists = arith.cmpi slt, %j, %in_range : index
          %count = arith.select %exists, %c8, %c0 : index
          %key_j = arith.addi %key0, %j : index
          %key = arith.select %exists, %key_j, %key0 : index
          %copy = nvgpu.device_async_copy %${x}[%b, %key, %g, ${col}], %${x}_tile[%j, ${col}], 8, %count ${ASYNC_COPY_HINT} : !dkv_${x} to !dkv_${x}_tile
        }
        <% endfor %>
        nvvm.cp.async.commit.group
        nvvm.cp.async.wait.group 0
        gpu.barrier

        // ldmatrix: lanes 8 q .. 8 q + 7 give the row addresses of 8x8 matrix q of the four.
${ nv.ldmatrix_lanes() }
        %hi_row = arith.addi %hi8, %matrix_row : index
        %lo_row = arith.addi %lo8, %matrix_row : index
        %tile_row = arith.addi %key_base, %hi_row : index
        // q and do chunks are stored XOR-swizzled by head (staging below): column c of head h at c ^ 8 (h & mask).
        %hi_row_bits_k = arith.andi %hi_row, %k_swizzle_mask : index
        %hi_swizzle_k = arith.muli %hi_row_bits_k, %c8 : index
        %hi_row_bits_v = arith.andi %hi_row, %v_swizzle_mask : index
        %hi_swizzle_v = arith.muli %hi_row_bits_v, %c8 : index
        %lo_row_bits_k = arith.andi %lo_row, %k_swizzle_mask : index
        %lo_swizzle_k = arith.muli %lo_row_bits_k, %c8 : index
        %lo_row_bits_v = arith.andi %lo_row, %v_swizzle_mask : index
        %lo_swizzle_v = arith.muli %lo_row_bits_v, %c8 : index

        // This subgroup's 16 keys of K and V as lhs fragments, read once: matrix q = (rows 8 (q / 2),
        // columns 8 (q mod 2)) is fragment element [q].
        <% for x, steps in [("k", "%d_steps"), ("v", "%dv_steps")] %>
        %${x}f_init = arith.constant dense<0.0> : !dkv_${x}_frags
        %${x}_frags = scf.for %s = %c0 to ${steps} step %c1 iter_args(%acc = %${x}f_init) -> (!dkv_${x}_frags) {
          %col0 = arith.muli %s, %c16 : index
          %col = arith.addi %col0, %lo8 : index
          %x = nvgpu.ldmatrix %${x}_tile[%tile_row, %col] numTiles = 4 transpose = false : !dkv_${x}_tile -> vector<4x2x${E}>
          %next = vector.insert %x, %acc[0, %s] : vector<4x2x${E}> into !dkv_${x}_frags
          scf.yield %next : !dkv_${x}_frags
        } {unroll_loop}
        <% endfor %>

        // Iteration t stages piece row t into buffer t mod 2 (empty group for a padding row or t = R) and
        // computes row t - 1 from the other buffer meanwhile.
        %dk_init = arith.constant dense<0.0> : !dkv_dk_acc
        %dv_init = arith.constant dense<0.0> : !dkv_dv_acc
        %dk_acc, %dv_acc = scf.for %t = %c0 to %steps step %c1 iter_args(%dk_iter = %dk_init, %dv_iter = %dv_init)
            -> (!dkv_dk_acc, !dkv_dv_acc) {
          %stage_buffer = arith.remui %t, %stages : index
          %t_in_range = arith.cmpi ult, %t, %rows : index
          %t_safe = arith.select %t_in_range, %t, %c0 : index
          %stage_m_i32 = memref.load %row_info[%t_safe, %c0] : !dkv_row_info
          %stage_used = arith.cmpi sge, %stage_m_i32, %c0_i32 : i32
          %stage = arith.andi %t_in_range, %stage_used : i1
          scf.if %stage {
            %m = arith.index_castui %stage_m_i32 : i32 to index
            // Heads h < HPG of the row; the padding heads' rows are zero-filled.
            <# q (columns d0, with K's chunk count and swizzle) then do (columns e0, with V's). #>
            <% for x, kv, col in [("q", "k", "%d0"), ("do", "v", "%e0")] %>
            scf.for %item = %tid to %${x}_items step %lanes {
              %chunk = arith.remui %item, %${kv}_chunks : index
              %h = arith.divui %item, %${kv}_chunks : index
              ${col} = arith.muli %chunk, %c8 : index
              %real = arith.cmpi ult, %h, %heads_per_group : index
              %count = arith.select %real, %c8, %c0 : index
              %head_h = arith.addi %h0, %h : index
              %head = arith.select %real, %head_h, %h0 : index
              %h_bits = arith.andi %h, %${kv}_swizzle_mask : index
              %swizzle = arith.muli %h_bits, %c8 : index
              ${col}_stored = arith.xori ${col}, %swizzle : index
              %copy = nvgpu.device_async_copy %${x}[%b, %m, %head, ${col}], %${x}_rows[%stage_buffer, %h, ${col}_stored], 8, %count ${ASYNC_COPY_HINT}
                  : !dkv_${x} to !dkv_${x}_rows
            }
            <% endfor %>
            %is_lse_lane = arith.cmpi ult, %tid, %heads_per_group : index
            scf.if %is_lse_lane {
              %head = arith.addi %h0, %tid : index
              %copy_l = nvgpu.device_async_copy %lse[%b, %head, %m], %lse_rows[%stage_buffer, %tid], 1
                  : memref<?x${H}x?xf32> to !dkv_stats
              %copy_d = nvgpu.device_async_copy %delta[%b, %m, %head], %delta_rows[%stage_buffer, %tid], 1
                  : memref<?x?x${H}xf32> to !dkv_stats
            }
          }
          nvvm.cp.async.commit.group
          nvvm.cp.async.wait.group ${DKDV_STAGES_MINUS_1}
          gpu.barrier

${ nv.previous("%row") }
          %row_m_i32 = memref.load %row_info[%row, %c0] : !dkv_row_info
          %row_used = arith.cmpi sge, %row_m_i32, %c0_i32 : i32
          %compute = arith.andi %row_used, %has_previous : i1
          %dk_next, %dv_next = scf.if %compute -> (!dkv_dk_acc, !dkv_dv_acc) {
            %last_i32 = memref.load %row_info[%row, %c1] : !dkv_row_info
            %last = arith.index_cast %last_i32 : i32 to index
<% if WINDOW != "0" %>
            %first_word = arith.constant 3 : index
            %first_i32 = memref.load %row_info[%row, %first_word] : !dkv_row_info
            %first = arith.index_cast %first_i32 : i32 to index
<% endif %>
            %weight_bits = memref.load %row_info[%row, %c2] : !dkv_row_info
            %weight = arith.bitcast %weight_bits : i32 to f32

            // s^T and dp^T, one 16-column step at a time (one ldmatrix of q or do rows gives the two rhs
            // fragments: matrix q is head tile q / 2, k' = q mod 2), so one step's fragments are live at once.
            %scores_zero = arith.constant dense<0.0> : !dkv_scores
${ nv.score_steps("%st", "%d_steps", "%scores_zero", "%k_frags", "!dkv_k_frags", "%q_rows", "!dkv_q_rows", "%buffer", "%hi_row", "%k_swizzle_high", "%lo8", "%hi_swizzle_k", dkv) }
${ nv.score_steps("%dpt", "%dv_steps", "%scores_zero", "%v_frags", "!dkv_v_frags", "%do_rows", "!dkv_do_rows", "%buffer", "%hi_row", "%v_swizzle_high", "%lo8", "%hi_swizzle_v", dkv) }

            // p^T and ds^T element by element: [tile][o][e] is key key_base + 8 o + r, head 8 tile + 2 c + e,
            // and goes to element [2 o + tile][e] of the lhs fragments; without the masks where every key of the
            // subgroup is visible to the row and its heads fill the tile (the same for all the subgroup's lanes).
${ nv.interior("last", "sle", "first") }
            %pt, %dst = scf.if %interior -> (!dkv_lhs, !dkv_lhs) {
${ p_and_ds_fragments(masked=false) }
              scf.yield %pt, %dst : !dkv_lhs, !dkv_lhs
            } else {
${ p_and_ds_fragments(masked=true) }
              scf.yield %pt, %dst : !dkv_lhs, !dkv_lhs
            }

            // dv += p^T do and dk += ds^T q, two column tiles per step: the rhs (heads x columns) is read
            // transposed (ldmatrix .trans: matrix q is column tile 2 s + q / 2, k' = q mod 2).
${ nv.accumulate_steps("%dv_new", "%dv_steps", "%dv_iter", "!dkv_dv_acc", "%pt", "!dkv_lhs", "%scores_zero", "%do_rows", "!dkv_do_rows", "%buffer", "%lo_row", "%v_swizzle_high", "%hi8", "%lo_swizzle_v", dkv) }
${ nv.accumulate_steps("%dk_new", "%d_steps", "%dk_iter", "!dkv_dk_acc", "%dst", "!dkv_lhs", "%scores_zero", "%q_rows", "!dkv_q_rows", "%buffer", "%lo_row", "%k_swizzle_high", "%hi8", "%lo_swizzle_k", dkv) }
            scf.yield %dk_new, %dv_new : !dkv_dk_acc, !dkv_dv_acc
          } else {
            scf.yield %dk_iter, %dv_iter : !dkv_dk_acc, !dkv_dv_acc
          }
          // The next iteration stages into the buffer just read.
          gpu.barrier
          scf.yield %dk_next, %dv_next : !dkv_dk_acc, !dkv_dv_acc
        }

        // The piece's partials: accumulator element [0][tile][o][e] is key key_base + 8 o + r, column
        // 8 tile + 2 c + e.
        <% for x, tiles, col in [("dk", "%d_tiles", "%d"), ("dv", "%dv_tiles", "%e")] %>
        scf.for %tile = %c0 to ${tiles} step %c1 {
          scf.for %o = %c0 to %c2 step %c1 {
            %o8 = arith.muli %o, %c8 : index
            %j0 = arith.addi %key_base, %o8 : index
            %j = arith.addi %j0, %r : index
            %tile8 = arith.muli %tile, %c8 : index
            ${col} = arith.addi %tile8, %c2x : index
            %x = vector.extract %${x}_acc[0, %tile, %o] : vector<2xf32> from !dkv_${x}_acc
            vector.store %x, %${x}_pieces[%piece, %j, ${col}] : !dkv_${x}_pieces, vector<2xf32>
          } {unroll_loop}
        } {unroll_loop}
        <% endfor %>
      }
      return
    }
<% endcall %>

// Host side: the kernel writes every used piece's partials, @dkdv_piece_sums adds them per block.
${ host.dkdv("selection_attention_dkdv_kernel_exe") }
