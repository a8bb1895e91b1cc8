// One-pass backward as a portable matrix-unit kernel: one workgroup per (query row m, kv group g, batch b),
// the portable dq kernel (dq_portable.mlir, whose body it includes as the dq_portable_* parts) plus, per
// selected block, the row's dk and dv contributions on the matrix units, added to f32 accumulators with
// native atomic adds (not bitwise reproducible: the order of the adds varies run to run):
//   dv[key, :] += sum_h p[h, key] do[h, :]     lhs p^T [16 keys x (heads)]  rhs do [(heads) x 16 columns]
//   dk[key, :] += sum_h ds[h, key] q[h, :]     lhs ds^T                     rhs q
// The reduction is over the group's 16 head rows (heads past HPG are zeros), so one atomic per (key, column)
// instead of HPG. The intrinsic's K = ${UNIT_K} is ${OPP_SLICES} slice(s) of 16: the rhs unit x holds, in its
// slice s, the 16 heads of columns K x + 16 s ..; the lhs of slice s holds p^T (ds^T) in slice s and zeros in
// the others, so one rhs unit serves ${OPP_SLICES} column tiles. The rhs fragments of q and do are the same for
// every block: read once into registers (D / K and Dv / K units). p^T and ds^T ([key][head]) are written into the
// K rows' and V rows' tiles (the 16 heads of key j in row j): subgroup w writes and reads only its own keys'
// rows, which after its s = q k^T and dp = do v^T nothing reads until the next block's rows are staged (after
// a barrier).
// The atomic is llvm.atomicrmw fadd through a raw pointer, as in onepass.mlir (the recipe's [onepass]
// pieces: global_atomic_add_f32 on gfx9 with rocdl.no_fine_grained_memory, red.global.add.f32 on NVIDIA).
// Visibility as in dq_portable.mlir: keys past the row's position contribute nothing and are never written.
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "gpu/portable/units.mlir" as units %>
<% set u = {'p': 'dqp', 'kind': MMA_KIND, 'run': RUN, 'runs': RUNS, 'acc_n': ACC_N, 'lhs': LHS_UNIT, 'rhs': RHS_UNIT, 'acc': ACC_UNIT, 'maps': [RUN_MAJOR_MAP, RUN_K_MAP, ACC_ROW_MAP, ACC_COL_MAP]} %>

// Push constants: B, M, N (i32), then the bits of scale (f32).
<% set inputs = ['q', 'k', 'v', 'block_indices', 'lse', 'delta', 'do'] %>
<% set outputs = ['dkv', 'dq'] %>
${ dispatch.layout("onepass_portable_layout", 4, inputs, outputs) }

