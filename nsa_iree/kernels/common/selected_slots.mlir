// Which keys each (b, m, g) query row sees, from its T slots (semantics.md, "Which keys a query row sees").
//   block_gather_index[b, m, g, t]: row of key_blocks to gather for slot t; a skipped slot points at the
//                                   zero block B * G * NB (see kv_blocks.mlir) and is masked out.
//   last_key[b, m, g, t]:           the last visible key of the slot's block, as an offset j in [0, BS):
//                                   key i*BS + j is visible iff j <= last_key (-1 for a skipped slot); with a
//                                   sliding window, the code of the first and the last (rules.key_code).
//                                   One i32 per slot instead of a [T, BS] mask per row: consumers
//                                   compare it with their key index inside the fused regions.
// A slot is skipped when i < 0 or i*BS > pos(m) (future; covers i*BS >= N); pos(m) = m + N - M.
// Comparing i <= floor(pos / BS) instead of i*BS <= pos avoids overflow for huge indices.
// Slots past block_counts arrive here already set to -1 by the host.
<% import "common/blocks.mlir" as blocks %>
<% import "common/rules.mlir" as rules %>
func.func private @selected_slots(%block_indices: tensor<?x?x${G}x${T}xi32>, %n: index)
    -> (tensor<?x?x${G}x${T}xi32>, tensor<?x?x${G}x${T}xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %block_size = arith.constant ${BS} : index
  %kv_heads = arith.constant ${G} : index
  %batch = tensor.dim %block_indices, %c0 : tensor<?x?x${G}x${T}xi32>
  %m_rows = tensor.dim %block_indices, %c1 : tensor<?x?x${G}x${T}xi32>
  %num_blocks = arith.ceildivui %n, %block_size : index
  ${ rules.offset() }

<% call blocks.per_slot("block_gather_index") %>
    %b = linalg.index 0 : index
    %m = linalg.index 1 : index
    %g = linalg.index 2 : index
${ blocks.selected("selected") }
    %bg0 = arith.muli %b, %kv_heads : index
    %bg = arith.addi %bg0, %g : index
    %row0 = arith.muli %bg, %num_blocks : index
    %row_selected = arith.addi %row0, %block : index
    %bg_count = arith.muli %batch, %kv_heads : index
    %zero_block = arith.muli %bg_count, %num_blocks : index
    %row = arith.select %selected, %row_selected, %zero_block : index
    %row_i32 = arith.index_cast %row : index to i32
    linalg.yield %row_i32 : i32
<% endcall %>

<% call blocks.per_slot("last_key") %>
    %m = linalg.index 1 : index
${ blocks.selected("selected") }
    // Only read when selected (0 <= i <= pos / BS), so key0 <= pos; capped at BS - 1 to stay in i32.
    %key0 = arith.muli %block, %block_size : index
    %past = arith.subi %pos, %key0 : index
    %last_in_block = arith.subi %block_size, %c1 : index
    %last = arith.minsi %past, %last_in_block : index
    %last_i32 = arith.index_cast %last : index to i32
${ rules.key_code("result", "last_i32", "selected") }
    linalg.yield %result : i32
<% endcall %>
  return %block_gather_index, %last_key : tensor<?x?x${G}x${T}xi32>, tensor<?x?x${G}x${T}xi32>
}
