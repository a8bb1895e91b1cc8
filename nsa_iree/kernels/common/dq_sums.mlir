<# part: takes PIECE_SUM_CONFIG #>
// dq from the f32 partials of a dk/dv kernel that makes them (gpu/hopper/dkdv_dq.mlir): row r of piece p of the
// block lists' inversion (common/inversion.mlir) holds, per head h of its kv group, ds k of that row's heads against
// the piece's block, at dq_pieces[p, r HPG + h mod HPG]. A row's dq is the sum of its partials over the slots that
// name a block it reads, in slot order, in f32, rounded once:
//
//   place[b, m, g, t] = p ROWS_PER_PIECE + r, where (b, m, g) is row r of piece p of the list of the block slot t
//                       names; -1 where the slot is skipped (the rule: common/blocks.mlir selected) or names a block
//                       an earlier slot of the row names (the dk/dv kernel counts it as often as it is listed:
//                       its weight is in the partial already)
//   dq[b, m, h, :]    = sum over t of dq_pieces[place[b, m, g, t] / ROWS_PER_PIECE,
//                                               (place mod ROWS_PER_PIECE) HPG + h mod HPG, :], g = h / HPG
//
// A place is found by binary search in its block's list (its rows are in increasing (b M + m) G + g, from
// piece_start ROWS_PER_PIECE on, -1 padding after them), so the inversion is as every other two-pass has it.
<% import "common/blocks.mlir" as blocks %>
<% import "common/rules.mlir" as rules %>
<% set dq_rows = (ROWS_PER_PIECE | int) * (HPG | int) %>
func.func private @dq_partial_sums(%dq_pieces: tensor<?x${dq_rows}x${D}xf32>,
    %block_indices: tensor<?x?x${G}x${T}xi32>, %entries: tensor<?x${ROWS_PER_PIECE}x2xi32>,
    %piece_start: tensor<?xi32>, %piece_count: tensor<?xi32>, %n: index) -> tensor<?x?x${H}x${D}x${E}> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c0_i32 = arith.constant 0 : i32
  %c1_i32 = arith.constant 1 : i32
  %c32_i32 = arith.constant 32 : i32
  %minus_one = arith.constant -1 : i32
  %false = arith.constant false
  %zero = arith.constant 0.0 : f32
  %block_size = arith.constant ${BS} : index
  %kv_heads = arith.constant ${G} : index
  %slots = arith.constant ${T} : index
  %heads_per_group = arith.constant ${HPG} : index
  %rows_per_piece = arith.constant ${ROWS_PER_PIECE} : index
  %rows_per_piece_i32 = arith.constant ${ROWS_PER_PIECE} : i32
  %batch = tensor.dim %block_indices, %c0 : tensor<?x?x${G}x${T}xi32>
  %m_rows = tensor.dim %block_indices, %c1 : tensor<?x?x${G}x${T}xi32>
  %num_blocks = arith.ceildivui %n, %block_size : index
  ${ rules.offset() }

<% call blocks.per_slot("place") %>
    %b = linalg.index 0 : index
    %m = linalg.index 1 : index
    %g = linalg.index 2 : index
    %t = linalg.index 3 : index
