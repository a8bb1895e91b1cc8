// Which keys each (b, m, g) query row sees, from its T slots (semantics.md, "Which keys a query row sees").
//   block_gather_index[b, m, g, t]: row of key_blocks to gather for slot t; a skipped slot points at the
//                                   zero block B * G * NB (see kv_blocks.mlir) and is masked out.
//   key_mask[b, m, g, t, j]:        key i*BS + j is visible: slot not skipped and i*BS + j <= pos(m).
// A slot is skipped when i < 0 or i*BS > pos(m) (future; covers i*BS >= N); pos(m) = m + N - M.
// Comparing i <= floor(pos / BS) instead of i*BS <= pos avoids overflow for huge indices.
// Slots past block_counts arrive here already set to -1 by the host.
func.func private @selected_slots(%block_indices: tensor<?x?x${G}x${T}xi32>, %n: index)
    -> (tensor<?x?x${G}x${T}xi32>, tensor<?x?x${G}x${T}x${BS}xi1>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %block_size = arith.constant ${BS} : index
  %kv_heads = arith.constant ${G} : index
  %batch = tensor.dim %block_indices, %c0 : tensor<?x?x${G}x${T}xi32>
  %m_rows = tensor.dim %block_indices, %c1 : tensor<?x?x${G}x${T}xi32>
  %num_blocks = arith.ceildivui %n, %block_size : index
  %offset = arith.subi %n, %m_rows : index

  %index_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${T}xi32>
  %block_gather_index = linalg.generic {
      indexing_maps = [affine_map<(b, m, g, t) -> (b, m, g, t)>, affine_map<(b, m, g, t) -> (b, m, g, t)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%block_indices : tensor<?x?x${G}x${T}xi32>) outs(%index_init : tensor<?x?x${G}x${T}xi32>) {
  ^bb0(%block_i32: i32, %out: i32):
    %b = linalg.index 0 : index
    %m = linalg.index 1 : index
    %g = linalg.index 2 : index
    %block = arith.index_cast %block_i32 : i32 to index
    %pos = arith.addi %m, %offset : index
    %last_visible = arith.floordivsi %pos, %block_size : index
    %not_negative = arith.cmpi sge, %block, %c0 : index
    %not_future = arith.cmpi sle, %block, %last_visible : index
    %selected = arith.andi %not_negative, %not_future : i1
    %bg0 = arith.muli %b, %kv_heads : index
    %bg = arith.addi %bg0, %g : index
    %row0 = arith.muli %bg, %num_blocks : index
    %row_selected = arith.addi %row0, %block : index
    %bg_count = arith.muli %batch, %kv_heads : index
    %zero_block = arith.muli %bg_count, %num_blocks : index
    %row = arith.select %selected, %row_selected, %zero_block : index
    %row_i32 = arith.index_cast %row : index to i32
    linalg.yield %row_i32 : i32
  } -> tensor<?x?x${G}x${T}xi32>

  %mask_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${T}x${BS}xi1>
  %key_mask = linalg.generic {
      indexing_maps = [affine_map<(b, m, g, t, j) -> (b, m, g, t)>, affine_map<(b, m, g, t, j) -> (b, m, g, t, j)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]}
      ins(%block_indices : tensor<?x?x${G}x${T}xi32>) outs(%mask_init : tensor<?x?x${G}x${T}x${BS}xi1>) {
  ^bb0(%block_i32: i32, %out: i1):
    %m = linalg.index 1 : index
    %j = linalg.index 4 : index
    %block = arith.index_cast %block_i32 : i32 to index
    %pos = arith.addi %m, %offset : index
    %last_visible = arith.floordivsi %pos, %block_size : index
    %not_negative = arith.cmpi sge, %block, %c0 : index
    %not_future = arith.cmpi sle, %block, %last_visible : index
    %selected = arith.andi %not_negative, %not_future : i1
    %key0 = arith.muli %block, %block_size : index
    %key = arith.addi %key0, %j : index
    %causal = arith.cmpi sle, %key, %pos : index
    %visible = arith.andi %selected, %causal : i1
    linalg.yield %visible : i1
  } -> tensor<?x?x${G}x${T}x${BS}xi1>
  return %block_gather_index, %key_mask : tensor<?x?x${G}x${T}xi32>, tensor<?x?x${G}x${T}x${BS}xi1>
}
