// Forward on CPUs: one hand-written dispatch, one work item per (query row m, kv group g, batch b), one pass
// over the row's selected blocks with an online softmax (the running max and sum per head).
//
// Vectors run along the HPG heads of the group (vector<HPG x f32>), which share every key of the row's
// blocks, so nothing is transposed per block:
//   qT[d, :]  = scale * q[b, m, heads, d]           (the row's q, transposed once, on the stack)
//   sT[j, :] += kT[d, key j] * qT[d, :]              (a broadcast key element times a vector of heads: FMAs,
//                                                    CPU_ROWS keys at a time, their vectors held in registers;
//                                                    kT: the K blocks transposed by mlir/cpu_blocks.mlir)
//   pT[j, :]  = exp(sT[j, :] - max)                  (in place)
//   oT[e, :] += v[key j, e] * pT[j, :]               (CPU_COLS value elements at a time)
// The per-block max and sum are plain vector maxima and sums over the block's keys. f32 throughout; bf16 and
// f16 inputs are extended as they are loaded.
//
// Skipped slots (i < 0, i * BS > pos(m), which covers i * BS >= N since pos(m) < N) are never read. Inside
// the diagonal block only keys <= pos(m) are read. A block listed twice is processed twice (multiplicity).
// A row with no visible key gets o = 0 and lse = -inf.
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/host.mlir" as host %>
<% import "cpu/host.mlir" as cpu %>
<% import "cpu/rows.mlir" as rows %>

<% set inputs = ['q', ("kT", "memref<?x" ~ D ~ "x" ~ BS ~ "x" ~ E ~ ">{%flat_blocks}", "key_blocks_t [B * G * NB, D, BS] (mlir/cpu_blocks.mlir)"), 'v', 'block_indices'] %>
<% set outputs = ['o', 'lse_rows'] %>
${ dispatch.layout("fwd_cpu_layout", 4, inputs, outputs) }

<% call dispatch.executable("selection_attention_fwd_cpu_exe", "selection_attention_fwd_cpu_row", "fwd_cpu_layout", ['m_rows', 'kv_heads', 'batch']) %>
<% call rows.function("selection_attention_fwd_cpu_row") %>
      %zero = arith.constant 0.0 : f32
      %one = arith.constant 1.0 : f32
      %neg_inf = arith.constant 0xFF800000 : f32
<% endcall %>
      %rows_step = arith.constant ${CPU_ROWS} : index
      %dcols_step = arith.constant ${CPU_DCOLS} : index
      %cols_step = arith.constant ${CPU_COLS} : index
      %zero_h = arith.constant dense<0.0> : vector<${HPG}xf32>
      %neg_inf_h = arith.constant dense<0xFF800000> : vector<${HPG}xf32>
      %zero_rows = arith.constant dense<0.0> : vector<${CPU_ROWS}x${HPG}xf32>

${ dispatch.ids(['m', 'g', 'b']) }
${ dispatch.push_constants("fwd_cpu_layout", ['batch', 'm_rows', 'n', 'scale']) }

${ dispatch.bindings("fwd_cpu_layout", inputs, outputs, only=['q']) }
      %num_blocks = arith.ceildivui %n, %block_size : index
      %bg_count = arith.muli %batch, %kv_heads : index
      %flat_blocks = arith.muli %bg_count, %num_blocks : index
${ dispatch.bindings("fwd_cpu_layout", inputs, outputs, only=['kT', 'v', 'block_indices', 'o', 'lse_rows']) }

      %qT = memref.alloca() : memref<${D}x${HPG}xf32>
      %oT = memref.alloca() : memref<${DV}x${HPG}xf32>
      %sT = memref.alloca() : memref<${BS}x${HPG}xf32>

      %h0 = arith.muli %g, %heads_per_group : index
      %scale_tile = vector.broadcast %scale : f32 to vector<${CPU_DCOLS}x${HPG}xf32>
${ rows.transposed("qT", "q", D, CPU_DCOLS, "d", "head_dim", "dcols_step", "h0", true) }
      scf.for %e = %c0 to %value_dim step %c1 {
        vector.store %zero_h, %oT[%e, %c0] : memref<${DV}x${HPG}xf32>, vector<${HPG}xf32>
      }

