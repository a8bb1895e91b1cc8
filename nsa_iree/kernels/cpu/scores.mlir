// The CPU kernels' scores of one selected block (forward_cpu.mlir, dq_cpu.mlir): sT[j, :] = sum_d
// kT[f, d, j] * qT[d, :] for the visible keys j < visible of flat block f, CPU_ROWS keys at a time (one
// vector load of consecutive keys, their vectors of heads accumulating in registers), then the ragged rest
// one key at a time. Uses %qT, %sT, %kT, %f, %full, %visible, %head_dim, %rows_step, %zero_rows, %zero_h;
// defines nothing used after it.
<# part: takes CPU_ROWS #>
          scf.for %j0 = %c0 to %full step %rows_step {
            %acc = scf.for %d = %c0 to %head_dim step %c1 iter_args(%acc = %zero_rows) -> (vector<${CPU_ROWS}x${HPG}xf32>) {
              %keys = vector.load %kT[%f, %d, %j0] : memref<?x${D}x${BS}x${E}>, vector<${CPU_ROWS}x${E}>
              %keys32 = ${EXTF} %keys : vector<${CPU_ROWS}x${E}> to vector<${CPU_ROWS}xf32>
              %qd = vector.load %qT[%d, %c0] : memref<${D}x${HPG}xf32>, vector<${HPG}xf32>
              %acc_new = vector.outerproduct %keys32, %qd, %acc : vector<${CPU_ROWS}xf32>, vector<${HPG}xf32>
              scf.yield %acc_new : vector<${CPU_ROWS}x${HPG}xf32>
            }
            vector.transfer_write %acc, %sT[%j0, %c0] {in_bounds = [true, true]}
                : vector<${CPU_ROWS}x${HPG}xf32>, memref<${BS}x${HPG}xf32>
          }
          scf.for %j = %full to %visible step %c1 {
            %acc = scf.for %d = %c0 to %head_dim step %c1 iter_args(%acc = %zero_h) -> (vector<${HPG}xf32>) {
              %x = memref.load %kT[%f, %d, %j] : memref<?x${D}x${BS}x${E}>
              %x32 = ${EXTF} %x : ${E} to f32
              %xs = vector.broadcast %x32 : f32 to vector<${HPG}xf32>
              %qd = vector.load %qT[%d, %c0] : memref<${D}x${HPG}xf32>, vector<${HPG}xf32>
              %acc_new = vector.fma %xs, %qd, %acc : vector<${HPG}xf32>
              scf.yield %acc_new : vector<${HPG}xf32>
            }
            vector.store %acc, %sT[%j, %c0] : memref<${BS}x${HPG}xf32>, vector<${HPG}xf32>
          }
