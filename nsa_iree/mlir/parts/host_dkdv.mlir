// Part of dkdv_kernel.mlir and dkdv_portable.mlir (`// part: host_dkdv`): the host
// function, one text for both; it dispatches its template's executable (${EXECUTABLE}: nsa_iree/render.py).
func.func @selection_attention_dkdv(%q: tensor<?x?x${H}x${D}x${E}>, %k: tensor<?x?x${G}x${D}x${E}>,
    %v: tensor<?x?x${G}x${DV}x${E}>, %block_indices: tensor<?x?x${G}x${T}xi32>, %lse: tensor<?x${H}x?xf32>,
    %delta: tensor<?x?x${H}xf32>, %do: tensor<?x?x${H}x${DV}x${E}>,
    %entries: tensor<?x${ROWS_PER_PIECE}x2xi32>, %piece_start: tensor<?xi32>, %piece_count: tensor<?xi32>,
    %scale: f32, %dk_out: tensor<?x?x${G}x${D}x${DKV_E}> {iree.abi.output = 0 : index},
    %dv_out: tensor<?x?x${G}x${DV}x${DKV_E}> {iree.abi.output = 1 : index},
    %transients: !hal.buffer {iree.abi.transients})
    -> (tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %batch = tensor.dim %q, %c0 : tensor<?x?x${H}x${D}x${E}>
  %m_rows = tensor.dim %q, %c1 : tensor<?x?x${H}x${D}x${E}>
  %n = tensor.dim %k, %c1 : tensor<?x?x${G}x${D}x${E}>
  %pieces = tensor.dim %entries, %c0 : tensor<?x${ROWS_PER_PIECE}x2xi32>
  %batch_i32 = arith.index_cast %batch : index to i32
  %m_rows_i32 = arith.index_cast %m_rows : index to i32
  %n_i32 = arith.index_cast %n : index to i32
  %pieces_i32 = arith.index_cast %pieces : index to i32
  %scale_bits = arith.bitcast %scale : f32 to i32
  %dk_pieces, %dv_pieces = flow.dispatch @${EXECUTABLE}::@selection_attention_dkdv_piece[%pieces](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %pieces_i32, %q, %k, %v, %block_indices, %lse, %delta, %do, %entries)
      : (i32, i32, i32, i32, i32, tensor<?x?x${H}x${D}x${E}>{%batch, %m_rows}, tensor<?x?x${G}x${D}x${E}>{%batch, %n},
         tensor<?x?x${G}x${DV}x${E}>{%batch, %n}, tensor<?x?x${G}x${T}xi32>{%batch, %m_rows},
         tensor<?x${H}x?xf32>{%batch, %m_rows}, tensor<?x?x${H}xf32>{%batch, %m_rows},
         tensor<?x?x${H}x${DV}x${E}>{%batch, %m_rows}, tensor<?x${ROWS_PER_PIECE}x2xi32>{%pieces})
      -> (tensor<?x${BS}x${D}xf32>{%pieces}, tensor<?x${BS}x${DV}xf32>{%pieces})
  %dk, %dv = func.call @dkdv_piece_sums(%dk_pieces, %dv_pieces, %piece_start, %piece_count, %batch, %n)
      : (tensor<?x${BS}x${D}xf32>, tensor<?x${BS}x${DV}xf32>, tensor<?xi32>, tensor<?xi32>, index, index)
      -> (tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>)
  return %dk, %dv : tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>
}
