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
//
// Why it is built the way it is (GPU cost at 64k tokens, 4096 blocks x 65536 rows):
// - IREE lowers iree_linalg_ext.scan to one sequential walk per scanned line, so one scan over all M rows
//   of a block serialises 65536 steps. m is cut into chunks of CHUNK rows instead: many short scans run in
//   parallel, one short scan runs over the chunk totals, and a row's place is chunk offset + in-chunk rank.
// - CHUNK = 256 (the literal in the shapes below: one constant for every target).
// - `selected` is written by a scatter of the B*M*G*T slots (not by a reduction that visits every (block,
//   row) pair over all T slots), and is i16 (in-chunk counts never exceed CHUNK), so the two dense (block,
//   row) tensors, [B*G*NB*ceil(M/CHUNK), CHUNK], take half the memory of i32 ones. Only the chunk-level scan,
//   whose counts reach M, is i32.
func.func @invert_block_indices(%block_indices: tensor<?x?x${G}x${T}xi32>, %n: index)
    -> (tensor<?x${ROWS_PER_PIECE}x2xi32>, tensor<?xi32>, tensor<?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c0_i32 = arith.constant 0 : i32
  %c1_i32 = arith.constant 1 : i32
  %c0_i16 = arith.constant 0 : i16
  %c1_i16 = arith.constant 1 : i16
  %minus_one = arith.constant -1 : i32
  %block_size = arith.constant ${BS} : index
  %kv_heads = arith.constant ${G} : index
  %slots = arith.constant ${T} : index
  %chunk = arith.constant 256 : index
  %rows_per_piece = arith.constant ${ROWS_PER_PIECE} : index
  %rows_per_piece_i32 = arith.constant ${ROWS_PER_PIECE} : i32
  %batch = tensor.dim %block_indices, %c0 : tensor<?x?x${G}x${T}xi32>
  %m_rows = tensor.dim %block_indices, %c1 : tensor<?x?x${G}x${T}xi32>
  %num_blocks = arith.ceildivui %n, %block_size : index
  %offset = arith.subi %n, %m_rows : index
  %chunks = arith.ceildivui %m_rows, %chunk : index
  %bg = arith.muli %batch, %kv_heads : index
  %flat_blocks = arith.muli %bg, %num_blocks : index

  // Whether each slot is used, and where its (block, row) flag lives: row m of flat block fb is element
  // m % CHUNK of line fb * chunks + m / CHUNK of `selected`. A skipped slot targets the spare line at the
  // end, which nothing reads. Every update writes 1, so a row listing a block twice writes 1 twice to one
  // place (benign), and the scatter can be unique_indices(true): the non-unique form runs on one GPU thread.
  %lines = arith.muli %flat_blocks, %chunks : index
  %where_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${T}x2xi32>
  %where = linalg.generic {
      indexing_maps = [affine_map<(b, m, g, t, x) -> (b, m, g, t)>, affine_map<(b, m, g, t, x) -> (b, m, g, t, x)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]}
      ins(%block_indices : tensor<?x?x${G}x${T}xi32>) outs(%where_init : tensor<?x?x${G}x${T}x2xi32>) {
  ^bb0(%block_i32: i32, %out: i32):
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
    %bgx = arith.muli %b, %kv_heads : index
    %bgi = arith.addi %bgx, %g : index
    %fb0 = arith.muli %bgi, %num_blocks : index
    %fb = arith.addi %fb0, %block : index
    %in_chunk = arith.remui %m, %chunk : index
    %which_chunk = arith.divui %m, %chunk : index
    %line_0 = arith.muli %fb, %chunks : index
    %line_used = arith.addi %line_0, %which_chunk : index
    %line = arith.select %chosen, %line_used, %lines : index
    %is_line = arith.cmpi eq, %x, %c0 : index
    %field = arith.select %is_line, %line, %in_chunk : index
    %field_i32 = arith.index_cast %field : index to i32
    linalg.yield %field_i32 : i32
  } -> tensor<?x?x${G}x${T}x2xi32>
  %where_flat = tensor.collapse_shape %where [[0, 1, 2, 3], [4]] : tensor<?x?x${G}x${T}x2xi32> into tensor<?x2xi32>
  %slot_total = tensor.dim %where_flat, %c0 : tensor<?x2xi32>
  %ones_init = tensor.empty(%slot_total) : tensor<?xi16>
  %ones = linalg.fill ins(%c1_i16 : i16) outs(%ones_init : tensor<?xi16>) -> tensor<?xi16>
  %spare_lines = arith.addi %lines, %c1 : index
  %sel_init = tensor.empty(%spare_lines) : tensor<?x256xi16>
  %sel_zero = linalg.fill ins(%c0_i16 : i16) outs(%sel_init : tensor<?x256xi16>) -> tensor<?x256xi16>
  %sel_all = iree_linalg_ext.scatter dimension_map = [0, 1] unique_indices(true)
      ins(%ones, %where_flat : tensor<?xi16>, tensor<?x2xi32>) outs(%sel_zero : tensor<?x256xi16>) {
  ^bb0(%new: i16, %old: i16):
    iree_linalg_ext.yield %new : i16
  } -> tensor<?x256xi16>
  %selected = tensor.extract_slice %sel_all[0, 0] [%lines, 256] [1, 1] : tensor<?x256xi16> to tensor<?x256xi16>

  // within[fb * chunks + j, k]: how many of rows j*CHUNK .. j*CHUNK + k selected block fb (inclusive,
  // in-chunk); the chunk's total is its last element. (Scan accumulator results are not used anywhere: in
  // IREE 3.13 they leave out the last element or, for a scanned dimension of length 1, stay unwritten.)
  // IREE's GPU scan gives each lane one line (its first dimension is spread over the lanes; a layout with
  // the lines innermost, which would coalesce, left the scan on one lane per workgroup).
  %within_init = tensor.empty(%lines) : tensor<?x256xi16>
  %unused_init = tensor.empty(%lines) : tensor<?xi16>
  %unused_zero = linalg.fill ins(%c0_i16 : i16) outs(%unused_init : tensor<?xi16>) -> tensor<?xi16>
  %within, %unused_chunk_total = iree_linalg_ext.scan dimension(1) inclusive(true)
      ins(%selected : tensor<?x256xi16>) outs(%within_init, %unused_zero : tensor<?x256xi16>, tensor<?xi16>) {
  ^bb0(%a: i16, %b: i16):
    %s = arith.addi %a, %b : i16
    iree_linalg_ext.yield %s : i16
  } -> tensor<?x256xi16>, tensor<?xi16>

  // before_chunk[fb, j]: rows of chunks 0..j-1 that selected fb (an exclusive scan over the chunk totals).
  // A block's list length is before_chunk + the chunk total at its last chunk.
  %last_in_chunk = arith.constant 255 : index
  %chunk_rows_wide_init = tensor.empty(%flat_blocks, %chunks) : tensor<?x?xi32>
  %chunk_rows_wide = linalg.generic {
      indexing_maps = [affine_map<(f, j) -> (f, j)>],
      iterator_types = ["parallel", "parallel"]}
      outs(%chunk_rows_wide_init : tensor<?x?xi32>) {
  ^bb0(%out: i32):
    %f = linalg.index 0 : index
    %j = linalg.index 1 : index
    %line_0 = arith.muli %f, %chunks : index
    %line = arith.addi %line_0, %j : index
    %r = tensor.extract %within[%line, %last_in_chunk] : tensor<?x256xi16>
    %w = arith.extui %r : i16 to i32
    linalg.yield %w : i32
  } -> tensor<?x?xi32>
  %before_init = tensor.empty(%flat_blocks, %chunks) : tensor<?x?xi32>
  %carry_init = tensor.empty(%flat_blocks) : tensor<?xi32>
  %carry_zero = linalg.fill ins(%c0_i32 : i32) outs(%carry_init : tensor<?xi32>) -> tensor<?xi32>
  %before_chunk, %carry = iree_linalg_ext.scan dimension(1) inclusive(false)
      ins(%chunk_rows_wide : tensor<?x?xi32>) outs(%before_init, %carry_zero : tensor<?x?xi32>, tensor<?xi32>) {
  ^bb0(%a: i32, %b: i32):
    %s = arith.addi %a, %b : i32
    iree_linalg_ext.yield %s : i32
  } -> tensor<?x?xi32>, tensor<?xi32>

  // Pieces per block, then the first piece of every block in (b, g, i) order.
  %last_chunk = arith.subi %chunks, %c1 : index
  %count_init = tensor.empty(%flat_blocks) : tensor<?xi32>
  %piece_count = linalg.generic {
      indexing_maps = [affine_map<(f) -> (f)>], iterator_types = ["parallel"]}
      outs(%count_init : tensor<?xi32>) {
  ^bb0(%out: i32):
    %f = linalg.index 0 : index
    %before_last = tensor.extract %before_chunk[%f, %last_chunk] : tensor<?x?xi32>
    %in_last = tensor.extract %chunk_rows_wide[%f, %last_chunk] : tensor<?x?xi32>
    %r = arith.addi %before_last, %in_last : i32
    %pieces = arith.ceildivui %r, %rows_per_piece_i32 : i32
    linalg.yield %pieces : i32
  } -> tensor<?xi32>
  %start_init = tensor.empty(%flat_blocks) : tensor<?xi32>
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
  %capacity = arith.muli %bg, %per_group : index
  %capacity_rows = arith.muli %capacity, %rows_per_piece : index
  %capacity_rows_i32 = arith.index_cast %capacity_rows : index to i32

  // One scatter update per slot: (c, fb) to its place in the list, or to the spare slot at the end when
  // the slot is skipped. A row listing a block twice writes the same value to the same place twice.
  // A row's 1-based place in its block's list = rows of earlier chunks + its in-chunk inclusive count.
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
    %in_chunk = arith.remui %m, %chunk : index
    %which_chunk = arith.divui %m, %chunk : index
    %line_0 = arith.muli %fb, %chunks : index
    %line = arith.addi %line_0, %which_chunk : index
    %rank_here = tensor.extract %within[%line, %in_chunk] : tensor<?x256xi16>
    %before_here = tensor.extract %before_chunk[%fb, %which_chunk] : tensor<?x?xi32>
    %rank_wide = arith.extui %rank_here : i16 to i32
    %start_here = tensor.extract %piece_start[%fb] : tensor<?xi32>
    %list_start = arith.muli %start_here, %rows_per_piece_i32 : i32
    %list_chunk = arith.addi %list_start, %before_here : i32
    %list_end = arith.addi %list_chunk, %rank_wide : i32
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
