// dq pass on CPUs: one hand-written dispatch, one work item per (query row m, kv group g, batch b), the
// layout of forward_cpu.mlir (vectors along the group's HPG heads). For every selected block:
//   sT[j, :]  = sum_d kT[d, key j] * qT[d, :]          (qT = scale * q, transposed once per row)
//   p         = exp(sT - lse)
//   dpT[j, :] = sum_e vT[e, key j] * doT[e, :]         (doT = do, transposed once per row)
//   ds        = p * (dp - delta)
//   dqT[d, :] += k[key j, d] * ds[j, :]                 (CPU_DCOLS elements of d at a time, in registers)
// and dq = scale * dqT, written once. f32 throughout; bf16 and f16 inputs are extended as they are loaded.
// Skipped slots are never read, only keys <= pos(m) are, a block listed twice counts twice; a row without
// visible keys gets dq = 0.
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/host.mlir" as host %>
<% import "cpu/host.mlir" as cpu %>
<% import "cpu/rows.mlir" as rows %>

<% set inputs = ['q', ("kT", "memref<?x" ~ D ~ "x" ~ BS ~ "x" ~ E ~ ">{%flat_blocks}", "key_blocks_t [B * G * NB, D, BS] (mlir/cpu_blocks.mlir)"), ("vT", "memref<?x" ~ DV ~ "x" ~ BS ~ "x" ~ E ~ ">{%flat_blocks}", "value_blocks_t [B * G * NB, Dv, BS]"), 'k', 'block_indices', 'lse', 'delta', 'do'] %>
<% set outputs = ['dq'] %>
${ dispatch.layout("dq_cpu_layout", 4, inputs, outputs) }

<% call dispatch.executable("selection_attention_dq_cpu_exe", "selection_attention_dq_cpu_row", "dq_cpu_layout", ['m_rows', 'kv_heads', 'batch']) %>
<% call rows.function("selection_attention_dq_cpu_row") %>
      %zero = arith.constant 0.0 : f32
<% endcall %>
      %rows_step = arith.constant ${CPU_ROWS} : index
      %dcols_step = arith.constant ${CPU_DCOLS} : index
      %cols_step = arith.constant ${CPU_COLS} : index
      %zero_h = arith.constant dense<0.0> : vector<${HPG}xf32>
      %zero_rows = arith.constant dense<0.0> : vector<${CPU_ROWS}x${HPG}xf32>

${ dispatch.ids(['m', 'g', 'b']) }
${ dispatch.push_constants("dq_cpu_layout", ['batch', 'm_rows', 'n', 'scale']) }
      %num_blocks = arith.ceildivui %n, %block_size : index
      %bg_count = arith.muli %batch, %kv_heads : index
      %flat_blocks = arith.muli %bg_count, %num_blocks : index

${ dispatch.bindings("dq_cpu_layout", inputs, outputs) }

      %qT = memref.alloca() : memref<${D}x${HPG}xf32>
      %doT = memref.alloca() : memref<${DV}x${HPG}xf32>
      %dqT = memref.alloca() : memref<${D}x${HPG}xf32>
      %sT = memref.alloca() : memref<${BS}x${HPG}xf32>
      %dpT = memref.alloca() : memref<${BS}x${HPG}xf32>

      %h0 = arith.muli %g, %heads_per_group : index
      %scale_h = vector.broadcast %scale : f32 to vector<${HPG}xf32>
      %scale_tile = vector.broadcast %scale : f32 to vector<${CPU_DCOLS}x${HPG}xf32>
${ rows.transposed("qT", "q", D, CPU_DCOLS, "d", "head_dim", "dcols_step", "h0", true) }
      scf.for %d = %c0 to %head_dim step %c1 {
        vector.store %zero_h, %dqT[%d, %c0] : memref<${D}x${HPG}xf32>, vector<${HPG}xf32>
      }
${ rows.transposed("doT", "do", DV, CPU_COLS, "e", "value_dim", "cols_step", "h0", false) }
      %lse_h = vector.transfer_read %lse[%b, %h0, %m], %zero
          {in_bounds = [true], permutation_map = affine_map<(b, h, m) -> (h)>}
          : memref<?x${H}x?xf32>, vector<${HPG}xf32>
      %delta_h = vector.load %delta[%b, %m, %h0] : memref<?x?x${H}xf32>, vector<${HPG}xf32>

