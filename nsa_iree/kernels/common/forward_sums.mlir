<# part: takes PIECE_SUM_CONFIG #>
// o and lse from the f32 partials of a forward over the block lists' pieces (gpu/hopper/forward_pieces.mlir: a
// piece's block against its rows, as gpu/hopper/dkdv_dq.mlir's dq): the piece of block i's list that holds row
// (b, m, g) writes, per head h of the group, at slot t, the first of the row's slots naming block i,
//
//   stats_slots[b, m, g, t, h mod HPG] = (m_t, l_t): the max over the block's keys the row sees of scale s, and the
//                                        sum of w exp(scale s - m_t) over them (w: how often the row lists it)
//   o_slots[b, m, g, t, h mod HPG, :]  = the sum of w exp(scale s - m_t) v over them
//
// and a row's o and lse combine its counted slots (common/blocks.mlir counted_slots), in slot order, in f32:
//
//   m = max of m_t,  l = sum of exp(m_t - m) l_t,  o = sum of (exp(m_t - m) / l) o_t (rounded once),  lse = m + log l
//
// A row with no counted slot has o = 0 and lse = -inf (docs/semantics.md). The other slots are never added.
<% import "common/blocks.mlir" as blocks %>
<% import "common/rules.mlir" as rules %>
func.func private @forward_partial_sums(%o_slots: tensor<?x?x${G}x${T}x${HPG}x${DV}xf32>,
    %stats_slots: tensor<?x?x${G}x${T}x${HPG}x2xf32>, %block_indices: tensor<?x?x${G}x${T}xi32>, %n: index)
    -> (tensor<?x?x${H}x${DV}x${E}>, tensor<?x${H}x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c0_i32 = arith.constant 0 : i32
  %c1_i32 = arith.constant 1 : i32
  %false = arith.constant false
  %zero = arith.constant 0.0 : f32
  %minus_inf = arith.constant 0xFF800000 : f32
  %block_size = arith.constant ${BS} : index
  %heads_per_group = arith.constant ${HPG} : index
  %batch = tensor.dim %block_indices, %c0 : tensor<?x?x${G}x${T}xi32>
  %m_rows = tensor.dim %block_indices, %c1 : tensor<?x?x${G}x${T}xi32>
  ${ rules.offset() }

${ blocks.counted_slots("counted") }

  // Each row's max and sum over its counted slots, [B, M, H] (the max first, then the sum against it).
  %row_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${H}xf32>
  %row_max, %row_sum = linalg.generic {
      indexing_maps = [affine_map<(b, m, h) -> (b, m, h)>, affine_map<(b, m, h) -> (b, m, h)>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      outs(%row_init, %row_init : tensor<?x?x${H}xf32>, tensor<?x?x${H}xf32>) {
  ^bb0(%out_max: f32, %out_sum: f32):
    %b = linalg.index 0 : index
    %m = linalg.index 1 : index
    %h = linalg.index 2 : index
    %g = arith.divui %h, %heads_per_group : index
    %head_in_group = arith.remui %h, %heads_per_group : index
    %max_0 = arith.constant 0xFF800000 : f32
<% for t in range(T | int) %>
    %t_${t} = arith.constant ${t} : index
    %counted_${t}_i32 = tensor.extract %counted[%b, %m, %g, %t_${t}] : tensor<?x?x${G}x${T}xi32>
    %is_counted_${t} = arith.cmpi ne, %counted_${t}_i32, %c0_i32 : i32
    %m_${t} = tensor.extract %stats_slots[%b, %m, %g, %t_${t}, %head_in_group, %c0] : tensor<?x?x${G}x${T}x${HPG}x2xf32>
    %max_with_${t} = arith.maximumf %max_${t}, %m_${t} : f32
    %max_${t + 1} = arith.select %is_counted_${t}, %max_with_${t}, %max_${t} : f32
<% endfor %>
    %sum_0 = arith.constant 0.0 : f32
<% for t in range(T | int) %>
    %l_${t} = tensor.extract %stats_slots[%b, %m, %g, %t_${t}, %head_in_group, %c1] : tensor<?x?x${G}x${T}x${HPG}x2xf32>
    %shift_${t} = arith.subf %m_${t}, %max_${T} : f32
    %rescale_${t} = math.exp %shift_${t} : f32
    %term_${t} = arith.mulf %rescale_${t}, %l_${t} : f32
    %sum_with_${t} = arith.addf %sum_${t}, %term_${t} : f32
    %sum_${t + 1} = arith.select %is_counted_${t}, %sum_with_${t}, %sum_${t} : f32
<% endfor %>
    linalg.yield %max_${T}, %sum_${T} : f32, f32
  } -> (tensor<?x?x${H}xf32>, tensor<?x?x${H}xf32>)

  // lse [B, H, M] = max + log sum; -inf for a row with no counted slot (its sum 0).
  %lse_init = tensor.empty(%batch, %m_rows) : tensor<?x${H}x?xf32>
  %lse = linalg.generic {
      indexing_maps = [affine_map<(b, h, m) -> (b, m, h)>, affine_map<(b, h, m) -> (b, m, h)>,
                       affine_map<(b, h, m) -> (b, h, m)>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%row_max, %row_sum : tensor<?x?x${H}xf32>, tensor<?x?x${H}xf32>) outs(%lse_init : tensor<?x${H}x?xf32>) {
  ^bb0(%max: f32, %sum: f32, %out: f32):
    %log_sum = math.log %sum : f32
    %with_max = arith.addf %max, %log_sum : f32
    // (unordered: a NaN sum, from a NaN in the row's q or its blocks' keys, reaches lse)
    %seen = arith.cmpf ugt, %sum, %zero : f32
    %lse_here = arith.select %seen, %with_max, %minus_inf : f32
    linalg.yield %lse_here : f32
  } -> tensor<?x${H}x?xf32>

  // Each (row, slot)'s factor exp(m_t - max) / sum, [B, M, H, T]; -1 for a slot not counted (never added: its o_t
  // is not written). A NaN factor (a NaN max or sum) is added: the row's NaN reaches its o (docs/semantics.md).
  %factor_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${H}x${T}xf32>
  %factor = linalg.generic {
      indexing_maps = [affine_map<(b, m, h, t) -> (b, m, h)>, affine_map<(b, m, h, t) -> (b, m, h)>,
                       affine_map<(b, m, h, t) -> (b, m, h, t)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%row_max, %row_sum : tensor<?x?x${H}xf32>, tensor<?x?x${H}xf32>)
      outs(%factor_init : tensor<?x?x${H}x${T}xf32>) {
  ^bb0(%max: f32, %sum: f32, %out: f32):
    %b = linalg.index 0 : index
    %m = linalg.index 1 : index
    %h = linalg.index 2 : index
    %t = linalg.index 3 : index
    %g = arith.divui %h, %heads_per_group : index
    %head_in_group = arith.remui %h, %heads_per_group : index
    %counted_i32 = tensor.extract %counted[%b, %m, %g, %t] : tensor<?x?x${G}x${T}xi32>
    %is_counted = arith.cmpi ne, %counted_i32, %c0_i32 : i32
    %m_t = tensor.extract %stats_slots[%b, %m, %g, %t, %head_in_group, %c0] : tensor<?x?x${G}x${T}x${HPG}x2xf32>
    %shift = arith.subf %m_t, %max : f32
    %rescale = math.exp %shift : f32
    %share = arith.divf %rescale, %sum : f32
    %minus_one = arith.constant -1.0 : f32
    %factor_here = arith.select %is_counted, %share, %minus_one : f32
    linalg.yield %factor_here : f32
  } -> tensor<?x?x${H}x${T}xf32>

  // o [B, M, H, Dv]: the counted slots' o_t times their factors, summed in slot order (0 for a row with none),
  // rounded once.
  %o = flow.dispatch.region -> (tensor<?x?x${H}x${DV}x${E}>{%batch, %m_rows}) {
    %o_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${H}x${DV}x${E}>
    %o_sum = linalg.generic {
        indexing_maps = [affine_map<(b, m, h, d) -> (b, m, h, d)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel"]
        ${PIECE_SUM_CONFIG}}
        outs(%o_init : tensor<?x?x${H}x${DV}x${E}>) {
    ^bb0(%out: ${E}):
      %b = linalg.index 0 : index
      %m = linalg.index 1 : index
      %h = linalg.index 2 : index
      %d = linalg.index 3 : index
      %g = arith.divui %h, %heads_per_group : index
      %head_in_group = arith.remui %h, %heads_per_group : index
      %acc_0 = arith.constant 0.0 : f32
<% for t in range(T | int) %>
      %t_${t} = arith.constant ${t} : index
      %f_${t} = tensor.extract %factor[%b, %m, %h, %t_${t}] : tensor<?x?x${H}x${T}xf32>
      %is_counted_${t} = arith.cmpf uge, %f_${t}, %zero : f32
      %x_${t} = tensor.extract %o_slots[%b, %m, %g, %t_${t}, %head_in_group, %d] : tensor<?x?x${G}x${T}x${HPG}x${DV}xf32>
      %acc_with_${t} = math.fma %f_${t}, %x_${t}, %acc_${t} : f32
      %acc_${t + 1} = arith.select %is_counted_${t}, %acc_with_${t}, %acc_${t} : f32
<% endfor %>
      %o_e = ${TRUNCF} %acc_${T} : f32 to ${E}
      linalg.yield %o_e : ${E}
    } -> tensor<?x?x${H}x${DV}x${E}>
    flow.return %o_sum : tensor<?x?x${H}x${DV}x${E}>
  }
  return %o, %lse : tensor<?x?x${H}x${DV}x${E}>, tensor<?x${H}x?xf32>
}
