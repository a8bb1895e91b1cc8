// Part of dq_portable.mlir and onepass_portable.mlir, after the ds tile is written and the workgroup
// synchronised: dq += ds k for this subgroup's d tiles (%dq_new).
          // dq += ds k for this subgroup's d tiles: lhs read j is ds row run_major(l, j), keys
          // u K + run_k(l, j) ...; rhs read j is the transposed K's row (d) 16 tile + run_major(l, j).
<# part: takes RUN, u, units #>
          %dq_new = scf.for %x_unit = %c0 to %dq_units step %c1 iter_args(%acc = %dq_iter) -> (!dqp_dq_units) {
            %x_sub = arith.muli %x_unit, %subgroups : index
            %tile = arith.addi %subgroup, %x_sub : index
            %mine = arith.cmpi ult, %tile, %d_tiles : index
            %updated = scf.if %mine -> (!dqp_dq_units) {
              %d_base = arith.muli %tile, %c16 : index
              %old_flat = vector.extract %acc[%x_unit] : !dqp_acc_flat from !dqp_dq_units
              %old = vector.shape_cast %old_flat : !dqp_acc_flat to !dqp_acc
              %sum = scf.for %u = %c0 to %key_units step %c1 iter_args(%a = %old) -> (!dqp_acc) {
                %u0 = arith.muli %u, %unit_k : index
                <% call units.read_pair("%pair", u) %>
                  %key = arith.addi %u0, %read_k : index
                  %x = vector.load %ds_tile[%read_major, %key] : !dqp_ds, vector<${RUN}x${E}>
                  %d = arith.addi %d_base, %read_major : index
                  %y = vector.load %k_cols[%d, %key] : !dqp_k_cols, vector<${RUN}x${E}>
                <% endcall %>
                %lhs_runs = vector.extract %pair[0] : !dqp_runs from !dqp_runs_pair
                %rhs_runs = vector.extract %pair[1] : !dqp_runs from !dqp_runs_pair
                %lhs = vector.shape_cast %lhs_runs : !dqp_runs to !dqp_lhs
                %rhs = vector.shape_cast %rhs_runs : !dqp_runs to !dqp_rhs
                ${ units.mma("%next", "%lhs", "%rhs", "%a", u) }
                scf.yield %next : !dqp_acc
              } {unroll_loop}
              %sum_flat = vector.shape_cast %sum : !dqp_acc to !dqp_acc_flat
              %next = vector.insert %sum_flat, %acc[%x_unit] : !dqp_acc_flat into !dqp_dq_units
              scf.yield %next : !dqp_dq_units
            } else {
              scf.yield %acc : !dqp_dq_units
            }
            scf.yield %updated : !dqp_dq_units
          } {unroll_loop}
