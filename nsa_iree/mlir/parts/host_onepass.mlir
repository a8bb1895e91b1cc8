// Part of onepass.mlir and onepass_portable.mlir (`// part: host_onepass`): the host
// function, one text for both; it dispatches its template's executable (${EXECUTABLE}: nsa_iree/render.py).
func.func @selection_attention_onepass(%q: tensor<?x?x${H}x${D}x${E}>, %k: tensor<?x?x${G}x${D}x${E}>,
    %v: tensor<?x?x${G}x${DV}x${E}>, %block_indices: tensor<?x?x${G}x${T}xi32>, %lse: tensor<?x${H}x?xf32>,
    %delta: tensor<?x?x${H}xf32>, %do: tensor<?x?x${H}x${DV}x${E}>, %scale: f32,
    %dq_out: tensor<?x?x${H}x${D}x${E}> {iree.abi.output = 0 : index},
    %dk_out: tensor<?x?x${G}x${D}x${DKV_E}> {iree.abi.output = 1 : index},
    %dv_out: tensor<?x?x${G}x${DV}x${DKV_E}> {iree.abi.output = 2 : index},
    %transients: !hal.buffer {iree.abi.transients})
    -> (tensor<?x?x${H}x${D}x${E}>, tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %kv_heads = arith.constant ${G} : index
  %head_dim = arith.constant ${D} : index
  %value_dim = arith.constant ${DV} : index
  %batch = tensor.dim %q, %c0 : tensor<?x?x${H}x${D}x${E}>
  %m_rows = tensor.dim %q, %c1 : tensor<?x?x${H}x${D}x${E}>
  %n = tensor.dim %k, %c1 : tensor<?x?x${G}x${D}x${E}>
  %kv_rows = arith.muli %batch, %n : index
  %kv_group_rows = arith.muli %kv_rows, %kv_heads : index
  %dk_size = arith.muli %kv_group_rows, %head_dim : index
  %dv_size = arith.muli %kv_group_rows, %value_dim : index
  %dkv_size = arith.addi %dk_size, %dv_size : index

  %acc_init = tensor.empty(%dkv_size) : tensor<?xf32>
  %acc_zero = linalg.fill ins(%zero : f32) outs(%acc_init : tensor<?xf32>) -> tensor<?xf32>
  %batch_i32 = arith.index_cast %batch : index to i32
  %m_rows_i32 = arith.index_cast %m_rows : index to i32
  %n_i32 = arith.index_cast %n : index to i32
  %scale_bits = arith.bitcast %scale : f32 to i32
  %acc, %dq = flow.dispatch @${EXECUTABLE}::@selection_attention_onepass_row[%m_rows, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %q, %k, %v, %block_indices, %lse, %delta, %do, %acc_zero)
      : (i32, i32, i32, i32, tensor<?x?x${H}x${D}x${E}>{%batch, %m_rows}, tensor<?x?x${G}x${D}x${E}>{%batch, %n},
         tensor<?x?x${G}x${DV}x${E}>{%batch, %n}, tensor<?x?x${G}x${T}xi32>{%batch, %m_rows},
         tensor<?x${H}x?xf32>{%batch, %m_rows}, tensor<?x?x${H}xf32>{%batch, %m_rows},
         tensor<?x?x${H}x${DV}x${E}>{%batch, %m_rows}, tensor<?xf32>{%dkv_size})
      -> (%acc_zero{%dkv_size}, tensor<?x?x${H}x${D}x${E}>{%batch, %m_rows})

  %dk_flat = tensor.extract_slice %acc[0] [%dk_size] [1] : tensor<?xf32> to tensor<?xf32>
  %dv_flat = tensor.extract_slice %acc[%dk_size] [%dv_size] [1] : tensor<?xf32> to tensor<?xf32>
  %dk_f32 = tensor.expand_shape %dk_flat [[0, 1, 2, 3]] output_shape [%batch, %n, ${G}, ${D}]
      : tensor<?xf32> into tensor<?x?x${G}x${D}xf32>
  %dv_f32 = tensor.expand_shape %dv_flat [[0, 1, 2, 3]] output_shape [%batch, %n, ${G}, ${DV}]
      : tensor<?xf32> into tensor<?x?x${G}x${DV}xf32>
  %dk_init = tensor.empty(%batch, %n) : tensor<?x?x${G}x${D}x${DKV_E}>
  %dk = linalg.generic {
      indexing_maps = [affine_map<(b, n, g, d) -> (b, n, g, d)>, affine_map<(b, n, g, d) -> (b, n, g, d)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%dk_f32 : tensor<?x?x${G}x${D}xf32>) outs(%dk_init : tensor<?x?x${G}x${D}x${DKV_E}>) {
  ^bb0(%x: f32, %out: ${DKV_E}):
    %x_e = ${DKV_TRUNCF} %x : f32 to ${DKV_E}
    linalg.yield %x_e : ${DKV_E}
  } -> tensor<?x?x${G}x${D}x${DKV_E}>
  %dv_init = tensor.empty(%batch, %n) : tensor<?x?x${G}x${DV}x${DKV_E}>
  %dv = linalg.generic {
      indexing_maps = [affine_map<(b, n, g, e) -> (b, n, g, e)>, affine_map<(b, n, g, e) -> (b, n, g, e)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%dv_f32 : tensor<?x?x${G}x${DV}xf32>) outs(%dv_init : tensor<?x?x${G}x${DV}x${DKV_E}>) {
  ^bb0(%x: f32, %out: ${DKV_E}):
    %x_e = ${DKV_TRUNCF} %x : f32 to ${DKV_E}
    linalg.yield %x_e : ${DKV_E}
  } -> tensor<?x?x${G}x${DV}x${DKV_E}>
  return %dq, %dk, %dv : tensor<?x?x${H}x${D}x${E}>, tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>
}
