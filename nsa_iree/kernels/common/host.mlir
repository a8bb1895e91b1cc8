// The host functions' text that every kernel family shares, as macros (the templates import this file):
// each stage's signature (the ABI nsa_iree/runtime.py calls, the same whichever kernel runs the stage), the
// sizes a host function reads off its arguments, the push constants of a per-row dispatch, and the whole host
// function of the families whose dispatch takes q, k, v as they are (nvidia, portable, linalg's one-pass).
<% import "common/dispatch.mlir" as dispatch %>

<# (`lists`: the forward over the pieces, which writes the block lists it inverted too, for the backward) #>
<% macro forward_signature(lists=false) %>
func.func @selection_attention_fwd(%q: tensor<?x?x${H}x${D}x${E}>, %k: tensor<?x?x${G}x${D}x${E}>,
    %v: tensor<?x?x${G}x${DV}x${E}>, %block_indices: tensor<?x?x${G}x${T}xi32>, %scale: f32,
    %o_out: tensor<?x?x${H}x${DV}x${E}> {iree.abi.output = 0 : index},
    %lse_out: tensor<?x${H}x?xf32> {iree.abi.output = 1 : index},
<% if lists %>
    %entries_out: tensor<?x${ROWS_PER_PIECE}x2xi32> {iree.abi.output = 2 : index},
    %piece_start_out: tensor<?xi32> {iree.abi.output = 3 : index},
    %piece_count_out: tensor<?xi32> {iree.abi.output = 4 : index},
<% endif %>
    %transients: !hal.buffer {iree.abi.transients})
    -> (tensor<?x?x${H}x${DV}x${E}>, tensor<?x${H}x?xf32>${ ", " ~ lists_types() if lists else "" }) {
<% endmacro %>

<# The types of the block lists (common/inversion.mlir): entries, piece_start, piece_count. #>
<% macro lists_types() %>tensor<?x${ROWS_PER_PIECE}x2xi32>, tensor<?xi32>, tensor<?xi32><% endmacro %>

<# The block lists as a function's parameters (after do, where dk/dv and the one-call backwards take them). #>
<% macro lists_params() %>
    %entries: tensor<?x${ROWS_PER_PIECE}x2xi32>, %piece_start: tensor<?xi32>, %piece_count: tensor<?xi32>,
<%- endmacro %>

<% macro dq_signature() %>
func.func @selection_attention_dq(%q: tensor<?x?x${H}x${D}x${E}>, %k: tensor<?x?x${G}x${D}x${E}>,
    %v: tensor<?x?x${G}x${DV}x${E}>, %block_indices: tensor<?x?x${G}x${T}xi32>, %lse: tensor<?x${H}x?xf32>,
    %delta: tensor<?x?x${H}xf32>, %do: tensor<?x?x${H}x${DV}x${E}>, %scale: f32,
    %dq_out: tensor<?x?x${H}x${D}x${E}> {iree.abi.output = 0 : index},
    %transients: !hal.buffer {iree.abi.transients}) -> tensor<?x?x${H}x${D}x${E}> {
<% endmacro %>

<% macro dkdv_signature() %>
func.func @selection_attention_dkdv(%q: tensor<?x?x${H}x${D}x${E}>, %k: tensor<?x?x${G}x${D}x${E}>,
    %v: tensor<?x?x${G}x${DV}x${E}>, %block_indices: tensor<?x?x${G}x${T}xi32>, %lse: tensor<?x${H}x?xf32>,
    %delta: tensor<?x?x${H}xf32>, %do: tensor<?x?x${H}x${DV}x${E}>,
${ lists_params() }
    %scale: f32, %dk_out: tensor<?x?x${G}x${D}x${DKV_E}> {iree.abi.output = 0 : index},
    %dv_out: tensor<?x?x${G}x${DV}x${DKV_E}> {iree.abi.output = 1 : index},
    %transients: !hal.buffer {iree.abi.transients})
    -> (tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>) {
<% endmacro %>

<# The signature of a backward in one call (dq, dk and dv): the one-pass's (@selection_attention_onepass, reading
   delta [B, M, H]), or, with `name` selection_attention_backward and `reads` "o", the CPU dense backward's
   (cpu/dense_backward.mlir), which reads o [B, M, H, Dv] and makes each row's delta itself (cpu/products.mlir
   delta_of_row). `lists`: the block lists (common/inversion.mlir) taken after do, as dk/dv's signature takes them. #>
<% macro onepass_signature(name="selection_attention_onepass", reads="delta", lists=false) %>
func.func @${name}(%q: tensor<?x?x${H}x${D}x${E}>, %k: tensor<?x?x${G}x${D}x${E}>,
    %v: tensor<?x?x${G}x${DV}x${E}>, %block_indices: tensor<?x?x${G}x${T}xi32>, %lse: tensor<?x${H}x?xf32>,
<% if reads == "o" %>
    %o: tensor<?x?x${H}x${DV}x${E}>, %do: tensor<?x?x${H}x${DV}x${E}>,
<% else %>
    %delta: tensor<?x?x${H}xf32>, %do: tensor<?x?x${H}x${DV}x${E}>,
<% endif %>
<% if lists %>
${ lists_params() }
<% endif %>
    %scale: f32,
    %dq_out: tensor<?x?x${H}x${D}x${E}> {iree.abi.output = 0 : index},
    %dk_out: tensor<?x?x${G}x${D}x${DKV_E}> {iree.abi.output = 1 : index},
    %dv_out: tensor<?x?x${G}x${DV}x${DKV_E}> {iree.abi.output = 2 : index},
    %transients: !hal.buffer {iree.abi.transients})
    -> (tensor<?x?x${H}x${D}x${E}>, tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>) {
<% endmacro %>

<# select_blocks' signature: block_indices [B, M, G, S] (S = T) of one sequence from q [B, M, H, D], k_cmp
   [B, C, G, D] (C = ceil(N / BS)), lse [B, H, M] f32, counts [B, M, G] i32, and n = N (the rows are the last M of N
   positions). #>
<% macro select_signature() %>
func.func @select_blocks(%q: tensor<?x?x${H}x${D}x${E}>, %k_cmp: tensor<?x?x${G}x${D}x${E}>,
    %lse: tensor<?x${H}x?xf32>, %counts: tensor<?x?x${G}xi32>, %scale: f32, %n: index,
    %out: tensor<?x?x${G}x${T}xi32> {iree.abi.output = 0 : index},
    %transients: !hal.buffer {iree.abi.transients}) -> tensor<?x?x${G}x${T}xi32> {
<% endmacro %>

<# select_blocks' host function for the GPU kernels: one dispatch of `executable`'s @`function` per (tile of
   `rows_per_workgroup` query rows, g, b) over q, k_cmp, lse and counts as they are; `inputs` and `outputs` are the
   kernel's operands (common/dispatch.mlir's layout()), whose types name %batch, %m_rows and %num_blocks. #>
<% macro select_blocks(executable, function, rows_per_workgroup, inputs, outputs) %>
${ select_signature() }
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %kv_heads = arith.constant ${G} : index
  %rows_per_workgroup = arith.constant ${rows_per_workgroup} : index
  %batch = tensor.dim %q, %c0 : tensor<?x?x${H}x${D}x${E}>
  %m_rows = tensor.dim %q, %c1 : tensor<?x?x${H}x${D}x${E}>
  %num_blocks = tensor.dim %k_cmp, %c1 : tensor<?x?x${G}x${D}x${E}>
  %row_tiles = arith.ceildivui %m_rows, %rows_per_workgroup : index
${ push_constants() }
  %block_indices = flow.dispatch @${executable}::@${function}[%row_tiles, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %q, %k_cmp, %lse, %counts)
      : (i32, i32, i32, i32, ${ dispatch.tensor_types(inputs) })
      -> (${ dispatch.tensor_types(outputs) })
  return %block_indices : tensor<?x?x${G}x${T}xi32>
}
<% endmacro %>

