// Index arithmetic of the block-major K/V layout the helper stages and kernels share, as macros: flat block
// f = (b * G + g) * NB + i holds keys i * BS .. i * BS + BS - 1 of group g of batch b.

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
