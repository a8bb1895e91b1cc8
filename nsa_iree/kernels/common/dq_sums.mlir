<# part: takes PIECE_SUM_CONFIG #>
// dq from the f32 partials of a dk/dv kernel that makes them (gpu/hopper/dkdv_dq.mlir): the piece of block i's list
// that holds row (b, m, g) writes, per head h of the group, ds k of that row's head against the block at
// dq_slots[b, m, g, t, h mod HPG], t the first of the row's slots naming block i. A row's dq is the sum of those
// partials over its slots in slot order, in f32, rounded once:
//
//   counted[b, m, g, t] = the slot names a block the row reads (the rule: common/blocks.mlir selected) that no
//                         earlier slot of the row names (the dk/dv kernel counts a block as often as the row lists
//                         it, in its p: its partial holds them all)
//   dq[b, m, h, :]      = sum over the counted t of dq_slots[b, m, h / HPG, t, h mod HPG, :]
//
// The partials of the other slots are never written, and never added.
<% import "common/blocks.mlir" as blocks %>
<% import "common/rules.mlir" as rules %>
func.func private @dq_partial_sums(%dq_slots: tensor<?x?x${G}x${T}x${HPG}x${D}xf32>,
    %block_indices: tensor<?x?x${G}x${T}xi32>, %n: index) -> tensor<?x?x${H}x${D}x${E}> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c0_i32 = arith.constant 0 : i32
  %c1_i32 = arith.constant 1 : i32
  %false = arith.constant false
  %block_size = arith.constant ${BS} : index
  %heads_per_group = arith.constant ${HPG} : index
  %batch = tensor.dim %block_indices, %c0 : tensor<?x?x${G}x${T}xi32>
  %m_rows = tensor.dim %block_indices, %c1 : tensor<?x?x${G}x${T}xi32>
  ${ rules.offset() }

${ blocks.counted_slots("counted") }

  // The sum in a region of its own so that its lowering config (lanes along the head dim: coalesced loads of every
  // partial) survives, as the piece sums' (common/piece_sums.mlir).
  %dq = flow.dispatch.region -> (tensor<?x?x${H}x${D}x${E}>{%batch, %m_rows}) {
    %dq_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${H}x${D}x${E}>
    %dq_sum = linalg.generic {
        indexing_maps = [affine_map<(b, m, h, d) -> (b, m, h, d)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel"]
        ${PIECE_SUM_CONFIG}}
        outs(%dq_init : tensor<?x?x${H}x${D}x${E}>) {
    ^bb0(%out: ${E}):
      %b = linalg.index 0 : index
      %m = linalg.index 1 : index
      %h = linalg.index 2 : index
      %d = linalg.index 3 : index
      %g = arith.divui %h, %heads_per_group : index
      %head_in_group = arith.remui %h, %heads_per_group : index
      // The slots unrolled: each read whether counted or not, so that a row's loads go out together (an unwritten
      // slot's value, whatever it is, is not added).
      %acc_0 = arith.constant 0.0 : f32
<% for t in range(T | int) %>
      %t_${t} = arith.constant ${t} : index
      %counted_${t}_i32 = tensor.extract %counted[%b, %m, %g, %t_${t}] : tensor<?x?x${G}x${T}xi32>
      %is_counted_${t} = arith.cmpi ne, %counted_${t}_i32, %c0_i32 : i32
      %x_${t} = tensor.extract %dq_slots[%b, %m, %g, %t_${t}, %head_in_group, %d] : tensor<?x?x${G}x${T}x${HPG}x${D}xf32>
      %sum_${t} = arith.addf %acc_${t}, %x_${t} : f32
      %acc_${t + 1} = arith.select %is_counted_${t}, %sum_${t}, %acc_${t} : f32
<% endfor %>
      %total_e = ${TRUNCF} %acc_${T} : f32 to ${E}
      linalg.yield %total_e : ${E}
    } -> tensor<?x?x${H}x${D}x${E}>
    flow.return %dq_sum : tensor<?x?x${H}x${D}x${E}>
  }
  return %dq : tensor<?x?x${H}x${D}x${E}>
}
