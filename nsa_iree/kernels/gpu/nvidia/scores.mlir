// Part of dq_kernel.mlir and forward_kernel.mlir (`// part: scores`): s = q k^T over this subgroup's 16
// keys of the block in %buffer, one 16-d step per ldmatrix (matrix q is key tile q / 2, k' = q mod 2) and
// two mma, so one step's fragments are live at a time. Uses %q_frags, %k_rows, %buffer, %score_row,
// %score_swizzle_k, %k_swizzle_high, %lo8, %scores_zero; defines %s_acc.
          %s_acc = scf.for %s = %c0 to %d_steps step %c1 iter_args(%acc = %scores_zero) -> (!dqk_scores) {
            %col0 = arith.muli %s, %c16 : index
            // col0 + lane column with its chunk XOR-swizzled inside its group (kept additive in s, so
            // the unrolled steps share (mask + 1) / 2 lane addresses plus immediates)
            %col_high = arith.andi %col0, %k_swizzle_high : index
            %col_low = arith.subi %col0, %col_high : index
            %col_lane = arith.addi %col_low, %lo8 : index
            %col_swizzled = arith.xori %col_lane, %score_swizzle_k : index
            %col = arith.addi %col_high, %col_swizzled : index
            %x = nvgpu.ldmatrix %k_rows[%buffer, %score_row, %col] numTiles = 4 transpose = false
                : !dqk_k_rows -> vector<4x2x${E}>
            %rhs = vector.shape_cast %x : vector<4x2x${E}> to !dqk_rhs_step
            %lhs0 = vector.extract %q_frags[0, %s] : vector<4x2x${E}> from !dqk_q_frags
            %lhs = vector.shape_cast %lhs0 : vector<4x2x${E}> to !dqk_lhs_step
            %next = iree_codegen.inner_tiled ins(%lhs, %rhs) outs(%acc) <
              indexing_maps = #dqk_contraction,
              iterator_types = [#linalg.iterator_type<parallel>, #linalg.iterator_type<parallel>, #linalg.iterator_type<reduction>],
              kind = #iree_gpu.mma_layout<${MMA_KIND}>,
              semantics = #iree_gpu.mma_semantics<distributed = true, opaque = false>
            > : !dqk_lhs_step, !dqk_rhs_step into !dqk_scores
            scf.yield %next : !dqk_scores
          } {unroll_loop}
