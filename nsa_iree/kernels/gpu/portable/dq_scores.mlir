// Part of dq_portable.mlir and onepass_portable.mlir, in the compute of slot t - 1: the visible-key bound
// and s = q k^T, dp = do v^T over this subgroup's 16 keys (%s_acc, %dp_acc).
<# part: takes u, units #>
<# With a window the row sees the block's keys from %p_first_visible (common/rules.mlir: first_key) on too, and a
   subgroup that sees none of its 16 keys skips the products (%sees false: s and dp 0, its ds masked to 0 as for any
   invisible key). #>
<% import "common/rules.mlir" as rules %>
          %p_key0 = arith.muli %previous, %block_size : index
          %p_to_pos = arith.subi %pos, %p_key0 : index
          %p_visible = arith.addi %p_to_pos, %c1 : index
          %acc_zero = arith.constant dense<0.0> : !dqp_acc
          // s = q k^T and dp = do v^T over this subgroup's 16 keys: rhs read j of a unit is key
          // key_base + run_major(l, j), columns u K + run_k(l, j) ...
<% if WINDOW != "0" %>
          ${ rules.first_key("p_first_visible", "pos", "p_key0") }
          %c15 = arith.constant 15 : index
          %key_last = arith.addi %key_base, %c15 : index
          ${ rules.key_in_range("sees", "key_base", "slt", "p_visible", "p_first_visible", j_last="key_last") }
          %s_acc, %dp_acc = scf.if %sees -> (!dqp_acc, !dqp_acc) {
${ units.unit_products("%s_seen", "%d_units", "%q_units", "!dqp_q_units", "%k_rows", "!dqp_k_rows", "%key_base", u) }
${ units.unit_products("%dp_seen", "%dv_units", "%do_units", "!dqp_do_units", "%v_rows", "!dqp_v_rows", "%key_base", u) }
            scf.yield %s_seen, %dp_seen : !dqp_acc, !dqp_acc
          } else {
            scf.yield %acc_zero, %acc_zero : !dqp_acc, !dqp_acc
          }
<% else %>
${ units.unit_products("%s_acc", "%d_units", "%q_units", "!dqp_q_units", "%k_rows", "!dqp_k_rows", "%key_base", u) }
${ units.unit_products("%dp_acc", "%dv_units", "%do_units", "!dqp_do_units", "%v_rows", "!dqp_v_rows", "%key_base", u) }
<% endif %>