<% set onepass = true %>
<% include "gpu/portable/dq_types.mlir" %>
!opp_smem = memref<${OPP_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
// p^T and ds^T of the block ([key][head], in the K rows' and V rows' tiles), q and do transposed ([d][head]).
!opp_pt = memref<${BS}x${D_PADDED}x${E}, #gpu.address_space<workgroup>>
!opp_dst = memref<${BS}x${DV_PADDED}x${E}, #gpu.address_space<workgroup>>
!opp_q_cols = memref<${D}x${OPP_HEADS_PADDED}x${E}, #gpu.address_space<workgroup>>
!opp_do_cols = memref<${DV}x${OPP_HEADS_PADDED}x${E}, #gpu.address_space<workgroup>>
!opp_q_rhs = vector<${D_UNITS}x${RUNS}x${RUN}x${E}>
!opp_do_rhs = vector<${DV_UNITS}x${RUNS}x${RUN}x${E}>
!opp_slices = vector<${OPP_SLICES}x${RUNS}x${RUN}x${E}>
!opp_zero_chunk = vector<8x${E}>

<# Zeros into the [row][8-element chunk] tiles `tiles` ((tile, type) pairs, rows of OPP_HEADS_PADDED elements). #>
<% macro zero_fill(chunks, tiles) %>
scf.for %c = %tid to ${chunks} step %lanes {
  %row = arith.divui %c, %row_chunks : index
  %chunk = arith.remui %c, %row_chunks : index
  %e0 = arith.muli %chunk, %c8 : index
<% for tile, tile_t in tiles %>
  vector.store %zero8, ${tile}[%row, %e0] : ${tile_t}, !opp_zero_chunk
<% endfor %>
}
<% endmacro %>

<# Row m's heads of `src` (src_t) transposed into `tile` (tile_t [column][head]); chunk c is head c mod 16,
   columns 8 (c / 16) ..; padding heads are left as they are. #>
<% macro transpose_heads(chunks, src, src_t, tile, tile_t) %>
scf.for %c = %tid to ${chunks} step %lanes {
  %h = arith.remui %c, %head_rows : index
  %chunk = arith.divui %c, %head_rows : index
  %d0 = arith.muli %chunk, %c8 : index
  %real = arith.cmpi ult, %h, %heads_per_group : index
  scf.if %real {
    %head = arith.addi %h0, %h : index
    %x = vector.load ${src}[%b, %m, %head, %d0] : ${src_t}, vector<8x${E}>
    scf.for %e = %c0 to %c8 step %c1 {
      %y = vector.extract %x[%e] : ${E} from vector<8x${E}>
      %d = arith.addi %d0, %e : index
      memref.store %y, ${tile}[%d, %h] : ${tile_t}
    } {unroll_loop}
  }
}
<% endmacro %>

<# out (out_t): rhs fragments of the transposed `tile` (tile_t [column][head]), one unit per K columns x <
   `count`: read j is column K x + 16 s + run_major(l, j), heads h .. of k = run_k(l, j) = 16 s + h (slice s; a
   read of RUN elements, RUN dividing 16, lies in one slice). #>
<% macro column_units(out, count, tile, tile_t, out_t) %>
${out}_init = arith.constant dense<0.0> : ${out_t}
${out} = scf.for %x = %c0 to ${count} step %c1 iter_args(%acc = ${out}_init) -> (${out_t}) {
  %acc_x = scf.for %j = %c0 to %runs step %c1 iter_args(%acc2 = %acc) -> (${out_t}) {
    %cj = affine.apply #dqp_run_major(%lane, %j)
    %kk = affine.apply #dqp_run_k(%lane, %j)
    %slice = arith.divui %kk, %c16 : index
    %h = arith.remui %kk, %c16 : index
    %xk = arith.muli %x, %unit_k : index
    %s16 = arith.muli %slice, %c16 : index
    %d0 = arith.addi %xk, %s16 : index
    %d = arith.addi %d0, %cj : index
    %y = vector.load ${tile}[%d, %h] : ${tile_t}, vector<${RUN}x${E}>
    %next = vector.insert %y, %acc2[%x, %j] : vector<${RUN}x${E}> into ${out_t}
    scf.yield %next : ${out_t}
  } {unroll_loop}
  scf.yield %acc_x : ${out_t}
} {unroll_loop}
<% endmacro %>

<# For each unit x < `count` and slice s: lhs slice s of `slices` (!opp_slices: the subgroup's keys) times
   rhs_units[x] (rhs_t), columns K x + 16 s .., added with atomics to the accumulator's rows of `cols` columns from
   element `base` (none: 0), for the keys row m sees. #>
<% macro add_keys(slices, count, rhs_units, rhs_t, cols, base) %>
scf.for %x = %c0 to ${count} step %c1 {
  %rhs_runs = vector.extract ${rhs_units}[%x] : !dqp_runs from ${rhs_t}
  %rhs = vector.shape_cast %rhs_runs : !dqp_runs to !dqp_rhs
  scf.for %s = %c0 to %slices step %c1 {
    %lhs_slice = vector.extract ${slices}[%s] : !dqp_runs from !opp_slices
    %lhs = vector.shape_cast %lhs_slice : !dqp_runs to !dqp_lhs
${ units.mma("%out", "%lhs", "%rhs", "%acc_zero2", u) }
    %out_flat = vector.shape_cast %out : !dqp_acc to !dqp_acc_flat
    scf.for %i = %c0 to %acc_n step %c1 {
      %kr = affine.apply #dqp_acc_row(%lane, %i)
      %cc = affine.apply #dqp_acc_col(%lane, %i)
      %j = arith.addi %key_base, %kr : index
      %key_visible = arith.cmpi slt, %j, %p_visible : index
      scf.if %key_visible {
        %key = arith.addi %p_key0, %j : index
        %kv_row0 = arith.muli %b, %n : index
        %kv_row = arith.addi %kv_row0, %key : index
        %row_group0 = arith.muli %kv_row, %kv_heads : index
        %row_group = arith.addi %row_group0, %g : index
        %at0 = arith.muli %row_group, ${cols} : index
        %xk = arith.muli %x, %unit_k : index
        %s16 = arith.muli %s, %c16 : index
        %col0 = arith.addi %xk, %s16 : index
        %col = arith.addi %col0, %cc : index
        %at = arith.addi %at0, %col : index
        %at_i64 = arith.index_cast %at : index to i64
<% if base %>
        %at_base = arith.addi ${base}, %at_i64 : i64
<% endif %>
        %contribution = vector.extract %out_flat[%i] : f32 from !dqp_acc_flat
        %ptr = llvm.getelementptr %dkv_ptr[${"%at_base" if base else "%at_i64"}] : (${ONEPASS_GLOBAL_PTR}, i64) -> ${ONEPASS_GLOBAL_PTR}, f32
        %before = llvm.atomicrmw fadd %ptr, %contribution monotonic ${ONEPASS_ATOMIC_ATTRIBUTES} : ${ONEPASS_GLOBAL_PTR}, f32
      }
    } {unroll_loop}
  } {unroll_loop}
} {unroll_loop}
<% endmacro %>

<# Slot t - 1's dk and dv (from %pt_tile, %dst_tile, %q_rhs, %do_rhs) added to the accumulator. #>
<% macro key_contributions() %>
// dv and dk of this subgroup's 16 keys, one [16 keys x 16 columns] unit per column tile: read j of p^T and ds^T
// is key key_base + run_major(l, j), heads h .. of k = run_k(l, j) = 16 s + h; the lhs of slice s keeps the
// reads of slice s, zeros elsewhere. Element i of the result is key key_base + acc_row(l, i), column
// K x + 16 s + acc_col(l, i), added to the accumulator when the key is visible.
<% call units.read_pair("%lhs_runs", u) %>
  %key = arith.addi %key_base, %read_major : index
  %read_h = arith.remui %read_k, %c16 : index
  %x = vector.load %pt_tile[%key, %read_h] : !opp_pt, vector<${RUN}x${E}>
  %y = vector.load %dst_tile[%key, %read_h] : !opp_dst, vector<${RUN}x${E}>
<% endcall %>
%p_runs = vector.extract %lhs_runs[0] : !dqp_runs from !dqp_runs_pair
%ds_runs = vector.extract %lhs_runs[1] : !dqp_runs from !dqp_runs_pair
<% if OPP_SLICES == "1" %>
%p_slices = vector.shape_cast %p_runs : !dqp_runs to !opp_slices
%ds_slices = vector.shape_cast %ds_runs : !dqp_runs to !opp_slices
<% else %>
%slices_init = arith.constant dense<0.0> : !opp_slices
%p_slices, %ds_slices = scf.for %s = %c0 to %slices step %c1 iter_args(%ps = %slices_init, %dss = %slices_init)
    -> (!opp_slices, !opp_slices) {
  %ps_s, %dss_s = scf.for %j = %c0 to %runs step %c1 iter_args(%pa = %ps, %da = %dss) -> (!opp_slices, !opp_slices) {
    %kk = affine.apply #dqp_run_k(%lane, %j)
    %slice = arith.divui %kk, %c16 : index
    %mine = arith.cmpi eq, %slice, %s : index
    %px = vector.extract %p_runs[%j] : vector<${RUN}x${E}> from !dqp_runs
    %dx = vector.extract %ds_runs[%j] : vector<${RUN}x${E}> from !dqp_runs
    %pv = arith.select %mine, %px, %zero_run : vector<${RUN}x${E}>
    %dv = arith.select %mine, %dx, %zero_run : vector<${RUN}x${E}>
    %pa2 = vector.insert %pv, %pa[%s, %j] : vector<${RUN}x${E}> into !opp_slices
    %da2 = vector.insert %dv, %da[%s, %j] : vector<${RUN}x${E}> into !opp_slices
    scf.yield %pa2, %da2 : !opp_slices, !opp_slices
  } {unroll_loop}
  scf.yield %ps_s, %dss_s : !opp_slices, !opp_slices
} {unroll_loop}
<% endif %>
%acc_zero2 = arith.constant dense<0.0> : !dqp_acc
${ add_keys("%p_slices", "%dv_units", "%do_rhs", "!opp_do_rhs", "%value_dim", "%dv_base") }
${ add_keys("%ds_slices", "%d_units", "%q_rhs", "!opp_q_rhs", "%head_dim", none) }
<% endmacro %>

<% call dispatch.executable("selection_attention_onepass_portable_exe", "selection_attention_onepass_row", "onepass_portable_layout", ['m_rows', 'kv_heads', 'batch'], lanes=LANES) %>
${ units.func_begin("selection_attention_onepass_row", LANES, SUBGROUP_SIZE) }
      <% include "gpu/portable/dq_constants.mlir" %>
      ${ units.index_constants({"kv_heads": G, "head_dim": D, "value_dim": DV, "head_rows": 16, "slices": OPP_SLICES,
          "q_chunks": OPP_Q_ITEMS, "do_chunks": OPP_DO_ITEMS}) }
      %zero_e = arith.constant 0.0 : ${E}

${ dispatch.ids(['m', 'g', 'b']) }
${ dispatch.push_constants("onepass_portable_layout", ['batch', 'm_rows', 'n', 'scale']) }

${ dispatch.bindings("onepass_portable_layout", inputs, outputs, only=['q', 'k', 'v', 'block_indices', 'lse', 'delta', 'do']) }
      // The dk/dv accumulator is flat: dk [B, N, G, D] then dv [B, N, G, Dv]; the atomics address it by offset.
      %kv_rows = arith.muli %batch, %n : index
      %kv_group_rows = arith.muli %kv_rows, %kv_heads : index
      %dk_size = arith.muli %kv_group_rows, %head_dim : index
      %dv_size = arith.muli %kv_group_rows, %value_dim : index
      %dkv_size = arith.addi %dk_size, %dv_size : index
${ dispatch.bindings("onepass_portable_layout", inputs, outputs, only=['dkv', 'dq']) }
      %dkv_address = memref.extract_aligned_pointer_as_index %dkv : memref<?xf32> -> index
      %dkv_address_i64 = arith.index_cast %dkv_address : index to i64
      %dkv_ptr = llvm.inttoptr %dkv_address_i64 : i64 to ${ONEPASS_GLOBAL_PTR}
      %dv_base = arith.index_cast %dk_size : index to i64

      ${ units.views("!opp_smem", [("k_rows", 0, "!dqp_k_rows"), ("v_rows", DQP_V_OFFSET, "!dqp_v_rows"),
          ("k_cols", DQP_KT_OFFSET, "!dqp_k_cols"), ("ds_tile", DQP_DS_OFFSET, "!dqp_ds")]) }
      %pt_offset = arith.constant ${OPP_PT_OFFSET} : index
      %dst_offset = arith.constant ${OPP_DST_OFFSET} : index
      %qt_offset = arith.constant ${OPP_QT_OFFSET} : index
      %dot_offset = arith.constant ${OPP_DOT_OFFSET} : index
      // p^T and ds^T: the K rows' and V rows' tiles, key j's 16 heads in row j (its first 16 elements).
      %pt_tile = memref.view %smem[%pt_offset][] : !opp_smem to !opp_pt
      %dst_tile = memref.view %smem[%dst_offset][] : !opp_smem to !opp_dst
      // q and do transposed ([d][head], heads past HPG zero) live only until their fragments are in
      // registers, in the bytes the K and V rows use later.
      %qt_tile = memref.view %smem[%qt_offset][] : !opp_smem to !opp_q_cols
      %dot_tile = memref.view %smem[%dot_offset][] : !opp_smem to !opp_do_cols

      ${ units.lane_ids("%c16") }
      %h0 = arith.muli %g, %heads_per_group : index

      <% include "gpu/portable/dq_prologue.mlir" %>

      // q and do transposed into workgroup memory (heads past HPG zero), then their rhs fragments into
      // registers (column_units).
      %q_cols_chunks = arith.constant ${OPP_Q_COLS_CHUNKS} : index
      %do_cols_chunks = arith.constant ${OPP_DO_COLS_CHUNKS} : index
      %zero8 = arith.constant dense<0.0> : !opp_zero_chunk
      %row_chunks = arith.constant ${OPP_HEADS_PADDED_CHUNKS} : index
      ${ zero_fill("%q_cols_chunks", [("%qt_tile", "!opp_q_cols")]) }
      ${ zero_fill("%do_cols_chunks", [("%dot_tile", "!opp_do_cols")]) }
      gpu.barrier
      // Chunk c: head c mod 16, elements 8 (c / 16) ..
      ${ transpose_heads("%q_chunks", "%q", "!dqp_q", "%qt_tile", "!opp_q_cols") }
      ${ transpose_heads("%do_chunks", "%do", "!dqp_do", "%dot_tile", "!opp_do_cols") }
      gpu.barrier
      ${ column_units("%q_rhs", "%d_units", "%qt_tile", "!opp_q_cols", "!opp_q_rhs") }
      ${ column_units("%do_rhs", "%dv_units", "%dot_tile", "!opp_do_cols", "!opp_do_rhs") }
      gpu.barrier

      // dq's slot loop; slot t - 1 also adds its dk and dv to the accumulator (key_contributions).
      <% include "gpu/portable/dq_slots.mlir" %>
      return
    }
<% endcall %>

// Host side: zero the accumulator, run the dispatch, cast dk and dv to the input type.
// dk and dv share ONE zero-filled accumulator: two separately zero-filled tied operands are CSE'd into one
// value, and both results would then alias one buffer.
${ host.onepass("selection_attention_onepass_portable_exe") }
