// Part of dq_portable.mlir and onepass_portable.mlir: q and do as register fragments, the (lse, delta) of
// each accumulator element's head, and pos(m). Uses the bindings, %lane, %h0 and the constants.
      // q and do as lhs fragments over all of D (Dv), loaded once from global memory: read j of unit u is
      // head run_major(l, j), columns u K + run_k(l, j) ...; padding heads (>= HPG) are zeros.
<# part: takes u, units #>
<% import "common/rules.mlir" as rules %>
${ units.head_units("%q_units", "%d_units", "!dqp_q_units", "%q", "!dqp_q", u) }
${ units.head_units("%do_units", "%dv_units", "!dqp_do_units", "%do", "!dqp_do", u) }

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
      ${ rules.offset() }
      ${ rules.position() }
      ${ rules.last_block("last_visible_block") }

