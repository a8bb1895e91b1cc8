// Forward: o [B, M, H, Dv] and lse [B, H, M] (f32, natural log).
// The selected K/V blocks are gathered with iree_linalg_ext.gather straight into online_attention, so IREE
// fuses the gather into the attention dispatch and never materialises gathered K/V.
// online_attention returns an unnormalised accumulator, the running max and the running sum; IREE's
// decomposition works in base 2 (scores scaled by log2(e)), so lse = max * ln(2) + log(sum).
// A row with no visible key has sum == 0: o = 0 and lse = -inf (semantics.md, empty rows).
func.func @selection_attention_fwd(%q: tensor<?x?x${H}x${D}x${E}>, %k: tensor<?x?x${G}x${D}x${E}>,
    %v: tensor<?x?x${G}x${DV}x${E}>, %block_indices: tensor<?x?x${G}x${T}xi32>, %scale: f32)
    -> (tensor<?x?x${H}x${DV}x${E}>, tensor<?x${H}x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %lowest = arith.constant -3.40282347e+38 : f32
  %neg_inf = arith.constant 0xFF800000 : f32
  %ln2 = arith.constant 0.693147180559945309 : f32
  %batch = tensor.dim %q, %c0 : tensor<?x?x${H}x${D}x${E}>
  %m_rows = tensor.dim %q, %c1 : tensor<?x?x${H}x${D}x${E}>
  %n = tensor.dim %k, %c1 : tensor<?x?x${G}x${D}x${E}>

  %key_blocks, %value_blocks = func.call @kv_blocks(%k, %v)
      : (tensor<?x?x${G}x${D}x${E}>, tensor<?x?x${G}x${DV}x${E}>) -> (tensor<?x${BS}x${D}x${E}>, tensor<?x${BS}x${DV}x${E}>)
  %block_gather_index, %key_mask = func.call @selected_slots(%block_indices, %n)
      : (tensor<?x?x${G}x${T}xi32>, index) -> (tensor<?x?x${G}x${T}xi32>, tensor<?x?x${G}x${T}x${BS}xi1>)

  %kg_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${T}x${BS}x${D}x${E}>
  %gathered_k = iree_linalg_ext.gather dimension_map = [0]
      ins(%key_blocks, %block_gather_index : tensor<?x${BS}x${D}x${E}>, tensor<?x?x${G}x${T}xi32>)
      outs(%kg_init : tensor<?x?x${G}x${T}x${BS}x${D}x${E}>) -> tensor<?x?x${G}x${T}x${BS}x${D}x${E}>
  %vg_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${T}x${BS}x${DV}x${E}>
  %gathered_v = iree_linalg_ext.gather dimension_map = [0]
      ins(%value_blocks, %block_gather_index : tensor<?x${BS}x${DV}x${E}>, tensor<?x?x${G}x${T}xi32>)
      outs(%vg_init : tensor<?x?x${G}x${T}x${BS}x${DV}x${E}>) -> tensor<?x?x${G}x${T}x${BS}x${DV}x${E}>

  %q_grouped = tensor.expand_shape %q [[0], [1], [2, 3], [4]] output_shape [%batch, %m_rows, ${G}, ${HPG}, ${D}]
      : tensor<?x?x${H}x${D}x${E}> into tensor<?x?x${G}x${HPG}x${D}x${E}>

  %acc_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${HPG}x${DV}xf32>
  %acc_zero = linalg.fill ins(%zero : f32) outs(%acc_init : tensor<?x?x${G}x${HPG}x${DV}xf32>) -> tensor<?x?x${G}x${HPG}x${DV}xf32>
  %row_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${HPG}xf32>
  %max_init = linalg.fill ins(%lowest : f32) outs(%row_init : tensor<?x?x${G}x${HPG}xf32>) -> tensor<?x?x${G}x${HPG}xf32>
  %sum_init = linalg.fill ins(%zero : f32) outs(%row_init : tensor<?x?x${G}x${HPG}xf32>) -> tensor<?x?x${G}x${HPG}xf32>
  %acc, %max, %sum = iree_linalg_ext.online_attention <{indexing_maps = [
        affine_map<(b, m, g, h, t, j, d, e) -> (b, m, g, h, d)>,
        affine_map<(b, m, g, h, t, j, d, e) -> (b, m, g, t, j, d)>,
        affine_map<(b, m, g, h, t, j, d, e) -> (b, m, g, t, j, e)>,
        affine_map<(b, m, g, h, t, j, d, e) -> ()>,
        affine_map<(b, m, g, h, t, j, d, e) -> (b, m, g, t, j)>,
        affine_map<(b, m, g, h, t, j, d, e) -> (b, m, g, h, e)>,
        affine_map<(b, m, g, h, t, j, d, e) -> (b, m, g, h)>,
        affine_map<(b, m, g, h, t, j, d, e) -> (b, m, g, h)>]}>
      ins(%q_grouped, %gathered_k, %gathered_v, %scale, %key_mask
          : tensor<?x?x${G}x${HPG}x${D}x${E}>, tensor<?x?x${G}x${T}x${BS}x${D}x${E}>,
            tensor<?x?x${G}x${T}x${BS}x${DV}x${E}>, f32, tensor<?x?x${G}x${T}x${BS}xi1>)
      outs(%acc_zero, %max_init, %sum_init
          : tensor<?x?x${G}x${HPG}x${DV}xf32>, tensor<?x?x${G}x${HPG}xf32>, tensor<?x?x${G}x${HPG}xf32>) {
  ^bb0(%score: f32):
    iree_linalg_ext.yield %score : f32
  } -> tensor<?x?x${G}x${HPG}x${DV}xf32>, tensor<?x?x${G}x${HPG}xf32>, tensor<?x?x${G}x${HPG}xf32>

  %o_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${HPG}x${DV}x${E}>
  %o_grouped = linalg.generic {
      indexing_maps = [affine_map<(b, m, g, h, e) -> (b, m, g, h, e)>, affine_map<(b, m, g, h, e) -> (b, m, g, h)>,
                       affine_map<(b, m, g, h, e) -> (b, m, g, h, e)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]}
      ins(%acc, %sum : tensor<?x?x${G}x${HPG}x${DV}xf32>, tensor<?x?x${G}x${HPG}xf32>)
      outs(%o_init : tensor<?x?x${G}x${HPG}x${DV}x${E}>) {
  ^bb0(%a: f32, %s: f32, %out: ${E}):
    %empty_row = arith.cmpf oeq, %s, %zero : f32
    %normalised = arith.divf %a, %s : f32
    %value = arith.select %empty_row, %zero, %normalised : f32
    %cast = ${TRUNCF} %value : f32 to ${E}
    linalg.yield %cast : ${E}
  } -> tensor<?x?x${G}x${HPG}x${DV}x${E}>
  %o = tensor.collapse_shape %o_grouped [[0], [1], [2, 3], [4]]
      : tensor<?x?x${G}x${HPG}x${DV}x${E}> into tensor<?x?x${H}x${DV}x${E}>

  %lse_init = tensor.empty(%batch, %m_rows) : tensor<?x${G}x${HPG}x?xf32>
  %lse_grouped = linalg.generic {
      indexing_maps = [affine_map<(b, g, h, m) -> (b, m, g, h)>, affine_map<(b, g, h, m) -> (b, m, g, h)>,
                       affine_map<(b, g, h, m) -> (b, g, h, m)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%max, %sum : tensor<?x?x${G}x${HPG}xf32>, tensor<?x?x${G}x${HPG}xf32>)
      outs(%lse_init : tensor<?x${G}x${HPG}x?xf32>) {
  ^bb0(%mx: f32, %s: f32, %out: f32):
    %empty_row = arith.cmpf oeq, %s, %zero : f32
    %log_sum = math.log %s : f32
    %max_nat = arith.mulf %mx, %ln2 : f32
    %l = arith.addf %max_nat, %log_sum : f32
    %value = arith.select %empty_row, %neg_inf, %l : f32
    linalg.yield %value : f32
  } -> tensor<?x${G}x${HPG}x?xf32>
  %lse = tensor.collapse_shape %lse_grouped [[0], [1, 2], [3]]
      : tensor<?x${G}x${HPG}x?xf32> into tensor<?x${H}x?xf32>
  return %o, %lse : tensor<?x?x${H}x${DV}x${E}>, tensor<?x${H}x?xf32>
}
