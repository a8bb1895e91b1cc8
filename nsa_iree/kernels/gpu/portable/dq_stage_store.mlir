// Part of dq_portable.mlir and onepass_portable.mlir, last in the slot loop: slot t's K (rows and
// transposed) and V rows from registers into workgroup memory, between two barriers.
        // Slot t's rows into workgroup memory, once every subgroup is done with slot t - 1's.
<# part: takes units #>
        gpu.barrier
        scf.if %stage {
          ${ units.store_rows("%k_per_lane", "%k_chunks", "%k_staged", "!dqp_k_staged", "%block_size", "%k_rows", "!dqp_k_rows", "%k_cols", "!dqp_k_cols") }
          ${ units.store_rows("%v_per_lane", "%v_chunks", "%v_staged", "!dqp_v_staged", "%block_size", "%v_rows", "!dqp_v_rows", none, none) }
        }
        gpu.barrier
