<# Macros of the nvidia dq, forward and dkdv kernels: their function's opening, lane ids and
   ldmatrix lane addresses, and the selected-block test. #>

<# The kernel function `name`'s opening: the unroll/lowering pipeline, `lanes` x 1 x 1 workgroups of subgroups of
   subgroup_size lanes, at least min_workgroups workgroups per multiprocessor. #>
<% macro func_open(name, lanes, subgroup_size, min_workgroups) %>
    func.func @${name}() attributes {translation_info = #iree_codegen.translation_info<
        pipeline = #iree_codegen.pass_pipeline<"iree-codegen-unroll-annotated-loops,canonicalize,cse,iree-gpu-unroll-to-intrinsics,canonicalize,cse,iree-gpu-lower-ops,canonicalize,cse">
        workgroup_size = [${lanes}, 1, 1] subgroup_size = ${subgroup_size}>,
        nvvm.minctasm = ${min_workgroups} : i32} {
<% endmacro %>

<# The lane's ids in an mma fragment: %tid, %subgroup, %lane in it, %r = lane / 4, %c = lane % 4, %c2x = 2 c
   (needs %subgroup_size). #>
<% macro lane_ids() %>
      %tid = gpu.thread_id x
      %subgroup = arith.divui %tid, %subgroup_size : index
      %lane = arith.remui %tid, %subgroup_size : index
      %r = arith.divui %lane, %c4 : index
      %c = arith.remui %lane, %c4 : index
      %c2x = arith.muli %c, %c2 : index
<% endmacro %>

<# ldmatrix: lanes 8 q .. 8 q + 7 give the row addresses of 8x8 matrix q of the four; defines %matrix_row (the
   lane's row in its matrix) and %lo8, %hi8 (8 (q mod 2), 8 (q / 2)). #>
<% macro ldmatrix_lanes() %>
      %matrix = arith.divui %lane, %c8 : index
      %matrix_row = arith.remui %lane, %c8 : index
      %matrix_lo = arith.remui %matrix, %c2 : index
      %matrix_hi = arith.divui %matrix, %c2 : index
      %lo8 = arith.muli %matrix_lo, %c8 : index
      %hi8 = arith.muli %matrix_hi, %c8 : index
<% endmacro %>

<# Whether slot `slot` of row (%b, %m, %g) names a block (not -1) that is not in the future: defines %block and
   `selected` (i1). #>
<% macro selected_block(slot, selected) %>
          %block_i32 = memref.load %block_indices[%b, %m, %g, ${slot}] : memref<?x?x${G}x${T}xi32>
          %block = arith.index_cast %block_i32 : i32 to index
          %not_negative = arith.cmpi sge, %block, %c0 : index
          %not_future = arith.cmpi sle, %block, %last_visible_block : index
          ${selected} = arith.andi %not_negative, %not_future : i1
<% endmacro %>

<# The row computed in iteration %t of a pipeline %lag iterations deep: %has_previous (t >= lag), `row` =
   t - lag (0 before) and its %buffer (row mod %stages). #>
<% macro previous(row) %>
        %has_previous = arith.cmpi uge, %t, %lag : index
        %previous = arith.select %has_previous, %t, %lag : index
        ${row} = arith.subi %previous, %lag : index
        %buffer = arith.remui ${row}, %stages : index
<% endmacro %>
