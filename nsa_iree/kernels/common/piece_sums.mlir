// The dk/dv pieces of every block summed in piece order (fixed, so bitwise reproducible) and cast to the
// input type: dk[b, key, g, :] = sum of dk_pieces[p, key mod BS, :] over the pieces p of key's block, as
// listed by @invert_block_indices (piece_start, piece_count per flat block (b * G + g) * NB + i).
// Each sum is its own region so that its lowering config (one element per lane, lanes along the head dim:
// coalesced loads of every piece's partial) survives; as a bare generic IREE collapses its dims and drops it.
func.func private @dkdv_piece_sums(%dk_pieces: tensor<?x${BS}x${D}xf32>, %dv_pieces: tensor<?x${BS}x${DV}xf32>,
    %piece_start: tensor<?xi32>, %piece_count: tensor<?xi32>, %batch: index, %n: index)
    -> (tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %block_size = arith.constant ${BS} : index
  %kv_heads = arith.constant ${G} : index
  %num_blocks = arith.ceildivui %n, %block_size : index
  %dk = flow.dispatch.region -> (tensor<?x?x${G}x${D}x${DKV_E}>{%batch, %n}) {
    %dk_init_out = tensor.empty(%batch, %n) : tensor<?x?x${G}x${D}x${DKV_E}>
    %dk_sum = linalg.generic {
        indexing_maps = [affine_map<(b, key, g, d) -> (b, key, g, d)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel"]
        ${PIECE_SUM_CONFIG}}
        outs(%dk_init_out : tensor<?x?x${G}x${D}x${DKV_E}>) {
    ^bb0(%out: ${DKV_E}):
      %b = linalg.index 0 : index
      %key = linalg.index 1 : index
      %g = linalg.index 2 : index
      %d = linalg.index 3 : index
      %block = arith.divui %key, %block_size : index
      %j = arith.remui %key, %block_size : index
      %bg0 = arith.muli %b, %kv_heads : index
      %bg = arith.addi %bg0, %g : index
      %fb0 = arith.muli %bg, %num_blocks : index
      %fb = arith.addi %fb0, %block : index
      %first_i32 = tensor.extract %piece_start[%fb] : tensor<?xi32>
      %count_i32 = tensor.extract %piece_count[%fb] : tensor<?xi32>
      %first = arith.index_cast %first_i32 : i32 to index
      %count = arith.index_cast %count_i32 : i32 to index
      %end = arith.addi %first, %count : index
      %total = scf.for %p = %first to %end step %c1 iter_args(%acc = %zero) -> (f32) {
        %x = tensor.extract %dk_pieces[%p, %j, %d] : tensor<?x${BS}x${D}xf32>
        %next = arith.addf %acc, %x : f32
        scf.yield %next : f32
      }
      %total_e = ${DKV_TRUNCF} %total : f32 to ${DKV_E}
      linalg.yield %total_e : ${DKV_E}
    } -> tensor<?x?x${G}x${D}x${DKV_E}>
    flow.return %dk_sum : tensor<?x?x${G}x${D}x${DKV_E}>
  }
  %dv = flow.dispatch.region -> (tensor<?x?x${G}x${DV}x${DKV_E}>{%batch, %n}) {
    %dv_init_out = tensor.empty(%batch, %n) : tensor<?x?x${G}x${DV}x${DKV_E}>
    %dv_sum = linalg.generic {
        indexing_maps = [affine_map<(b, key, g, e) -> (b, key, g, e)>],
        iterator_types = ["parallel", "parallel", "parallel", "parallel"]
        ${PIECE_SUM_CONFIG}}
        outs(%dv_init_out : tensor<?x?x${G}x${DV}x${DKV_E}>) {
    ^bb0(%out: ${DKV_E}):
      %b = linalg.index 0 : index
      %key = linalg.index 1 : index
      %g = linalg.index 2 : index
      %e = linalg.index 3 : index
      %block = arith.divui %key, %block_size : index
      %j = arith.remui %key, %block_size : index
      %bg0 = arith.muli %b, %kv_heads : index
      %bg = arith.addi %bg0, %g : index
      %fb0 = arith.muli %bg, %num_blocks : index
      %fb = arith.addi %fb0, %block : index
      %first_i32 = tensor.extract %piece_start[%fb] : tensor<?xi32>
      %count_i32 = tensor.extract %piece_count[%fb] : tensor<?xi32>
      %first = arith.index_cast %first_i32 : i32 to index
      %count = arith.index_cast %count_i32 : i32 to index
      %end = arith.addi %first, %count : index
      %total = scf.for %p = %first to %end step %c1 iter_args(%acc = %zero) -> (f32) {
        %x = tensor.extract %dv_pieces[%p, %j, %e] : tensor<?x${BS}x${DV}xf32>
        %next = arith.addf %acc, %x : f32
        scf.yield %next : f32
      }
      %total_e = ${DKV_TRUNCF} %total : f32 to ${DKV_E}
      linalg.yield %total_e : ${DKV_E}
    } -> tensor<?x?x${G}x${DV}x${DKV_E}>
    flow.return %dv_sum : tensor<?x?x${G}x${DV}x${DKV_E}>
  }
  return %dk, %dv : tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>
}
