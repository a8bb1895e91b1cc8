// The dk/dv pieces of every block summed in piece order (fixed, so bitwise reproducible) and cast to the
// input type: dk[b, key, g, :] = sum of dk_pieces[p, key mod BS, :] over the pieces p of key's block, as
// listed by @invert_block_indices (piece_start, piece_count per flat block (b * G + g) * NB + i).
// Each sum is its own region so that its lowering config (one element per lane, lanes along the head dim:
// coalesced loads of every piece's partial) survives; as a bare generic IREE collapses its dims and drops it.
<% import "common/blocks.mlir" as blocks %>
func.func private @dkdv_piece_sums(%dk_pieces: tensor<?x${BS}x${D}xf32>, %dv_pieces: tensor<?x${BS}x${DV}xf32>,
    %piece_start: tensor<?xi32>, %piece_count: tensor<?xi32>, %batch: index, %n: index)
    -> (tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %block_size = arith.constant ${BS} : index
  %kv_heads = arith.constant ${G} : index
  %num_blocks = arith.ceildivui %n, %block_size : index
<% for name, dim, index in [("dk", D, "d"), ("dv", DV, "e")] %>
  %${name} = flow.dispatch.region -> (tensor<?x?x${G}x${dim}x${DKV_E}>{%batch, %n}) {
    %${name}_init_out = tensor.empty(%batch, %n) : tensor<?x?x${G}x${dim}x${DKV_E}>
    %${name}_sum = linalg.generic {
        indexing_maps = [affine_map<(b, key, g, ${index}) -> (b, key, g, ${index})>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel"]
        ${PIECE_SUM_CONFIG}}
        outs(%${name}_init_out : tensor<?x?x${G}x${dim}x${DKV_E}>) {
    ^bb0(%out: ${DKV_E}):
      %b = linalg.index 0 : index
      %key = linalg.index 1 : index
      %g = linalg.index 2 : index
      %${index} = linalg.index 3 : index
${ blocks.flat_block("block", "fb", "      ") }
      %first_i32 = tensor.extract %piece_start[%fb] : tensor<?xi32>
      %count_i32 = tensor.extract %piece_count[%fb] : tensor<?xi32>
      %first = arith.index_cast %first_i32 : i32 to index
      %count = arith.index_cast %count_i32 : i32 to index
      %end = arith.addi %first, %count : index
      %total = scf.for %p = %first to %end step %c1 iter_args(%acc = %zero) -> (f32) {
        %x = tensor.extract %${name}_pieces[%p, %j, %${index}] : tensor<?x${BS}x${dim}xf32>
        %next = arith.addf %acc, %x : f32
        scf.yield %next : f32
      }
      %total_e = ${DKV_TRUNCF} %total : f32 to ${DKV_E}
      linalg.yield %total_e : ${DKV_E}
    } -> tensor<?x?x${G}x${dim}x${DKV_E}>
    flow.return %${name}_sum : tensor<?x?x${G}x${dim}x${DKV_E}>
  }
<% endfor %>
  return %dk, %dv : tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>
}
