// Part of dq_portable.mlir and onepass_portable.mlir, first in the slot loop: slot t's block (-1 when
// skipped) and its K and V rows loaded into registers (%k_staged, %v_staged).
        // Slot t: its block, or -1 when skipped (or t = T).
<# part: takes units #>
        ${ units.slot_block() }
        // Chunk c of the K block is (key c mod BS, elements 8 (c / BS) ..): consecutive lanes take
        // consecutive keys, so the transposed copy's 16-bit stores are consecutive.
        %k_staged, %v_staged = scf.if %stage -> (!dqp_k_staged, !dqp_v_staged) {
          ${ units.stage_rows("%ks", "%k_per_lane", "%k_none", "%k_chunks", "%k", "!dqp_k", "!dqp_k_staged") }
          ${ units.stage_rows("%vs", "%v_per_lane", "%v_none", "%v_chunks", "%v", "!dqp_v", "!dqp_v_staged") }
          scf.yield %ks, %vs : !dqp_k_staged, !dqp_v_staged
        } else {
          scf.yield %k_none, %v_none : !dqp_k_staged, !dqp_v_staged
        }

