// Part of the forward kernels (gpu/nvidia/forward.mlir, wide_forward.mlir, gpu/portable/forward.mlir: `// part:
// forward_combine`): after each subgroup has written its running max, sum and unnormalised o for its heads
// (%max_parts, %sum_parts [parts, heads], %o_parts [parts, heads, Dv]: a part per subgroup, or per key split of
// the wide kernel's) and the workgroup has synchronised, combine the combined_parts parts in order (fixed:
// bitwise reproducible) and write lse and o. Uses %tid, %lanes, %heads_per_group, %value_dim, %h0, %b, %m, %o,
// %lse, %minus_inf, %zero, %one.
      // Combine in subgroup order (heads past HPG are padding: not written). Lane h < HPG: M = max_w m_w,
      // L = sum_w l_w exp(m_w - M), lse = M + log(L), and the weight of each subgroup's o, exp(m_w - M) / L,
      // in place of m_w (only lane h touches column h).
<# part: takes FWD_O_QUADS, FWD_O_STORE_ALIGNMENT, combined_parts #>
      %is_head_lane = arith.cmpi ult, %tid, %heads_per_group : index
      scf.if %is_head_lane {
        %row_max = scf.for %w = %c0 to ${combined_parts} step %c1 iter_args(%acc = %minus_inf) -> (f32) {
          %x = memref.load %max_parts[%w, %tid] : !fwk_stats
          %next = arith.maximumf %acc, %x : f32
          scf.yield %next : f32
        }
        %empty = arith.cmpf oeq, %row_max, %minus_inf : f32
        %safe_max = arith.select %empty, %zero, %row_max : f32
        %total = scf.for %w = %c0 to ${combined_parts} step %c1 iter_args(%l = %zero) -> (f32) {
          %mw = memref.load %max_parts[%w, %tid] : !fwk_stats
          %lw = memref.load %sum_parts[%w, %tid] : !fwk_stats
          %nothing = arith.cmpf oeq, %mw, %minus_inf : f32
          %drop = arith.subf %mw, %safe_max : f32
          %factor0 = math.exp %drop : f32
          %factor = arith.select %nothing, %zero, %factor0 : f32
          memref.store %factor, %sum_parts[%w, %tid] : !fwk_stats
          %lf = arith.mulf %lw, %factor : f32
          %l_next = arith.addf %l, %lf : f32
          scf.yield %l_next : f32
        }
        %seen = arith.cmpf ogt, %total, %zero : f32
        %safe_total = arith.select %seen, %total, %one : f32
        %inverse0 = arith.divf %one, %safe_total : f32
        %inverse = arith.select %seen, %inverse0, %zero : f32
        scf.for %w = %c0 to ${combined_parts} step %c1 {
          %factor = memref.load %sum_parts[%w, %tid] : !fwk_stats
          %weight = arith.mulf %factor, %inverse : f32
          memref.store %weight, %max_parts[%w, %tid] : !fwk_stats
        }
        %log_total = math.log %safe_total : f32
        %lse_value = arith.addf %safe_max, %log_total : f32
        %lse_final = arith.select %seen, %lse_value, %minus_inf : f32
        %head = arith.addi %h0, %tid : index
        memref.store %lse_final, %lse[%b, %head, %m] : memref<?x${H}x?xf32>
      }
      gpu.barrier
      // o, four columns a lane (Dv is a multiple of 4): a 16-byte read of each part, one 8-byte store (f16/bf16)
      // or 16-byte (f32); the same fma order per column as one column a lane.
      %o_quads = arith.constant ${FWD_O_QUADS} : index
      %quad = arith.constant 4 : index
      %dv_quads = arith.divui %value_dim, %quad : index
      %no_o = arith.constant dense<0.0> : vector<4xf32>
      scf.for %item = %tid to %o_quads step %lanes {
        %h = arith.divui %item, %dv_quads : index
        %column_quad = arith.remui %item, %dv_quads : index
        %e = arith.muli %column_quad, %quad : index
        %o_value = scf.for %w = %c0 to ${combined_parts} step %c1 iter_args(%acc = %no_o) -> (vector<4xf32>) {
          %weight = memref.load %max_parts[%w, %h] : !fwk_stats
          %weights = vector.broadcast %weight : f32 to vector<4xf32>
          %ow = vector.load %o_parts[%w, %h, %e] alignment = 16 : !fwk_o_parts, vector<4xf32>
          %next = math.fma %ow, %weights, %acc : vector<4xf32>
          scf.yield %next : vector<4xf32>
        }
        %o_e = ${TRUNCF} %o_value : vector<4xf32> to vector<4x${E}>
        %head = arith.addi %h0, %h : index
        vector.store %o_e, %o[%b, %m, %head, %e] alignment = ${FWD_O_STORE_ALIGNMENT} : !fwk_o, vector<4x${E}>
      }
