// NSA's mean pooling (nsa_iree.mean_pooling, docs/semantics.md 'The compression branch and block selection') as
// IREE dispatches, so that on the CPU the compression branch runs on IREE's workers from the pooling on (no hand-off
// to torch's thread pool between its calls: docs/runtime.md, 'CPU threads'). x [B, P, G, D] holds C = ceil(P / BS)
// blocks of BS tokens, the last one short when BS does not divide P; counts [C] (f32) holds the tokens of block c,
// which the caller knows (a packed layout's blocks are short where its sequences end):
//   @block_means       y [B, C, G, D] = (sum over the block's tokens of x) / counts[c], in f32, rounded once to E
//   @block_means_grad  dx [B, P, G, D] = dy[b, c] / counts[c], c the token's block, rounded once to E (P given)
// (the operations of torch's mean on the GPUs: the f32 sum over the count, not times its rounded inverse)
// The tokens past P in the last block are zeros (tensor.pad), which add nothing to the sum.
<% set x_t = "tensor<?x?x" ~ G ~ "x" ~ D ~ "x" ~ E ~ ">" %>
<% set blocks_t = "tensor<?x?x" ~ BS ~ "x" ~ G ~ "x" ~ D ~ "x" ~ E ~ ">" %>
<% set sums_t = "tensor<?x?x" ~ G ~ "x" ~ D ~ "xf32>" %>

func.func @block_means(%x: ${x_t}, %counts: tensor<?xf32>, %y_out: ${x_t} {iree.abi.output = 0 : index},
    %transients: !hal.buffer {iree.abi.transients}) -> ${x_t} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %pad = arith.constant 0.0 : ${E}
  %block_size = arith.constant ${BS} : index
  %batch = tensor.dim %x, %c0 : ${x_t}
  %tokens = tensor.dim %x, %c1 : ${x_t}
  %blocks = tensor.dim %counts, %c0 : tensor<?xf32>
  %whole = arith.muli %blocks, %block_size : index
  %short = arith.subi %whole, %tokens : index
  %padded = tensor.pad %x low[0, 0, 0, 0] high[0, %short, 0, 0] {
  ^bb0(%i: index, %j: index, %k: index, %l: index):
    tensor.yield %pad : ${E}
  } : ${x_t} to ${x_t}
  %by_block = tensor.expand_shape %padded [[0], [1, 2], [3], [4]] output_shape [%batch, %blocks, ${BS}, ${G}, ${D}]
      : ${x_t} into ${blocks_t}
  %init = tensor.empty(%batch, %blocks) : ${sums_t}
  %zeros = linalg.fill ins(%zero : f32) outs(%init : ${sums_t}) -> ${sums_t}
  %sums = linalg.generic {
      indexing_maps = [affine_map<(b, c, g, d, j) -> (b, c, j, g, d)>, affine_map<(b, c, g, d, j) -> (b, c, g, d)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
      ins(%by_block : ${blocks_t}) outs(%zeros : ${sums_t}) {
  ^bb0(%xe: ${E}, %acc: f32):
    %xf = ${EXTF} %xe : ${E} to f32
    %sum = arith.addf %acc, %xf : f32
    linalg.yield %sum : f32
  } -> ${sums_t}
  %means_init = tensor.empty(%batch, %blocks) : ${x_t}
  %means = linalg.generic {
      indexing_maps = [affine_map<(b, c, g, d) -> (b, c, g, d)>, affine_map<(b, c, g, d) -> (c)>,
                       affine_map<(b, c, g, d) -> (b, c, g, d)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%sums, %counts : ${sums_t}, tensor<?xf32>) outs(%means_init : ${x_t}) {
  ^bb0(%s: f32, %n: f32, %unused: ${E}):
    %mean = arith.divf %s, %n : f32
    %rounded = ${TRUNCF} %mean : f32 to ${E}
    linalg.yield %rounded : ${E}
  } -> ${x_t}
  return %means : ${x_t}
}

func.func @block_means_grad(%dy: ${x_t}, %counts: tensor<?xf32>, %tokens: index,
    %dx_out: ${x_t} {iree.abi.output = 0 : index}, %transients: !hal.buffer {iree.abi.transients}) -> ${x_t} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %batch = tensor.dim %dy, %c0 : ${x_t}
  %blocks = tensor.dim %dy, %c1 : ${x_t}
  %init = tensor.empty(%batch, %blocks) : ${blocks_t}
  %spread = linalg.generic {
      indexing_maps = [affine_map<(b, c, j, g, d) -> (b, c, g, d)>, affine_map<(b, c, j, g, d) -> (c)>,
                       affine_map<(b, c, j, g, d) -> (b, c, j, g, d)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel", "parallel"]}
      ins(%dy, %counts : ${x_t}, tensor<?xf32>) outs(%init : ${blocks_t}) {
  ^bb0(%g: ${E}, %n: f32, %unused: ${E}):
    %gf = ${EXTF} %g : ${E} to f32
    %share = arith.divf %gf, %n : f32
    %rounded = ${TRUNCF} %share : f32 to ${E}
    linalg.yield %rounded : ${E}
  } -> ${blocks_t}
  %by_token = tensor.collapse_shape %spread [[0], [1, 2], [3], [4]] : ${blocks_t} into ${x_t}
  %dx = tensor.extract_slice %by_token[0, 0, 0, 0] [%batch, %tokens, ${G}, ${D}] [1, 1, 1, 1] : ${x_t} to ${x_t}
  return %dx : ${x_t}
}
