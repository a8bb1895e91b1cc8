// Stable inversion of block_indices for the two-pass backward: for every (b, g, kv block i) the query rows
// that selected it, in increasing m, cut into pieces of ROWS_PER_PIECE rows.
//
//   entries[p, r]    = (c, fb): row r of piece p is query row-group c = (b * M + m) * G + g, and the piece
//                      belongs to flat block fb = (b * G + g) * NB + i; (-1, -1) pads a piece.
//   piece_start[fb]  = first piece of block fb;  piece_count[fb] = ceil(rows that selected fb / ROWS_PER_PIECE)
//
// Pieces bound the work of one dk/dv work item: with realistic selections block 0 is selected by every row,
// and one work item walking all M rows would serialise the pass. The list order comes from counting, not
// from atomics, so the result (and the dk/dv reduction order built on it) is the same on every run.
// A row that lists a block twice appears once here; the dk/dv pass counts its multiplicity.
//
// Cost shape (64k tokens, 4 groups: 4096 blocks x 65536 rows). IREE lowers iree_linalg_ext.scan to one
// sequential walk per scanned line, so a scan over all M rows of every block walks 65536 steps. Rows are
// instead cut into chunks of 64 (the literal 64 in the shapes below; docs/performance.md, 'Recipe and template values'):
//   selected   [b, g, i, chunk, r] i8: 1 where row chunk*64 + r lists block i, written by a 1-D scatter
//                                      of the slots (a 2-D scatter of these flags gave wrong lists on the
//                                      H200; tests/lit/dispatch_count.test keeps every scatter 1-D);
//   chunk_rows [b, g, i, chunk]      : rows of the chunk that selected the block (a 64-wide reduction);
//   through    [b, g, i, chunk]      : inclusive scan of chunk_rows over the chunks, in two levels (groups
//                                      of 32 chunks; M/2048 sequential steps per line);
//   chunk_bits [b, g, i, chunk] i64  : bit r set where row chunk*64 + r selected the block (the same
//                                      reduction as chunk_rows);
//   rank of a slot                   : through - chunk_rows + rows r' <= r of its chunk that selected the
//                                      block (the popcount of chunk_bits' bits 0 .. r; no scan).
// Only each scan's first result is read (the inclusive ones' and piece_start's, an exclusive scan): in IREE 3.13
// the accumulator result leaves out the last element (and stays unwritten for a scanned dimension of length 1).
// (A stage of the two-pass, and a part of gpu/hopper/forward_pieces.mlir, which inverts the lists itself.)
<# part: takes CHUNK_COUNT_CONFIG, CHUNK_SUM_CONFIG #>
<% import "common/blocks.mlir" as blocks %>
<% import "common/rules.mlir" as rules %>
func.func @invert_block_indices(%block_indices: tensor<?x?x${G}x${T}xi32>, %n: index,
    %transients: !hal.buffer {iree.abi.transients})
    -> (tensor<?x${ROWS_PER_PIECE}x2xi32>, tensor<?xi32>, tensor<?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c0_i32 = arith.constant 0 : i32
  %c1_i32 = arith.constant 1 : i32
  %c0_i8 = arith.constant 0 : i8
  %c0_i64 = arith.constant 0 : i64
  %all_ones = arith.constant -1 : i64
  %c63 = arith.constant 63 : index
  %c1_i8 = arith.constant 1 : i8
  %minus_one = arith.constant -1 : i32
  %chunk = arith.constant 64 : index
  %block_size = arith.constant ${BS} : index
  %kv_heads = arith.constant ${G} : index
  %slots = arith.constant ${T} : index
  %rows_per_piece = arith.constant ${ROWS_PER_PIECE} : index
  %rows_per_piece_i32 = arith.constant ${ROWS_PER_PIECE} : i32
  %batch = tensor.dim %block_indices, %c0 : tensor<?x?x${G}x${T}xi32>
  %m_rows = tensor.dim %block_indices, %c1 : tensor<?x?x${G}x${T}xi32>
  %num_blocks = arith.ceildivui %n, %block_size : index
  ${ rules.offset() }

  %chunks = arith.ceildivui %m_rows, %chunk : index
  %bg_count = arith.muli %batch, %kv_heads : index
  %flat_blocks = arith.muli %bg_count, %num_blocks : index

  // Where each slot's flag lives: element fb * (chunks + 1) * 64 + m of `selected` flattened. Every line
  // has one spare chunk after its rows: a skipped slot writes there (in block 0's line), so the tensor needs
  // no slicing before it is reshaped, and nothing reads the spare chunks' flags (their counts come after
  // every real chunk in the scan below). Every update writes 1, so a row listing a block twice writes 1
  // twice to one place (benign); the scatter can say unique_indices(true), whose GPU lowering is parallel
  // (the non-unique form runs on one thread). The index is one i64 per update: a 1-D scatter, with room for
  // B * G * NB * M flags.
  %line_chunks = arith.addi %chunks, %c1 : index
  %line_len = arith.muli %line_chunks, %chunk : index
  %spare_row = arith.muli %chunks, %chunk : index
  %flag_where_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${T}xi64>
  %flag_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${T}xi8>
  %flag_where, %flag_one = linalg.generic {
      indexing_maps = [affine_map<(b, m, g, t) -> (b, m, g, t)>, affine_map<(b, m, g, t) -> (b, m, g, t)>,
                       affine_map<(b, m, g, t) -> (b, m, g, t)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%block_indices : tensor<?x?x${G}x${T}xi32>)
      outs(%flag_where_init, %flag_init : tensor<?x?x${G}x${T}xi64>, tensor<?x?x${G}x${T}xi8>) {
  ^bb0(%block_i32: i32, %out_where: i64, %out_flag: i8):
    %b = linalg.index 0 : index
    %m = linalg.index 1 : index
    %g = linalg.index 2 : index
${ blocks.selected("chosen") }
    %safe_block = arith.select %chosen, %block, %c0 : index
    %row = arith.select %chosen, %m, %spare_row : index
    %bgx = arith.muli %b, %kv_heads : index
    %bgi = arith.addi %bgx, %g : index
    %fb0 = arith.muli %bgi, %num_blocks : index
    %fb = arith.addi %fb0, %safe_block : index
    %line_start = arith.muli %fb, %line_len : index
    %where = arith.addi %line_start, %row : index
    %where_i64 = arith.index_cast %where : index to i64
    linalg.yield %where_i64, %c1_i8 : i64, i8
  } -> (tensor<?x?x${G}x${T}xi64>, tensor<?x?x${G}x${T}xi8>)
  %flag_where_flat = tensor.collapse_shape %flag_where [[0, 1, 2, 3]] : tensor<?x?x${G}x${T}xi64> into tensor<?xi64>
  %slot_total = tensor.dim %flag_where_flat, %c0 : tensor<?xi64>
  %flag_where_col = tensor.expand_shape %flag_where_flat [[0, 1]] output_shape [%slot_total, 1]
      : tensor<?xi64> into tensor<?x1xi64>
  %ones = tensor.collapse_shape %flag_one [[0, 1, 2, 3]] : tensor<?x?x${G}x${T}xi8> into tensor<?xi8>
  %flag_count = arith.muli %flat_blocks, %line_len : index
  %flags_init = tensor.empty(%flag_count) : tensor<?xi8>
  %flags_zero = linalg.fill ins(%c0_i8 : i8) outs(%flags_init : tensor<?xi8>) -> tensor<?xi8>
  %flags = iree_linalg_ext.scatter dimension_map = [0] unique_indices(true)
      ins(%ones, %flag_where_col : tensor<?xi8>, tensor<?x1xi64>) outs(%flags_zero : tensor<?xi8>) {
  ^bb0(%new: i8, %old: i8):
    iree_linalg_ext.yield %new : i8
  } -> tensor<?xi8>
  %selected = tensor.expand_shape %flags [[0, 1, 2, 3, 4]]
      output_shape [%batch, ${G}, %num_blocks, %line_chunks, 64] : tensor<?xi8> into tensor<?x${G}x?x?x64xi8>

  // chunk_rows, and chunk_bits[b, g, i, j]: bit r set where row j 64 + r selected the block (the rank below counts
  // the bits at and below a row's own, one load and a popcount).
  %chunk_rows, %chunk_bits = flow.dispatch.region -> (tensor<?x${G}x?x?xi32>{%batch, %num_blocks, %line_chunks},
                                                      tensor<?x${G}x?x?xi64>{%batch, %num_blocks, %line_chunks}) {
    %chunk_rows_init = tensor.empty(%batch, %num_blocks, %line_chunks) : tensor<?x${G}x?x?xi32>
    %chunk_rows_zero = linalg.fill ins(%c0_i32 : i32) outs(%chunk_rows_init : tensor<?x${G}x?x?xi32>) -> tensor<?x${G}x?x?xi32>
    %chunk_bits_init = tensor.empty(%batch, %num_blocks, %line_chunks) : tensor<?x${G}x?x?xi64>
    %chunk_bits_zero = linalg.fill ins(%c0_i64 : i64) outs(%chunk_bits_init : tensor<?x${G}x?x?xi64>) -> tensor<?x${G}x?x?xi64>
    %chunk_sum, %chunk_or = linalg.generic {
        indexing_maps = [affine_map<(b, g, i, j, r) -> (b, g, i, j, r)>, affine_map<(b, g, i, j, r) -> (b, g, i, j)>,
                         affine_map<(b, g, i, j, r) -> (b, g, i, j)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]
        ${CHUNK_COUNT_CONFIG}}
        ins(%selected : tensor<?x${G}x?x?x64xi8>) outs(%chunk_rows_zero, %chunk_bits_zero
            : tensor<?x${G}x?x?xi32>, tensor<?x${G}x?x?xi64>) {
    ^bb0(%flag: i8, %acc: i32, %bits: i64):
      %flag_i32 = arith.extui %flag : i8 to i32
      %sum = arith.addi %acc, %flag_i32 : i32
      %r = linalg.index 4 : index
      %r_i64 = arith.index_cast %r : index to i64
      %flag_i64 = arith.extui %flag : i8 to i64
      %bit = arith.shli %flag_i64, %r_i64 : i64
      %bits_now = arith.ori %bits, %bit : i64
      linalg.yield %sum, %bits_now : i32, i64
    } -> (tensor<?x${G}x?x?xi32>, tensor<?x${G}x?x?xi64>)
    flow.return %chunk_sum, %chunk_or : tensor<?x${G}x?x?xi32>, tensor<?x${G}x?x?xi64>
  }

  // through[b, g, i, j]: rows of chunks 0 .. j that selected the block (an inclusive scan over a line's
  // chunks), in two levels: the chunks summed in groups of 32 (in parallel), an inclusive scan of the group
  // sums (line_chunks / 32 steps per line), then each chunk adds the earlier chunks of its own group (at
  // most 31 loads). One scan over all the chunks walks them one after the other per line: 1025 steps at
  // 64k tokens. (CHUNK_SUM_CONFIG: the recipe's tiling of the two passes, a line's chunks across a workgroup's
  // lanes; IREE 3.13's own flattens each pass and gave a workgroup of 32 lanes 4 elements on cuda.)
  %group = arith.constant 32 : index
  %groups = arith.ceildivui %line_chunks, %group : index
  %group_sum_init = tensor.empty(%batch, %num_blocks, %groups) : tensor<?x${G}x?x?xi32>
  %group_sum = flow.dispatch.region -> (tensor<?x${G}x?x?xi32>{%batch, %num_blocks, %groups}) {
  %group_sum_pass = linalg.generic {
      indexing_maps = [affine_map<(b, g, i, q) -> (b, g, i, q)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]
      ${CHUNK_SUM_CONFIG}}
      outs(%group_sum_init : tensor<?x${G}x?x?xi32>) {
  ^bb0(%out: i32):
    %b = linalg.index 0 : index
    %g = linalg.index 1 : index
    %i = linalg.index 2 : index
    %q = linalg.index 3 : index
    %first = arith.muli %q, %group : index
    %after = arith.addi %first, %group : index
    %end = arith.minui %after, %line_chunks : index
    %sum = scf.for %j = %first to %end step %c1 iter_args(%acc = %c0_i32) -> (i32) {
      %x = tensor.extract %chunk_rows[%b, %g, %i, %j] : tensor<?x${G}x?x?xi32>
      %next = arith.addi %acc, %x : i32
      scf.yield %next : i32
    }
    linalg.yield %sum : i32
  } -> tensor<?x${G}x?x?xi32>
  flow.return %group_sum_pass : tensor<?x${G}x?x?xi32>
  }
  %groups_through_init = tensor.empty(%batch, %num_blocks, %groups) : tensor<?x${G}x?x?xi32>
  %rows_init = tensor.empty(%batch, %num_blocks) : tensor<?x${G}x?xi32>
  %rows_zero = linalg.fill ins(%c0_i32 : i32) outs(%rows_init : tensor<?x${G}x?xi32>) -> tensor<?x${G}x?xi32>
  %groups_through, %unused_total = iree_linalg_ext.scan dimension(3) inclusive(true)
      ins(%group_sum : tensor<?x${G}x?x?xi32>) outs(%groups_through_init, %rows_zero : tensor<?x${G}x?x?xi32>, tensor<?x${G}x?xi32>) {
  ^bb0(%a: i32, %b: i32):
    %s = arith.addi %a, %b : i32
    iree_linalg_ext.yield %s : i32
  } -> tensor<?x${G}x?x?xi32>, tensor<?x${G}x?xi32>
  %through_init = tensor.empty(%batch, %num_blocks, %line_chunks) : tensor<?x${G}x?x?xi32>
  %through = flow.dispatch.region -> (tensor<?x${G}x?x?xi32>{%batch, %num_blocks, %line_chunks}) {
  %through_pass = linalg.generic {
      indexing_maps = [affine_map<(b, g, i, j) -> (b, g, i, j)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]
      ${CHUNK_SUM_CONFIG}}
      outs(%through_init : tensor<?x${G}x?x?xi32>) {
  ^bb0(%out: i32):
    %b = linalg.index 0 : index
    %g = linalg.index 1 : index
    %i = linalg.index 2 : index
    %j = linalg.index 3 : index
    %q = arith.divui %j, %group : index
    %first = arith.muli %q, %group : index
    %through_group = tensor.extract %groups_through[%b, %g, %i, %q] : tensor<?x${G}x?x?xi32>
    %in_group = tensor.extract %group_sum[%b, %g, %i, %q] : tensor<?x${G}x?x?xi32>
    %before_group = arith.subi %through_group, %in_group : i32
    %last = arith.addi %j, %c1 : index
    %sum = scf.for %j2 = %first to %last step %c1 iter_args(%acc = %before_group) -> (i32) {
      %x = tensor.extract %chunk_rows[%b, %g, %i, %j2] : tensor<?x${G}x?x?xi32>
      %next = arith.addi %acc, %x : i32
      scf.yield %next : i32
    }
    linalg.yield %sum : i32
  } -> tensor<?x${G}x?x?xi32>
  flow.return %through_pass : tensor<?x${G}x?x?xi32>
  }

  // Pieces per block (its list length is `through` at the last chunk), then the first piece of every block
  // in (b, g, i) order.
  %last_chunk = arith.subi %chunks, %c1 : index
  %count_init = tensor.empty(%batch, %num_blocks) : tensor<?x${G}x?xi32>
  %piece_count_3d = linalg.generic {
      indexing_maps = [affine_map<(b, g, i) -> (b, g, i)>], iterator_types = ["parallel", "parallel", "parallel"]}
      outs(%count_init : tensor<?x${G}x?xi32>) {
  ^bb0(%out: i32):
    %b = linalg.index 0 : index
    %g = linalg.index 1 : index
    %i = linalg.index 2 : index
    %rows = tensor.extract %through[%b, %g, %i, %last_chunk] : tensor<?x${G}x?x?xi32>
    %pieces = arith.ceildivui %rows, %rows_per_piece_i32 : i32
    linalg.yield %pieces : i32
  } -> tensor<?x${G}x?xi32>
  %piece_count = tensor.collapse_shape %piece_count_3d [[0, 1, 2]] : tensor<?x${G}x?xi32> into tensor<?xi32>
  %start_init = tensor.empty(%flat_blocks) : tensor<?xi32>
  %total_init = tensor.empty() : tensor<i32>
  %total_zero = linalg.fill ins(%c0_i32 : i32) outs(%total_init : tensor<i32>) -> tensor<i32>
  %piece_start, %total_pieces = iree_linalg_ext.scan dimension(0) inclusive(false)
      ins(%piece_count : tensor<?xi32>) outs(%start_init, %total_zero : tensor<?xi32>, tensor<i32>) {
  ^bb0(%a: i32, %b: i32):
    %s = arith.addi %a, %b : i32
    iree_linalg_ext.yield %s : i32
  } -> tensor<?xi32>, tensor<i32>

  // rank[b, m, g, t]: 1-based place of row m in the list of the block slot t names = rows of earlier
  // chunks (through - chunk_rows) + rows r' <= r of its own chunk that selected the block. Skipped slots get
  // block 0's value, which the scatter below ignores.
<% call blocks.per_slot("rank") %>
    %b = linalg.index 0 : index
    %m = linalg.index 1 : index
    %g = linalg.index 2 : index
    %block = arith.index_cast %block_i32 : i32 to index
    %in_range = arith.cmpi ult, %block, %num_blocks : index
    %safe_block = arith.select %in_range, %block, %c0 : index
    %j = arith.divui %m, %chunk : index
    %row_in_chunk = arith.remui %m, %chunk : index
    %through_here = tensor.extract %through[%b, %g, %safe_block, %j] : tensor<?x${G}x?x?xi32>
    %in_chunk = tensor.extract %chunk_rows[%b, %g, %safe_block, %j] : tensor<?x${G}x?x?xi32>
    %before = arith.subi %through_here, %in_chunk : i32
    // The chunk's rows r' <= r that selected the block: its bits 0 .. r (all ones shifted right by 63 - r).
    %bits = tensor.extract %chunk_bits[%b, %g, %safe_block, %j] : tensor<?x${G}x?x?xi64>
    %above = arith.subi %c63, %row_in_chunk : index
    %above_i64 = arith.index_cast %above : index to i64
    %at_or_below = arith.shrui %all_ones, %above_i64 : i64
    %bits_here = arith.andi %bits, %at_or_below : i64
    %count_i64 = math.ctpop %bits_here : i64
    %count = arith.trunci %count_i64 : i64 to i32
    %rank_here = arith.addi %before, %count : i32
    linalg.yield %rank_here : i32
<% endcall %>

  // Capacity: every row adds at most T entries and every block pads at most one piece.
  %mt = arith.muli %m_rows, %slots : index
  %row_pieces = arith.ceildivui %mt, %rows_per_piece : index
  %per_group = arith.addi %row_pieces, %num_blocks : index
  %capacity = arith.muli %bg_count, %per_group : index
  %capacity_rows = arith.muli %capacity, %rows_per_piece : index
  %capacity_rows_i32 = arith.index_cast %capacity_rows : index to i32

  // One scatter update per slot: (c, fb) to its place in the list, or to the spare slot at the end when
  // the slot is skipped. A row listing a block twice writes the same value to the same place twice.
  %target_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${T}xi32>
  %update_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${T}x2xi32>
  %target, %update = linalg.generic {
      indexing_maps = [affine_map<(b, m, g, t, x) -> (b, m, g, t)>, affine_map<(b, m, g, t, x) -> (b, m, g, t)>,
                       affine_map<(b, m, g, t, x) -> (b, m, g, t)>, affine_map<(b, m, g, t, x) -> (b, m, g, t, x)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]}
      ins(%block_indices, %rank : tensor<?x?x${G}x${T}xi32>, tensor<?x?x${G}x${T}xi32>) outs(%target_init, %update_init
          : tensor<?x?x${G}x${T}xi32>, tensor<?x?x${G}x${T}x2xi32>) {
  ^bb0(%block_i32: i32, %rank_here: i32, %out_target: i32, %out_update: i32):
    %b = linalg.index 0 : index
    %m = linalg.index 1 : index
    %g = linalg.index 2 : index
    %x = linalg.index 4 : index
${ blocks.selected("chosen") }
    %safe_block = arith.select %chosen, %block, %c0 : index
    %bgx = arith.muli %b, %kv_heads : index
    %bgi = arith.addi %bgx, %g : index
    %fb0 = arith.muli %bgi, %num_blocks : index
    %fb = arith.addi %fb0, %safe_block : index
    %start_here = tensor.extract %piece_start[%fb] : tensor<?xi32>
    %list_start = arith.muli %start_here, %rows_per_piece_i32 : i32
    %list_end = arith.addi %list_start, %rank_here : i32
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
