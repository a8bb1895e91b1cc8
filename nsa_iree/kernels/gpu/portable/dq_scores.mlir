// Part of dq_portable.mlir and onepass_portable.mlir, in the compute of slot t - 1: the visible-key bound
// and s = q k^T, dp = do v^T over this subgroup's 16 keys (%s_acc, %dp_acc).
<# part: takes u, units #>
          %p_key0 = arith.muli %previous, %block_size : index
          %p_to_pos = arith.subi %pos, %p_key0 : index
          %p_visible = arith.addi %p_to_pos, %c1 : index
          %acc_zero = arith.constant dense<0.0> : !dqp_acc
          // s = q k^T and dp = do v^T over this subgroup's 16 keys: rhs read j of a unit is key
          // key_base + run_major(l, j), columns u K + run_k(l, j) ...
${ units.unit_products("%s_acc", "%d_units", "%q_units", "!dqp_q_units", "%k_rows", "!dqp_k_rows", "%key_base", u) }
${ units.unit_products("%dp_acc", "%dv_units", "%do_units", "!dqp_do_units", "%v_rows", "!dqp_v_rows", "%key_base", u) }
