// Part of dq_kernel.mlir and forward_kernel.mlir (included by nsa_iree/render.py where a line reads
// `// part: q_fragments`): q of the subgroup's 16 rows as lhs fragments over all of D, loaded once: rows 8 i + r
// at position q_rows[i] (%m for both in the selection kernels, whose rows are one position's heads).
// Uses %q, %b, %m, %head_0, %head_1, %head_valid_0, %head_valid_1, %c2x and the constants; defines %q_frags.
<# part: takes q_rows #>
      %q_init = arith.constant dense<0.0> : !dqk_q_frags
      %q_frags = scf.for %s = %c0 to %d_steps step %c1 iter_args(%acc = %q_init) -> (!dqk_q_frags) {
        %col0 = arith.muli %s, %c16 : index
        %col1 = arith.addi %col0, %c2x : index
        %col2 = arith.addi %col1, %c8 : index
        <# Fragment element k of step s: head row 8 (k / 2) + r, column col1 (k even) or col2 = col1 + 8. #>
        <% for x, head, col in [("%x00", "0", "%col1"), ("%x01", "0", "%col2"), ("%x10", "1", "%col1"), ("%x11", "1", "%col2")] %>
        ${x} = scf.if %head_valid_${head} -> (vector<2x${E}>) {
          %x = vector.load %q[%b, ${ q_rows[head | int] }, %head_${head}, ${col}] : !dqk_q, vector<2x${E}>
          scf.yield %x : vector<2x${E}>
        } else {
          scf.yield %zero_pair : vector<2x${E}>
        }
        <% endfor %>
        %a0 = vector.insert %x00, %acc[0, %s, 0] : vector<2x${E}> into !dqk_q_frags
        %a1 = vector.insert %x01, %a0[0, %s, 1] : vector<2x${E}> into !dqk_q_frags
        %a2 = vector.insert %x10, %a1[0, %s, 2] : vector<2x${E}> into !dqk_q_frags
        %a3 = vector.insert %x11, %a2[0, %s, 3] : vector<2x${E}> into !dqk_q_frags
        scf.yield %a3 : !dqk_q_frags
      } {unroll_loop}
