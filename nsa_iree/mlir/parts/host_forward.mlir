// Part of forward_kernel.mlir and forward_portable.mlir (`// part: host_forward`): the host
// function, one text for both; it dispatches its template's executable (${EXECUTABLE}: nsa_iree/render.py).
func.func @selection_attention_fwd(%q: tensor<?x?x${H}x${D}x${E}>, %k: tensor<?x?x${G}x${D}x${E}>,
    %v: tensor<?x?x${G}x${DV}x${E}>, %block_indices: tensor<?x?x${G}x${T}xi32>, %scale: f32,
    %o_out: tensor<?x?x${H}x${DV}x${E}> {iree.abi.output = 0 : index},
    %lse_out: tensor<?x${H}x?xf32> {iree.abi.output = 1 : index},
    %transients: !hal.buffer {iree.abi.transients})
    -> (tensor<?x?x${H}x${DV}x${E}>, tensor<?x${H}x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %kv_heads = arith.constant ${G} : index
  %batch = tensor.dim %q, %c0 : tensor<?x?x${H}x${D}x${E}>
  %m_rows = tensor.dim %q, %c1 : tensor<?x?x${H}x${D}x${E}>
  %n = tensor.dim %k, %c1 : tensor<?x?x${G}x${D}x${E}>
  %batch_i32 = arith.index_cast %batch : index to i32
  %m_rows_i32 = arith.index_cast %m_rows : index to i32
  %n_i32 = arith.index_cast %n : index to i32
  %scale_bits = arith.bitcast %scale : f32 to i32
  %o, %lse = flow.dispatch @${EXECUTABLE}::@selection_attention_fwd_row[%m_rows, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %q, %k, %v, %block_indices)
      : (i32, i32, i32, i32, tensor<?x?x${H}x${D}x${E}>{%batch, %m_rows}, tensor<?x?x${G}x${D}x${E}>{%batch, %n},
         tensor<?x?x${G}x${DV}x${E}>{%batch, %n}, tensor<?x?x${G}x${T}xi32>{%batch, %m_rows})
      -> (tensor<?x?x${H}x${DV}x${E}>{%batch, %m_rows}, tensor<?x${H}x?xf32>{%batch, %m_rows})
  return %o, %lse : tensor<?x?x${H}x${DV}x${E}>, tensor<?x${H}x?xf32>
}
