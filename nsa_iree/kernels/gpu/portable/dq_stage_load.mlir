// Part of dq_portable.mlir and onepass_portable.mlir, first in the slot loop: slot t's block (-1 when
// skipped) and its K and V rows loaded into registers (%k_staged, %v_staged).
        // Slot t: its block, or -1 when skipped (or t = T).
        %t_in_range = arith.cmpi ult, %t, %slots : index
        %block = scf.if %t_in_range -> (index) {
          %block_i32 = memref.load %block_indices[%b, %m, %g, %t] : memref<?x?x${G}x${T}xi32>
          %i = arith.index_cast %block_i32 : i32 to index
          %not_negative = arith.cmpi sge, %i, %c0 : index
          %not_future = arith.cmpi sle, %i, %last_visible_block : index
          %selected = arith.andi %not_negative, %not_future : i1
          %i_or_none = arith.select %selected, %i, %block_none : index
          scf.yield %i_or_none : index
        } else {
          scf.yield %block_none : index
        }
        %stage = arith.cmpi sge, %block, %c0 : index
        %key0 = arith.muli %block, %block_size : index
        %to_pos = arith.subi %pos, %key0 : index
        %visible = arith.addi %to_pos, %c1 : index
        // Chunk c of the K block is (key c mod BS, elements 8 (c / BS) ..): consecutive lanes take
        // consecutive keys, so the transposed copy's 16-bit stores are consecutive.
        %k_staged, %v_staged = scf.if %stage -> (!dqp_k_staged, !dqp_v_staged) {
          %ks = scf.for %i = %c0 to %k_per_lane step %c1 iter_args(%acc = %k_none) -> (!dqp_k_staged) {
            %i_lanes = arith.muli %i, %lanes : index
            %c = arith.addi %tid, %i_lanes : index
            %j = arith.remui %c, %block_size : index
            %chunk = arith.divui %c, %block_size : index
            %d0 = arith.muli %chunk, %c8 : index
            %in_tile = arith.cmpi ult, %c, %k_chunks : index
            %is_visible = arith.cmpi slt, %j, %visible : index
            %read = arith.andi %in_tile, %is_visible : i1
            %x = scf.if %read -> (vector<8x${E}>) {
              %key = arith.addi %key0, %j : index
              %y = vector.load %k[%b, %key, %g, %d0] : !dqp_k, vector<8x${E}>
              scf.yield %y : vector<8x${E}>
            } else {
              scf.yield %zero_chunk : vector<8x${E}>
            }
            %next = vector.insert %x, %acc[%i] : vector<8x${E}> into !dqp_k_staged
            scf.yield %next : !dqp_k_staged
          } {unroll_loop}
          %vs = scf.for %i = %c0 to %v_per_lane step %c1 iter_args(%acc = %v_none) -> (!dqp_v_staged) {
            %i_lanes = arith.muli %i, %lanes : index
            %c = arith.addi %tid, %i_lanes : index
            %j = arith.remui %c, %block_size : index
            %chunk = arith.divui %c, %block_size : index
            %e0 = arith.muli %chunk, %c8 : index
            %in_tile = arith.cmpi ult, %c, %v_chunks : index
            %is_visible = arith.cmpi slt, %j, %visible : index
            %read = arith.andi %in_tile, %is_visible : i1
            %x = scf.if %read -> (vector<8x${E}>) {
              %key = arith.addi %key0, %j : index
              %y = vector.load %v[%b, %key, %g, %e0] : !dqp_v, vector<8x${E}>
              scf.yield %y : vector<8x${E}>
            } else {
              scf.yield %zero_chunk : vector<8x${E}>
            }
            %next = vector.insert %x, %acc[%i] : vector<8x${E}> into !dqp_v_staged
            scf.yield %next : !dqp_v_staged
          } {unroll_loop}
          scf.yield %ks, %vs : !dqp_k_staged, !dqp_v_staged
        } else {
          scf.yield %k_none, %v_none : !dqp_k_staged, !dqp_v_staged
        }

