// Forward as a portable matrix-unit kernel: one workgroup per (query row m, kv group g, batch b), one pass over
// the selected blocks with an online softmax; one text for every intrinsic (nsa_iree/fragments.py: Unit;
// dq_portable.mlir explains the units and maps).
//
// Subgroup w owns keys [K w, K w + K) of every block, K = ${UNIT_K} the intrinsic's reduction size, so that
// its p v is whole units: per block
//   s  = q k^T      [16 heads x K keys]; q fragments in registers, K's rhs fragments read from global memory
//                   straight into registers one slot ahead (each K element once per workgroup)
//   m' = max(m, rowmax(scale s)), p = exp(scale s - m'), l = l exp(m - m') + rowsum(p), o = o exp(m - m')
//                   (row max and sum over the lanes of a row: gpu.shuffle xor)
//   o += p v        lhs p [16 x K] through the subgroup's own tile in workgroup memory; rhs v from a
//                   transposed V copy [Dv][key] staged from registers loaded one slot ahead
// Invisible keys and padding heads take no part (p = 0). At the end the subgroups' (max, sum, o) are combined
// in subgroup order (the forward_combine part, shared with forward_kernel.mlir): lse = M + log(L) (natural
// log); a row that sees no key gets o = 0 and lse = -inf. p is rounded to the input type for the matrix units,
// as in the linalg forward. Visibility as in dq_portable.mlir (semantics.md).
<# With a window (WINDOW > 0) a block's keys before the row's first_key (common/rules.mlir) are invisible too: staged
   as zeros, and a subgroup none of whose K keys the row sees skips its products for the block (its scores are -inf,
   so its max, sum and o only rescale). #>
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "gpu/portable/units.mlir" as units %>
<% import "common/rules.mlir" as rules %>
<% set u = {'p': 'fwp', 'kind': MMA_KIND, 'run': RUN, 'runs': RUNS, 'acc_n': ACC_N, 'lhs': LHS_UNIT, 'rhs': RHS_UNIT, 'acc': ACC_UNIT, 'maps': [RUN_MAJOR_MAP, RUN_K_MAP, ACC_ROW_MAP, ACC_COL_MAP]} %>

// Push constants: B, M, N (i32), then the bits of scale (f32).
<% set inputs = ['q', 'k', 'v', 'block_indices'] %>
<% set outputs = ['o', 'lse'] %>
${ dispatch.layout("fwd_portable_layout", 4, inputs, outputs) }

