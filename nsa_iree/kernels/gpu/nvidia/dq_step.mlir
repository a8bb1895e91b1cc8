<% import "gpu/nvidia/kernel.mlir" as nv %>
<# The dq kernels' step over 16 keys (imported as dq_step by gpu/nvidia/dq.mlir, which splits a block's keys over
   its subgroups, and dense_dq.mlir, whose subgroups each take every key of a tile). #>

<# dq += ds k over 16 keys (key_base .. key_base + 15 of the staged rows in %buffer: read at %score_row for s and
   dp, swizzled by %score_swizzle_k / %score_swizzle_v, and at %dq_row, swizzled by %dq_swizzle_k, for ds k) for
   the subgroup's 16 rows: q (%q_frags), do (%do_tile[do_index %do_lane_row, col], do_index "" or the subgroup's
   "%subgroup, "; %do_lane_row = 8 (q mod 2) + the lane's row in matrix q), each row's p_and_ds terms (kernel.mlir's
   p_and_ds_row: %row_0_lse2, %row_0_delta, %row_1_lse2, %row_1_delta), heads %head_valid_0/_1, keys below %visible
   (or below %visible_0/_1 per row when `per_row`). Takes %dq_iter (!dqk_dq_acc) and defines %dq_new. `t` names the s = q k^T
   types (kernel.mlir's types, with kind); ex2 and pack_pair are the recipe's instructions (EX2, PACK_PAIR). #>
<% macro step(t, ex2, pack_pair, do_index="", per_row=false) %>
          // s and dp over this subgroup's 16 keys: per 16-d step one ldmatrix (two rhs fragments: matrix q
          // is key tile q / 2, k' = q mod 2) and two mma, so only one step's fragments are live at a time.
          %scores_zero = arith.constant dense<0.0> : !dqk_scores
${ nv.score_steps("%s_acc", "%d_steps", "%scores_zero", "%q_frags", "!dqk_q_frags", "%k_rows", "!dqk_k_rows", "%buffer", "%score_row", "%k_swizzle_high", "%lo8", "%score_swizzle_k", t) }
          %dp_acc = scf.for %s = %c0 to %dv_steps step %c1 iter_args(%acc = %scores_zero) -> (!dqk_scores) {
            %col0 = arith.muli %s, %c16 : index
            %v_col_high = arith.andi %col0, %v_swizzle_high : index
            %v_col_low = arith.subi %col0, %v_col_high : index
            %v_col_lane = arith.addi %v_col_low, %lo8 : index
            %v_col_swizzled = arith.xori %v_col_lane, %score_swizzle_v : index
            %v_col = arith.addi %v_col_high, %v_col_swizzled : index
            %x = nvgpu.ldmatrix %v_rows[%buffer, %score_row, %v_col] numTiles = 4 transpose = false
                : !dqk_v_rows -> vector<4x2x${E}>
            %rhs = vector.shape_cast %x : vector<4x2x${E}> to !dqk_rhs_step
            // do as the lhs: ldmatrix gives the matrices in the mma instruction's register order (matrix q =
            // (row half q mod 2, d half q / 2)); the lhs fragment's element [2 i + k'] is (row half i, d half k'),
            // so elements 1 and 2 trade places here and the lowering's reorder cancels it: no register copies.
            %do_col = arith.addi %col0, %hi8 : index
            %lhs_mma = nvgpu.ldmatrix %do_tile[${do_index}%do_lane_row, %do_col] numTiles = 4 transpose = false
                : !dqk_do_tile -> vector<4x2x${E}>
            %do_m1 = vector.extract %lhs_mma[1] : vector<2x${E}> from vector<4x2x${E}>
            %do_m2 = vector.extract %lhs_mma[2] : vector<2x${E}> from vector<4x2x${E}>
            %lhs_12 = vector.insert %do_m2, %lhs_mma[1] : vector<2x${E}> into vector<4x2x${E}>
            %lhs0 = vector.insert %do_m1, %lhs_12[2] : vector<2x${E}> into vector<4x2x${E}>
            %lhs = vector.shape_cast %lhs0 : vector<4x2x${E}> to !dqk_lhs_step
            %next = iree_codegen.inner_tiled ins(%lhs, %rhs) outs(%acc) <
              indexing_maps = #dqk_contraction,
              iterator_types = [#linalg.iterator_type<parallel>, #linalg.iterator_type<parallel>, #linalg.iterator_type<reduction>],
              kind = #iree_gpu.mma_layout<${t.kind}>,
              semantics = #iree_gpu.mma_semantics<distributed = true, opaque = false>
            > : !dqk_lhs_step, !dqk_rhs_step into !dqk_scores
            scf.yield %next : !dqk_scores
          } {unroll_loop}

          // ds, element by element of the accumulators: [tile][i][e] is head 8 i + r, key
          // key_base + 8 tile + 2 c + e. It goes straight into the lhs fragment of dq = ds k, whose element
          // [2 i + tile][e] is the same (head, key): the 16 keys of the subgroup are that product's reduction.
          %ds_init = arith.constant dense<0.0> : !dqk_ds_frags
          %ds_frags = scf.for %tile = %c0 to %c2 step %c1 iter_args(%acc = %ds_init) -> (!dqk_ds_frags) {
            %acc_i = scf.for %i = %c0 to %c2 step %c1 iter_args(%acc2 = %acc) -> (!dqk_ds_frags) {
              %is_row_1 = arith.cmpi eq, %i, %c1 : index
              %head_valid = arith.select %is_row_1, %head_valid_1, %head_valid_0 : i1
              %l = arith.select %is_row_1, %row_1_lse2, %row_0_lse2 : f32
              %dl = arith.select %is_row_1, %row_1_delta, %row_0_delta : f32
              %pair_f32 = scf.for %e = %c0 to %c2 step %c1 iter_args(%pair_acc = %zero_f32_pair) -> (vector<2xf32>) {
${ nv.score_element(per_row) }
                %dpv = vector.extract %dp_acc[0, %tile, %i, %e] : f32 from !dqk_scores
${ nv.p_and_ds("sv", "dpv", "l", "dl", ex2, "p") }
                %ds_live = arith.select %live, %ds_scaled, %zero : f32
                %next = vector.insert %ds_live, %pair_acc[%e] : f32 into vector<2xf32>
                scf.yield %next : vector<2xf32>
              } {unroll_loop}
              // (both to the input type in one instruction: element 0 in the low half)
              %ds0 = vector.extract %pair_f32[0] : f32 from vector<2xf32>
              %ds1 = vector.extract %pair_f32[1] : f32 from vector<2xf32>
              %packed = ${pack_pair} %ds1, %ds0 : (f32, f32) -> i32
              %packed_v = vector.broadcast %packed : i32 to vector<1xi32>
              %pair = vector.bitcast %packed_v : vector<1xi32> to vector<2x${E}>
              %i2 = arith.muli %i, %c2 : index
              %frag_row = arith.addi %i2, %tile : index
              %next = vector.insert %pair, %acc2[0, 0, %frag_row] : vector<2x${E}> into !dqk_ds_frags
              scf.yield %next : !dqk_ds_frags
            } {unroll_loop}
            scf.yield %acc_i : !dqk_ds_frags
          } {unroll_loop}

          // dq += ds k: rhs [d tile][k'][e] = k[key_base + 8 k' + 2 c + e][8 d_tile + r], a transposed read of
          // the row-major K tile (ldmatrix .trans: matrix q is d tile 2 s + q / 2, k' = q mod 2), two d tiles
          // per step.
${ nv.accumulate_steps("%dq_new", "%d_steps", "%dq_iter", "!dqk_dq_acc", "%ds_frags", "!dqk_ds_frags", none, "%k_rows", "!dqk_k_rows", "%buffer", "%dq_row", "%k_swizzle_high", "%hi8", "%dq_swizzle_k", t) }
<% endmacro %>
