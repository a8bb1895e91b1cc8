// Part of dq_portable.mlir and onepass_portable.mlir, last in the slot loop: slot t's K (rows and
// transposed) and V rows from registers into workgroup memory, between two barriers.
        // Slot t's rows into workgroup memory, once every subgroup is done with slot t - 1's.
        gpu.barrier
        scf.if %stage {
          scf.for %i = %c0 to %k_per_lane step %c1 {
            %i_lanes = arith.muli %i, %lanes : index
            %c = arith.addi %tid, %i_lanes : index
            %in_tile = arith.cmpi ult, %c, %k_chunks : index
            scf.if %in_tile {
              %j = arith.remui %c, %block_size : index
              %chunk = arith.divui %c, %block_size : index
              %d0 = arith.muli %chunk, %c8 : index
              %x = vector.extract %k_staged[%i] : vector<8x${E}> from !dqp_k_staged
              vector.store %x, %k_rows[%j, %d0] : !dqp_k_rows, vector<8x${E}>
              scf.for %e = %c0 to %c8 step %c1 {
                %y = vector.extract %x[%e] : ${E} from vector<8x${E}>
                %d = arith.addi %d0, %e : index
                memref.store %y, %k_cols[%d, %j] : !dqp_k_cols
              } {unroll_loop}
            }
          } {unroll_loop}
          scf.for %i = %c0 to %v_per_lane step %c1 {
            %i_lanes = arith.muli %i, %lanes : index
            %c = arith.addi %tid, %i_lanes : index
            %in_tile = arith.cmpi ult, %c, %v_chunks : index
            scf.if %in_tile {
              %j = arith.remui %c, %block_size : index
              %chunk = arith.divui %c, %block_size : index
              %e0 = arith.muli %chunk, %c8 : index
              %x = vector.extract %v_staged[%i] : vector<8x${E}> from !dqp_v_staged
              vector.store %x, %v_rows[%j, %e0] : !dqp_v_rows, vector<8x${E}>
            }
          } {unroll_loop}
        }
        gpu.barrier