!fwk_o = memref<?x?x${H}x${DV}x${E}>
!fwp_smem = memref<${FWP_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
// Workgroup tiles: V transposed, each subgroup's p, and after the loop each subgroup's o, max and sum.
!fwp_v_cols = memref<${DV}x${BS_PADDED}x${E}, #gpu.address_space<workgroup>>
!fwp_p = memref<${FWD_SUBGROUPS}x16x${UNIT_K_PADDED}x${E}, #gpu.address_space<workgroup>>
!fwk_o_parts = memref<${FWD_SUBGROUPS}x16x${DV}xf32, #gpu.address_space<workgroup>>
!fwk_stats = memref<${FWD_SUBGROUPS}x16xf32, #gpu.address_space<workgroup>>
${ units.types(u) }
!fwp_q_units = vector<${D_UNITS}x${RUNS}x${RUN}x${E}>
!fwp_k_units = vector<${KEY_TILES}x${D_UNITS}x${RUNS}x${RUN}x${E}>
!fwp_scores = vector<${KEY_TILES}x${ACC_N}xf32>
!fwp_o_units = vector<${DV_TILES16}x${ACC_N}xf32>
!fwp_v_staged = vector<${FWD_V_ITEMS_PER_LANE}x8x${E}>


<# out (!fwp_acc_flat): per element i, `combine` (arith.maximumf, arith.addf) from `start` over this lane's elements
   of `scores` (!fwp_scores) in i's row (same row offset, every key tile). #>
<% macro lane_fold(out, init, start, scores, combine) %>
${out} = scf.for %i = %c0 to %acc_n step %c1 iter_args(%acc = ${init}) -> (!fwp_acc_flat) {
  %row_i = affine.apply #fwp_acc_row(%c0, %i)
  %folded = scf.for %kt = %c0 to %key_tiles step %c1 iter_args(%a = ${start}) -> (f32) {
    %a_kt = scf.for %i2 = %c0 to %acc_n step %c1 iter_args(%a2 = %a) -> (f32) {
      %row_i2 = affine.apply #fwp_acc_row(%c0, %i2)
      %same = arith.cmpi eq, %row_i, %row_i2 : index
      %xv = vector.extract ${scores}[%kt, %i2] : f32 from !fwp_scores
      %candidate = ${combine} %a2, %xv : f32
      %next = arith.select %same, %candidate, %a2 : f32
      scf.yield %next : f32
    } {unroll_loop}
    scf.yield %a_kt : f32
  } {unroll_loop}
  %next = vector.insert %folded, %acc[%i] : f32 into !fwp_acc_flat
  scf.yield %next : !fwp_acc_flat
} {unroll_loop}
<% endmacro %>

<# out (!fwp_acc_flat): `combine` of each element of `init` over the lanes of its row (xor shuffles). #>
<% macro row_shuffle(out, init, combine) %>
${out} = scf.for %sh = %c0 to %row_shuffles step %c1 iter_args(%acc = ${init}) -> (!fwp_acc_flat) {
  %sh_i32 = arith.index_cast %sh : index to i32
  %distance = arith.shli %row_stride, %sh_i32 : i32
  %reduced = scf.for %i = %c0 to %acc_n step %c1 iter_args(%a = %acc) -> (!fwp_acc_flat) {
    %mine = vector.extract %a[%i] : f32 from !fwp_acc_flat
    %theirs, %valid = gpu.shuffle xor %mine, %distance, %width : f32
    %both = ${combine} %mine, %theirs : f32
    %next = vector.insert %both, %a[%i] : f32 into !fwp_acc_flat
    scf.yield %next : !fwp_acc_flat
  } {unroll_loop}
  scf.yield %reduced : !fwp_acc_flat
} {unroll_loop}
<% endmacro %>

<% call dispatch.executable("selection_attention_fwd_portable_exe", "selection_attention_fwd_row", "fwd_portable_layout", ['m_rows', 'kv_heads', 'batch'], lanes=FWD_LANES) %>
${ units.func_begin("selection_attention_fwd_row", FWD_LANES, SUBGROUP_SIZE) }
      ${ units.index_constants({"c0": 0, "c1": 1, "c8": 8, "c16": 16}) }
      %c0_i32 = arith.constant 0 : i32
      %c1_i32 = arith.constant 1 : i32
      %width = arith.constant ${SUBGROUP_SIZE} : i32
      %row_stride = arith.constant ${ROW_SHUFFLE_STRIDE} : i32
      %zero = arith.constant 0.0 : f32
      %one = arith.constant 1.0 : f32
      %minus_inf = arith.constant 0xFF800000 : f32
      ${ units.zero_reads(u) }
      ${ units.index_constants({"heads_per_group": HPG, "block_size": BS, "slots": T, "steps": T_PLUS_1, "lanes": FWD_LANES,
          "subgroup_size": SUBGROUP_SIZE, "subgroups": FWD_SUBGROUPS, "unit_k": UNIT_K, "runs": RUNS, "acc_n": ACC_N,
          "key_tiles": KEY_TILES, "row_shuffles": ROW_SHUFFLES, "d_units": D_UNITS, "dv_tiles": DV_TILES16, "value_dim": DV,
          "v_chunks": V_ITEMS, "v_per_lane": FWD_V_ITEMS_PER_LANE}) }

${ dispatch.ids(['m', 'g', 'b']) }
${ dispatch.push_constants("fwd_portable_layout", ['batch', 'm_rows', 'n', 'scale']) }

${ dispatch.bindings("fwd_portable_layout", inputs, outputs) }

      ${ units.views("!fwp_smem", [("v_cols", 0, "!fwp_v_cols"), ("p_tiles", FWP_P_OFFSET, "!fwp_p"),
          ("o_parts", FWP_O_PARTS_OFFSET, "!fwk_o_parts"), ("max_parts", FWP_MAX_OFFSET, "!fwk_stats"),
          ("sum_parts", FWP_SUM_OFFSET, "!fwk_stats")]) }

      ${ units.lane_ids("%unit_k") }
      %h0 = arith.muli %g, %heads_per_group : index

      // q as lhs fragments over all of D, loaded once: read j of unit u is head run_major(l, j), columns
      // u K + run_k(l, j) ...; padding heads (>= HPG) are zeros.
${ units.head_units("%q_units", "%d_units", "!fwp_q_units", "%q", "!fwp_q", u) }

      // pos(m) = m + N - M (bottom-right alignment); signed, in index arithmetic.
      ${ rules.offset() }
      ${ rules.position() }
      ${ rules.last_block("last_visible_block") }

      // Iteration t loads slot t's K fragments and V rows into registers (zeros past the last visible key),
      // computes slot t - 1, then stores the V rows transposed for iteration t + 1. Carried per lane: o, and
      // for each accumulator element (its head acc_row(l, i)) the running max and this lane's part of the sum.
      %o_init = arith.constant dense<0.0> : !fwp_o_units
      %stats_init = arith.constant dense<0xFF800000> : !fwp_acc_flat
      %sums_init = arith.constant dense<0.0> : !fwp_acc_flat
      %k_none = arith.constant dense<0.0> : !fwp_k_units
      %v_none = arith.constant dense<0.0> : !fwp_v_staged
      %block_none = arith.constant -1 : index
      %o_acc, %max_acc, %sum_acc, %k_last, %last_block = scf.for %t = %c0 to %steps step %c1
          iter_args(%o_iter = %o_init, %mx = %stats_init, %l_iter = %sums_init, %k_prev = %k_none, %previous = %block_none)
          -> (!fwp_o_units, !fwp_acc_flat, !fwp_acc_flat, !fwp_k_units, index) {
        ${ units.slot_block() }
        %k_next, %v_staged = scf.if %stage -> (!fwp_k_units, !fwp_v_staged) {
          // This subgroup's K as rhs fragments: read j of key tile kt, unit u is key
          // key_base + 16 kt + run_major(l, j), columns u K + run_k(l, j) ...
          %ks = scf.for %kt = %c0 to %key_tiles step %c1 iter_args(%acc = %k_none) -> (!fwp_k_units) {
            %acc_kt = scf.for %u = %c0 to %d_units step %c1 iter_args(%acc2 = %acc) -> (!fwp_k_units) {
              %acc_u = scf.for %j = %c0 to %runs step %c1 iter_args(%acc3 = %acc2) -> (!fwp_k_units) {
                %kj = affine.apply #fwp_run_major(%lane, %j)
                %kk = affine.apply #fwp_run_k(%lane, %j)
                %kt16 = arith.muli %kt, %c16 : index
                %j0 = arith.addi %key_base, %kt16 : index
                %jj = arith.addi %j0, %kj : index
                %u0 = arith.muli %u, %unit_k : index
                %col = arith.addi %u0, %kk : index
                ${ rules.key_in_range("is_visible", "jj", "slt", "visible", "first_visible") }
                %x = scf.if %is_visible -> (vector<${RUN}x${E}>) {
                  %key = arith.addi %key0, %jj : index
                  %y = vector.load %k[%b, %key, %g, %col] : !fwp_k, vector<${RUN}x${E}>
                  scf.yield %y : vector<${RUN}x${E}>
                } else {
                  scf.yield %zero_run : vector<${RUN}x${E}>
                }
                %next = vector.insert %x, %acc3[%kt, %u, %j] : vector<${RUN}x${E}> into !fwp_k_units
                scf.yield %next : !fwp_k_units
              } {unroll_loop}
              scf.yield %acc_u : !fwp_k_units
            } {unroll_loop}
            scf.yield %acc_kt : !fwp_k_units
          } {unroll_loop}
          // V chunk c is (key c mod BS, elements 8 (c / BS) ..): consecutive lanes take consecutive keys, so
          // the transposed copy's 16-bit stores are consecutive.
          ${ units.stage_rows("%vs", "%v_per_lane", "%v_none", "%v_chunks", "%v", "!fwp_v", "!fwp_v_staged") }
          scf.yield %ks, %vs : !fwp_k_units, !fwp_v_staged
        } else {
          scf.yield %k_none, %v_none : !fwp_k_units, !fwp_v_staged
        }

        // Slot t - 1: its K fragments are %k_prev, its V in workgroup memory.
        %compute = arith.cmpi sge, %previous, %c0 : index
        %o_next, %mx_next, %l_next = scf.if %compute -> (!fwp_o_units, !fwp_acc_flat, !fwp_acc_flat) {
          %p_key0 = arith.muli %previous, %block_size : index
          %p_to_pos = arith.subi %pos, %p_key0 : index
          %p_visible = arith.addi %p_to_pos, %c1 : index
<% if WINDOW != "0" %>
          ${ rules.first_key("p_first_visible", "pos", "p_key0") }
          // Whether the row sees any of this subgroup's keys key_base .. key_base + K - 1 (uniform per subgroup).
          %unit_k_minus_1 = arith.constant ${ (UNIT_K | int) - 1 } : index
          %key_last = arith.addi %key_base, %unit_k_minus_1 : index
          ${ rules.key_in_range("sees", "key_base", "slt", "p_visible", "p_first_visible", j_last="key_last") }
<% endif %>
          %acc_zero = arith.constant dense<0.0> : !fwp_acc
          %x_init = arith.constant dense<0.0> : !fwp_scores
          // Scaled scores, -inf where the key is invisible or the head is padding: element i of key tile kt is
          // head acc_row(l, i), key key_base + 16 kt + acc_col(l, i).
<% if WINDOW != "0" %>
          %x = scf.if %sees -> (!fwp_scores) {
          %x_seen = scf.for %kt = %c0 to %key_tiles step %c1 iter_args(%xs = %x_init) -> (!fwp_scores) {
<% else %>
          %x = scf.for %kt = %c0 to %key_tiles step %c1 iter_args(%xs = %x_init) -> (!fwp_scores) {
<% endif %>
            %s = scf.for %u = %c0 to %d_units step %c1 iter_args(%acc = %acc_zero) -> (!fwp_acc) {
              %rhs_runs = vector.extract %k_prev[%kt, %u] : !fwp_runs from !fwp_k_units
              %rhs = vector.shape_cast %rhs_runs : !fwp_runs to !fwp_rhs
              %lhs_runs = vector.extract %q_units[%u] : !fwp_runs from !fwp_q_units
              %lhs = vector.shape_cast %lhs_runs : !fwp_runs to !fwp_lhs
              ${ units.mma("%next", "%lhs", "%rhs", "%acc", u) }
              scf.yield %next : !fwp_acc
            } {unroll_loop}
            %s_flat = vector.shape_cast %s : !fwp_acc to !fwp_acc_flat
            %masked = scf.for %i = %c0 to %acc_n step %c1 iter_args(%acc = %s_flat) -> (!fwp_acc_flat) {
              %h = affine.apply #fwp_acc_row(%lane, %i)
              %col = affine.apply #fwp_acc_col(%lane, %i)
              %kt16 = arith.muli %kt, %c16 : index
              %j0 = arith.addi %key_base, %kt16 : index
              %jj = arith.addi %j0, %col : index
              ${ rules.key_in_range("key_visible", "jj", "slt", "p_visible", "p_first_visible") }
              %head_real = arith.cmpi ult, %h, %heads_per_group : index
              %live = arith.andi %key_visible, %head_real : i1
              %sv = vector.extract %acc[%i] : f32 from !fwp_acc_flat
              %scaled = arith.mulf %sv, %scale : f32
              %xv = arith.select %live, %scaled, %minus_inf : f32
              %next = vector.insert %xv, %acc[%i] : f32 into !fwp_acc_flat
              scf.yield %next : !fwp_acc_flat
            } {unroll_loop}
            %next = vector.insert %masked, %xs[%kt] : !fwp_acc_flat into !fwp_scores
            scf.yield %next : !fwp_scores
          } {unroll_loop}
<% if WINDOW != "0" %>
            scf.yield %x_seen : !fwp_scores
          } else {
            %x_unseen = arith.constant dense<0xFF800000> : !fwp_scores
            scf.yield %x_unseen : !fwp_scores
          }
<% endif %>

          // Block max of element i's head: over this lane's elements of that head (element i' with the same
          // row offset, every key tile), then over the lanes of the row (xor shuffles).
          %bm_init = arith.constant dense<0xFF800000> : !fwp_acc_flat
          ${ lane_fold("%lane_max", "%bm_init", "%minus_inf", "%x", "arith.maximumf") }
          ${ row_shuffle("%block_max", "%lane_max", "arith.maximumf") }
          // New max, rescale factors (a head that has seen no key keeps max -inf, o = 0 and sum 0), p and this
          // lane's row sums (over the same elements as the max).
          %new_max = arith.maximumf %mx, %block_max : !fwp_acc_flat
          %minus_infs = arith.constant dense<0xFF800000> : !fwp_acc_flat
          %zeros = arith.constant dense<0.0> : !fwp_acc_flat
          %none = arith.cmpf oeq, %new_max, %minus_infs : !fwp_acc_flat
          %safe_max = arith.select %none, %zeros, %new_max : vector<${ACC_N}xi1>, !fwp_acc_flat
          %drop = arith.subf %mx, %safe_max : !fwp_acc_flat
          %alpha = math.exp %drop : !fwp_acc_flat
          %p_init = arith.constant dense<0.0> : !fwp_scores
          %p_all = scf.for %kt = %c0 to %key_tiles step %c1 iter_args(%acc = %p_init) -> (!fwp_scores) {
            %x_kt = vector.extract %x[%kt] : !fwp_acc_flat from !fwp_scores
            %shifted = arith.subf %x_kt, %safe_max : !fwp_acc_flat
            %p_kt = math.exp %shifted : !fwp_acc_flat
            %next = vector.insert %p_kt, %acc[%kt] : !fwp_acc_flat into !fwp_scores
            scf.yield %next : !fwp_scores
          } {unroll_loop}
          ${ lane_fold("%psum", "%zeros", "%zero", "%p_all", "arith.addf") }
          %l_scaled = arith.mulf %l_iter, %alpha : !fwp_acc_flat
          %l_new = arith.addf %l_scaled, %psum : !fwp_acc_flat

          // p (rounded to the input type) into this subgroup's tile at (head, 16 kt + column).
          scf.for %kt = %c0 to %key_tiles step %c1 {
            scf.for %i = %c0 to %acc_n step %c1 {
              %h = affine.apply #fwp_acc_row(%lane, %i)
              %col = affine.apply #fwp_acc_col(%lane, %i)
              %kt16 = arith.muli %kt, %c16 : index
              %jj = arith.addi %kt16, %col : index
              %pv = vector.extract %p_all[%kt, %i] : f32 from !fwp_scores
              %p_e = ${TRUNCF} %pv : f32 to ${E}
              memref.store %p_e, %p_tiles[%subgroup, %h, %jj] : !fwp_p
            } {unroll_loop}
          } {unroll_loop}
          gpu.barrier

          // o = o alpha (element i of every o unit is head acc_row(l, i)), then o += p v: lhs read j is head
          // run_major(l, j), keys run_k(l, j) ... of this subgroup's tile; rhs read j is V's column (dv)
          // 16 tile + run_major(l, j), keys key_base + run_k(l, j) ...
<% if WINDOW != "0" %>
          // (A subgroup that sees none of the block's keys has p = 0: o is only rescaled.)
          %o_new = scf.if %sees -> (!fwp_o_units) {
<% endif %>
          ${ units.read_runs("%lhs_runs", "%p_tiles", "!fwp_p", none, none, u, lead="%subgroup, ") }
          %lhs = vector.shape_cast %lhs_runs : !fwp_runs to !fwp_lhs
<% if WINDOW != "0" %>
          %o_seen = scf.for %tile = %c0 to %dv_tiles step %c1 iter_args(%acc = %o_iter) -> (!fwp_o_units) {
<% else %>
          %o_new = scf.for %tile = %c0 to %dv_tiles step %c1 iter_args(%acc = %o_iter) -> (!fwp_o_units) {
<% endif %>
            %col0 = arith.muli %tile, %c16 : index
            ${ units.read_runs("%rhs_runs", "%v_cols", "!fwp_v_cols", "%col0", "%key_base", u) }
            %rhs = vector.shape_cast %rhs_runs : !fwp_runs to !fwp_rhs
            %old_flat = vector.extract %acc[%tile] : !fwp_acc_flat from !fwp_o_units
            %rescaled_flat = arith.mulf %old_flat, %alpha : !fwp_acc_flat
            %rescaled = vector.shape_cast %rescaled_flat : !fwp_acc_flat to !fwp_acc
            ${ units.mma("%out", "%lhs", "%rhs", "%rescaled", u) }
            %out_flat = vector.shape_cast %out : !fwp_acc to !fwp_acc_flat
            %next = vector.insert %out_flat, %acc[%tile] : !fwp_acc_flat into !fwp_o_units
            scf.yield %next : !fwp_o_units
          } {unroll_loop}
<% if WINDOW != "0" %>
            scf.yield %o_seen : !fwp_o_units
          } else {
            %alpha_units = vector.broadcast %alpha : !fwp_acc_flat to !fwp_o_units
            %o_rescaled = arith.mulf %o_iter, %alpha_units : !fwp_o_units
            scf.yield %o_rescaled : !fwp_o_units
          }
<% endif %>
          scf.yield %o_new, %new_max, %l_new : !fwp_o_units, !fwp_acc_flat, !fwp_acc_flat
        } else {
          scf.yield %o_iter, %mx, %l_iter : !fwp_o_units, !fwp_acc_flat, !fwp_acc_flat
        }

        // Slot t's V rows into workgroup memory, once every subgroup is done with slot t - 1's.
        gpu.barrier
        scf.if %stage {
          ${ units.store_rows("%v_per_lane", "%v_chunks", "%v_staged", "!fwp_v_staged", "%block_size", none, none, "%v_cols", "!fwp_v_cols") }
        }
        gpu.barrier
        scf.yield %o_next, %mx_next, %l_next, %k_next, %block : !fwp_o_units, !fwp_acc_flat, !fwp_acc_flat, !fwp_k_units, index
      }

      // Each subgroup's o, max and sum (sum over the lanes of a row) into workgroup memory: the lane holding
      // column 0 of a head writes that head's max and sum.
      ${ row_shuffle("%row_sums", "%sum_acc", "arith.addf") }
      scf.for %i = %c0 to %acc_n step %c1 {
        %h = affine.apply #fwp_acc_row(%lane, %i)
        %col = affine.apply #fwp_acc_col(%lane, %i)
        %first = arith.cmpi eq, %col, %c0 : index
        scf.if %first {
          %mv = vector.extract %max_acc[%i] : f32 from !fwp_acc_flat
          %sv = vector.extract %row_sums[%i] : f32 from !fwp_acc_flat
          memref.store %mv, %max_parts[%subgroup, %h] : !fwk_stats
          memref.store %sv, %sum_parts[%subgroup, %h] : !fwk_stats
        }
      } {unroll_loop}
      scf.for %tile = %c0 to %dv_tiles step %c1 {
        scf.for %i = %c0 to %acc_n step %c1 {
          %h = affine.apply #fwp_acc_row(%lane, %i)
          %col = affine.apply #fwp_acc_col(%lane, %i)
          %col0 = arith.muli %tile, %c16 : index
          %e = arith.addi %col0, %col : index
          %ov = vector.extract %o_acc[%tile, %i] : f32 from !fwp_o_units
          memref.store %ov, %o_parts[%subgroup, %h, %e] : !fwk_o_parts
        } {unroll_loop}
      } {unroll_loop}
      gpu.barrier

      <% set combined_parts = "%subgroups" %>
      <% include "gpu/forward_combine.mlir" %>
      return
    }
<% endcall %>

// Host side: one dispatch, o and lse written into the caller's tensors.
${ host.forward("selection_attention_fwd_portable_exe") }