<# %c0, %c1, what a call block adds, and %batch, %m_rows, %n read off q [B, M, H, D] and k [B, N, G, D]. #>
<% macro sizes() %>
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
<% if caller is defined %>
${ caller() }
<%- endif %>
  %batch = tensor.dim %q, %c0 : tensor<?x?x${H}x${D}x${E}>
  %m_rows = tensor.dim %q, %c1 : tensor<?x?x${H}x${D}x${E}>
  %n = tensor.dim %k, %c1 : tensor<?x?x${G}x${D}x${E}>
<% endmacro %>

<# The push constants of a dispatch: B, M, N (and the piece count when `pieces`) as i32, then scale's bits. #>
<% macro push_constants(pieces=false) %>
  %batch_i32 = arith.index_cast %batch : index to i32
  %m_rows_i32 = arith.index_cast %m_rows : index to i32
  %n_i32 = arith.index_cast %n : index to i32
<% if pieces %>
  %pieces_i32 = arith.index_cast %pieces : index to i32
<% endif %>
  %scale_bits = arith.bitcast %scale : f32 to i32
<% endmacro %>

<# The types of a stage's operands as a dispatch lists them, with their dynamic sizes. #>
<% macro row_operand_types() %>
tensor<?x?x${H}x${D}x${E}>{%batch, %m_rows}, tensor<?x?x${G}x${D}x${E}>{%batch, %n},
         tensor<?x?x${G}x${DV}x${E}>{%batch, %n}, tensor<?x?x${G}x${T}xi32>{%batch, %m_rows}
