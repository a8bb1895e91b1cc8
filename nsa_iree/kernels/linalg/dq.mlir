// dq pass (query-major, no cross-row reduction): for every (b, m, g) row and head h of the group,
//   s = q k^T over the T*BS gathered keys, p = exp(scale * s - lse) on visible keys,
//   dp = do v^T, ds = p * (dp - delta), dq = scale * ds k; key j of slot t is visible iff j <= last_key[t].
// Everything sits in one flow.dispatch.region, which pins the fusion: the gathered K/V and the s, p, dp,
// ds tiles live only inside the dispatch, never in memory for the whole sequence. The contraction
// attributes are empty on CPU and name the matrix-unit layouts on GPU targets (pipelines/<target>.toml).
<% import "common/rules.mlir" as rules %>
<% import "common/contraction.mlir" as contraction %>
<% import "common/host.mlir" as host %>
<% import "linalg/host.mlir" as linalg %>
<% import "linalg/regions.mlir" as regions %>
${ host.dq_signature() }
${ host.sizes() }

${ linalg.kv_blocks() }
${ linalg.selected_slots() }
  %q_grouped = tensor.expand_shape %q [[0], [1], [2, 3], [4]] output_shape [%batch, %m_rows, ${G}, ${HPG}, ${D}]
      : tensor<?x?x${H}x${D}x${E}> into tensor<?x?x${G}x${HPG}x${D}x${E}>
  %do_grouped = tensor.expand_shape %do [[0], [1], [2, 3], [4]] output_shape [%batch, %m_rows, ${G}, ${HPG}, ${DV}]
      : tensor<?x?x${H}x${DV}x${E}> into tensor<?x?x${G}x${HPG}x${DV}x${E}>
  %lse_grouped = tensor.expand_shape %lse [[0], [1, 2], [3]] output_shape [%batch, ${G}, ${HPG}, %m_rows]
      : tensor<?x${H}x?xf32> into tensor<?x${G}x${HPG}x?xf32>
  %delta_grouped = tensor.expand_shape %delta [[0], [1], [2, 3]] output_shape [%batch, %m_rows, ${G}, ${HPG}]
      : tensor<?x?x${H}xf32> into tensor<?x?x${G}x${HPG}xf32>

  %dq_grouped = flow.dispatch.region -> (tensor<?x?x${G}x${HPG}x${D}x${E}>{%batch, %m_rows}) {
    %zero = arith.constant 0.0 : f32
${ regions.gather("k", "key_blocks", D) }
${ regions.gather("v", "value_blocks", DV) }

${ regions.scores_zero() }
${ regions.product("s", "q_grouped", "gathered_k", "d", D, DQ_SCORES_CONFIG) }
${ regions.product("dp", "do_grouped", "gathered_v", "e", DV, DQ_DP_CONFIG) }

    // ds * scale, rounded to the input type so that the dq product runs on the matrix units.
    // The select keeps masked keys exactly zero (and empty rows, whose lse is -inf, free of NaN).
    %ds_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${HPG}x${T}x${BS}x${E}>
    %ds = linalg.generic {
        indexing_maps = [affine_map<(b, m, g, h, t, j) -> (b, m, g, h, t, j)>,
                         affine_map<(b, m, g, h, t, j) -> (b, m, g, h, t, j)>,
                         affine_map<(b, m, g, h, t, j) -> (b, g, h, m)>,
                         affine_map<(b, m, g, h, t, j) -> (b, m, g, h)>,
                         affine_map<(b, m, g, h, t, j) -> (b, m, g, t)>,
                         affine_map<(b, m, g, h, t, j) -> (b, m, g, h, t, j)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "parallel"]}
        ins(%s, %dp, %lse_grouped, %delta_grouped, %last_key
            : tensor<?x?x${G}x${HPG}x${T}x${BS}xf32>, tensor<?x?x${G}x${HPG}x${T}x${BS}xf32>,
              tensor<?x${G}x${HPG}x?xf32>, tensor<?x?x${G}x${HPG}xf32>, tensor<?x?x${G}x${T}xi32>)
        outs(%ds_init : tensor<?x?x${G}x${HPG}x${T}x${BS}x${E}>) {
    ^bb0(%sv: f32, %dpv: f32, %l: f32, %dl: f32, %last: i32, %out: ${E}):
      %j = linalg.index 5 : index
      %j_i32 = arith.index_cast %j : index to i32
${ rules.key_visible("visible", "j_i32", "last") }
      %scaled = arith.mulf %sv, %scale : f32
      %shifted = arith.subf %scaled, %l : f32
      %p = math.exp %shifted : f32
      %dp_minus_delta = arith.subf %dpv, %dl : f32
      %ds_raw = arith.mulf %p, %dp_minus_delta : f32
      %ds_scaled = arith.mulf %ds_raw, %scale : f32
      %ds_visible = arith.select %visible, %ds_scaled, %zero : f32
      %ds_e = ${TRUNCF} %ds_visible : f32 to ${E}
      linalg.yield %ds_e : ${E}
    } -> tensor<?x?x${G}x${HPG}x${T}x${BS}x${E}>

    %dq_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${HPG}x${D}xf32>
    %dq_zero = linalg.fill ins(%zero : f32) outs(%dq_init : tensor<?x?x${G}x${HPG}x${D}xf32>)
        -> tensor<?x?x${G}x${HPG}x${D}xf32>
    %dq_f32 = linalg.generic {
        indexing_maps = [affine_map<(b, m, g, h, d, t, j) -> (b, m, g, h, t, j)>,
                         affine_map<(b, m, g, h, d, t, j) -> (b, m, g, t, j, d)>,
                         affine_map<(b, m, g, h, d, t, j) -> (b, m, g, h, d)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction", "reduction"]
        ${DQ_ROOT_CONFIG}}
        ins(%ds, %gathered_k : tensor<?x?x${G}x${HPG}x${T}x${BS}x${E}>, tensor<?x?x${G}x${T}x${BS}x${D}x${E}>)
        outs(%dq_zero : tensor<?x?x${G}x${HPG}x${D}xf32>) {
${ contraction.mul_add("    ") }
    } -> tensor<?x?x${G}x${HPG}x${D}xf32>
    %dq_e_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${HPG}x${D}x${E}>
    %dq_e = linalg.generic {
        indexing_maps = [affine_map<(b, m, g, h, d) -> (b, m, g, h, d)>, affine_map<(b, m, g, h, d) -> (b, m, g, h, d)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]}
        ins(%dq_f32 : tensor<?x?x${G}x${HPG}x${D}xf32>) outs(%dq_e_init : tensor<?x?x${G}x${HPG}x${D}x${E}>) {
    ^bb0(%x: f32, %out: ${E}):
      %x_e = ${TRUNCF} %x : f32 to ${E}
      linalg.yield %x_e : ${E}
    } -> tensor<?x?x${G}x${HPG}x${D}x${E}>
    flow.return %dq_e : tensor<?x?x${G}x${HPG}x${D}x${E}>
  }
  %dq = tensor.collapse_shape %dq_grouped [[0], [1], [2, 3], [4]]
      : tensor<?x?x${G}x${HPG}x${D}x${E}> into tensor<?x?x${H}x${D}x${E}>
  return %dq : tensor<?x?x${H}x${D}x${E}>
}
