// Backward preprocess: delta[b, m, h] = sum_d o[b, m, h, d] * do[b, m, h, d], accumulated in f32.
// Row-major like o and do (not head-major like lse): each delta is one contiguous Dv-vector reduction, and
// both consumers read it per (row, group).
<% import "common/contraction.mlir" as contraction %>
func.func @selection_attention_delta(%o: tensor<?x?x${H}x${DV}x${E}>, %do: tensor<?x?x${H}x${DV}x${E}>,
    %transients: !hal.buffer {iree.abi.transients}) -> tensor<?x?x${H}xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %batch = tensor.dim %o, %c0 : tensor<?x?x${H}x${DV}x${E}>
  %m_rows = tensor.dim %o, %c1 : tensor<?x?x${H}x${DV}x${E}>
  %delta = flow.dispatch.region -> (tensor<?x?x${H}xf32>{%batch, %m_rows}) {
    %init = tensor.empty(%batch, %m_rows) : tensor<?x?x${H}xf32>
    %zeros = linalg.fill ins(%zero : f32) outs(%init : tensor<?x?x${H}xf32>) -> tensor<?x?x${H}xf32>
    %delta_sum = linalg.generic {
        indexing_maps = [affine_map<(b, m, h, e) -> (b, m, h, e)>, affine_map<(b, m, h, e) -> (b, m, h, e)>,
                         affine_map<(b, m, h, e) -> (b, m, h)>],
        iterator_types = ["parallel", "parallel", "parallel", "reduction"]
        ${DELTA_CONFIG}}
        ins(%o, %do : tensor<?x?x${H}x${DV}x${E}>, tensor<?x?x${H}x${DV}x${E}>) outs(%zeros : tensor<?x?x${H}xf32>) {
${ contraction.mul_add("    ") }
    } -> tensor<?x?x${H}xf32>
    flow.return %delta_sum : tensor<?x?x${H}xf32>
  }
  return %delta : tensor<?x?x${H}xf32>
}
