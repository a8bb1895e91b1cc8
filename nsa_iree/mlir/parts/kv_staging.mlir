// Part of dq_kernel.mlir and forward_kernel.mlir (`// part: kv_staging`): the first half of loop iteration t,
// which stages slot t's K and V rows into buffer t mod STAGES with 16-byte asynchronous copies (rows past the
// last visible key zero-filled, not read; each lane's copies unrolled), commits one group (empty for a skipped slot or t >= T), waits
// for the group of the slot computed in this iteration and synchronises the workgroup.
// Uses %t, %stages, %slots, %block_indices, %b, %m, %g, %last_visible_block, %pos, %tid, %lanes, %k_per_lane,
// %v_per_lane, %k, %v,
// %k_rows, %v_rows and the constants.
        %stage_buffer = arith.remui %t, %stages : index
        %t_in_range = arith.cmpi ult, %t, %slots : index
        scf.if %t_in_range {
          %block_i32 = memref.load %block_indices[%b, %m, %g, %t] : memref<?x?x${G}x${T}xi32>
          %block = arith.index_cast %block_i32 : i32 to index
          %not_negative = arith.cmpi sge, %block, %c0 : index
          %not_future = arith.cmpi sle, %block, %last_visible_block : index
          %selected = arith.andi %not_negative, %not_future : i1
          scf.if %selected {
            %key0 = arith.muli %block, %block_size : index
            %to_pos = arith.subi %pos, %key0 : index
            %visible = arith.addi %to_pos, %c1 : index
            // Item = (key j, chunk of 8 elements); lanes run along a row (coalesced).
            scf.for %i = %c0 to %k_per_lane step %c1 {
             %i_lanes = arith.muli %i, %lanes : index
             %item = arith.addi %tid, %i_lanes : index
             %in_tile = arith.cmpi ult, %item, %k_items : index
             scf.if %in_tile {
              %chunk = arith.remui %item, %k_chunks : index
              %j = arith.divui %item, %k_chunks : index
              %d0 = arith.muli %chunk, %c8 : index
              %is_visible = arith.cmpi slt, %j, %visible : index
              %count = arith.select %is_visible, %c8, %c0 : index
              %key_j = arith.addi %key0, %j : index
              %key = arith.select %is_visible, %key_j, %key0 : index
              %copy = nvgpu.device_async_copy %k[%b, %key, %g, %d0], %k_rows[%stage_buffer, %j, %d0], 8, %count ${ASYNC_COPY_HINT}
                  : !dqk_k to !dqk_k_rows
             }
            } {unroll_loop}
            scf.for %i = %c0 to %v_per_lane step %c1 {
             %i_lanes = arith.muli %i, %lanes : index
             %item = arith.addi %tid, %i_lanes : index
             %in_tile = arith.cmpi ult, %item, %v_items : index
             scf.if %in_tile {
              %chunk = arith.remui %item, %v_chunks : index
              %j = arith.divui %item, %v_chunks : index
              %e0 = arith.muli %chunk, %c8 : index
              %is_visible = arith.cmpi slt, %j, %visible : index
              %count = arith.select %is_visible, %c8, %c0 : index
              %key_j = arith.addi %key0, %j : index
              %key = arith.select %is_visible, %key_j, %key0 : index
              %copy = nvgpu.device_async_copy %v[%b, %key, %g, %e0], %v_rows[%stage_buffer, %j, %e0], 8, %count ${ASYNC_COPY_HINT}
                  : !dqk_v to !dqk_v_rows
             }
            } {unroll_loop}
          }
        }
        nvvm.cp.async.commit.group
        nvvm.cp.async.wait.group ${DQ_STAGES_MINUS_1}
        gpu.barrier

