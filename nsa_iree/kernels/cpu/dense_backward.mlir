// The compressed attention's backward on CPUs in one pass (kernels.DENSE: the dense form of the dk/dv stage, which
// writes dq as well: kernels.COVERS), deterministic and without atomics. One work item per (item, kv group g,
// batch b), item i taking the rows m = i, i + ITEMS, i + 2 ITEMS, ... (ITEMS = min(ceil(M / CPU_ITEM_ROWS),
// CPU_ITEMS): every item has about the same work under the staircase). For each of a row's selected blocks (the
// tiles of compressed keys it sees), S, dP, P and DS are made once (cpu/products.mlir, the layout of dq.mlir and
// dkdv.mlir):
//   dq[h, :]          += sum_j DS[h, j] * k[key j, :]                 (in registers, the row's dq written once)
//   dv[block, j, :]   += sum_h P[h, j] * do[m, h, :]                  (into the item's f32 partial of the block)
//   dk[block, j, :]   += sum_h DS[h, j] * q[m, h, :]
// where the two-pass makes S and dP twice (its dk/dv pass and its dq pass) and inverts the block lists. Each item's
// partial of flat block f is piece f * ITEMS + i; @dkdv_piece_sums adds a block's ITEMS partials in item order
// (bitwise reproducible, whatever the number of threads) and rounds them once. The partials take
// B G NB ITEMS BS (D + Dv) 4 bytes: few for the compressed keys' tiles (NB = ceil(C / BS)), which is why the
// sliding window, whose rows each read two blocks of N / BS, keeps the two-pass (kernels/cpu/__init__.py: limits).
// delta = rowsum(do * o) is made for each row as its work starts (products.delta_of_row): no delta stage, one
// dispatch and one call for the backward.
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/host.mlir" as host %>
<% import "cpu/host.mlir" as cpu %>
<% import "cpu/products.mlir" as products %>
<% import "cpu/rows.mlir" as rows %>

<# %`name` = the piece of this item's partial of flat block %`f`: f * ITEMS + item (@dkdv_piece_sums' lists below). #>
<% macro piece(name, f) %>
%${name}_f = arith.muli %${f}, %items : index
        %${name} = arith.addi %${name}_f, %item : index<% endmacro %>

<% set inputs = ['q', ("kT", "memref<?x" ~ D ~ "x" ~ BS ~ "x" ~ E ~ ">{%flat_blocks}", "key_blocks_t [B * G * NB, D, BS] (cpu/blocks.mlir)"), ("vT", "memref<?x" ~ DV ~ "x" ~ BS ~ "x" ~ E ~ ">{%flat_blocks}", "value_blocks_t [B * G * NB, Dv, BS]"), 'k', 'block_indices', 'lse', 'o', 'do'] %>
<% set outputs = ['dq', ("acc", "memref<?x" ~ BS ~ "x" ~ CPU_DKV ~ "xf32>{%pieces}", "f32 partials [B * G * NB * ITEMS, BS, D + Dv]: each item's dk (times scale), then dv, of every block")] %>
${ dispatch.layout("dense_backward_cpu_layout", 5, inputs, outputs) }

<% call dispatch.executable("selection_attention_backward_cpu_exe", "selection_attention_backward_cpu_item", "dense_backward_cpu_layout", ['items', 'kv_heads', 'batch']) %>
<% call rows.function("selection_attention_backward_cpu_item") %>
      %zero = arith.constant 0.0 : f32
<% endcall %>
      %dq_heads_step = arith.constant ${CPU_DQ_HEADS} : index
      %dq_cols_step = arith.constant ${CPU_DQ_COLS} : index
      %zero_d = arith.constant dense<0.0> : vector<${D}xf32>
      %zero_row = arith.constant dense<0.0> : vector<${CPU_DKV}xf32>
${ products.constants(CPU_KROWS, CPU_VCOLS, CPU_KCOLS, CPU_SROWS) }

${ dispatch.ids(['item', 'g', 'b']) }
${ dispatch.push_constants("dense_backward_cpu_layout", ['batch', 'm_rows', 'n', 'items', 'scale']) }
      %num_blocks = arith.ceildivui %n, %block_size : index
      %bg_count = arith.muli %batch, %kv_heads : index
      %flat_blocks = arith.muli %bg_count, %num_blocks : index
      %pieces = arith.muli %flat_blocks, %items : index

