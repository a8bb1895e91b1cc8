// dq pass on CPUs: one hand-written dispatch, one work item per (query row m, kv group g, batch b). For every
// selected block, with vectors along the block's BS keys (the layout of dkdv.mlir, cpu/products.mlir):
//   S[h, :]  = scale * sum_d q[m, h, d] * kT[d, :]      (each q element a scalar broadcast over the keys)
//   dP[h, :] = sum_e do[m, h, e] * vT[e, :]
//   P = exp(S - lse[h]), DS = P * (dP - delta[h])       (0 on the keys the row does not see)
// and with vectors along D:
//   dq[h, :] += sum_j DS[h, j] * k[key j, :]            (CPU_DQ_HEADS heads x CPU_DQ_COLS elements in registers)
// then dq = scale * dq, written once as each head's contiguous row (streaming stores where the rows are whole cache
// lines: CPU_DQ_STREAM). No tile is transposed. f32 throughout; bf16
// and f16 inputs are extended as they are loaded. Skipped slots are never read, only keys <= pos(m) are, a block
// listed twice counts twice; a row without visible keys gets dq = 0.
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/host.mlir" as host %>
<% import "cpu/host.mlir" as cpu %>
<% import "cpu/products.mlir" as products %>
<% import "cpu/rows.mlir" as rows %>

<% set inputs = ['q', ("kT", "memref<?x" ~ D ~ "x" ~ BS ~ "x" ~ E ~ ">{%flat_blocks}", "key_blocks_t [B * G * NB, D, BS] (mlir/cpu_blocks.mlir)"), ("vT", "memref<?x" ~ DV ~ "x" ~ BS ~ "x" ~ E ~ ">{%flat_blocks}", "value_blocks_t [B * G * NB, Dv, BS]"), 'k', 'block_indices', 'lse', 'delta', 'do'] %>
<% set outputs = ['dq'] %>
${ dispatch.layout("dq_cpu_layout", 4, inputs, outputs) }

<% call dispatch.executable("selection_attention_dq_cpu_exe", "selection_attention_dq_cpu_row", "dq_cpu_layout", ['m_rows', 'kv_heads', 'batch']) %>
<% call rows.function("selection_attention_dq_cpu_row") %>
      %zero = arith.constant 0.0 : f32
<% endcall %>
      %dq_heads_step = arith.constant ${CPU_DQ_HEADS} : index
      %dq_cols_step = arith.constant ${CPU_DQ_COLS} : index
      %zero_keys = arith.constant dense<0.0> : vector<${BS}xf32>
      %zero_d = arith.constant dense<0.0> : vector<${D}xf32>
      %key_iota = vector.step : vector<${BS}xindex>

${ dispatch.ids(['m', 'g', 'b']) }
${ dispatch.push_constants("dq_cpu_layout", ['batch', 'm_rows', 'n', 'scale']) }
      %num_blocks = arith.ceildivui %n, %block_size : index
      %bg_count = arith.muli %batch, %kv_heads : index
      %flat_blocks = arith.muli %bg_count, %num_blocks : index

${ dispatch.bindings("dq_cpu_layout", inputs, outputs) }

      %s_tile = memref.alloca() : memref<${HPG}x${BS}xf32>
      %dp_tile = memref.alloca() : memref<${HPG}x${BS}xf32>
      %dq_tile = memref.alloca() : memref<${HPG}x${D}xf32>
      %h_first = arith.muli %g, %heads_per_group : index
${ products.row_backward(CPU_SROWS, CPU_SROWS_HALF, CPU_DQ_HEADS, CPU_DQ_COLS, CPU_DQ_STREAM) }
      return
    }
<% endcall %>

${ host.dq_signature() }
<% call host.sizes() %>
  %kv_heads = arith.constant ${G} : index
  %block_size = arith.constant ${BS} : index
<% endcall %>
${ cpu.flat_blocks() }
${ host.push_constants() }
${ cpu.blocks_t() }
  %dq = flow.dispatch @selection_attention_dq_cpu_exe::@selection_attention_dq_cpu_row[%m_rows, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %q, %key_blocks_t, %value_blocks_t, %k, %block_indices, %lse,
      %delta, %do)
      : (i32, i32, i32, i32, ${ dispatch.tensor_types(inputs) })
      -> ${ dispatch.tensor_types(outputs) }
  return %dq : tensor<?x?x${H}x${D}x${E}>
}
