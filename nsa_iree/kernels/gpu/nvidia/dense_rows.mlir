// Part of the dense kernels (dense_forward.mlir, dense_dq.mlir: `// part: dense_rows`): the rows of the workgroup's
// tile. Row R of kv group g is (position m = R / HPG, head h0 + R mod HPG); the lane's rows are rows 8 i + r of its
// subgroup's 16 (i = 0, 1): %row_i, %m_i, %head_i, %head_valid_i (false past M x HPG: padding) and %pos_i = pos(m_i).
// Defines besides %subgroup_row0, %subgroup_pos (the last position the subgroup's rows see keys up to; -1: none,
// also for a subgroup of padding rows), the workgroup's %pos, its last tile %last_visible_block, the tiles it
// stages %slots and the pipeline's %steps. Uses %g, %row_tile, %subgroup, %r, %m_rows, %heads_per_group,
// %rows_per_workgroup, %block_size, %lag and the constants.
<# part: takes nothing #>
<# With a window (selection keys, KEY_STRIDE 1) it also defines %offset and the band's %first_tile; the staged
   tiles %slots are then the band's, from %first_tile on. #>
<% import "common/rules.mlir" as rules %>
<% if KEY_STRIDE == "1" %>
      ${ rules.offset() }
<% endif %>
      %r8 = arith.addi %r, %c8 : index
      %h0 = arith.muli %g, %heads_per_group : index
      %group_rows = arith.muli %m_rows, %heads_per_group : index
      %last_row = arith.subi %group_rows, %c1 : index
      %tile_row0 = arith.muli %row_tile, %rows_per_workgroup : index
      %subgroup_rows = arith.muli %subgroup, %c16 : index
      %subgroup_row0 = arith.addi %tile_row0, %subgroup_rows : index

<% for i, lane_row in [("0", "%r"), ("1", "%r8")] %>
      %row_${i} = arith.addi %subgroup_row0, ${lane_row} : index
      %m_${i} = arith.divui %row_${i}, %heads_per_group : index
      %head_in_group_${i} = arith.remui %row_${i}, %heads_per_group : index
      %head_${i} = arith.addi %h0, %head_in_group_${i} : index
      %head_valid_${i} = arith.cmpi ult, %row_${i}, %group_rows : index
      ${ rules.position("pos_" ~ i, "m_" ~ i) }
<% endfor %>
      // The last position the subgroup's rows see keys up to (-1: none, also for a subgroup of padding rows),
      // and the workgroup's: %pos, its last tile %last_visible_block and the tiles it stages, %slots.
      %subgroup_end0 = arith.addi %subgroup_row0, %c15 : index
      %subgroup_end = arith.minui %subgroup_end0, %last_row : index
      %subgroup_m = arith.divui %subgroup_end, %heads_per_group : index
      ${ rules.position("subgroup_pos_real", "subgroup_m") }
      %subgroup_live = arith.cmpi ult, %subgroup_row0, %group_rows : index
      %minus_one = arith.constant -1 : index
      %subgroup_pos = arith.select %subgroup_live, %subgroup_pos_real, %minus_one : index
      %tile_end0 = arith.addi %tile_row0, %rows_per_workgroup : index
      %tile_end1 = arith.subi %tile_end0, %c1 : index
      %tile_end = arith.minui %tile_end1, %last_row : index
      %tile_m = arith.divui %tile_end, %heads_per_group : index
      ${ rules.position("pos", "tile_m") }
      ${ rules.last_block("last_visible_block") }
      %tiles_seen = arith.addi %last_visible_block, %c1 : index
<% if WINDOW != "0" %>
      // The band: the first tile the workgroup's first row sees in its window (%first_tile), to the last.
      %tile_m_first = arith.divui %tile_row0, %heads_per_group : index
      ${ rules.position("pos_first", "tile_m_first") }
      ${ rules.first_key("band_start", "pos_first", "c0") }
      %band_start_key = arith.maxsi %band_start, %c0 : index
      %first_tile = arith.divui %band_start_key, %block_size : index
      %band_tiles = arith.subi %tiles_seen, %first_tile : index
      %slots = arith.maxsi %band_tiles, %c0 : index
<% else %>
      %slots = arith.maxsi %tiles_seen, %c0 : index
<% endif %>
      %steps = arith.addi %slots, %lag : index

