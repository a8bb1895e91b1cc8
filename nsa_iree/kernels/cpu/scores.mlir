// The CPU kernels' scores of one selected block (forward_cpu.mlir, dq_cpu.mlir): sT[j, :] = sum_d
// kT[f, d, j] * qT[d, :] for the visible keys j < visible of flat block f, CPU_ROWS keys at a time (one
// vector load of consecutive keys, their vectors of heads accumulating in registers) up to %full
// (rows.whole_steps), then the rest, if any, one key at a time. Uses %qT, %sT, %kT, %f, %full, %visible, %head_dim, %rows_step, %zero_rows, %zero_h;
// defines nothing used after it.
<# part: takes CPU_ROWS, rows #>
<% set kt = "memref<?x" ~ D ~ "x" ~ BS ~ "x" ~ E ~ ">" %>
          scf.for %j0 = %c0 to %full step %rows_step {
            ${ rows.key_rows_scores("%f", "j0", kt, CPU_ROWS) }
            vector.transfer_write %acc, %sT[%j0, %c0] {in_bounds = [true, true]}
                : vector<${CPU_ROWS}x${HPG}xf32>, memref<${BS}x${HPG}xf32>
          }
          scf.for %j = %full to %visible step %c1 {
            ${ rows.key_scores("%f", "j", kt) }
            vector.store %acc, %sT[%j, %c0] : memref<${BS}x${HPG}xf32>, vector<${HPG}xf32>
          }
