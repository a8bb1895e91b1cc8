// Block-major copies of K and V, the layout every gather of a selected block reads:
//   key_blocks[(b * G + g) * NB + i, j, :] = k[b, i * BS + j, g, :]     (NB = ceil(N / BS))
//   key_blocks[B * G * NB, :, :]          = 0                         (the zero block)
// Rows past N in the partial last block repeat row N - 1; every consumer masks them out. Skipped slots
// gather the zero block: a masked score still multiplies its V row (p = 0) and a masked ds its K row, so a
// NaN or Inf in a block that a row did not select would otherwise reach that row (0 * NaN = NaN).
// K and V are G/H the size of Q, so this copy is cheap next to the passes that read it.
// (Called with B, N > 0: the host handles empty problems without launching anything.)
<% import "common/blocks.mlir" as blocks %>
func.func private @kv_blocks(%k: tensor<?x?x${G}x${D}x${E}>, %v: tensor<?x?x${G}x${DV}x${E}>)
    -> (tensor<?x${BS}x${D}x${E}>, tensor<?x${BS}x${DV}x${E}>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : ${E}
${ blocks.sizes() }
  %rows = arith.addi %flat_blocks, %c1 : index

<% for name, x, dim, index in [("key", "k", D, "d"), ("value", "v", DV, "e")] %>

  %${name}_blocks_init = tensor.empty(%rows) : tensor<?x${BS}x${dim}x${E}>
  %${name}_blocks = linalg.generic {
      indexing_maps = [affine_map<(f, j, ${index}) -> (f, j, ${index})>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      outs(%${name}_blocks_init : tensor<?x${BS}x${dim}x${E}>) {
  ^bb0(%out: ${E}):
    %f = linalg.index 0 : index
    %j = linalg.index 1 : index
    %${index} = linalg.index 2 : index
    %real = arith.cmpi ult, %f, %flat_blocks : index
    %f_safe = arith.select %real, %f, %c0 : index
${ blocks.source_row("f_safe", "    ") }
    %x = tensor.extract %${x}[%b, %row, %g, %${index}] : tensor<?x?x${G}x${dim}x${E}>
    %x_or_zero = arith.select %real, %x, %zero : ${E}
    linalg.yield %x_or_zero : ${E}
  } -> tensor<?x${BS}x${dim}x${E}>
<% endfor %>
  return %key_blocks, %value_blocks : tensor<?x${BS}x${D}x${E}>, tensor<?x${BS}x${DV}x${E}>
}