<%- endmacro %>
<# (`reads` "o": o [B, M, H, Dv] in delta's place, for a dispatch that makes delta: dense_backward) #>
<% macro backward_operand_types(reads="delta") %>
<% if reads == "o" %>
${ row_operand_types() },
         tensor<?x${H}x?xf32>{%batch, %m_rows}, tensor<?x?x${H}x${DV}x${E}>{%batch, %m_rows},
         tensor<?x?x${H}x${DV}x${E}>{%batch, %m_rows}
<%- else %>
${ row_operand_types() },
         tensor<?x${H}x?xf32>{%batch, %m_rows}, tensor<?x?x${H}xf32>{%batch, %m_rows},
         tensor<?x?x${H}x${DV}x${E}>{%batch, %m_rows}
<%- endif %>
<%- endmacro %>

<# The dense kernels' grid: %row_tiles = ceil(M HPG / rows_per_workgroup) tiles of a group's rows (nothing when
   rows_per_workgroup is none: one workgroup per row). #>
<% macro _row_tile_constants(rows_per_workgroup) %>
<% if rows_per_workgroup %>
  %heads_per_group = arith.constant ${HPG} : index
  %rows_per_workgroup = arith.constant ${rows_per_workgroup} : index
<% endif %>
<%- endmacro %>
<% macro _row_tiles(rows_per_workgroup) %>
<% if rows_per_workgroup %>
  %group_rows = arith.muli %m_rows, %heads_per_group : index
  %row_tiles = arith.ceildivui %group_rows, %rows_per_workgroup : index
<% endif %>
<%- endmacro %>

<# The forward's host function: one dispatch of `executable`'s @`function` per (m, g, b), or, given
   `rows_per_workgroup`, per (tile of that many of a group's M x HPG rows, g, b). #>
<% macro forward(executable, function="selection_attention_fwd_row", rows_per_workgroup=none) %>
${ forward_signature() }
<% call sizes() %>
  %kv_heads = arith.constant ${G} : index
${ _row_tile_constants(rows_per_workgroup) }
<% endcall %>
${ _row_tiles(rows_per_workgroup) }
${ push_constants() }
  %o, %lse = flow.dispatch @${executable}::@${function}[${ "%row_tiles" if rows_per_workgroup else "%m_rows" }, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %q, %k, %v, %block_indices)
      : (i32, i32, i32, i32, ${ row_operand_types() })
      -> (tensor<?x?x${H}x${DV}x${E}>{%batch, %m_rows}, tensor<?x${H}x?xf32>{%batch, %m_rows})
  return %o, %lse : tensor<?x?x${H}x${DV}x${E}>, tensor<?x${H}x?xf32>
}
<% endmacro %>

<# The block lists inverted (common/inversion.mlir) in a host function whose %block_indices, %n and %transients
   are in scope: %entries, %piece_start, %piece_count. #>
