<# Macros of the nvidia dq, forward and dkdv kernels: 16-column steps that read one operand from XOR-swizzled
   workgroup rows with ldmatrix and multiply it on the tensor cores (iree_codegen.inner_tiled). #>

<# The rhs of 16-column step %s: column col0 = 16 s plus the lane's column `lane` (%lo8 or %hi8), its chunk
   XOR-swizzled (`swizzle`) inside its group (kept additive in s, so the unrolled steps share (mask + 1) / 2 lane
   addresses plus immediates: `high` masks the bits above the group), read from rows[buffer, row, col] with
   ldmatrix (`transpose`: true or false); defines %rhs of type rhs_type. #>
<% macro rhs_step(rows, rows_type, buffer, row, high, lane, swizzle, transpose, rhs_type) %>
            %col0 = arith.muli %s, %c16 : index
            %col_high = arith.andi %col0, ${high} : index
            %col_low = arith.subi %col0, %col_high : index
            %col_lane = arith.addi %col_low, ${lane} : index
            %col_swizzled = arith.xori %col_lane, ${swizzle} : index
            %col = arith.addi %col_high, %col_swizzled : index
            %step_x = nvgpu.ldmatrix ${rows}[${buffer}, ${row}, %col] numTiles = 4 transpose = ${transpose}
                : ${rows_type} -> vector<4x2x${E}>
            %rhs = vector.shape_cast %step_x : vector<4x2x${E}> to ${rhs_type}
<% endmacro %>

<# result = lhs rhs + acc on the tensor cores: the contraction map and mma kind of the kernel, the three types. #>
<% macro mma(result, lhs, rhs, acc, contraction, kind, lhs_type, rhs_type, acc_type) %>
            ${result} = iree_codegen.inner_tiled ins(${lhs}, ${rhs}) outs(${acc}) <
              indexing_maps = ${contraction},
              iterator_types = [#linalg.iterator_type<parallel>, #linalg.iterator_type<parallel>, #linalg.iterator_type<reduction>],
              kind = #iree_gpu.mma_layout<${kind}>,
              semantics = #iree_gpu.mma_semantics<distributed = true, opaque = false>
            > : ${lhs_type}, ${rhs_type} into ${acc_type}
<% endmacro %>

<# result = sum over `steps` 16-column steps of lhs fragment [0, s] of `frags` (frags_type) times the rhs of
   rhs_step (rows, rows_type, buffer, row, high, lane, swizzle, not transposed), from `zero`; one step's fragments
   live at a time. `t` names the kernel's types: t.lhs, t.rhs, t.acc, t.contraction, t.kind. #>
<% macro score_steps(result, steps, zero, frags, frags_type, rows, rows_type, buffer, row, high, lane, swizzle, t) %>
          ${result} = scf.for %s = %c0 to ${steps} step %c1 iter_args(%acc = ${zero}) -> (${t.acc}) {
${ rhs_step(rows, rows_type, buffer, row, high, lane, swizzle, "false", t.rhs) }
            %lhs0 = vector.extract ${frags}[0, %s] : vector<4x2x${E}> from ${frags_type}
            %lhs = vector.shape_cast %lhs0 : vector<4x2x${E}> to ${t.lhs}
${ mma("%next", "%lhs", "%rhs", "%acc", t.contraction, t.kind, t.lhs, t.rhs, t.acc) }
            scf.yield %next : ${t.acc}
          } {unroll_loop}
<% endmacro %>

<# result = init + lhs (lhs_type) times rows read transposed, two column tiles of the accumulator (acc_type)
   per step over `steps` steps: the rhs of rhs_step (rows, rows_type, buffer, row, high, lane, swizzle,
   transposed), the tiles 2 s and 2 s + 1 taken through a t.acc pair (from `zero`, or none: a zero made in
   the loop) and put back. #>
<% macro accumulate_steps(result, steps, init, acc_type, lhs, lhs_type, zero, rows, rows_type, buffer, row, high, lane, swizzle, t) %>
          ${result} = scf.for %s = %c0 to ${steps} step %c1 iter_args(%acc = ${init}) -> (${acc_type}) {
${ rhs_step(rows, rows_type, buffer, row, high, lane, swizzle, "true", t.rhs) }
            %s2 = arith.muli %s, %c2 : index
            %s2_1 = arith.addi %s2, %c1 : index
            %acc0 = vector.extract %acc[0, %s2] : vector<2x2xf32> from ${acc_type}
            %acc1 = vector.extract %acc[0, %s2_1] : vector<2x2xf32> from ${acc_type}
<% if zero is none %>
            %pair0 = arith.constant dense<0.0> : ${t.acc}
<% endif %>
            %pair1 = vector.insert %acc0, ${zero or "%pair0"}[0, 0] : vector<2x2xf32> into ${t.acc}
            %pair = vector.insert %acc1, %pair1[0, 1] : vector<2x2xf32> into ${t.acc}
${ mma("%out", lhs, "%rhs", "%pair", t.contraction, t.kind, lhs_type, t.rhs, t.acc) }
            %out0 = vector.extract %out[0, 0] : vector<2x2xf32> from ${t.acc}
            %out1 = vector.extract %out[0, 1] : vector<2x2xf32> from ${t.acc}
            %next0 = vector.insert %out0, %acc[0, %s2] : vector<2x2xf32> into ${acc_type}
            %next = vector.insert %out1, %next0[0, %s2_1] : vector<2x2xf32> into ${acc_type}
            scf.yield %next : ${acc_type}
          } {unroll_loop}
<% endmacro %>
