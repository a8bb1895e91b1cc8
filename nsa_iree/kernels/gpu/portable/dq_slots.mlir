// Part of dq.mlir and onepass.mlir: the slot loop (iteration t loads slot t's K and V rows into registers,
// computes slot t - 1 from workgroup memory, then stores the registers there for iteration t + 1), and dq
// written after it; with `onepass`, slot t - 1 also adds its dk and dv (onepass.mlir: key_contributions).
<# part: takes key_contributions, onepass, u, units #>
      %dq_init = arith.constant dense<0.0> : !dqp_dq_units
      %k_none = arith.constant dense<0.0> : !dqp_k_staged
      %v_none = arith.constant dense<0.0> : !dqp_v_staged
      %block_none = arith.constant -1 : index
      %dq_acc, %last_block = scf.for %t = %c0 to %steps step %c1 iter_args(%dq_iter = %dq_init, %previous = %block_none)
          -> (!dqp_dq_units, index) {
        <% include "gpu/portable/dq_stage_load.mlir" %>
        // Slot t - 1 (its rows are in workgroup memory).
        %compute = arith.cmpi sge, %previous, %c0 : index
        %dq_next = scf.if %compute -> (!dqp_dq_units) {
          <% include "gpu/portable/dq_scores.mlir" %>
<% if onepass %>
          // p^T and ds^T go into the K and V rows just read (onepass.mlir): every lane's reads before any write,
          // stated as a barrier (the order through the matrix instruction's operands is one no checker sees).
          gpu.barrier
<% endif %>
          // ds (one-pass: and p), element by element: element i is head acc_row(l, i), key key_base + acc_col(l, i).
          ${ units.ds_elements(u, onepass) }
          gpu.barrier

          <% include "gpu/portable/dq_update.mlir" %>
<% if onepass %>

          ${ key_contributions() }
<% endif %>
          scf.yield %dq_new : !dqp_dq_units
        } else {
          scf.yield %dq_iter : !dqp_dq_units
        }

        <% include "gpu/portable/dq_stage_store.mlir" %>
        scf.yield %dq_next, %block : !dqp_dq_units, index
      }

      <% include "gpu/portable/dq_write.mlir" %>
