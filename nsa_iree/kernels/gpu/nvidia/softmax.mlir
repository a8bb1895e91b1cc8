<% import "gpu/nvidia/kernel.mlir" as nv %>
<# The forward kernels' online softmax over 16 keys (imported as softmax by gpu/nvidia/forward.mlir, which splits a
   block's keys over its subgroups, and dense_forward.mlir, whose subgroups each take every key of a tile): the
   quad reduction and one step of 16 keys against a subgroup's 16 rows. #>

<# result = x reduced with `op` (arith.maximumf, arith.addf) over the 4 lanes (c) that share a head. #>
<% macro quad_reduce(result, x, op) %>
          ${result}_s1, ${result}_v1 = gpu.shuffle xor ${x}, %c1_i32, %c32_i32 : f32
          ${result}_1 = ${op} ${x}, ${result}_s1 : f32
          ${result}_s2, ${result}_v2 = gpu.shuffle xor ${result}_1, %c2_i32, %c32_i32 : f32
          ${result} = ${op} ${result}_1, ${result}_s2 : f32
<% endmacro %>

<# The online softmax's rule for moving the running max (its reference point), from the lane's two rows' block maxes
   %block_max_0, %block_max_1 (base 2, over the 4 lanes of a row) and their running maxes %mx0, %mx1: %any_grows,
   one decision for the subgroup (`vote_any`, the recipe's instruction). #>
<% macro moves(vote_any) %>
          // The running max moves only when some head of the subgroup exceeds it by more than
          // RESCALE_SLACK (a decision uniform over the subgroup); otherwise p = 2^(x - max) <= 2^RESCALE_SLACK
          // against the stale max, and o, max and sum stay as they are. The result is the same softmax (o and
          // the sum share the reference point) with one rescale of o per moved max instead of one per block.
          %limit_0 = arith.addf %mx0, %rescale_slack : f32
          %limit_1 = arith.addf %mx1, %rescale_slack : f32
          %grows_0 = arith.cmpf ogt, %block_max_0, %limit_0 : f32
          %grows_1 = arith.cmpf ogt, %block_max_1, %limit_1 : f32
          %grows = arith.ori %grows_0, %grows_1 : i1
          %grows_i32 = arith.extui %grows : i1 to i32
          %any_grows_i32 = ${vote_any} %grows_i32 : (i32) -> i32
          %any_grows = arith.cmpi ne, %any_grows_i32, %c0_i32 : i32
<% endmacro %>

<# Where %any_grows holds: the rows' new maxes %new_max_0, %new_max_1 and the factors %alpha_0, %alpha_1 that take o
   and the sums %l0, %l1 to them (%l0_scaled, %l1_scaled), 2^x by `ex2`. #>
<% macro rescale_factors(ex2) %>
            // Rescale factors; a head that has seen no key yet keeps max -inf, o = 0 and sum 0.
            %new_max_0 = arith.maximumf %mx0, %block_max_0 : f32
            %new_max_1 = arith.maximumf %mx1, %block_max_1 : f32
            %none_0 = arith.cmpf oeq, %new_max_0, %minus_inf : f32
            %none_1 = arith.cmpf oeq, %new_max_1, %minus_inf : f32
            %safe_new_0 = arith.select %none_0, %zero, %new_max_0 : f32
            %safe_new_1 = arith.select %none_1, %zero, %new_max_1 : f32
            %drop_0 = arith.subf %mx0, %safe_new_0 : f32
            %drop_1 = arith.subf %mx1, %safe_new_1 : f32
            %alpha_0 = ${ex2} %drop_0 : (f32) -> f32
            %alpha_1 = ${ex2} %drop_1 : (f32) -> f32
            %l0_scaled = arith.mulf %l0, %alpha_0 : f32
            %l1_scaled = arith.mulf %l1, %alpha_1 : f32
<% endmacro %>

<# The rows' reference maxes %max_ref_0, %max_ref_1 as the exponents' offsets %safe_max_0, %safe_max_1 (0 for a row
   that has seen no key: its x are -inf, its p 0). #>
