// Index arithmetic of the block-major K/V layout the helper stages and kernels share, as macros: flat block
// f = (b * G + g) * NB + i holds keys i * BS .. i * BS + BS - 1 of group g of batch b.
<% import "common/rules.mlir" as rules %>

<# Of %k [B, N, G, D]: %batch, %n, %num_blocks (NB), %last_row (N - 1) and %flat_blocks (B * G * NB), with
   %block_size and %kv_heads; reads %c0 and %c1. #>
<% macro sizes() %>
  %block_size = arith.constant ${BS} : index
  %kv_heads = arith.constant ${G} : index
  %batch = tensor.dim %k, %c0 : tensor<?x?x${G}x${D}x${E}>
  %n = tensor.dim %k, %c1 : tensor<?x?x${G}x${D}x${E}>
  %num_blocks = arith.ceildivui %n, %block_size : index
  %last_row = arith.subi %n, %c1 : index
  %bg_count = arith.muli %batch, %kv_heads : index
  %flat_blocks = arith.muli %bg_count, %num_blocks : index
<% endmacro %>

<# From flat block %`f` and key j of it: %i, %bg, %g, %b and %row, the source row (at most %last_row);
   reads %num_blocks, %kv_heads, %block_size. `indent`: the lines' leading spaces. #>
<% macro source_row(f, indent) %>
${indent}%i = arith.remui %${f}, %num_blocks : index
${indent}%bg = arith.divui %${f}, %num_blocks : index
${indent}%g = arith.remui %bg, %kv_heads : index
${indent}%b = arith.divui %bg, %kv_heads : index
${indent}%row0 = arith.muli %i, %block_size : index
${indent}%row1 = arith.addi %row0, %j : index
${indent}%row = arith.minui %row1, %last_row : index
<% endmacro %>

<# From key %key of group %g of batch %b: %`block` (its block i), %j (its place in it), %bg and %`f` (the flat
   block, through %`f`0); reads %block_size, %kv_heads, %num_blocks. `indent`: the lines' leading spaces. #>
<% macro flat_block(block, f, indent) %>
${indent}%${block} = arith.divui %key, %block_size : index
${indent}%j = arith.remui %key, %block_size : index
${indent}%bg0 = arith.muli %b, %kv_heads : index
${indent}%bg = arith.addi %bg0, %g : index
${indent}%${f}0 = arith.muli %bg, %num_blocks : index
${indent}%${f} = arith.addi %${f}0, %${block} : index
<% endmacro %>

<# %block (%block_i32 as an index) and %`name`: whether row %m reads it (not skipped, not past %pos / BS, with
   %pos = pos(%m) and %last_visible its last block: common/rules.mlir). #>
<% macro selected(name) %>
    %block = arith.index_cast %block_i32 : i32 to index
    ${ rules.position() }
    ${ rules.last_block("last_visible") }
    %not_negative = arith.cmpi sge, %block, %c0 : index
    %not_future = arith.cmpi sle, %block, %last_visible : index
    %${name} = arith.andi %not_negative, %not_future : i1
<% endmacro %>

<# %`name` [B, M, G, T] i32, one element per slot of %block_indices (through %`name`_init); the call block is the
   body, given %block_i32 (the slot's block) and ending in its linalg.yield. #>
<% macro per_slot(name) %>
  %${name}_init = tensor.empty(%batch, %m_rows) : tensor<?x?x${G}x${T}xi32>
  %${name} = linalg.generic {
      indexing_maps = [affine_map<(b, m, g, t) -> (b, m, g, t)>, affine_map<(b, m, g, t) -> (b, m, g, t)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%block_indices : tensor<?x?x${G}x${T}xi32>) outs(%${name}_init : tensor<?x?x${G}x${T}xi32>) {
  ^bb0(%block_i32: i32, %out: i32):
${ caller() }
  } -> tensor<?x?x${G}x${T}xi32>
<% endmacro %>

<# %`name` [B, M, G, T] i32: 1 where the slot names a block row m reads (selected()) that no earlier slot of the row
   names, else 0 (a kernel that counts a block as often as the row lists it, in its p, holds them all in the block's
   one partial: common/dq_sums.mlir, common/forward_sums.mlir); reads %block_indices, %batch, %m_rows, %offset,
   %block_size, %c0, %c1, %c0_i32, %c1_i32 and %false. #>
<% macro counted_slots(name) %>
<% call per_slot(name) %>
    %m = linalg.index 1 : index
    %b = linalg.index 0 : index
    %g = linalg.index 2 : index
    %t = linalg.index 3 : index
${ selected("chosen") }
    %named_before = scf.for %u = %c0 to %t step %c1 iter_args(%seen = %false) -> (i1) {
      %other = tensor.extract %block_indices[%b, %m, %g, %u] : tensor<?x?x${G}x${T}xi32>
      %same = arith.cmpi eq, %other, %block_i32 : i32
      %seen_now = arith.ori %seen, %same : i1
      scf.yield %seen_now : i1
    }
    %first_naming = arith.cmpi eq, %named_before, %false : i1
    %counted_here = arith.andi %chosen, %first_naming : i1
    %counted_i32 = arith.select %counted_here, %c1_i32, %c0_i32 : i32
    linalg.yield %counted_i32 : i32
<% endcall %>
<% endmacro %>
