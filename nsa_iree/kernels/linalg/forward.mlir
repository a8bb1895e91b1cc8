// Forward: o [B, M, H, Dv] and lse [B, H, M] (f32, natural log), with the loop structure of the dq pass
// (mlir/dq.mlir):
//   block statistics region: s = scale * q k^T per selected block (matrix units on GPUs), then per (row,
//       head, slot) the max of the block's visible scores and the sum of exp(s - max). Each reduction spans
//       one block's BS keys, so the region's root is an ordinary reduction over a contraction.
//   combine:  lse = M + log(sum_t sum_t * exp(max_t - M)), M = max_t max_t; only 2*T floats per row and
//       head are written between the two.
//   o region: p = exp(s - lse) on visible keys, o = p v (s recomputed: nothing of size T*BS per row
//       leaves a dispatch).
// Key j of slot t is visible iff j <= last_key[t] (mlir/selected_slots.mlir), compared inside the regions.
// A row with no visible key gets lse = -inf and o = 0 (semantics.md, empty rows).
// o and lse are written into the caller's %o_out and %lse_out (iree.abi.output: destination passing).
// (iree_linalg_ext.online_attention would do this in one dispatch, but IREE 3.13's llvm-cpu tiling of its
// head dimension gives wrong results for D > 128; a single running max/sum over all T*BS keys instead
// became scalar code on GPUs.)
<% import "common/rules.mlir" as rules %>
<% import "common/contraction.mlir" as contraction %>
<% import "common/host.mlir" as host %>
<% import "linalg/host.mlir" as linalg %>
<% import "linalg/regions.mlir" as regions %>
${ host.forward_signature() }
<% call host.sizes() %>
  %zero = arith.constant 0.0 : f32
<% endcall %>

