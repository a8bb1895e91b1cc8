// Backward preprocess: delta[b, h, m] = sum_d o[b, m, h, d] * do[b, m, h, d], accumulated in f32.
func.func @selection_attention_delta(%o: tensor<?x?x${H}x${DV}x${E}>, %do: tensor<?x?x${H}x${DV}x${E}>,
    %transients: !hal.buffer {iree.abi.transients}) -> tensor<?x${H}x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %batch = tensor.dim %o, %c0 : tensor<?x?x${H}x${DV}x${E}>
  %m_rows = tensor.dim %o, %c1 : tensor<?x?x${H}x${DV}x${E}>
  %init = tensor.empty(%batch, %m_rows) : tensor<?x${H}x?xf32>
  %zeros = linalg.fill ins(%zero : f32) outs(%init : tensor<?x${H}x?xf32>) -> tensor<?x${H}x?xf32>
  %delta = linalg.generic {
      indexing_maps = [affine_map<(b, h, m, e) -> (b, m, h, e)>, affine_map<(b, h, m, e) -> (b, m, h, e)>,
                       affine_map<(b, h, m, e) -> (b, h, m)>],
      iterator_types = ["parallel", "parallel", "parallel", "reduction"]}
      ins(%o, %do : tensor<?x?x${H}x${DV}x${E}>, tensor<?x?x${H}x${DV}x${E}>) outs(%zeros : tensor<?x${H}x?xf32>) {
  ^bb0(%x: ${E}, %y: ${E}, %acc: f32):
    %x32 = ${EXTF} %x : ${E} to f32
    %y32 = ${EXTF} %y : ${E} to f32
    %xy = arith.mulf %x32, %y32 : f32
    %sum = arith.addf %acc, %xy : f32
    linalg.yield %sum : f32
  } -> tensor<?x${H}x?xf32>
  return %delta : tensor<?x${H}x?xf32>
}
