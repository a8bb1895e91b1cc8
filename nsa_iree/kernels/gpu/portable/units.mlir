// The matrix-unit text the portable kernels share, as macros (forward, dq, dk/dv and one-pass import this file).
// `u` is the kernel's unit: {'p': its type prefix, 'kind': MMA_KIND, 'run': RUN, 'runs': RUNS, 'acc_n': ACC_N,
// 'lhs'/'rhs'/'acc': the fragment shapes, 'maps': [RUN_MAJOR_MAP, RUN_K_MAP, ACC_ROW_MAP, ACC_COL_MAP]}.
// Which keys a row sees is common/rules.mlir's (with a window: from a block's first_key on, key_in_range).
<% import "common/rules.mlir" as rules %>

<# The operands' memref types (!p_q, !p_k, !p_v, !p_do), the unit's fragment types (!p_lhs, !p_rhs, !p_acc, their
   reads !p_runs, the flat accumulator) and placement maps. #>
<% macro types(u) %>
!${u.p}_q = memref<?x?x${H}x${D}x${E}>
!${u.p}_k = memref<?x?x${G}x${D}x${E}>
!${u.p}_v = memref<?x?x${G}x${DV}x${E}>
!${u.p}_do = memref<?x?x${H}x${DV}x${E}>
// One unit's fragments: lhs [16 x K], rhs [K x 16], acc [16 x 16]; the same elements as runs of reads.
!${u.p}_lhs = vector<${u.lhs}x${E}>
!${u.p}_rhs = vector<${u.rhs}x${E}>
!${u.p}_acc = vector<${u.acc}xf32>
!${u.p}_runs = vector<${u.runs}x${u.run}x${E}>
!${u.p}_acc_flat = vector<${u.acc_n}xf32>
// Placement (lane l, read j or element i): row / column and k of read j, row and column of acc element i.
#${u.p}_run_major = ${u.maps[0]}
#${u.p}_run_k = ${u.maps[1]}
#${u.p}_acc_row = ${u.maps[2]}
#${u.p}_acc_col = ${u.maps[3]}
#${u.p}_contraction = [affine_map<(i, j, k) -> (i, k)>, affine_map<(i, j, k) -> (k, j)>, affine_map<(i, j, k) -> (i, j)>]
<% endmacro %>

