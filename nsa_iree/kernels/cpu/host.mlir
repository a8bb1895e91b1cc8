// The host functions' text the CPU kernels share, as macros (cpu/*.mlir import this file): the count of the
// transposed K/V blocks and the call that makes them (cpu/blocks.mlir), and lse from the rows' layout.

<# %num_blocks, %bg_count and %flat_blocks (B * G * NB, the transposed blocks) from %n, %batch, %kv_heads and
   %block_size. #>
<% macro flat_blocks() %>
  %num_blocks = arith.ceildivui %n, %block_size : index
  %bg_count = arith.muli %batch, %kv_heads : index
  %flat_blocks = arith.muli %bg_count, %num_blocks : index
<% endmacro %>

<# %key_blocks_t [B * G * NB, D, BS] and %value_blocks_t [B * G * NB, Dv, BS]: %k and %v's blocks, transposed. #>
<% macro blocks_t() %>
  %key_blocks_t, %value_blocks_t = func.call @cpu_blocks_t(%k, %v)
      : (tensor<?x?x${G}x${D}x${E}>, tensor<?x?x${G}x${DV}x${E}>) -> (tensor<?x${D}x${BS}x${E}>, tensor<?x${DV}x${BS}x${E}>)
<% endmacro %>

<# %lse [B, H, M] f32: %lse_rows [B, M, H] transposed. The CPU kernels write a row's HPG lse values as one
   contiguous vector: written along M, every row of a work item would store to HPG cache lines that the rows
   of the other cores' work items store to as well. #>
<% macro lse_by_heads() %>
  %lse_empty = tensor.empty(%batch, %m_rows) : tensor<?x${H}x?xf32>
  %lse = linalg.transpose ins(%lse_rows : tensor<?x?x${H}xf32>) outs(%lse_empty : tensor<?x${H}x?xf32>)
      permutation = [0, 2, 1]
<% endmacro %>

<# %dk, %dv [B, N, G, D | Dv] in DKV_E: the f32 partial rows %`partials` [%pieces, BS, D + Dv] (dk's columns, then
   dv's) summed per block in piece order by @dkdv_piece_sums (common/piece_sums.mlir) over %piece_start and
   %piece_count. #>
<% macro piece_sums(partials) %>
  %dk_pieces = tensor.extract_slice %${partials}[0, 0, 0] [%pieces, ${BS}, ${D}] [1, 1, 1]
      : tensor<?x${BS}x${ (D | int) + (DV | int) }xf32> to tensor<?x${BS}x${D}xf32>
  %dv_pieces = tensor.extract_slice %${partials}[0, 0, ${D}] [%pieces, ${BS}, ${DV}] [1, 1, 1]
      : tensor<?x${BS}x${ (D | int) + (DV | int) }xf32> to tensor<?x${BS}x${DV}xf32>
  %dk, %dv = func.call @dkdv_piece_sums(%dk_pieces, %dv_pieces, %piece_start, %piece_count, %batch, %n)
      : (tensor<?x${BS}x${D}xf32>, tensor<?x${BS}x${DV}xf32>, tensor<?xi32>, tensor<?xi32>, index, index)
      -> (tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>)
<% endmacro %>
