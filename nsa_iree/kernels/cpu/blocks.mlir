// Block-major, transposed copies of K and V for the CPU kernels (nsa_iree/mlir/*_cpu.mlir):
//   key_blocks_t[(b * G + g) * NB + i, d, j] = k[b, i * BS + j, g, d]     (NB = ceil(N / BS))
// and value_blocks_t likewise from v. With the keys of a block innermost, the kernels' products over the
// head dims read CPU_ROWS consecutive keys as one vector (k[key, d] for fixed d is strided in k itself).
// Rows past N in the partial last block repeat row N - 1; the kernels never read them.
// K and V are G/H the size of Q, so this copy is cheap next to the passes that read it.
func.func private @cpu_blocks_t(%k: tensor<?x?x${G}x${D}x${E}>, %v: tensor<?x?x${G}x${DV}x${E}>)
    -> (tensor<?x${D}x${BS}x${E}>, tensor<?x${DV}x${BS}x${E}>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %block_size = arith.constant ${BS} : index
  %kv_heads = arith.constant ${G} : index
  %batch = tensor.dim %k, %c0 : tensor<?x?x${G}x${D}x${E}>
  %n = tensor.dim %k, %c1 : tensor<?x?x${G}x${D}x${E}>
  %num_blocks = arith.ceildivui %n, %block_size : index
  %last_row = arith.subi %n, %c1 : index
  %bg_count = arith.muli %batch, %kv_heads : index
  %flat_blocks = arith.muli %bg_count, %num_blocks : index

  %key_init = tensor.empty(%flat_blocks) : tensor<?x${D}x${BS}x${E}>
  %key_blocks_t = linalg.generic {
      indexing_maps = [affine_map<(f, d, j) -> (f, d, j)>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      outs(%key_init : tensor<?x${D}x${BS}x${E}>) {
  ^bb0(%out: ${E}):
    %f = linalg.index 0 : index
    %d = linalg.index 1 : index
    %j = linalg.index 2 : index
    %i = arith.remui %f, %num_blocks : index
    %bg = arith.divui %f, %num_blocks : index
    %g = arith.remui %bg, %kv_heads : index
    %b = arith.divui %bg, %kv_heads : index
    %row0 = arith.muli %i, %block_size : index
    %row1 = arith.addi %row0, %j : index
    %row = arith.minui %row1, %last_row : index
    %x = tensor.extract %k[%b, %row, %g, %d] : tensor<?x?x${G}x${D}x${E}>
    linalg.yield %x : ${E}
  } -> tensor<?x${D}x${BS}x${E}>

  %value_init = tensor.empty(%flat_blocks) : tensor<?x${DV}x${BS}x${E}>
  %value_blocks_t = linalg.generic {
      indexing_maps = [affine_map<(f, e, j) -> (f, e, j)>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      outs(%value_init : tensor<?x${DV}x${BS}x${E}>) {
  ^bb0(%out: ${E}):
    %f = linalg.index 0 : index
    %e = linalg.index 1 : index
    %j = linalg.index 2 : index
    %i = arith.remui %f, %num_blocks : index
    %bg = arith.divui %f, %num_blocks : index
    %g = arith.remui %bg, %kv_heads : index
    %b = arith.divui %bg, %kv_heads : index
    %row0 = arith.muli %i, %block_size : index
    %row1 = arith.addi %row0, %j : index
    %row = arith.minui %row1, %last_row : index
    %x = tensor.extract %v[%b, %row, %g, %e] : tensor<?x?x${G}x${DV}x${E}>
    linalg.yield %x : ${E}
  } -> tensor<?x${DV}x${BS}x${E}>
  return %key_blocks_t, %value_blocks_t : tensor<?x${D}x${BS}x${E}>, tensor<?x${DV}x${BS}x${E}>
}