<% macro inverted_lists() %>
  %entries, %piece_start, %piece_count = func.call @invert_block_indices(%block_indices, %n, %transients)
      : (tensor<?x?x${G}x${T}xi32>, index, !hal.buffer) -> (${ lists_types() })
<%- endmacro %>

<# The type of f32 partials per (row, slot) [B, M, G, T, HPG, `width`]. #>
<% macro slots_type(width) %>tensor<?x?x${G}x${T}x${HPG}x${width}xf32><% endmacro %>

<# The forward over the block lists' pieces (gpu/hopper/forward_pieces.mlir): the block lists inverted (common/
   inversion.mlir), one dispatch of `executable`'s @`function` per piece writing its rows' f32 partials per slot, o
   [B, M, G, T, HPG, Dv] and (max, sum) [B, M, G, T, HPG, 2], then each row's counted slots combined in slot order
   (common/forward_sums.mlir). The lists are outputs too: the backward of the same block indices takes them
   (dkdv's selection_attention_backward_lists) instead of inverting them again. #>
<% macro forward_pieces(executable, function) %>
<% set o_slots_type = slots_type(DV) %>
<% set stats_slots_type = slots_type(2) %>
${ forward_signature(lists=true) }
${ sizes() }
${ inverted_lists() }
  %pieces = tensor.dim %entries, %c0 : tensor<?x${ROWS_PER_PIECE}x2xi32>
${ push_constants(pieces=true) }
  %o_slots, %stats_slots = flow.dispatch @${executable}::@${function}[%pieces](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %pieces_i32, %q, %k, %v, %block_indices, %entries)
      : (i32, i32, i32, i32, i32, ${ row_operand_types() }, tensor<?x${ROWS_PER_PIECE}x2xi32>{%pieces})
      -> (${o_slots_type}{%batch, %m_rows}, ${stats_slots_type}{%batch, %m_rows})
  %o, %lse = func.call @forward_partial_sums(%o_slots, %stats_slots, %block_indices, %n)
      : (${o_slots_type}, ${stats_slots_type}, tensor<?x?x${G}x${T}xi32>, index)
      -> (tensor<?x?x${H}x${DV}x${E}>, tensor<?x${H}x?xf32>)
  return %o, %lse, %entries, %piece_start, %piece_count
      : tensor<?x?x${H}x${DV}x${E}>, tensor<?x${H}x?xf32>, ${ lists_types() }
}
<% endmacro %>

<# dq's host function: one dispatch of `executable`'s @`function` per (m, g, b), or per row tile as the forward's. #>
<% macro dq(executable, function="selection_attention_dq_row", rows_per_workgroup=none) %>
${ dq_signature() }
<% call sizes() %>
  %kv_heads = arith.constant ${G} : index
${ _row_tile_constants(rows_per_workgroup) }
<% endcall %>
${ _row_tiles(rows_per_workgroup) }
${ push_constants() }
  %dq = flow.dispatch @${executable}::@${function}[${ "%row_tiles" if rows_per_workgroup else "%m_rows" }, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %q, %k, %v, %block_indices, %lse, %delta, %do)
      : (i32, i32, i32, i32, ${ backward_operand_types() })
      -> tensor<?x?x${H}x${D}x${E}>{%batch, %m_rows}
  return %dq : tensor<?x?x${H}x${D}x${E}>
}
<% endmacro %>

