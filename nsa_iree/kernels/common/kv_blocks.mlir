// Block-major copies of K and V, the layout every gather of a selected block reads:
//   key_blocks[(b * G + g) * NB + i, j, :] = k[b, i * BS + j, g, :]     (NB = ceil(N / BS))
//   key_blocks[B * G * NB, :, :]          = 0                         (the zero block)
// Rows past N in the partial last block repeat row N - 1; every consumer masks them out. Skipped slots
// gather the zero block: a masked score still multiplies its V row (p = 0) and a masked ds its K row, so a
// NaN or Inf in a block that a row did not select would otherwise reach that row (0 * NaN = NaN).
// K and V are G/H the size of Q, so this copy is cheap next to the passes that read it.
// (Called with B, N > 0: the host handles empty problems without launching anything.)
func.func private @kv_blocks(%k: tensor<?x?x${G}x${D}x${E}>, %v: tensor<?x?x${G}x${DV}x${E}>)
    -> (tensor<?x${BS}x${D}x${E}>, tensor<?x${BS}x${DV}x${E}>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : ${E}
  %block_size = arith.constant ${BS} : index
  %kv_heads = arith.constant ${G} : index
  %batch = tensor.dim %k, %c0 : tensor<?x?x${G}x${D}x${E}>
  %n = tensor.dim %k, %c1 : tensor<?x?x${G}x${D}x${E}>
  %num_blocks = arith.ceildivui %n, %block_size : index
  %last_row = arith.subi %n, %c1 : index
  %bg_count = arith.muli %batch, %kv_heads : index
  %flat_blocks = arith.muli %bg_count, %num_blocks : index
  %rows = arith.addi %flat_blocks, %c1 : index

  %key_blocks_init = tensor.empty(%rows) : tensor<?x${BS}x${D}x${E}>
  %key_blocks = linalg.generic {
      indexing_maps = [affine_map<(f, j, d) -> (f, j, d)>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      outs(%key_blocks_init : tensor<?x${BS}x${D}x${E}>) {
  ^bb0(%out: ${E}):
    %f = linalg.index 0 : index
    %j = linalg.index 1 : index
    %d = linalg.index 2 : index
    %real = arith.cmpi ult, %f, %flat_blocks : index
    %f_safe = arith.select %real, %f, %c0 : index
    %i = arith.remui %f_safe, %num_blocks : index
    %bg = arith.divui %f_safe, %num_blocks : index
    %g = arith.remui %bg, %kv_heads : index
    %b = arith.divui %bg, %kv_heads : index
    %row0 = arith.muli %i, %block_size : index
    %row1 = arith.addi %row0, %j : index
    %row = arith.minui %row1, %last_row : index
    %x = tensor.extract %k[%b, %row, %g, %d] : tensor<?x?x${G}x${D}x${E}>
    %x_or_zero = arith.select %real, %x, %zero : ${E}
    linalg.yield %x_or_zero : ${E}
  } -> tensor<?x${BS}x${D}x${E}>

  %value_blocks_init = tensor.empty(%rows) : tensor<?x${BS}x${DV}x${E}>
  %value_blocks = linalg.generic {
      indexing_maps = [affine_map<(f, j, e) -> (f, j, e)>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      outs(%value_blocks_init : tensor<?x${BS}x${DV}x${E}>) {
  ^bb0(%out: ${E}):
    %f = linalg.index 0 : index
    %j = linalg.index 1 : index
    %e = linalg.index 2 : index
    %real = arith.cmpi ult, %f, %flat_blocks : index
    %f_safe = arith.select %real, %f, %c0 : index
    %i = arith.remui %f_safe, %num_blocks : index
    %bg = arith.divui %f_safe, %num_blocks : index
    %g = arith.remui %bg, %kv_heads : index
    %b = arith.divui %bg, %kv_heads : index
    %row0 = arith.muli %i, %block_size : index
    %row1 = arith.addi %row0, %j : index
    %row = arith.minui %row1, %last_row : index
    %x = tensor.extract %v[%b, %row, %g, %e] : tensor<?x?x${G}x${DV}x${E}>
    %x_or_zero = arith.select %real, %x, %zero : ${E}
    linalg.yield %x_or_zero : ${E}
  } -> tensor<?x${BS}x${DV}x${E}>
  return %key_blocks, %value_blocks : tensor<?x${BS}x${D}x${E}>, tensor<?x${BS}x${DV}x${E}>
}