${ dispatch.bindings("dense_backward_cpu_layout", inputs, outputs) }

      %s_tile = memref.alloca() : memref<${HPG}x${BS}xf32>
      %dp_tile = memref.alloca() : memref<${HPG}x${BS}xf32>
      %dq_tile = memref.alloca() : memref<${HPG}x${D}xf32>
      %delta_tile = memref.alloca() : memref<${HPG}xf32>
      %h_first = arith.muli %g, %heads_per_group : index
      // This item's partials of the group's blocks start at 0 (a block no row of the item reads stays 0).
      %group = arith.muli %b, %kv_heads : index
      %group_g = arith.addi %group, %g : index
      %group_f0 = arith.muli %group_g, %num_blocks : index
      scf.for %i = %c0 to %num_blocks step %c1 {
        %fi = arith.addi %group_f0, %i : index
        ${ piece("zeroed", "fi") }
        scf.for %j = %c0 to %block_size step %c1 {
          vector.store %zero_row, %acc[%zeroed, %j, %c0] : memref<?x${BS}x${CPU_DKV}xf32>, vector<${CPU_DKV}xf32>
        }
      }

      scf.for %m = %item to %m_rows step %items {
<% call products.row_backward(CPU_SROWS, CPU_SROWS_HALF, CPU_DQ_HEADS, CPU_DQ_COLS, CPU_DQ_STREAM, CPU_DELTA_LANES) %>
          // dv and dk of the block's visible keys from the same P and DS, into this item's partial of it (each slot
          // once: a block listed twice adds twice).
          ${ piece("piece", "f") }
${ products.add_to_acc(CPU_KROWS, CPU_VCOLS, CPU_KCOLS, CPU_DKV, at="piece") }
<% endcall %>
      }

      scf.for %i = %c0 to %num_blocks step %c1 {
        %fi = arith.addi %group_f0, %i : index
        ${ piece("scaled", "fi") }
${ products.scale_dk("scaled", CPU_DKV) }
      }
      return
    }
<% endcall %>

${ host.onepass_signature("selection_attention_backward", "o") }
<% call host.sizes() %>
  %kv_heads = arith.constant ${G} : index
  %block_size = arith.constant ${BS} : index
  %items_most = arith.constant ${CPU_ITEMS} : index
  %item_rows = arith.constant ${CPU_ITEM_ROWS} : index
<% endcall %>
  %items_wanted = arith.ceildivui %m_rows, %item_rows : index
  %items = arith.minui %items_wanted, %items_most : index
  %items_i32 = arith.index_cast %items : index to i32
${ cpu.flat_blocks() }
  %pieces = arith.muli %flat_blocks, %items : index
${ host.push_constants() }
${ cpu.blocks_t() }
  %dq, %partials = flow.dispatch @selection_attention_backward_cpu_exe::@selection_attention_backward_cpu_item[%items, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %items_i32, %scale_bits, %q, %key_blocks_t, %value_blocks_t, %k,
      %block_indices, %lse, %o, %do)
      : (i32, i32, i32, i32, i32, ${ dispatch.tensor_types(inputs) })
      -> (${ dispatch.tensor_types(outputs) })
  // Block f's pieces are f * ITEMS .. f * ITEMS + ITEMS - 1 (@dkdv_piece_sums' lists).
  %lists_init = tensor.empty(%flat_blocks) : tensor<?xi32>
  %piece_start, %piece_count = linalg.generic {
      indexing_maps = [affine_map<(f) -> (f)>, affine_map<(f) -> (f)>], iterator_types = ["parallel"]}
      outs(%lists_init, %lists_init : tensor<?xi32>, tensor<?xi32>) {
  ^bb0(%start_out: i32, %count_out: i32):
    %fb = linalg.index 0 : index
    %first = arith.muli %fb, %items : index
    %first_i32 = arith.index_cast %first : index to i32
    linalg.yield %first_i32, %items_i32 : i32, i32
  } -> (tensor<?xi32>, tensor<?xi32>)
${ cpu.piece_sums("partials") }
  return %dq, %dk, %dv : tensor<?x?x${H}x${D}x${E}>, tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>
}