<# the keys of a block a row sees start at ${first} (rows.block_extent) #>
<% set first = "%first_visible" if WINDOW != "0" else "%c0" %>
${ rows.position() }
      scf.for %t = %c0 to %slots step %c1 {
${ rows.slot_block() }
        scf.if %selected {
${ rows.block_extent() }
${ rows.whole_steps(CPU_ROWS) }
<% include "cpu/scores.mlir" %>
          // dpT[j, :] = sum_e vT[f, e, j] * doT[e, :], as the scores.
          scf.for %j0 = %c0 to %full step %rows_step {
            %acc = scf.for %e = %c0 to %value_dim step %c1 iter_args(%acc = %zero_rows) -> (vector<${CPU_ROWS}x${HPG}xf32>) {
              %vals = vector.load %vT[%f, %e, %j0] : memref<?x${DV}x${BS}x${E}>, vector<${CPU_ROWS}x${E}>
              %vals32 = ${EXTF} %vals : vector<${CPU_ROWS}x${E}> to vector<${CPU_ROWS}xf32>
              %doe = vector.load %doT[%e, %c0] : memref<${DV}x${HPG}xf32>, vector<${HPG}xf32>
              %acc_new = vector.outerproduct %vals32, %doe, %acc : vector<${CPU_ROWS}xf32>, vector<${HPG}xf32>
              scf.yield %acc_new : vector<${CPU_ROWS}x${HPG}xf32>
            }
            vector.transfer_write %acc, %dpT[%j0, %c0] {in_bounds = [true, true]}
                : vector<${CPU_ROWS}x${HPG}xf32>, memref<${BS}x${HPG}xf32>
          }
          scf.for %j = %full to %visible step %c1 {
            %acc = scf.for %e = %c0 to %value_dim step %c1 iter_args(%acc = %zero_h) -> (vector<${HPG}xf32>) {
              %x = memref.load %vT[%f, %e, %j] : memref<?x${DV}x${BS}x${E}>
              %x32 = ${EXTF} %x : ${E} to f32
              %xs = vector.broadcast %x32 : f32 to vector<${HPG}xf32>
              %doe = vector.load %doT[%e, %c0] : memref<${DV}x${HPG}xf32>, vector<${HPG}xf32>
              %acc_new = vector.fma %xs, %doe, %acc : vector<${HPG}xf32>
              scf.yield %acc_new : vector<${HPG}xf32>
            }
            vector.store %acc, %dpT[%j, %c0] : memref<${BS}x${HPG}xf32>, vector<${HPG}xf32>
          }
          // ds = exp(s - lse) * (dp - delta), into dpT.
          scf.for %j = ${first} to %visible step %c1 {
            %s = vector.load %sT[%j, %c0] : memref<${BS}x${HPG}xf32>, vector<${HPG}xf32>
            %shifted = arith.subf %s, %lse_h : vector<${HPG}xf32>
            %p = math.exp %shifted : vector<${HPG}xf32>
            %dp = vector.load %dpT[%j, %c0] : memref<${BS}x${HPG}xf32>, vector<${HPG}xf32>
            %dp_minus_delta = arith.subf %dp, %delta_h : vector<${HPG}xf32>
            %ds = arith.mulf %p, %dp_minus_delta : vector<${HPG}xf32>
            vector.store %ds, %dpT[%j, %c0] : memref<${BS}x${HPG}xf32>, vector<${HPG}xf32>
          }
          // dqT[d, :] += sum_j k[key0 + j, d] * ds[j, :], CPU_DCOLS elements of d at a time.
          scf.for %d0 = %c0 to %head_dim step %dcols_step {
            %dq_old = vector.transfer_read %dqT[%d0, %c0], %zero {in_bounds = [true, true]}
                : memref<${D}x${HPG}xf32>, vector<${CPU_DCOLS}x${HPG}xf32>
            %dq_new = scf.for %j = ${first} to %visible step %c1 iter_args(%acc = %dq_old) -> (vector<${CPU_DCOLS}x${HPG}xf32>) {
              %key = arith.addi %key0, %j : index
              %keys = vector.load %k[%b, %key, %g, %d0] : memref<?x?x${G}x${D}x${E}>, vector<${CPU_DCOLS}x${E}>
              %keys32 = ${EXTF} %keys : vector<${CPU_DCOLS}x${E}> to vector<${CPU_DCOLS}xf32>
              %ds = vector.load %dpT[%j, %c0] : memref<${BS}x${HPG}xf32>, vector<${HPG}xf32>
              %acc_new = vector.outerproduct %keys32, %ds, %acc : vector<${CPU_DCOLS}xf32>, vector<${HPG}xf32>
              scf.yield %acc_new : vector<${CPU_DCOLS}x${HPG}xf32>
            }
            vector.transfer_write %dq_new, %dqT[%d0, %c0] {in_bounds = [true, true]}
                : vector<${CPU_DCOLS}x${HPG}xf32>, memref<${D}x${HPG}xf32>
          }
        }
      }

${ rows.transposed_store("dqT", "dq", D, CPU_DCOLS, "d", "head_dim", "dcols_step", "h0", "scale_h") }
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