<% macro reference_max() %>
          %none_ref_0 = arith.cmpf oeq, %max_ref_0, %minus_inf : f32
          %none_ref_1 = arith.cmpf oeq, %max_ref_1, %minus_inf : f32
          %safe_max_0 = arith.select %none_ref_0, %zero, %max_ref_0 : f32
          %safe_max_1 = arith.select %none_ref_1, %zero, %max_ref_1 : f32
<% endmacro %>

<# One step of the online softmax: 16 keys (key_base .. key_base + 15 of the staged rows in %buffer, read at
   %score_row for s = q k^T and %pv_row for p v, swizzled by %score_swizzle_k and %pv_swizzle_v) against the
   subgroup's 16 rows (%q_frags; head rows %head_valid_0/_1, keys below %visible, or below %visible_0/_1 per row
   when `per_row`). Takes the running state %o_iter (!fwk_o_acc), %mx0, %mx1 (row maxes, base 2), %l0, %l1
   (the lane's parts of the row sums) and defines the next: %o_new, %max_ref_0, %max_ref_1, %l0_new, %l1_new.
   `t` names the s = q k^T types (kernel.mlir's types, with kind); ex2, pack_pair and vote_any are the recipe's
   instructions (the family's EX2, PACK_PAIR, VOTE_ANY). Without `masked` no key or row is tested (a step where
   kernel.mlir's %interior holds). #>
<% macro step(t, ex2, pack_pair, vote_any, per_row=false, masked=true) %>
          %scores_zero = arith.constant dense<0.0> : !dqk_scores
${ nv.score_steps("%s_acc", "%d_steps", "%scores_zero", "%q_frags", "!dqk_q_frags", "%k_rows", "!dqk_k_rows", "%buffer", "%score_row", "%k_swizzle_high", "%lo8", "%score_swizzle_k", t, chains=2) }
          // Scores in base-2 units, x = s scale log2(e), -inf where the key is invisible or the head is
          // padding: [tile][i][e] is head 8 i + r, key key_base + 8 tile + 2 c + e.
          %x_init = arith.constant dense<0.0> : !dqk_scores
          %x = scf.for %tile = %c0 to %c2 step %c1 iter_args(%acc = %x_init) -> (!dqk_scores) {
            %acc_i = scf.for %i = %c0 to %c2 step %c1 iter_args(%acc2 = %acc) -> (!dqk_scores) {
              %is_row_1 = arith.cmpi eq, %i, %c1 : index
              %head_valid = arith.select %is_row_1, %head_valid_1, %head_valid_0 : i1
              %acc_e = scf.for %e = %c0 to %c2 step %c1 iter_args(%acc3 = %acc2) -> (!dqk_scores) {
${ nv.score_element(per_row, masked) }
                %scaled = arith.mulf %sv, %scale_log2 : f32
                %xv = arith.select %live, %scaled, %minus_inf : f32
                %next = vector.insert %xv, %acc3[0, %tile, %i, %e] : f32 into !dqk_scores
                scf.yield %next : !dqk_scores
              } {unroll_loop}
              scf.yield %acc_e : !dqk_scores
            } {unroll_loop}
            scf.yield %acc_i : !dqk_scores
          } {unroll_loop}
          // Block max per head: over the lane's 4 keys, then over the 4 lanes (c) sharing the head.
          %x00 = vector.extract %x[0, 0, 0] : vector<2xf32> from !dqk_scores
          %x10 = vector.extract %x[0, 1, 0] : vector<2xf32> from !dqk_scores
          %x01 = vector.extract %x[0, 0, 1] : vector<2xf32> from !dqk_scores
          %x11 = vector.extract %x[0, 1, 1] : vector<2xf32> from !dqk_scores
          %row0 = arith.maximumf %x00, %x10 : vector<2xf32>
          %row1 = arith.maximumf %x01, %x11 : vector<2xf32>
          %lane_max_0 = vector.reduction <maximumf>, %row0 : vector<2xf32> into f32
          %lane_max_1 = vector.reduction <maximumf>, %row1 : vector<2xf32> into f32
<% for h in ["0", "1"] %>
${ quad_reduce("%block_max_" ~ h, "%lane_max_" ~ h, "arith.maximumf") }
<% endfor %>
${ moves(vote_any) }
          %o_ref, %max_ref_0, %max_ref_1, %l0_ref, %l1_ref = scf.if %any_grows -> (!fwk_o_acc, f32, f32, f32, f32) {
${ rescale_factors(ex2) }
            // o = o * alpha per head: accumulator element [0][tile][i][e] is head 8 i + r.
            %alpha_rows0 = vector.broadcast %alpha_0 : f32 to vector<2xf32>
            %alpha_rows1 = vector.broadcast %alpha_1 : f32 to vector<2xf32>
            %alpha_pair0 = arith.constant dense<0.0> : vector<2x2xf32>
            %alpha_pair1 = vector.insert %alpha_rows0, %alpha_pair0[0] : vector<2xf32> into vector<2x2xf32>
            %alpha_pair = vector.insert %alpha_rows1, %alpha_pair1[1] : vector<2xf32> into vector<2x2xf32>
            %alpha_all = vector.broadcast %alpha_pair : vector<2x2xf32> to !fwk_o_acc
            %o_rescaled = arith.mulf %o_iter, %alpha_all : !fwk_o_acc
            scf.yield %o_rescaled, %new_max_0, %new_max_1, %l0_scaled, %l1_scaled : !fwk_o_acc, f32, f32, f32, f32
          } else {
            scf.yield %o_iter, %mx0, %mx1, %l0, %l1 : !fwk_o_acc, f32, f32, f32, f32
          }
${ reference_max() }

          // p = 2^(x - max) (0 for x = -inf), its row sums per lane, and p as the lhs fragment of p v:
          // element [2 i + tile][e], each pair converted to the input type by one instruction.
          %p_init = arith.constant dense<0.0> : !fwk_p_frags
          %p_frags, %psum_0, %psum_1 = scf.for %tile = %c0 to %c2 step %c1
              iter_args(%acc = %p_init, %ps0 = %zero, %ps1 = %zero) -> (!fwk_p_frags, f32, f32) {
            %acc_i, %ps0_i, %ps1_i = scf.for %i = %c0 to %c2 step %c1
                iter_args(%acc2 = %acc, %ps0b = %ps0, %ps1b = %ps1) -> (!fwk_p_frags, f32, f32) {
              %is_row_1 = arith.cmpi eq, %i, %c1 : index
              %row_max = arith.select %is_row_1, %safe_max_1, %safe_max_0 : f32
              %xv0 = vector.extract %x[0, %tile, %i, 0] : f32 from !dqk_scores
              %xv1 = vector.extract %x[0, %tile, %i, 1] : f32 from !dqk_scores
              %shifted0 = arith.subf %xv0, %row_max : f32
              %shifted1 = arith.subf %xv1, %row_max : f32
              %p0 = ${ex2} %shifted0 : (f32) -> f32
              %p1 = ${ex2} %shifted1 : (f32) -> f32
              %pair_sum = arith.addf %p0, %p1 : f32
              %packed = ${pack_pair} %p1, %p0 : (f32, f32) -> i32
              %packed_v = vector.broadcast %packed : i32 to vector<1xi32>
              %pair = vector.bitcast %packed_v : vector<1xi32> to vector<2x${E}>
              %i2 = arith.muli %i, %c2 : index
              %frag_row = arith.addi %i2, %tile : index
              %next = vector.insert %pair, %acc2[0, 0, %frag_row] : vector<2x${E}> into !fwk_p_frags
              %add_0 = arith.select %is_row_1, %zero, %pair_sum : f32
              %add_1 = arith.select %is_row_1, %pair_sum, %zero : f32
              %ps0_next = arith.addf %ps0b, %add_0 : f32
              %ps1_next = arith.addf %ps1b, %add_1 : f32
              scf.yield %next, %ps0_next, %ps1_next : !fwk_p_frags, f32, f32
            } {unroll_loop}
            scf.yield %acc_i, %ps0_i, %ps1_i : !fwk_p_frags, f32, f32
          } {unroll_loop}
          %l0_new = arith.addf %l0_ref, %psum_0 : f32
          %l1_new = arith.addf %l1_ref, %psum_1 : f32

          // o += p v with v read transposed (ldmatrix .trans), two e tiles per step.
${ nv.accumulate_steps("%o_new", "%dv_steps", "%o_ref", "!fwk_o_acc", "%p_frags", "!fwk_p_frags", "%scores_zero", "%v_rows", "!dqk_v_rows", "%buffer", "%pv_row", "%v_swizzle_high", "%hi8", "%pv_swizzle_v", t) }
<% endmacro %>

<# `step` as two copies under kernel.mlir's subgroup-uniform %interior test (rows of one position: the selection
   forward's): the one without masks where every key of the step is visible to every row, the masked one at the
   edges of the row's range. Takes and defines what `step` does. #>
<% macro checked_step(t, ex2, pack_pair, vote_any) %>
${ nv.interior() }
          %o_new, %max_ref_0, %max_ref_1, %l0_new, %l1_new = scf.if %interior -> (!fwk_o_acc, f32, f32, f32, f32) {
${ step(t, ex2, pack_pair, vote_any, masked=false) }
            scf.yield %o_new, %max_ref_0, %max_ref_1, %l0_new, %l1_new : !fwk_o_acc, f32, f32, f32, f32
          } else {
${ step(t, ex2, pack_pair, vote_any) }
            scf.yield %o_new, %max_ref_0, %max_ref_1, %l0_new, %l1_new : !fwk_o_acc, f32, f32, f32, f32
          }
<% endmacro %>

<# The online softmax over the first `keys` keys of the staged tile or block in %buffer, 16 at a time (steps
   `first`, first + `stride`, ... of `step` below %subtiles, in key order) against the subgroup's 16 rows: takes the
   running state %o_tile, %mx0_tile, %mx1_tile, %l0_tile, %l1_tile and defines the next, %o_j, %mx0_j, %mx1_j,
   %l0_j, %l1_j. Uses %score_lane_row, %pv_lane_row (the lane's ldmatrix rows of a step) and the swizzle masks;
   t, ex2, pack_pair, vote_any and per_row as `step`'s. #>
<% macro tile_steps(keys, t, ex2, pack_pair, vote_any, per_row=false, first="%c0", stride="%c1") %>
          %key_steps0 = arith.ceildivui ${keys}, %c16 : index
          %key_steps = arith.minui %key_steps0, %subtiles : index
          %o_j, %mx0_j, %mx1_j, %l0_j, %l1_j = scf.for %key_step = ${first} to %key_steps step ${stride}
              iter_args(%o_iter = %o_tile, %mx0 = %mx0_tile, %mx1 = %mx1_tile, %l0 = %l0_tile, %l1 = %l1_tile)
              -> (!fwk_o_acc, f32, f32, f32, f32) {
            %key_base = arith.muli %key_step, %c16 : index
            // K and V chunks are stored XOR-swizzled by row (kv_staging): column c of row j at c ^ 8 (j & mask).
            %score_row = arith.addi %key_base, %score_lane_row : index
            %score_row_bits = arith.andi %score_row, %k_swizzle_mask : index
            %score_swizzle_k = arith.muli %score_row_bits, %c8 : index
            %pv_row = arith.addi %key_base, %pv_lane_row : index
            %pv_row_bits = arith.andi %pv_row, %v_swizzle_mask : index
            %pv_swizzle_v = arith.muli %pv_row_bits, %c8 : index
${ step(t, ex2, pack_pair, vote_any, per_row) }
            scf.yield %o_new, %max_ref_0, %max_ref_1, %l0_new, %l1_new : !fwk_o_acc, f32, f32, f32, f32
          }
<%- endmacro %>

<# The epilogue of kernels whose subgroups own whole rows (each row's keys all seen by one subgroup): each row's sum
   over the 4 lanes that share it, lse and o = o / sum written for the lane's rows (%head_i, %m_i; none where
   %head_valid_i is false; `rows` name their positions). Takes the loop's %o_acc, %max_0, %max_1 (base 2), %sum_0, %sum_1. #>
<% macro rows_out(rows=("%m_0", "%m_1")) %>
      // Each row's sum (over the 4 lanes that share it), 1 / sum and lse = max ln 2 + log(sum): -inf and o = 0
      // for a row that saw no key.
<% for i in ["0", "1"] %>
${ quad_reduce("%row_sum_" ~ i, "%sum_" ~ i, "arith.addf") }
      %seen_${i} = arith.cmpf ogt, %row_sum_${i}, %zero : f32
      %safe_sum_${i} = arith.select %seen_${i}, %row_sum_${i}, %one : f32
      %inverse_all_${i} = arith.divf %one, %safe_sum_${i} : f32
      %inverse_${i} = arith.select %seen_${i}, %inverse_all_${i}, %zero : f32
      %max_nat_${i} = arith.mulf %max_${i}, %ln2 : f32
      %log_sum_${i} = math.log %safe_sum_${i} : f32
      %lse_all_${i} = arith.addf %max_nat_${i}, %log_sum_${i} : f32
      %lse_${i} = arith.select %seen_${i}, %lse_all_${i}, %minus_inf : f32
      %inverse_pair_${i} = vector.broadcast %inverse_${i} : f32 to vector<2xf32>
<% endfor %>
      %first_of_row = arith.cmpi eq, %c, %c0 : index
<% for i in ["0", "1"] %>
      %writes_lse_${i} = arith.andi %first_of_row, %head_valid_${i} : i1
      scf.if %writes_lse_${i} {
        memref.store %lse_${i}, %lse[%b, %head_${i}, ${ rows[i | int] }] : memref<?x${H}x?xf32>
      }
<% endfor %>
      // o: accumulator element [0][tile][i] holds row 8 i + r, columns 8 tile + 2 c and + 1.
${ nv.store_rows("%o_acc", "!fwk_o_acc", "%dv_tiles", "%o", "!fwk_o", scaled=true, rows=rows) }
<%- endmacro %>

<# The forward kernels' partial results, before a combine across subgroups (gpu/forward_combine.mlir): the lane's two
   rows' running max (in natural units), sum (over the 4 lanes that share a row) and unnormalised o into part
   `index` of %max_parts, %sum_parts and %o_parts at rows row_0 and row_1 (= row_0 + 8), then a barrier. Takes the
   loop's %o_acc, %max_0, %max_1 (base 2), %sum_0, %sum_1. #>
<% macro parts_out(index, row_0, row_1) %>
      // Each subgroup's partial o, max and sum (sums over the 4 lanes of a head) into workgroup memory.
<% for h in ["0", "1"] %>
${ quad_reduce("%row_sum_" ~ h, "%sum_" ~ h, "arith.addf") }
<% endfor %>
      %first_of_head = arith.cmpi eq, %c, %c0 : index
      // The maxes back in natural units (the combine's).
      %max_nat_0 = arith.mulf %max_0, %ln2 : f32
      %max_nat_1 = arith.mulf %max_1, %ln2 : f32
      scf.if %first_of_head {
        memref.store %max_nat_0, %max_parts[${index}, ${row_0}] : !fwk_stats
        memref.store %max_nat_1, %max_parts[${index}, ${row_1}] : !fwk_stats
        memref.store %row_sum_0, %sum_parts[${index}, ${row_0}] : !fwk_stats
        memref.store %row_sum_1, %sum_parts[${index}, ${row_1}] : !fwk_stats
      }
      scf.for %tile = %c0 to %dv_tiles step %c1 {
        scf.for %i = %c0 to %c2 step %c1 {
          %i8 = arith.muli %i, %c8 : index
          %h = arith.addi %i8, ${row_0} : index
          %tile8 = arith.muli %tile, %c8 : index
          %e = arith.addi %tile8, %c2x : index
          %part = vector.extract %o_acc[0, %tile, %i] : vector<2xf32> from !fwk_o_acc
          vector.store %part, %o_parts[${index}, %h, %e] : !fwk_o_parts, vector<2xf32>
        } {unroll_loop}
      } {unroll_loop}
      gpu.barrier
<%- endmacro %>