<# out = lhs rhs + acc: one inner_tiled of the unit (all three named by their SSA values). #>
<% macro mma(out, lhs, rhs, acc, u) %>
${out} = iree_codegen.inner_tiled ins(${lhs}, ${rhs}) outs(${acc}) <
  indexing_maps = #${u.p}_contraction,
  iterator_types = [#linalg.iterator_type<parallel>, #linalg.iterator_type<parallel>, #linalg.iterator_type<reduction>],
  kind = #iree_gpu.mma_layout<${u.kind}>,
  semantics = #iree_gpu.mma_semantics<distributed = true, opaque = false>
> : !${u.p}_lhs, !${u.p}_rhs into !${u.p}_acc
<% endmacro %>

<# out (!p_runs): a fragment's reads from workgroup tile `tile` (type tile_t): read j at [lead major, k],
   major = major_base + run_major(l, j), k = k_base + run_k(l, j) (a base of none: the map alone). #>
<% macro read_runs(out, tile, tile_t, major_base, k_base, u, lead='') %>
${out} = scf.for %j = %c0 to %runs step %c1 iter_args(%r = %zero_runs) -> (!${u.p}_runs) {
  %read_major = affine.apply #${u.p}_run_major(%lane, %j)
  %read_k = affine.apply #${u.p}_run_k(%lane, %j)
<% if major_base %>
  %read_row = arith.addi ${major_base}, %read_major : index
<% endif %>
<% if k_base %>
  %read_col = arith.addi ${k_base}, %read_k : index
<% endif %>
  %read_x = vector.load ${tile}[${lead}${"%read_row" if major_base else "%read_major"}, ${"%read_col" if k_base else "%read_k"}] : ${tile_t}, vector<${u.run}x${E}>
  %next = vector.insert %read_x, %r[%j] : vector<${u.run}x${E}> into !${u.p}_runs
  scf.yield %next : !${u.p}_runs
} {unroll_loop}
<% endmacro %>

<# out (!p_acc) = sum over `units` units u of lhs_units[u] (register fragments, type lhs_units_t) times the rhs
   read from `tile` at rows major_base + run_major(l, j), columns u K + run_k(l, j); starts from %acc_zero. #>
<% macro unit_products(out, units, lhs_units, lhs_units_t, tile, tile_t, major_base, u) %>
${out} = scf.for %u = %c0 to ${units} step %c1 iter_args(%acc = %acc_zero) -> (!${u.p}_acc) {
  %u0 = arith.muli %u, %unit_k : index
${ read_runs("%rhs_runs", tile, tile_t, major_base, "%u0", u) }
  %rhs = vector.shape_cast %rhs_runs : !${u.p}_runs to !${u.p}_rhs
  %lhs_runs = vector.extract ${lhs_units}[%u] : !${u.p}_runs from ${lhs_units_t}
  %lhs = vector.shape_cast %lhs_runs : !${u.p}_runs to !${u.p}_lhs
${ mma("%next", "%lhs", "%rhs", "%acc", u) }
  scf.yield %next : !${u.p}_acc
} {unroll_loop}
<% endmacro %>

<# out (staged_t, per_lane chunks of 8 elements): a lane's part of a block's rows of `src` (src_t) in registers;
   chunk c = tid + i lanes is key c mod BS, elements 8 (c / BS) ..; starts from `zeros`; zeros past `chunks` and for keys >= %visible
   (with a window also below %first_visible: slot_block's). #>
<% macro stage_rows(out, per_lane, zeros, chunks, src, src_t, staged_t) %>
<% call lane_chunks(out, per_lane, zeros, staged_t) %>
  %j = arith.remui %c, %block_size : index
  %chunk = arith.divui %c, %block_size : index
  %d0 = arith.muli %chunk, %c8 : index
  %in_tile = arith.cmpi ult, %c, ${chunks} : index
  ${ rules.key_in_range("is_visible", "j", "slt", "visible", "first_visible") }
  %read = arith.andi %in_tile, %is_visible : i1
<% call chunk_or_zero("%read", src, "%b, %key, %g, %d0", src_t, staged_t) %>
    %key = arith.addi %key0, %j : index
<% endcall %>
<% endcall %>
<% endmacro %>

<# out (staged_t) = `zeros` with a lane's `per_lane` chunks staged: per step i, chunk %c = tid + i lanes; the call
   block's text stages it (ending with chunk_or_zero). #>
<% macro lane_chunks(out, per_lane, zeros, staged_t) %>
${out} = scf.for %i = %c0 to ${per_lane} step %c1 iter_args(%acc = ${zeros}) -> (${staged_t}) {
  %i_lanes = arith.muli %i, %lanes : index
  %c = arith.addi %tid, %i_lanes : index
${ caller() }
} {unroll_loop}
<% endmacro %>

<# The end of a lane_chunks step: chunk %i of %acc (staged_t) is 8 elements of `src` (src_t) at `at` where
   `live`, computed by the call block's text, else zeros (%zero_chunk); yields the updated %acc. #>
<% macro chunk_or_zero(live, src, at, src_t, staged_t) %>
  %x = scf.if ${live} -> (vector<8x${E}>) {
${ caller() }
    %y = vector.load ${src}[${at}] : ${src_t}, vector<8x${E}>
    scf.yield %y : vector<8x${E}>
  } else {
    scf.yield %zero_chunk : vector<8x${E}>
  }
  %next = vector.insert %x, %acc[%i] : vector<8x${E}> into ${staged_t}
  scf.yield %next : ${staged_t}
<% endmacro %>

<# Registers `staged` (staged_t, per_lane chunks; chunk c is row c mod `rows_of`, elements 8 (c / rows_of) ..) into
   workgroup memory: as rows into `rows` [row][element] and/or transposed into `cols` [element][row] (none: not). #>
<% macro store_rows(per_lane, chunks, staged, staged_t, rows_of, rows, rows_t, cols, cols_t) %>
scf.for %i = %c0 to ${per_lane} step %c1 {
  %i_lanes = arith.muli %i, %lanes : index
  %c = arith.addi %tid, %i_lanes : index
  %in_tile = arith.cmpi ult, %c, ${chunks} : index
  scf.if %in_tile {
    %j = arith.remui %c, ${rows_of} : index
    %chunk = arith.divui %c, ${rows_of} : index
    %d0 = arith.muli %chunk, %c8 : index
    %x = vector.extract ${staged}[%i] : vector<8x${E}> from ${staged_t}
<% if rows %>
    vector.store %x, ${rows}[%j, %d0] : ${rows_t}, vector<8x${E}>
<% endif %>
<% if cols %>
    scf.for %e = %c0 to %c8 step %c1 {
      %y = vector.extract %x[%e] : ${E} from vector<8x${E}>
      %d = arith.addi %d0, %e : index
      memref.store %y, ${cols}[%d, %j] : ${cols_t}
    } {unroll_loop}
<% endif %>
  }
} {unroll_loop}
<% endmacro %>

<# out (out_t, [units][RUNS] reads of u.run): register fragments over `units` units of K columns; read j of unit u
   is major run_major(l, j) (%read_major), columns u K + run_k(l, j) ... (%col). caller("guard") sets %exists from
   them, caller("load") loads %y where it holds; zeros elsewhere. #>
<% macro register_units(out, units, out_t, u) %>
${out}_init = arith.constant dense<0.0> : ${out_t}
${out} = scf.for %u = %c0 to ${units} step %c1 iter_args(%acc = ${out}_init) -> (${out_t}) {
  %acc_u = scf.for %j = %c0 to %runs step %c1 iter_args(%acc2 = %acc) -> (${out_t}) {
    %read_major = affine.apply #${u.p}_run_major(%lane, %j)
    %kk = affine.apply #${u.p}_run_k(%lane, %j)
    %u0 = arith.muli %u, %unit_k : index
    %col = arith.addi %u0, %kk : index
${ caller("guard") }
    %x = scf.if %exists -> (vector<${u.run}x${E}>) {
${ caller("load") }
      scf.yield %y : vector<${u.run}x${E}>
    } else {
      scf.yield %zero_run : vector<${u.run}x${E}>
    }
    %next = vector.insert %x, %acc2[%u, %j] : vector<${u.run}x${E}> into ${out_t}
    scf.yield %next : ${out_t}
  } {unroll_loop}
  scf.yield %acc_u : ${out_t}
} {unroll_loop}
<% endmacro %>

<# out: row m's heads of `src` (src_t [B, M, H, cols]) as lhs fragments (major: head of the group, from %h0);
   padding heads (>= HPG) are zeros. #>
<% macro head_units(out, units, out_t, src, src_t, u) %>
<% call(part) register_units(out, units, out_t, u) %>
<% if part == "guard" %>
    %exists = arith.cmpi ult, %read_major, %heads_per_group : index
<% else %>
      %head = arith.addi %h0, %read_major : index
      %y = vector.load ${src}[%b, %m, %head, %col] : ${src_t}, vector<${u.run}x${E}>
<% endif %>
<% endcall %>
<% endmacro %>

<# out: the subgroup's keys of block %key0 of `src` (src_t [B, N, G, cols]) as fragments (major: key
   %key_base + ..); keys past N are zeros. #>
<% macro key_units(out, units, out_t, src, src_t, u) %>
<% call(part) register_units(out, units, out_t, u) %>
<% if part == "guard" %>
    %key1 = arith.addi %key0, %key_base : index
    %key = arith.addi %key1, %read_major : index
    %exists = arith.cmpi ult, %key, %n : index
<% else %>
      %y = vector.load ${src}[%b, %key, %g, %col] : ${src_t}, vector<${u.run}x${E}>
<% endif %>
<% endcall %>
<% endmacro %>

<# Slot t's block %block (-1: skipped, or t = T), %stage (it is staged), its first key %key0 and %visible (how many of
   its keys row m sees: offsets below it; with a window, those from %first_visible on), from %block_indices, %pos and
   %last_visible_block. #>