<# dk/dv's host function: one dispatch of `executable`'s @selection_attention_dkdv_piece per piece, then the
   pieces summed per block in order (common/piece_sums.mlir). `with_dq` (gpu/hopper/dkdv_dq.mlir): the backward in
   one call (onepass_signature's selection_attention_backward, reading o): delta (common/delta.mlir) and the block
   lists' inversion (common/inversion.mlir) as calls first; the kernel writes dq's f32 partials per (row, slot)
   [B, M, G, T, HPG, D] too, each row's summed in slot order (common/dq_sums.mlir). And the same backward taking
   the lists the forward over the pieces wrote (selection_attention_backward_lists: no inversion). #>
<% macro dkdv(executable, with_dq=false) %>
<% if with_dq %>
${ _dkdv_function(executable, with_dq=true, lists=false) }

${ _dkdv_function(executable, with_dq=true, lists=true) }
<% else %>
${ _dkdv_function(executable) }
<% endif %>
<% endmacro %>

<# One of dkdv's functions (`lists`: it takes the block lists rather than inverting them). #>
<% macro _dkdv_function(executable, with_dq=false, lists=false) %>
<% set dq_slots_type = slots_type(D) %>
<% if with_dq %>
${ onepass_signature("selection_attention_backward_lists" if lists else "selection_attention_backward", "o", lists) }
${ sizes() }
  %delta = func.call @selection_attention_delta(%o, %do, %transients)
      : (tensor<?x?x${H}x${DV}x${E}>, tensor<?x?x${H}x${DV}x${E}>, !hal.buffer) -> tensor<?x?x${H}xf32>
<% if not lists %>
${ inverted_lists() }
<% endif %>
<% else %>
${ dkdv_signature() }
${ sizes() }
<% endif %>
  %pieces = tensor.dim %entries, %c0 : tensor<?x${ROWS_PER_PIECE}x2xi32>
${ push_constants(pieces=true) }
  %dk_pieces, %dv_pieces${ ", %dq_slots" if with_dq else "" } = flow.dispatch @${executable}::@selection_attention_dkdv_piece[%pieces](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %pieces_i32, %q, %k, %v, %block_indices, %lse, %delta, %do, %entries)
      : (i32, i32, i32, i32, i32, ${ backward_operand_types() }, tensor<?x${ROWS_PER_PIECE}x2xi32>{%pieces})
      -> (tensor<?x${BS}x${D}xf32>{%pieces}, tensor<?x${BS}x${DV}xf32>{%pieces}${ (", " ~ dq_slots_type ~ "{%batch, %m_rows}") if with_dq else "" })
  %dk, %dv = func.call @dkdv_piece_sums(%dk_pieces, %dv_pieces, %piece_start, %piece_count, %batch, %n)
      : (tensor<?x${BS}x${D}xf32>, tensor<?x${BS}x${DV}xf32>, tensor<?xi32>, tensor<?xi32>, index, index)
      -> (tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>)
<% if with_dq %>
  %dq = func.call @dq_partial_sums(%dq_slots, %block_indices, %n)
      : (${dq_slots_type}, tensor<?x?x${G}x${T}xi32>, index) -> tensor<?x?x${H}x${D}x${E}>
  return %dq, %dk, %dv : tensor<?x?x${H}x${D}x${E}>, tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>
<% else %>
  return %dk, %dv : tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>
<% endif %>
}
<% endmacro %>

<# The backward in one host function (one call of the runtime, no host gap between its dispatches) where the dq
   kernel makes delta and the dk/dv kernel takes the keys in tiles (gpu/hopper/dense_dq.mlir, dense_dkdv.mlir):
   `dq`'s @function per (tile of `rows_per_workgroup` of a group's rows, g, b) writes dq and delta from o and do,
   then `dkdv`'s per (tile of `keys_per_workgroup` keys, g, b) writes dk and dv; no block lists inverted
   (kernels.COVERS). `dq` and `dkdv`: (executable, function). #>
<% macro dense_backward(dq, rows_per_workgroup, dkdv, keys_per_workgroup) %>
${ onepass_signature("selection_attention_backward", "o") }
<% call sizes() %>
  %kv_heads = arith.constant ${G} : index
${ _row_tile_constants(rows_per_workgroup) }
  %keys_per_workgroup = arith.constant ${keys_per_workgroup} : index
<% endcall %>
${ _row_tiles(rows_per_workgroup) }
  %key_tiles = arith.ceildivui %n, %keys_per_workgroup : index