${ linalg.kv_blocks() }
${ linalg.selected_slots() }

  %neg_inf_s = arith.constant 0xFF800000 : f32
  %q_grouped = tensor.expand_shape %q [[0], [1], [2, 3], [4]] output_shape [%batch, %m_rows, ${G}, ${HPG}, ${D}]
      : tensor<?x?x${H}x${D}x${E}> into tensor<?x?x${G}x${HPG}x${D}x${E}>

  // Per selected block (t parallel): its max over the visible keys and the sum of exp(s - that max), two
  // plain reductions over the block's BS keys. The root (the sum) reduces one block per workgroup, so the
  // q k^T product in front of it is an ordinary contraction (matrix units on GPU targets).
  %block_max, %block_sum = flow.dispatch.region -> (tensor<?x?x${G}x${HPG}x${T}xf32>{%batch, %m_rows},
      tensor<?x?x${G}x${HPG}x${T}xf32>{%batch, %m_rows}) {
${ regions.gather("k", "key_blocks", D) }
${ regions.scores_zero() }
${ regions.product("s", "q_grouped", "gathered_k", "d", D, FWD_LSE_SCORES_CONFIG) }
    %blk_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${HPG}x${T}xf32>
    %max_init = linalg.fill ins(%neg_inf_s : f32) outs(%blk_init : tensor<?x?x${G}x${HPG}x${T}xf32>)
        -> tensor<?x?x${G}x${HPG}x${T}xf32>
    %sum_init = linalg.fill ins(%zero : f32) outs(%blk_init : tensor<?x?x${G}x${HPG}x${T}xf32>)
        -> tensor<?x?x${G}x${HPG}x${T}xf32>
    %bmax = linalg.generic {
        indexing_maps = [affine_map<(b, m, g, h, t, j) -> (b, m, g, h, t, j)>,
                         affine_map<(b, m, g, h, t, j) -> (b, m, g, t)>,
                         affine_map<(b, m, g, h, t, j) -> (b, m, g, h, t)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction"]
        ${FWD_LSE_MAX_CONFIG}}
        ins(%s, %last_key : tensor<?x?x${G}x${HPG}x${T}x${BS}xf32>, tensor<?x?x${G}x${T}xi32>)
        outs(%max_init : tensor<?x?x${G}x${HPG}x${T}xf32>) {
    ^bb0(%sv: f32, %last: i32, %mx: f32):
      %j = linalg.index 5 : index
      %j_i32 = arith.index_cast %j : index to i32
${ rules.key_visible("visible", "j_i32", "last") }
      %scaled = arith.mulf %sv, %scale : f32
      %masked = arith.select %visible, %scaled, %neg_inf_s : f32
      %new_max = arith.maximumf %mx, %masked : f32
      linalg.yield %new_max : f32
    } -> tensor<?x?x${G}x${HPG}x${T}xf32>
    // A block with no visible key has max -inf: its keys contribute 0 (the select keeps exp(-inf - -inf),
    // NaN, out of the sum).
    %bsum = linalg.generic {
        indexing_maps = [affine_map<(b, m, g, h, t, j) -> (b, m, g, h, t, j)>,
                         affine_map<(b, m, g, h, t, j) -> (b, m, g, t)>,
                         affine_map<(b, m, g, h, t, j) -> (b, m, g, h, t)>,
                         affine_map<(b, m, g, h, t, j) -> (b, m, g, h, t)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction"]
        ${FWD_LSE_ROOT_CONFIG}}
        ins(%s, %last_key, %bmax : tensor<?x?x${G}x${HPG}x${T}x${BS}xf32>, tensor<?x?x${G}x${T}xi32>,
            tensor<?x?x${G}x${HPG}x${T}xf32>)
        outs(%sum_init : tensor<?x?x${G}x${HPG}x${T}xf32>) {
    ^bb0(%sv: f32, %last: i32, %mx: f32, %sm: f32):
      %j = linalg.index 5 : index
      %j_i32 = arith.index_cast %j : index to i32
${ rules.key_visible("visible", "j_i32", "last") }
      %scaled = arith.mulf %sv, %scale : f32
      %shifted = arith.subf %scaled, %mx : f32
      %e = math.exp %shifted : f32
      %term = arith.select %visible, %e, %zero : f32
      %added = arith.addf %sm, %term : f32
      linalg.yield %added : f32
    } -> tensor<?x?x${G}x${HPG}x${T}xf32>
    flow.return %bmax, %bsum : tensor<?x?x${G}x${HPG}x${T}xf32>, tensor<?x?x${G}x${HPG}x${T}xf32>
  }
  // Combine the T blocks: M = max_t block_max, lse = M + log(sum_t block_sum * exp(block_max - M)); -inf for
  // a row with no visible key (M = -inf: every term is skipped and the sum stays 0).
  %row_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${HPG}xf32>
  %rmax_init = linalg.fill ins(%neg_inf_s : f32) outs(%row_init : tensor<?x?x${G}x${HPG}xf32>) -> tensor<?x?x${G}x${HPG}xf32>
  %rsum_init = linalg.fill ins(%zero : f32) outs(%row_init : tensor<?x?x${G}x${HPG}xf32>) -> tensor<?x?x${G}x${HPG}xf32>
  %row_max = linalg.generic {
      indexing_maps = [affine_map<(b, m, g, h, t) -> (b, m, g, h, t)>, affine_map<(b, m, g, h, t) -> (b, m, g, h)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%block_max : tensor<?x?x${G}x${HPG}x${T}xf32>) outs(%rmax_init : tensor<?x?x${G}x${HPG}xf32>) {
  ^bb0(%bm: f32, %mx: f32):
    %new_max = arith.maximumf %mx, %bm : f32
    linalg.yield %new_max : f32
  } -> tensor<?x?x${G}x${HPG}xf32>
  %row_sum = linalg.generic {
      indexing_maps = [affine_map<(b, m, g, h, t) -> (b, m, g, h, t)>, affine_map<(b, m, g, h, t) -> (b, m, g, h, t)>,
                       affine_map<(b, m, g, h, t) -> (b, m, g, h)>, affine_map<(b, m, g, h, t) -> (b, m, g, h)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%block_max, %block_sum, %row_max : tensor<?x?x${G}x${HPG}x${T}xf32>, tensor<?x?x${G}x${HPG}x${T}xf32>,
          tensor<?x?x${G}x${HPG}xf32>)
      outs(%rsum_init : tensor<?x?x${G}x${HPG}xf32>) {
  ^bb0(%bm: f32, %bs: f32, %mx: f32, %sm: f32):
    %empty_block = arith.cmpf oeq, %bm, %neg_inf_s : f32
    %shift = arith.subf %bm, %mx : f32
    %rescale = math.exp %shift : f32
    %term = arith.mulf %bs, %rescale : f32
    %kept = arith.select %empty_block, %zero, %term : f32
    %added = arith.addf %sm, %kept : f32
    linalg.yield %added : f32
  } -> tensor<?x?x${G}x${HPG}xf32>
  %lse_rows = linalg.generic {
      indexing_maps = [affine_map<(b, m, g, h) -> (b, m, g, h)>, affine_map<(b, m, g, h) -> (b, m, g, h)>,
                       affine_map<(b, m, g, h) -> (b, m, g, h)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%row_max, %row_sum : tensor<?x?x${G}x${HPG}xf32>, tensor<?x?x${G}x${HPG}xf32>)
      outs(%row_init : tensor<?x?x${G}x${HPG}xf32>) {
  ^bb0(%mx: f32, %sm: f32, %out: f32):
    %empty_row = arith.cmpf oeq, %sm, %zero : f32
    %log_sum = math.log %sm : f32
    %l = arith.addf %mx, %log_sum : f32
    %value = arith.select %empty_row, %neg_inf_s, %l : f32
    linalg.yield %value : f32
  } -> tensor<?x?x${G}x${HPG}xf32>

  %o_grouped = flow.dispatch.region -> (tensor<?x?x${G}x${HPG}x${DV}x${E}>{%batch, %m_rows}) {
${ regions.gather("k", "key_blocks", D) }
${ regions.gather("v", "value_blocks", DV) }
${ regions.scores_zero() }
${ regions.product("s", "q_grouped", "gathered_k", "d", D, FWD_O_SCORES_CONFIG) }
    // p in the input type so that p v runs on the matrix units; masked keys (and empty rows) give 0.
    %p_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${HPG}x${T}x${BS}x${E}>
    %p = linalg.generic {
        indexing_maps = [affine_map<(b, m, g, h, t, j) -> (b, m, g, h, t, j)>,
                         affine_map<(b, m, g, h, t, j) -> (b, m, g, h)>,
                         affine_map<(b, m, g, h, t, j) -> (b, m, g, t)>,
                         affine_map<(b, m, g, h, t, j) -> (b, m, g, h, t, j)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "parallel"]}
        ins(%s, %lse_rows, %last_key : tensor<?x?x${G}x${HPG}x${T}x${BS}xf32>, tensor<?x?x${G}x${HPG}xf32>,
            tensor<?x?x${G}x${T}xi32>)
        outs(%p_init : tensor<?x?x${G}x${HPG}x${T}x${BS}x${E}>) {
    ^bb0(%sv: f32, %l: f32, %last: i32, %out: ${E}):
      %j = linalg.index 5 : index
      %j_i32 = arith.index_cast %j : index to i32
${ rules.key_visible("visible", "j_i32", "last") }
      %scaled = arith.mulf %sv, %scale : f32
      %shifted = arith.subf %scaled, %l : f32
      %e = math.exp %shifted : f32
      %pv = arith.select %visible, %e, %zero : f32
      %pv_e = ${TRUNCF} %pv : f32 to ${E}
      linalg.yield %pv_e : ${E}
    } -> tensor<?x?x${G}x${HPG}x${T}x${BS}x${E}>
    %acc_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${HPG}x${DV}xf32>
    %acc_zero = linalg.fill ins(%zero : f32) outs(%acc_init : tensor<?x?x${G}x${HPG}x${DV}xf32>)
        -> tensor<?x?x${G}x${HPG}x${DV}xf32>
    %o_f32 = linalg.generic {
        indexing_maps = [affine_map<(b, m, g, h, e, t, j) -> (b, m, g, h, t, j)>,
                         affine_map<(b, m, g, h, e, t, j) -> (b, m, g, t, j, e)>,
                         affine_map<(b, m, g, h, e, t, j) -> (b, m, g, h, e)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel", "reduction", "reduction"]
        ${FWD_O_ROOT_CONFIG}}
        ins(%p, %gathered_v : tensor<?x?x${G}x${HPG}x${T}x${BS}x${E}>, tensor<?x?x${G}x${T}x${BS}x${DV}x${E}>)
        outs(%acc_zero : tensor<?x?x${G}x${HPG}x${DV}xf32>) {
${ contraction.mul_add("    ") }
    } -> tensor<?x?x${G}x${HPG}x${DV}xf32>
    %o_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${HPG}x${DV}x${E}>
    %o_e = linalg.generic {
        indexing_maps = [affine_map<(b, m, g, h, e) -> (b, m, g, h, e)>, affine_map<(b, m, g, h, e) -> (b, m, g, h, e)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]}
        ins(%o_f32 : tensor<?x?x${G}x${HPG}x${DV}xf32>) outs(%o_init : tensor<?x?x${G}x${HPG}x${DV}x${E}>) {
    ^bb0(%x: f32, %out: ${E}):
      %x_e = ${TRUNCF} %x : f32 to ${E}
      linalg.yield %x_e : ${E}
    } -> tensor<?x?x${G}x${HPG}x${DV}x${E}>
    flow.return %o_e : tensor<?x?x${G}x${HPG}x${DV}x${E}>
  }
  %o = tensor.collapse_shape %o_grouped [[0], [1], [2, 3], [4]]
      : tensor<?x?x${G}x${HPG}x${DV}x${E}> into tensor<?x?x${H}x${DV}x${E}>

  %lse_init = tensor.empty(%batch, %m_rows) : tensor<?x${G}x${HPG}x?xf32>
  %lse_grouped = linalg.generic {
      indexing_maps = [affine_map<(b, g, h, m) -> (b, m, g, h)>, affine_map<(b, g, h, m) -> (b, g, h, m)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%lse_rows : tensor<?x?x${G}x${HPG}xf32>) outs(%lse_init : tensor<?x${G}x${HPG}x?xf32>) {
  ^bb0(%l: f32, %out: f32):
    linalg.yield %l : f32
  } -> tensor<?x${G}x${HPG}x?xf32>
  %lse = tensor.collapse_shape %lse_grouped [[0], [1, 2], [3]]
      : tensor<?x${G}x${HPG}x?xf32> into tensor<?x${H}x?xf32>
  return %o, %lse : tensor<?x?x${H}x${DV}x${E}>, tensor<?x${H}x?xf32>
}