${ blocks.selected("chosen") }
    %named_before = scf.for %u = %c0 to %t step %c1 iter_args(%seen = %false) -> (i1) {
      %other = tensor.extract %block_indices[%b, %m, %g, %u] : tensor<?x?x${G}x${T}xi32>
      %same = arith.cmpi eq, %other, %block_i32 : i32
      %seen_now = arith.ori %seen, %same : i1
      scf.yield %seen_now : i1
    }
    %first_naming = arith.cmpi eq, %named_before, %false : i1
    %counted = arith.andi %chosen, %first_naming : i1
    %place_here = scf.if %counted -> (i32) {
      %bg0 = arith.muli %b, %kv_heads : index
      %bg = arith.addi %bg0, %g : index
      %fb0 = arith.muli %bg, %num_blocks : index
      %fb = arith.addi %fb0, %block : index
      %start = tensor.extract %piece_start[%fb] : tensor<?xi32>
      %count = tensor.extract %piece_count[%fb] : tensor<?xi32>
      %lo0 = arith.muli %start, %rows_per_piece_i32 : i32
      %len = arith.muli %count, %rows_per_piece_i32 : i32
      %hi0 = arith.addi %lo0, %len : i32
      // the row's key in the list: (b M + m) G + g
      %bm = arith.muli %b, %m_rows : index
      %bmm = arith.addi %bm, %m : index
      %c_0 = arith.muli %bmm, %kv_heads : index
      %c_index = arith.addi %c_0, %g : index
      %c = arith.index_cast %c_index : index to i32
      // the first place in [lo0, hi0) whose row is not before c (padding, -1, is after every row): bits(len)
      // halvings of [lo, hi)
      %len_zeros = math.ctlz %len : i32
      %probes_i32 = arith.subi %c32_i32, %len_zeros : i32
      %probes = arith.index_cast %probes_i32 : i32 to index
      %lo, %hi = scf.for %s = %c0 to %probes step %c1 iter_args(%lo_s = %lo0, %hi_s = %hi0) -> (i32, i32) {
        %open = arith.cmpi slt, %lo_s, %hi_s : i32
        %span = arith.subi %hi_s, %lo_s : i32
        %half = arith.shrui %span, %c1_i32 : i32
        %mid_open = arith.addi %lo_s, %half : i32
        %mid = arith.select %open, %mid_open, %lo0 : i32
        %mid_index = arith.index_cast %mid : i32 to index
        %piece = arith.divui %mid_index, %rows_per_piece : index
        %row = arith.remui %mid_index, %rows_per_piece : index
        %listed = tensor.extract %entries[%piece, %row, %c0] : tensor<?x${ROWS_PER_PIECE}x2xi32>
        %is_row = arith.cmpi sge, %listed, %c0_i32 : i32
        %is_earlier = arith.cmpi slt, %listed, %c : i32
        %earlier = arith.andi %is_row, %is_earlier : i1
        %go_up = arith.andi %open, %earlier : i1
        %not_earlier = arith.cmpi eq, %earlier, %false : i1
        %go_down = arith.andi %open, %not_earlier : i1
        %mid_next = arith.addi %mid, %c1_i32 : i32
        %lo_next = arith.select %go_up, %mid_next, %lo_s : i32
        %hi_next = arith.select %go_down, %mid, %hi_s : i32
        scf.yield %lo_next, %hi_next : i32, i32
      }
      scf.yield %lo : i32
    } else {
      scf.yield %minus_one : i32
    }
    linalg.yield %place_here : i32
<% endcall %>

  // Each sum is its own region so that its lowering config (lanes along the head dim: coalesced loads of every
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
      %total = scf.for %t = %c0 to %slots step %c1 iter_args(%acc = %zero) -> (f32) {
        %place_i32 = tensor.extract %place[%b, %m, %g, %t] : tensor<?x?x${G}x${T}xi32>
        %listed = arith.cmpi sge, %place_i32, %c0_i32 : i32
        %next = scf.if %listed -> (f32) {
          %place_index = arith.index_cast %place_i32 : i32 to index
          %piece = arith.divui %place_index, %rows_per_piece : index
          %row = arith.remui %place_index, %rows_per_piece : index
          %row_heads = arith.muli %row, %heads_per_group : index
          %dq_row = arith.addi %row_heads, %head_in_group : index
          %x = tensor.extract %dq_pieces[%piece, %dq_row, %d] : tensor<?x${dq_rows}x${D}xf32>
          %sum = arith.addf %acc, %x : f32
          scf.yield %sum : f32
        } else {
          scf.yield %acc : f32
        }
        scf.yield %next : f32
      }
      %total_e = ${TRUNCF} %total : f32 to ${E}
      linalg.yield %total_e : ${E}
    } -> tensor<?x?x${H}x${D}x${E}>
    flow.return %dq_sum : tensor<?x?x${H}x${D}x${E}>
  }
  return %dq : tensor<?x?x${H}x${D}x${E}>
}