<% macro slot_block() %>
%t_in_range = arith.cmpi ult, %t, %slots : index
%block = scf.if %t_in_range -> (index) {
  %block_i32 = memref.load %block_indices[%b, %m, %g, %t] : memref<?x?x${G}x${T}xi32>
  %i = arith.index_cast %block_i32 : i32 to index
  %not_negative = arith.cmpi sge, %i, %c0 : index
  %not_future = arith.cmpi sle, %i, %last_visible_block : index
  %selected = arith.andi %not_negative, %not_future : i1
  %i_or_none = arith.select %selected, %i, %block_none : index
  scf.yield %i_or_none : index
} else {
  scf.yield %block_none : index
}
%stage = arith.cmpi sge, %block, %c0 : index
%key0 = arith.muli %block, %block_size : index
%to_pos = arith.subi %pos, %key0 : index
%visible = arith.addi %to_pos, %c1 : index
<% if WINDOW != "0" %>
${ rules.first_key("first_visible") }
<% endif %>
<% endmacro %>

<# The kernel function's opening: @name with its translation info, `lanes` threads in subgroups of subgroup_size. #>
<% macro func_begin(name, lanes, subgroup_size) %>
func.func @${name}() attributes {translation_info = #iree_codegen.translation_info<
    pipeline = #iree_codegen.pass_pipeline<"iree-codegen-unroll-annotated-loops,canonicalize,cse,iree-gpu-unroll-to-intrinsics,canonicalize,cse,iree-gpu-lower-ops,canonicalize,cse">
    workgroup_size = [${lanes}, 1, 1] subgroup_size = ${subgroup_size}>} {
<% endmacro %>

<# %name = arith.constant value : index for each name: value of the dict `values`, in order. #>
<% macro index_constants(values) %>
<% for name, value in values.items() %>
%${name} = arith.constant ${value} : index
<% endfor %>
<% endmacro %>

<# %smem (smem_t) allocated, then per (name, byte offset, type) of `tiles` a view %name of that type at the offset
   (the offsets' constants first). #>
<% macro views(smem_t, tiles) %>
%smem = memref.alloc() : ${smem_t}
<% for name, offset, type in tiles if offset | string != "0" %>
%${name}_offset = arith.constant ${offset} : index
<% endfor %>
<% for name, offset, type in tiles %>
%${name} = memref.view %smem[${"%c0" if offset | string == "0" else "%" ~ name ~ "_offset"}][] : ${smem_t} to ${type}
<% endfor %>
<% endmacro %>

<# %tid, its %subgroup and %lane, and %key_base = subgroup keys_per_subgroup (an SSA value), the subgroup's first key. #>
<% macro lane_ids(keys_per_subgroup) %>
%tid = gpu.thread_id x
%subgroup = arith.divui %tid, %subgroup_size : index
%lane = arith.remui %tid, %subgroup_size : index
%key_base = arith.muli %subgroup, ${keys_per_subgroup} : index
<% endmacro %>

<# %p and %ds_scaled of one element from %sv (s), %dpv (dp), %l (lse) and %dl (delta): p = w exp(scale s - lse)
   (w the SSA value `weight`; none: 1), ds = scale p (dp - delta). #>
<% macro p_ds(weight) %>
%scaled = arith.mulf %sv, %scale : f32
%shifted = arith.subf %scaled, %l : f32
<% if weight %>
%ex = math.exp %shifted : f32
%p = arith.mulf ${weight}, %ex : f32
<% else %>
%p = math.exp %shifted : f32
<% endif %>
%dp_minus_delta = arith.subf %dpv, %dl : f32
%ds_raw = arith.mulf %p, %dp_minus_delta : f32
%ds_scaled = arith.mulf %ds_raw, %scale : f32
<% endmacro %>

<# dq and one-pass, slot t - 1: ds of each element of %s_acc and %dp_acc (head acc_row(l, i), key key_base +
   acc_col(l, i); 0 where the key is invisible, below %p_visible and with a window from %p_first_visible on, or the
   head padding) into %ds_tile [head][key]; with key_heads, also p and ds into %pt_tile (!opp_pt) and %dst_tile
   (!opp_dst) [key][head]. #>
<% macro ds_elements(u, key_heads) %>
%s_flat = vector.shape_cast %s_acc : !${u.p}_acc to !${u.p}_acc_flat
%dp_flat = vector.shape_cast %dp_acc : !${u.p}_acc to !${u.p}_acc_flat
scf.for %i = %c0 to %acc_n step %c1 {
  %h = affine.apply #${u.p}_acc_row(%lane, %i)
  %col = affine.apply #${u.p}_acc_col(%lane, %i)
  %j = arith.addi %key_base, %col : index
  ${ rules.key_in_range("key_visible", "j", "slt", "p_visible", "p_first_visible") }
  %head_real = arith.cmpi ult, %h, %heads_per_group : index
  %live = arith.andi %key_visible, %head_real : i1
  %sv = vector.extract %s_flat[%i] : f32 from !${u.p}_acc_flat
  %dpv = vector.extract %dp_flat[%i] : f32 from !${u.p}_acc_flat
  %l = vector.extract %lse_e[%i] : f32 from !${u.p}_acc_flat
  %dl = vector.extract %delta_e[%i] : f32 from !${u.p}_acc_flat
${ p_ds(none) }
<% if key_heads %>
  %p_live = arith.select %live, %p, %zero : f32
<% endif %>
  %ds_live = arith.select %live, %ds_scaled, %zero : f32
<% if key_heads %>
  %p_e = ${TRUNCF} %p_live : f32 to ${E}
<% endif %>
  %ds_e = ${TRUNCF} %ds_live : f32 to ${E}
  memref.store %ds_e, %ds_tile[%h, %j] : !${u.p}_ds
<% if key_heads %>
  memref.store %p_e, %pt_tile[%j, %h] : !opp_pt
  memref.store %ds_e, %dst_tile[%j, %h] : !opp_dst
<% endif %>
} {unroll_loop}
<% endmacro %>

<# out (!p_runs_pair): two fragments read together, read j of each: caller() loads %x (first) and %y (second) from
   %read_major = run_major(l, j) and %read_k = run_k(l, j). #>
<% macro read_pair(out, u) %>
${out} = scf.for %j = %c0 to %runs step %c1 iter_args(%r = %zero_runs2) -> (!${u.p}_runs_pair) {
  %read_major = affine.apply #${u.p}_run_major(%lane, %j)
  %read_k = affine.apply #${u.p}_run_k(%lane, %j)
${ caller() }
  %r1 = vector.insert %x, %r[0, %j] : vector<${u.run}x${E}> into !${u.p}_runs_pair
  %r2 = vector.insert %y, %r1[1, %j] : vector<${u.run}x${E}> into !${u.p}_runs_pair
  scf.yield %r2 : !${u.p}_runs_pair
} {unroll_loop}
<% endmacro %>

<# The zero read, zero fragment reads (!p_runs) and zero 8-element chunk of the staging loops. #>
<% macro zero_reads(u) %>
%zero_run = arith.constant dense<0.0> : vector<${u.run}x${E}>
%zero_runs = arith.constant dense<0.0> : !${u.p}_runs
%zero_chunk = arith.constant dense<0.0> : vector<8x${E}>
<% endmacro %>
