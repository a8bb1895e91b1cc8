// Block-major, transposed copies of K and V for the CPU kernels (nsa_iree/mlir/*_cpu.mlir):
//   key_blocks_t[(b * G + g) * NB + i, d, j] = k[b, i * BS + j, g, d]     (NB = ceil(N / BS))
// and value_blocks_t likewise from v. With the keys of a block innermost, the kernels' products over the
// head dims read CPU_ROWS consecutive keys as one vector (k[key, d] for fixed d is strided in k itself).
// Rows past N in the partial last block repeat row N - 1; the kernels never read them.
// K and V are G/H the size of Q, so this copy is cheap next to the passes that read it.
<% import "common/blocks.mlir" as blocks %>
func.func private @cpu_blocks_t(%k: tensor<?x?x${G}x${D}x${E}>, %v: tensor<?x?x${G}x${DV}x${E}>)
    -> (tensor<?x${D}x${BS}x${E}>, tensor<?x${DV}x${BS}x${E}>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
${ blocks.sizes() }

<% for name, x, dim, index in [("key", "k", D, "d"), ("value", "v", DV, "e")] %>
  %${name}_init = tensor.empty(%flat_blocks) : tensor<?x${dim}x${BS}x${E}>
  %${name}_blocks_t = linalg.generic {
      indexing_maps = [affine_map<(f, ${index}, j) -> (f, ${index}, j)>],
      iterator_types = ["parallel", "parallel", "parallel"]}
      outs(%${name}_init : tensor<?x${dim}x${BS}x${E}>) {
  ^bb0(%out: ${E}):
    %f = linalg.index 0 : index
    %${index} = linalg.index 1 : index
    %j = linalg.index 2 : index
${ blocks.source_row("f", "    ") }
    %x = tensor.extract %${x}[%b, %row, %g, %${index}] : tensor<?x?x${G}x${dim}x${E}>
    linalg.yield %x : ${E}
  } -> tensor<?x${dim}x${BS}x${E}>
<% if loop.first %>

<% endif %>
<% endfor %>
  return %key_blocks_t, %value_blocks_t : tensor<?x${D}x${BS}x${E}>, tensor<?x${DV}x${BS}x${E}>
}