<# the keys of a block a row sees start at ${first} (rows.block_extent) #>
<% set first = "%first_visible" if WINDOW != "0" else "%c0" %>
${ rows.position() }
      %m_final, %l_final = scf.for %t = %c0 to %slots step %c1
          iter_args(%m_run = %neg_inf_h, %l_run = %zero_h) -> (vector<${HPG}xf32>, vector<${HPG}xf32>) {
${ rows.slot_block() }
        %m_next, %l_next = scf.if %selected -> (vector<${HPG}xf32>, vector<${HPG}xf32>) {
${ rows.block_extent() }
${ rows.whole_steps(CPU_ROWS) }
<% include "cpu/scores.mlir" %>
          %mx = scf.for %j = ${first} to %visible step %c1 iter_args(%acc = %neg_inf_h) -> (vector<${HPG}xf32>) {
            %s = vector.load %sT[%j, %c0] : memref<${BS}x${HPG}xf32>, vector<${HPG}xf32>
            %bigger = arith.maximumf %acc, %s : vector<${HPG}xf32>
            scf.yield %bigger : vector<${HPG}xf32>
          }
          %m_new = arith.maximumf %m_run, %mx : vector<${HPG}xf32>
          // exp(-inf - m_new) = 0 for the first block; m_new is finite (the block has a visible key).
          %shift = arith.subf %m_run, %m_new : vector<${HPG}xf32>
          %alpha = math.exp %shift : vector<${HPG}xf32>
          %l_block = scf.for %j = ${first} to %visible step %c1 iter_args(%acc = %zero_h) -> (vector<${HPG}xf32>) {
            %s = vector.load %sT[%j, %c0] : memref<${BS}x${HPG}xf32>, vector<${HPG}xf32>
            %shifted = arith.subf %s, %m_new : vector<${HPG}xf32>
            %p = math.exp %shifted : vector<${HPG}xf32>
            vector.store %p, %sT[%j, %c0] : memref<${BS}x${HPG}xf32>, vector<${HPG}xf32>
            %sum = arith.addf %acc, %p : vector<${HPG}xf32>
            scf.yield %sum : vector<${HPG}xf32>
          }
          %l_scaled = arith.mulf %l_run, %alpha : vector<${HPG}xf32>
          %l_new = arith.addf %l_scaled, %l_block : vector<${HPG}xf32>
          %alpha_cols = vector.broadcast %alpha : vector<${HPG}xf32> to vector<${CPU_COLS}x${HPG}xf32>
          scf.for %e0 = %c0 to %value_dim step %cols_step {
            %o_old = vector.transfer_read %oT[%e0, %c0], %zero {in_bounds = [true, true]}
                : memref<${DV}x${HPG}xf32>, vector<${CPU_COLS}x${HPG}xf32>
            %o_rescaled = arith.mulf %o_old, %alpha_cols : vector<${CPU_COLS}x${HPG}xf32>
            %o_new = scf.for %j = ${first} to %visible step %c1 iter_args(%acc = %o_rescaled) -> (vector<${CPU_COLS}x${HPG}xf32>) {
              %key = arith.addi %key0, %j : index
              %vals = vector.load %v[%b, %key, %g, %e0] : memref<?x?x${G}x${DV}x${E}>, vector<${CPU_COLS}x${E}>
              %vals32 = ${EXTF} %vals : vector<${CPU_COLS}x${E}> to vector<${CPU_COLS}xf32>
              %p = vector.load %sT[%j, %c0] : memref<${BS}x${HPG}xf32>, vector<${HPG}xf32>
              %acc_new = vector.outerproduct %vals32, %p, %acc : vector<${CPU_COLS}xf32>, vector<${HPG}xf32>
              scf.yield %acc_new : vector<${CPU_COLS}x${HPG}xf32>
            }
            vector.transfer_write %o_new, %oT[%e0, %c0] {in_bounds = [true, true]}
                : vector<${CPU_COLS}x${HPG}xf32>, memref<${DV}x${HPG}xf32>
          }
          scf.yield %m_new, %l_new : vector<${HPG}xf32>, vector<${HPG}xf32>
        } else {
          scf.yield %m_run, %l_run : vector<${HPG}xf32>, vector<${HPG}xf32>
        }
        scf.yield %m_next, %l_next : vector<${HPG}xf32>, vector<${HPG}xf32>
      }

      // o = oT / sum (0 for a row without visible keys), lse = max + log(sum) (-inf there).
      %empty_row = arith.cmpf oeq, %l_final, %zero_h : vector<${HPG}xf32>
      %one_h = vector.broadcast %one : f32 to vector<${HPG}xf32>
      %inverse = arith.divf %one_h, %l_final : vector<${HPG}xf32>
      %weight = arith.select %empty_row, %zero_h, %inverse : vector<${HPG}xi1>, vector<${HPG}xf32>
${ rows.transposed_store("oT", "o", DV, CPU_COLS, "e", "value_dim", "cols_step", "h0", "weight", CPU_O_STREAM) }
      %log_sum = math.log %l_final : vector<${HPG}xf32>
      %lse_sum = arith.addf %m_final, %log_sum : vector<${HPG}xf32>
      %lse_h = arith.select %empty_row, %neg_inf_h, %lse_sum : vector<${HPG}xi1>, vector<${HPG}xf32>
      vector.store %lse_h, %lse_rows[%b, %m, %h0] : memref<?x?x${H}xf32>, vector<${HPG}xf32>
      return
    }
<% endcall %>

${ host.forward_signature() }
<% call host.sizes() %>
  %kv_heads = arith.constant ${G} : index
<% endcall %>
${ host.push_constants() }
  %block_size = arith.constant ${BS} : index
${ cpu.flat_blocks() }
${ cpu.blocks_t() }
  %o, %lse_rows = flow.dispatch @selection_attention_fwd_cpu_exe::@selection_attention_fwd_cpu_row[%m_rows, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %q, %key_blocks_t, %v, %block_indices)
      : (i32, i32, i32, i32, ${ dispatch.tensor_types(inputs) })
      -> (${ dispatch.tensor_types(outputs) })
${ cpu.lse_by_heads() }
  return %o, %lse : tensor<?x?x${H}x${DV}x${E}>, tensor<?x${H}x?xf32>
}
