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
          ${ units.stage_rows("%ks", "%k_per_lane", "%k_none", "%k_chunks", "%k", "!dqp_k", "!dqp_k_staged") }
          ${ units.stage_rows("%vs", "%v_per_lane", "%v_none", "%v_chunks", "%v", "!dqp_v", "!dqp_v_staged") }
          scf.yield %ks, %vs : !dqp_k_staged, !dqp_v_staged
        } else {
          scf.yield %k_none, %v_none : !dqp_k_staged, !dqp_v_staged
        }

