// Block-major copies of K and V, the layout every gather of a selected block reads:
//   key_blocks[(b * G + g) * NB + i, j, :] = k[b, i * BS + j, g, :]     (NB = ceil(N / BS))
// Rows past N in the partial last block repeat row N - 1; every consumer masks them out.
// K and V are G/H the size of Q, so this copy is cheap next to the passes that read it.
func.func private @kv_blocks(%k: tensor<?x?x${G}x${D}x${E}>, %v: tensor<?x?x${G}x${DV}x${E}>)
    -> (tensor<?x${BS}x${D}x${E}>, tensor<?x${BS}x${DV}x${E}>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %block_size = arith.constant ${BS} : index
  %batch = tensor.dim %k, %c0 : tensor<?x?x${G}x${D}x${E}>
  %n = tensor.dim %k, %c1 : tensor<?x?x${G}x${D}x${E}>
  %num_blocks = arith.ceildivui %n, %block_size : index
  %last_row = arith.subi %n, %c1 : index

  %kb_init = tensor.empty(%batch, %num_blocks) : tensor<?x${G}x?x${BS}x${D}x${E}>
  %kb = linalg.generic {
      indexing_maps = [affine_map<(b, g, i, j, d) -> (b, g, i, j, d)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]}
      outs(%kb_init : tensor<?x${G}x?x${BS}x${D}x${E}>) {
  ^bb0(%out: ${E}):
    %b = linalg.index 0 : index
    %g = linalg.index 1 : index
    %i = linalg.index 2 : index
    %j = linalg.index 3 : index
    %d = linalg.index 4 : index
    %row0 = arith.muli %i, %block_size : index
    %row1 = arith.addi %row0, %j : index
    %row = arith.minui %row1, %last_row : index
    %x = tensor.extract %k[%b, %row, %g, %d] : tensor<?x?x${G}x${D}x${E}>
    linalg.yield %x : ${E}
  } -> tensor<?x${G}x?x${BS}x${D}x${E}>

  %vb_init = tensor.empty(%batch, %num_blocks) : tensor<?x${G}x?x${BS}x${DV}x${E}>
  %vb = linalg.generic {
      indexing_maps = [affine_map<(b, g, i, j, e) -> (b, g, i, j, e)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]}
      outs(%vb_init : tensor<?x${G}x?x${BS}x${DV}x${E}>) {
  ^bb0(%out: ${E}):
    %b = linalg.index 0 : index
    %g = linalg.index 1 : index
    %i = linalg.index 2 : index
    %j = linalg.index 3 : index
    %e = linalg.index 4 : index
    %row0 = arith.muli %i, %block_size : index
    %row1 = arith.addi %row0, %j : index
    %row = arith.minui %row1, %last_row : index
    %x = tensor.extract %v[%b, %row, %g, %e] : tensor<?x?x${G}x${DV}x${E}>
    linalg.yield %x : ${E}
  } -> tensor<?x${G}x?x${BS}x${DV}x${E}>

  %key_blocks = tensor.collapse_shape %kb [[0, 1, 2], [3], [4]]
      : tensor<?x${G}x?x${BS}x${D}x${E}> into tensor<?x${BS}x${D}x${E}>
  %value_blocks = tensor.collapse_shape %vb [[0, 1, 2], [3], [4]]
      : tensor<?x${G}x?x${BS}x${DV}x${E}> into tensor<?x${BS}x${DV}x${E}>
  return %key_blocks, %value_blocks : tensor<?x${BS}x${D}x${E}>, tensor<?x${BS}x${DV}x${E}>
}
