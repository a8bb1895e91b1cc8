// Part of dq_portable.mlir and onepass_portable.mlir: q and do as register fragments, the (lse, delta) of
// each accumulator element's head, and pos(m). Uses the bindings, %lane, %h0 and the constants.
      // q and do as lhs fragments over all of D (Dv), loaded once from global memory: read j of unit u is
      // head run_major(l, j), columns u K + run_k(l, j) ...; padding heads (>= HPG) are zeros.
      %q_init = arith.constant dense<0.0> : !dqp_q_units
      %q_units = scf.for %u = %c0 to %d_units step %c1 iter_args(%acc = %q_init) -> (!dqp_q_units) {
        %acc_u = scf.for %j = %c0 to %runs step %c1 iter_args(%acc2 = %acc) -> (!dqp_q_units) {
          %h = affine.apply #dqp_run_major(%lane, %j)
          %kk = affine.apply #dqp_run_k(%lane, %j)
          %u0 = arith.muli %u, %unit_k : index
          %col = arith.addi %u0, %kk : index
          %real = arith.cmpi ult, %h, %heads_per_group : index
          %x = scf.if %real -> (vector<${RUN}x${E}>) {
            %head = arith.addi %h0, %h : index
            %y = vector.load %q[%b, %m, %head, %col] : !dqp_q, vector<${RUN}x${E}>
            scf.yield %y : vector<${RUN}x${E}>
          } else {
            scf.yield %zero_run : vector<${RUN}x${E}>
          }
          %next = vector.insert %x, %acc2[%u, %j] : vector<${RUN}x${E}> into !dqp_q_units
          scf.yield %next : !dqp_q_units
        } {unroll_loop}
        scf.yield %acc_u : !dqp_q_units
      } {unroll_loop}
      %do_init = arith.constant dense<0.0> : !dqp_do_units
      %do_units = scf.for %u = %c0 to %dv_units step %c1 iter_args(%acc = %do_init) -> (!dqp_do_units) {
        %acc_u = scf.for %j = %c0 to %runs step %c1 iter_args(%acc2 = %acc) -> (!dqp_do_units) {
          %h = affine.apply #dqp_run_major(%lane, %j)
          %kk = affine.apply #dqp_run_k(%lane, %j)
          %u0 = arith.muli %u, %unit_k : index
          %col = arith.addi %u0, %kk : index
          %real = arith.cmpi ult, %h, %heads_per_group : index
          %x = scf.if %real -> (vector<${RUN}x${E}>) {
            %head = arith.addi %h0, %h : index
            %y = vector.load %do[%b, %m, %head, %col] : !dqp_do, vector<${RUN}x${E}>
            scf.yield %y : vector<${RUN}x${E}>
          } else {
            scf.yield %zero_run : vector<${RUN}x${E}>
          }
          %next = vector.insert %x, %acc2[%u, %j] : vector<${RUN}x${E}> into !dqp_do_units
          scf.yield %next : !dqp_do_units
        } {unroll_loop}
        scf.yield %acc_u : !dqp_do_units
      } {unroll_loop}

      // lse and delta of the head of each accumulator element (0 for padding heads, whose ds is masked).
      %stats_init = arith.constant dense<0.0> : !dqp_acc_flat
      %lse_e, %delta_e = scf.for %i = %c0 to %acc_n step %c1 iter_args(%l_acc = %stats_init, %d_acc = %stats_init)
          -> (!dqp_acc_flat, !dqp_acc_flat) {
        %h = affine.apply #dqp_acc_row(%lane, %i)
        %real = arith.cmpi ult, %h, %heads_per_group : index
        %head = arith.addi %h0, %h : index
        %l, %dl = scf.if %real -> (f32, f32) {
          %x = memref.load %lse[%b, %head, %m] : memref<?x${H}x?xf32>
          %y = memref.load %delta[%b, %m, %head] : memref<?x?x${H}xf32>
          scf.yield %x, %y : f32, f32
        } else {
          scf.yield %zero, %zero : f32, f32
        }
        %l_next = vector.insert %l, %l_acc[%i] : f32 into !dqp_acc_flat
        %d_next = vector.insert %dl, %d_acc[%i] : f32 into !dqp_acc_flat
        scf.yield %l_next, %d_next : !dqp_acc_flat, !dqp_acc_flat
      } {unroll_loop}

      // pos(m) = m + N - M (bottom-right alignment); signed, in index arithmetic.
      %offset = arith.subi %n, %m_rows : index
      %pos = arith.addi %m, %offset : index
      %last_visible_block = arith.floordivsi %pos, %block_size : index

