// Stable inversion of block_indices for the two-pass backward: for every (b, g, kv block i) the query rows
// that selected it, in increasing m, cut into pieces of ROWS_PER_PIECE rows.
//
//   entries[p, r]    = (c, fb): row r of piece p is query row-group c = (b * M + m) * G + g, and the piece
//                      belongs to flat block fb = (b * G + g) * NB + i; (-1, -1) pads a piece.
//   piece_start[fb]  = first piece of block fb;  piece_count[fb] = ceil(rows that selected fb / ROWS_PER_PIECE)
//
// Pieces bound the work of one dk/dv work item: with realistic selections block 0 is selected by every row,
// and one work item walking all M rows would serialise the pass. The list order comes from a scan over m,
// not from atomics, so the result (and the dk/dv reduction order built on it) is the same on every run.
// A row that lists a block twice appears once here; the dk/dv pass counts its multiplicity.
func.func @invert_block_indices(%block_indices: tensor<?x?x${G}x${T}xi32>, %n: index)
    -> (tensor<?x${ROWS_PER_PIECE}x2xi32>, tensor<?xi32>, tensor<?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c0_i32 = arith.constant 0 : i32
  %c1_i32 = arith.constant 1 : i32
  %minus_one = arith.constant -1 : i32
  %block_size = arith.constant ${BS} : index
  %kv_heads = arith.constant ${G} : index
  %slots = arith.constant ${T} : index
  %rows_per_piece = arith.constant ${ROWS_PER_PIECE} : index
  %rows_per_piece_i32 = arith.constant ${ROWS_PER_PIECE} : i32
  %batch = tensor.dim %block_indices, %c0 : tensor<?x?x${G}x${T}xi32>
  %m_rows = tensor.dim %block_indices, %c1 : tensor<?x?x${G}x${T}xi32>
  %num_blocks = arith.ceildivui %n, %block_size : index
  %offset = arith.subi %n, %m_rows : index

  // selected[b, g, i, m] = 1 when row m lists block i in a slot that is not skipped.
  %sel_init = tensor.empty(%batch, %num_blocks, %m_rows) : tensor<?x${G}x?x?xi32>
  %sel_zero = linalg.fill ins(%c0_i32 : i32) outs(%sel_init : tensor<?x${G}x?x?xi32>) -> tensor<?x${G}x?x?xi32>
  %selected = linalg.generic {
      indexing_maps = [affine_map<(b, g, i, m, t) -> (b, m, g, t)>, affine_map<(b, g, i, m, t) -> (b, g, i, m)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%block_indices : tensor<?x?x${G}x${T}xi32>) outs(%sel_zero : tensor<?x${G}x?x?xi32>) {
  ^bb0(%block_i32: i32, %acc: i32):
    %i = linalg.index 2 : index
    %m = linalg.index 3 : index
    %block = arith.index_cast %block_i32 : i32 to index
    %pos = arith.addi %m, %offset : index
    %last_visible = arith.floordivsi %pos, %block_size : index
    %same = arith.cmpi eq, %block, %i : index
    %not_future = arith.cmpi sle, %i, %last_visible : index
    %hit = arith.andi %same, %not_future : i1
    %hit_i32 = arith.extui %hit : i1 to i32
    %any = arith.maxsi %acc, %hit_i32 : i32
    linalg.yield %any : i32
  } -> tensor<?x${G}x?x?xi32>

  // through[b, g, i, m]: how many of rows 0..m selected block i (an inclusive scan over m), so row m's place in
  // block i's list is through - 1, and through at m = M - 1 is the length of the list. (The scan's
  // accumulator result leaves out the last element in IREE 3.13, inclusive or not: it is not used.)
  %through_init = tensor.empty(%batch, %num_blocks, %m_rows) : tensor<?x${G}x?x?xi32>
  %rows_init = tensor.empty(%batch, %num_blocks) : tensor<?x${G}x?xi32>
  %rows_zero = linalg.fill ins(%c0_i32 : i32) outs(%rows_init : tensor<?x${G}x?xi32>) -> tensor<?x${G}x?xi32>
  %through, %unused_total = iree_linalg_ext.scan dimension(3) inclusive(true)
      ins(%selected : tensor<?x${G}x?x?xi32>) outs(%through_init, %rows_zero : tensor<?x${G}x?x?xi32>, tensor<?x${G}x?xi32>) {
  ^bb0(%a: i32, %b: i32):
    %s = arith.addi %a, %b : i32
    iree_linalg_ext.yield %s : i32
  } -> tensor<?x${G}x?x?xi32>, tensor<?x${G}x?xi32>

  // Pieces per block, then the first piece of every block in (b, g, i) order.
  %last_row = arith.subi %m_rows, %c1 : index
  %count_init = tensor.empty(%batch, %num_blocks) : tensor<?x${G}x?xi32>
  %piece_count_3d = linalg.generic {
      indexing_maps = [affine_map<(b, g, i) -> (b, g, i)>], iterator_types = ["parallel", "parallel", "parallel"]}
      outs(%count_init : tensor<?x${G}x?xi32>) {
  ^bb0(%out: i32):
    %b = linalg.index 0 : index
    %g = linalg.index 1 : index
    %i = linalg.index 2 : index
    %rows = tensor.extract %through[%b, %g, %i, %last_row] : tensor<?x${G}x?x?xi32>
    %pieces = arith.ceildivui %rows, %rows_per_piece_i32 : i32
    linalg.yield %pieces : i32
  } -> tensor<?x${G}x?xi32>
  %piece_count = tensor.collapse_shape %piece_count_3d [[0, 1, 2]] : tensor<?x${G}x?xi32> into tensor<?xi32>
  %total_blocks = tensor.dim %piece_count, %c0 : tensor<?xi32>
  %start_init = tensor.empty(%total_blocks) : tensor<?xi32>
  %total_init = tensor.empty() : tensor<i32>
  %total_zero = linalg.fill ins(%c0_i32 : i32) outs(%total_init : tensor<i32>) -> tensor<i32>
  %piece_start, %total_pieces = iree_linalg_ext.scan dimension(0) inclusive(false)
      ins(%piece_count : tensor<?xi32>) outs(%start_init, %total_zero : tensor<?xi32>, tensor<i32>) {
  ^bb0(%a: i32, %b: i32):
    %s = arith.addi %a, %b : i32
    iree_linalg_ext.yield %s : i32
  } -> tensor<?xi32>, tensor<i32>

  // Capacity: every row adds at most T entries and every block pads at most one piece.
  %mt = arith.muli %m_rows, %slots : index
  %row_pieces = arith.ceildivui %mt, %rows_per_piece : index
  %per_group = arith.addi %row_pieces, %num_blocks : index
  %bg = arith.muli %batch, %kv_heads : index
  %capacity = arith.muli %bg, %per_group : index
  %capacity_rows = arith.muli %capacity, %rows_per_piece : index
  %capacity_rows_i32 = arith.index_cast %capacity_rows : index to i32

  // One scatter update per slot: (c, fb) to its place in the list, or to the spare slot at the end when
  // the slot is skipped. A row listing a block twice writes the same value to the same place twice.
  %target_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${T}xi32>
  %update_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${T}x2xi32>
  %target, %update = linalg.generic {
      indexing_maps = [affine_map<(b, m, g, t, x) -> (b, m, g, t)>, affine_map<(b, m, g, t, x) -> (b, m, g, t)>,
                       affine_map<(b, m, g, t, x) -> (b, m, g, t, x)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]}
      ins(%block_indices : tensor<?x?x${G}x${T}xi32>) outs(%target_init, %update_init
          : tensor<?x?x${G}x${T}xi32>, tensor<?x?x${G}x${T}x2xi32>) {
  ^bb0(%block_i32: i32, %out_target: i32, %out_update: i32):
    %b = linalg.index 0 : index
    %m = linalg.index 1 : index
    %g = linalg.index 2 : index
    %x = linalg.index 4 : index
    %block = arith.index_cast %block_i32 : i32 to index
    %pos = arith.addi %m, %offset : index
    %last_visible = arith.floordivsi %pos, %block_size : index
    %not_negative = arith.cmpi sge, %block, %c0 : index
    %not_future = arith.cmpi sle, %block, %last_visible : index
    %chosen = arith.andi %not_negative, %not_future : i1
    %safe_block = arith.select %chosen, %block, %c0 : index
    %bgx = arith.muli %b, %kv_heads : index
    %bgi = arith.addi %bgx, %g : index
    %fb0 = arith.muli %bgi, %num_blocks : index
    %fb = arith.addi %fb0, %safe_block : index
    %through_here = tensor.extract %through[%b, %g, %safe_block, %m] : tensor<?x${G}x?x?xi32>
    %start_here = tensor.extract %piece_start[%fb] : tensor<?xi32>
    %list_start = arith.muli %start_here, %rows_per_piece_i32 : i32
    %list_end = arith.addi %list_start, %through_here : i32
    %place = arith.subi %list_end, %c1_i32 : i32
    %slot_target = arith.select %chosen, %place, %capacity_rows_i32 : i32
    %bm = arith.muli %b, %m_rows : index
    %bmm = arith.addi %bm, %m : index
    %c_0 = arith.muli %bmm, %kv_heads : index
    %c = arith.addi %c_0, %g : index
    %is_row = arith.cmpi eq, %x, %c0 : index
    %field = arith.select %is_row, %c, %fb : index
    %field_i32 = arith.index_cast %field : index to i32
    linalg.yield %slot_target, %field_i32 : i32, i32
  } -> (tensor<?x?x${G}x${T}xi32>, tensor<?x?x${G}x${T}x2xi32>)
  %target_flat = tensor.collapse_shape %target [[0, 1, 2, 3]] : tensor<?x?x${G}x${T}xi32> into tensor<?xi32>
  %slot_total = tensor.dim %target_flat, %c0 : tensor<?xi32>
  %target_col = tensor.expand_shape %target_flat [[0, 1]] output_shape [%slot_total, 1] : tensor<?xi32> into tensor<?x1xi32>
  %update_flat = tensor.collapse_shape %update [[0, 1, 2, 3], [4]] : tensor<?x?x${G}x${T}x2xi32> into tensor<?x2xi32>

  %list_len = arith.addi %capacity_rows, %c1 : index
  %list_init = tensor.empty(%list_len) : tensor<?x2xi32>
  %list_empty = linalg.fill ins(%minus_one : i32) outs(%list_init : tensor<?x2xi32>) -> tensor<?x2xi32>
  %list = iree_linalg_ext.scatter dimension_map = [0] unique_indices(true)
      ins(%update_flat, %target_col : tensor<?x2xi32>, tensor<?x1xi32>) outs(%list_empty : tensor<?x2xi32>) {
  ^bb0(%new: i32, %old: i32):
    iree_linalg_ext.yield %new : i32
  } -> tensor<?x2xi32>
  %list_used = tensor.extract_slice %list[0, 0] [%capacity_rows, 2] [1, 1] : tensor<?x2xi32> to tensor<?x2xi32>
  %entries = tensor.expand_shape %list_used [[0, 1], [2]] output_shape [%capacity, ${ROWS_PER_PIECE}, 2]
      : tensor<?x2xi32> into tensor<?x${ROWS_PER_PIECE}x2xi32>
  return %entries, %piece_start, %piece_count : tensor<?x${ROWS_PER_PIECE}x2xi32>, tensor<?xi32>, tensor<?xi32>
}
