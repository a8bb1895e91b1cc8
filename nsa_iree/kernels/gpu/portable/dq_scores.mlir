// Part of dq_portable.mlir and onepass_portable.mlir, in the compute of slot t - 1: the visible-key bound
// and s = q k^T, dp = do v^T over this subgroup's 16 keys (%s_acc, %dp_acc).
          %p_key0 = arith.muli %previous, %block_size : index
          %p_to_pos = arith.subi %pos, %p_key0 : index
          %p_visible = arith.addi %p_to_pos, %c1 : index
          %acc_zero = arith.constant dense<0.0> : !dqp_acc
          // s = q k^T and dp = do v^T over this subgroup's 16 keys: rhs read j of a unit is key
          // key_base + run_major(l, j), columns u K + run_k(l, j) ...
          %s_acc = scf.for %u = %c0 to %d_units step %c1 iter_args(%acc = %acc_zero) -> (!dqp_acc) {
            %u0 = arith.muli %u, %unit_k : index
            %rhs_runs = scf.for %j = %c0 to %runs step %c1 iter_args(%r = %zero_runs) -> (!dqp_runs) {
              %kj = affine.apply #dqp_run_major(%lane, %j)
              %kk = affine.apply #dqp_run_k(%lane, %j)
              %row = arith.addi %key_base, %kj : index
              %col = arith.addi %u0, %kk : index
              %x = vector.load %k_rows[%row, %col] : !dqp_k_rows, vector<${RUN}x${E}>
              %next = vector.insert %x, %r[%j] : vector<${RUN}x${E}> into !dqp_runs
              scf.yield %next : !dqp_runs
            } {unroll_loop}
            %rhs = vector.shape_cast %rhs_runs : !dqp_runs to !dqp_rhs
            %lhs_runs = vector.extract %q_units[%u] : !dqp_runs from !dqp_q_units
            %lhs = vector.shape_cast %lhs_runs : !dqp_runs to !dqp_lhs
            %next = iree_codegen.inner_tiled ins(%lhs, %rhs) outs(%acc) <
              indexing_maps = #dqp_contraction,
              iterator_types = [#linalg.iterator_type<parallel>, #linalg.iterator_type<parallel>, #linalg.iterator_type<reduction>],
              kind = #iree_gpu.mma_layout<${MMA_KIND}>,
              semantics = #iree_gpu.mma_semantics<distributed = true, opaque = false>
            > : !dqp_lhs, !dqp_rhs into !dqp_acc
            scf.yield %next : !dqp_acc
          } {unroll_loop}
          %dp_acc = scf.for %u = %c0 to %dv_units step %c1 iter_args(%acc = %acc_zero) -> (!dqp_acc) {
            %u0 = arith.muli %u, %unit_k : index
            %rhs_runs = scf.for %j = %c0 to %runs step %c1 iter_args(%r = %zero_runs) -> (!dqp_runs) {
              %kj = affine.apply #dqp_run_major(%lane, %j)
              %kk = affine.apply #dqp_run_k(%lane, %j)
              %row = arith.addi %key_base, %kj : index
              %col = arith.addi %u0, %kk : index
              %x = vector.load %v_rows[%row, %col] : !dqp_v_rows, vector<${RUN}x${E}>
              %next = vector.insert %x, %r[%j] : vector<${RUN}x${E}> into !dqp_runs
              scf.yield %next : !dqp_runs
            } {unroll_loop}
            %rhs = vector.shape_cast %rhs_runs : !dqp_runs to !dqp_rhs
            %lhs_runs = vector.extract %do_units[%u] : !dqp_runs from !dqp_do_units
            %lhs = vector.shape_cast %lhs_runs : !dqp_runs to !dqp_lhs
            %next = iree_codegen.inner_tiled ins(%lhs, %rhs) outs(%acc) <
              indexing_maps = #dqp_contraction,
              iterator_types = [#linalg.iterator_type<parallel>, #linalg.iterator_type<parallel>, #linalg.iterator_type<reduction>],
              kind = #iree_gpu.mma_layout<${MMA_KIND}>,
              semantics = #iree_gpu.mma_semantics<distributed = true, opaque = false>
            > : !dqp_lhs, !dqp_rhs into !dqp_acc
            scf.yield %next : !dqp_acc
          } {unroll_loop}