${ push_constants() }
  %dq, %delta = flow.dispatch @${dq[0]}::@${dq[1]}[%row_tiles, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %q, %k, %v, %block_indices, %lse, %o, %do)
      : (i32, i32, i32, i32, ${ backward_operand_types("o") })
      -> (tensor<?x?x${H}x${D}x${E}>{%batch, %m_rows}, tensor<?x?x${H}xf32>{%batch, %m_rows})
  %dk, %dv = flow.dispatch @${dkdv[0]}::@${dkdv[1]}[%key_tiles, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %q, %k, %v, %block_indices, %lse, %delta, %do)
      : (i32, i32, i32, i32, ${ backward_operand_types() })
      -> (tensor<?x?x${G}x${D}x${DKV_E}>{%batch, %n}, tensor<?x?x${G}x${DV}x${DKV_E}>{%batch, %n})
  return %dq, %dk, %dv : tensor<?x?x${H}x${D}x${E}>, tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>
}
<% endmacro %>

<# `name` [B, N, G, `dim`] in DKV_E: the f32 `name`_f32 rounded (the one-pass's dk and dv). #>
<% macro round_accumulator(name, dim, index) %>
  %${name}_init = tensor.empty(%batch, %n) : tensor<?x?x${G}x${dim}x${DKV_E}>
  %${name} = linalg.generic {
      indexing_maps = [affine_map<(b, n, g, ${index}) -> (b, n, g, ${index})>, affine_map<(b, n, g, ${index}) -> (b, n, g, ${index})>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%${name}_f32 : tensor<?x?x${G}x${dim}xf32>) outs(%${name}_init : tensor<?x?x${G}x${dim}x${DKV_E}>) {
  ^bb0(%x: f32, %out: ${DKV_E}):
    %x_e = ${DKV_TRUNCF} %x : f32 to ${DKV_E}
    linalg.yield %x_e : ${DKV_E}
  } -> tensor<?x?x${G}x${dim}x${DKV_E}>
<% endmacro %>

<# The one-pass backward's host function: one dispatch of `executable`'s @selection_attention_onepass_row per
   (m, g, b), adding dk and dv into one zeroed f32 accumulator, then both rounded. #>
<% macro onepass(executable) %>
${ onepass_signature() }
<% call sizes() %>
  %zero = arith.constant 0.0 : f32
  %kv_heads = arith.constant ${G} : index
  %head_dim = arith.constant ${D} : index
  %value_dim = arith.constant ${DV} : index
<% endcall %>
  %kv_rows = arith.muli %batch, %n : index
  %kv_group_rows = arith.muli %kv_rows, %kv_heads : index
  %dk_size = arith.muli %kv_group_rows, %head_dim : index
  %dv_size = arith.muli %kv_group_rows, %value_dim : index
  %dkv_size = arith.addi %dk_size, %dv_size : index

  %acc_init = tensor.empty(%dkv_size) : tensor<?xf32>
  %acc_zero = linalg.fill ins(%zero : f32) outs(%acc_init : tensor<?xf32>) -> tensor<?xf32>
${ push_constants() }
  %acc, %dq = flow.dispatch @${executable}::@selection_attention_onepass_row[%m_rows, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %q, %k, %v, %block_indices, %lse, %delta, %do, %acc_zero)
      : (i32, i32, i32, i32, ${ backward_operand_types() }, tensor<?xf32>{%dkv_size})
      -> (%acc_zero{%dkv_size}, tensor<?x?x${H}x${D}x${E}>{%batch, %m_rows})

  %dk_flat = tensor.extract_slice %acc[0] [%dk_size] [1] : tensor<?xf32> to tensor<?xf32>
  %dv_flat = tensor.extract_slice %acc[%dk_size] [%dv_size] [1] : tensor<?xf32> to tensor<?xf32>
  %dk_f32 = tensor.expand_shape %dk_flat [[0, 1, 2, 3]] output_shape [%batch, %n, ${G}, ${D}]
      : tensor<?xf32> into tensor<?x?x${G}x${D}xf32>
  %dv_f32 = tensor.expand_shape %dv_flat [[0, 1, 2, 3]] output_shape [%batch, %n, ${G}, ${DV}]
      : tensor<?xf32> into tensor<?x?x${G}x${DV}xf32>
${ round_accumulator("dk", D, "d") }
${ round_accumulator("dv", DV, "e") }
  return %dq, %dk, %dv : tensor<?x?x${H}x${D}x${E}>, tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>
}
<% endmacro %>
