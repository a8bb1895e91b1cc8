<% import "common/rules.mlir" as rules %>
<# Macros of the nvidia dq, forward and dkdv kernels (imported as nv): the function's opening, lane ids and
   ldmatrix lane addresses, the pipeline's previous-row step and selected-block test; the 16-column steps that read
   one operand from XOR-swizzled workgroup rows with ldmatrix and multiply on the tensor cores; and what dq and
   forward share besides (the K/V pipeline of gpu/nvidia/kv_staging.mlir, the q fragments, s = q k^T): types,
   constants, positions, the score element. #>

<# The named constants of `names`, in order: cN (N : index), cN_i32 (N : i32), the f32 ones of FLOATS, and
   (name, value) pairs (index). #>
<% set FLOATS = {"zero": "0.0", "one": "1.0", "minus_inf": "0xFF800000", "log2e": "1.44269504", "ln2": "0.693147182"} %>
<% macro constants(names) %>
<% for name in names %>
<% if name is not string %>
      %${name[0]} = arith.constant ${name[1]} : index
<% elif name in FLOATS %>
      %${name} = arith.constant ${ FLOATS[name] } : f32
<% elif name.endswith("_i32") %>
      %${name} = arith.constant ${ name[1:-4] } : i32
<% else %>
      %${name} = arith.constant ${ name[1:] } : index
<% endif %>
<% endfor %>
<% endmacro %>

<# The lane's rows of accumulator `acc` (acc_type; element [0][tile][i] is row 8 i + r, columns 8 tile + 2 c and
   + 1, over `tiles` 8-column tiles) into `dest` (dest_type) at [%b, rows[i], %head_i, column] in E (rows: the
   positions of the lane's two rows, %m_i by default), times %inverse_pair_i where `scaled`; a row with
   %head_valid_i false (padding) is not written. (The epilogue of kernels whose subgroups write their own rows.) #>
<% macro store_rows(acc, acc_type, tiles, dest, dest_type, scaled=false, rows=("%m_0", "%m_1")) %>
      scf.for %tile = %c0 to ${tiles} step %c1 {
        %tile8 = arith.muli %tile, %c8 : index
        %column = arith.addi %tile8, %c2x : index
<% for i in ["0", "1"] %>
        scf.if %head_valid_${i} {
          %part_${i} = vector.extract ${acc}[0, %tile, ${i}] : vector<2xf32> from ${acc_type}
<% if scaled %>
          %scaled_${i} = arith.mulf %part_${i}, %inverse_pair_${i} : vector<2xf32>
<% endif %>
          %pair_${i} = ${TRUNCF} %${"scaled_" if scaled else "part_"}${i} : vector<2xf32> to vector<2x${E}>
          vector.store %pair_${i}, ${dest}[%b, ${ rows[i | int] }, %head_${i}, %column] : ${dest_type}, vector<2x${E}>
        }
<% endfor %>
      } {unroll_loop}
<% endmacro %>

<# The kernel function `name`'s opening: the unroll/lowering pipeline, `lanes` x 1 x 1 workgroups of subgroups of
   subgroup_size lanes, at least min_workgroups workgroups per multiprocessor. #>
<% macro func_open(name, lanes, subgroup_size, min_workgroups) %>
    func.func @${name}() attributes {translation_info = #iree_codegen.translation_info<
        pipeline = #iree_codegen.pass_pipeline<"iree-codegen-unroll-annotated-loops,canonicalize,cse,iree-gpu-unroll-to-intrinsics,canonicalize,cse,iree-gpu-lower-ops,canonicalize,cse">
        workgroup_size = [${lanes}, 1, 1] subgroup_size = ${subgroup_size}>,
        nvvm.minctasm = ${min_workgroups} : i32} {
<% endmacro %>

<# The lane's ids in an mma fragment: %tid, %subgroup, %lane in it, %r = lane / 4, %c = lane % 4, %c2x = 2 c
   (needs %subgroup_size). #>
<% macro lane_ids() %>
      %tid = gpu.thread_id x
      %subgroup = arith.divui %tid, %subgroup_size : index
      %lane = arith.remui %tid, %subgroup_size : index
      %r = arith.divui %lane, %c4 : index
      %c = arith.remui %lane, %c4 : index
      %c2x = arith.muli %c, %c2 : index
<% endmacro %>

<# ldmatrix: lanes 8 q .. 8 q + 7 give the row addresses of 8x8 matrix q of the four; defines %matrix_row (the
   lane's row in its matrix) and %lo8, %hi8 (8 (q mod 2), 8 (q / 2)). #>
<% macro ldmatrix_lanes() %>
      %matrix = arith.divui %lane, %c8 : index
      %matrix_row = arith.remui %lane, %c8 : index
      %matrix_lo = arith.remui %matrix, %c2 : index
      %matrix_hi = arith.divui %matrix, %c2 : index
      %lo8 = arith.muli %matrix_lo, %c8 : index
      %hi8 = arith.muli %matrix_hi, %c8 : index
<% endmacro %>

<# Whether slot `slot` of row (%b, %m, %g) names a block (not -1) that is not in the future: defines %`prefix`block
   and `selected` (i1) (and %`prefix`block_i32, %`prefix`not_negative, %`prefix`not_future). #>
<% macro selected_block(slot, selected, prefix="") %>
          %${prefix}block_i32 = memref.load %block_indices[%b, %m, %g, ${slot}] : memref<?x?x${G}x${T}xi32>
          %${prefix}block = arith.index_cast %${prefix}block_i32 : i32 to index
          %${prefix}not_negative = arith.cmpi sge, %${prefix}block, %c0 : index
          %${prefix}not_future = arith.cmpi sle, %${prefix}block, %last_visible_block : index
          ${selected} = arith.andi %${prefix}not_negative, %${prefix}not_future : i1
<% endmacro %>

<# The tile staged in iteration `slot` (kv_staging's staged_block, in the dense kernels): tile `slot` itself, read iff it is at or before
   the last tile the workgroup sees (%last_visible_block); defines %block and `selected`. #>
<% macro next_tile(slot, selected) %>
<% if WINDOW != "0" %>
          %staged_tile = arith.addi %first_tile, ${slot} : index
          %block = arith.minsi %staged_tile, %last_visible_block : index
          ${selected} = arith.cmpi sle, %staged_tile, %last_visible_block : index
<% else %>
          %block = arith.minsi ${slot}, %last_visible_block : index
          ${selected} = arith.cmpi sle, ${slot}, %last_visible_block : index
<% endif %>
<% endmacro %>

<# The dense kernels' tile computed in iteration %slot (kv_staging's order: with a window, the band's tiles from
   %first_tile on): its first key %key0 and whether the subgroup's rows see any of it (%sees, with
   %has_previous: %compute). #>
<% macro dense_tile() %>
<% if WINDOW != "0" %>
        %tile_of_slot = arith.addi %first_tile, %slot : index
        %key0 = arith.muli %tile_of_slot, %block_size : index
<% else %>
        %key0 = arith.muli %slot, %block_size : index
<% endif %>
        %sees = arith.cmpi sle, %key0, %subgroup_pos : index
        %compute = arith.andi %sees, %has_previous : i1
<% endmacro %>

<# The lane's two rows' visible keys of the tile at %key0 (the dense kernels; rows %pos_0, %pos_1): below
   %visible_0/_1 and, with a window, from %first_visible_0/_1 on (score_element's per_row bounds). #>
<% macro dense_row_bounds() %>
          %to_pos_0 = arith.subi %pos_0, %key0 : index
          %visible_0 = arith.addi %to_pos_0, %c1 : index
          %to_pos_1 = arith.subi %pos_1, %key0 : index
          %visible_1 = arith.addi %to_pos_1, %c1 : index
<% if WINDOW != "0" %>
          ${ rules.first_key("first_visible_0", "pos_0") }
          ${ rules.first_key("first_visible_1", "pos_1") }
<% endif %>
<% endmacro %>

<# The row computed in iteration %t of a pipeline %lag iterations deep: %has_previous (t >= lag), `row` =
   t - lag (0 before) and its %buffer (row mod %stages). #>
<% macro previous(row) %>
        %has_previous = arith.cmpi uge, %t, %lag : index
        %previous = arith.select %has_previous, %t, %lag : index
        ${row} = arith.subi %previous, %lag : index
        %buffer = arith.remui ${row}, %stages : index
<% endmacro %>

<# The rhs of 16-column step %s: column col0 = 16 s plus the lane's column `lane` (%lo8 or %hi8), its chunk
   XOR-swizzled (`swizzle`) inside its group (kept additive in s, so the unrolled steps share (mask + 1) / 2 lane
   addresses plus immediates: `high` masks the bits above the group), read from rows[buffer, row, col] with
   ldmatrix (`transpose`: true or false); defines %rhs of type rhs_type. #>
<% macro rhs_step(rows, rows_type, buffer, row, high, lane, swizzle, transpose, rhs_type) %>
            %col0 = arith.muli %s, %c16 : index
            %col_high = arith.andi %col0, ${high} : index
            %col_low = arith.subi %col0, %col_high : index
            %col_lane = arith.addi %col_low, ${lane} : index
            %col_swizzled = arith.xori %col_lane, ${swizzle} : index
            %col = arith.addi %col_high, %col_swizzled : index
            %step_x = nvgpu.ldmatrix ${rows}[${buffer}, ${row}, %col] numTiles = 4 transpose = ${transpose}
                : ${rows_type} -> vector<4x2x${E}>
            %rhs = vector.shape_cast %step_x : vector<4x2x${E}> to ${rhs_type}
<% endmacro %>

<# result = lhs rhs + acc on the tensor cores: the contraction map and mma kind of the kernel, the three types. #>
<% macro mma(result, lhs, rhs, acc, contraction, kind, lhs_type, rhs_type, acc_type) %>
            ${result} = iree_codegen.inner_tiled ins(${lhs}, ${rhs}) outs(${acc}) <
              indexing_maps = ${contraction},
              iterator_types = [#linalg.iterator_type<parallel>, #linalg.iterator_type<parallel>, #linalg.iterator_type<reduction>],
              kind = #iree_gpu.mma_layout<${kind}>,
              semantics = #iree_gpu.mma_semantics<distributed = true, opaque = false>
            > : ${lhs_type}, ${rhs_type} into ${acc_type}
<% endmacro %>

<# result = sum over `steps` 16-column steps of lhs fragment [0, s] of `frags` (frags_type) times the rhs of
   rhs_step (rows, rows_type, buffer, row, high, lane, swizzle, not transposed), from `zero`; one step's fragments
   live at a time. `t` names the kernel's types: t.lhs, t.rhs, t.acc, t.contraction, t.kind. With `chains` 2 the
   even and the odd steps go to two accumulators summed at the end (the unrolled selects fold): two chains of
   dependent mma half as long, for kernels whose step waits on them (the forward's online softmax). #>
<% macro score_steps(result, steps, zero, frags, frags_type, rows, rows_type, buffer, row, high, lane, swizzle, t, chains=1) %>
<% if chains == 2 %>
          ${result}_even, ${result}_odd = scf.for %s = %c0 to ${steps} step %c1 iter_args(%acc_even = ${zero}, %acc_odd = ${zero}) -> (${t.acc}, ${t.acc}) {
<% else %>
          ${result} = scf.for %s = %c0 to ${steps} step %c1 iter_args(%acc = ${zero}) -> (${t.acc}) {
<% endif %>
${ rhs_step(rows, rows_type, buffer, row, high, lane, swizzle, "false", t.rhs) }
            %lhs0 = vector.extract ${frags}[0, %s] : vector<4x2x${E}> from ${frags_type}
            %lhs = vector.shape_cast %lhs0 : vector<4x2x${E}> to ${t.lhs}
<% if chains == 2 %>
            %s_bit = arith.andi %s, %c1 : index
            %odd = arith.cmpi ne, %s_bit, %c0 : index
            %acc = arith.select %odd, %acc_odd, %acc_even : ${t.acc}
<% endif %>
${ mma("%next", "%lhs", "%rhs", "%acc", t.contraction, t.kind, t.lhs, t.rhs, t.acc) }
<% if chains == 2 %>
            %even_next = arith.select %odd, %acc_even, %next : ${t.acc}
            %odd_next = arith.select %odd, %next, %acc_odd : ${t.acc}
            scf.yield %even_next, %odd_next : ${t.acc}, ${t.acc}
          } {unroll_loop}
          ${result} = arith.addf ${result}_even, ${result}_odd : ${t.acc}
<% else %>
            scf.yield %next : ${t.acc}
          } {unroll_loop}
<% endif %>
<% endmacro %>

<# result = init + lhs (lhs_type) times rows read transposed, two column tiles of the accumulator (acc_type)
   per step over `steps` steps: the rhs of rhs_step (rows, rows_type, buffer, row, high, lane, swizzle,
   transposed), the tiles 2 s and 2 s + 1 taken through a t.acc pair (from `zero`, or none: a zero made in
   the loop) and put back. #>
<% macro accumulate_steps(result, steps, init, acc_type, lhs, lhs_type, zero, rows, rows_type, buffer, row, high, lane, swizzle, t) %>
          ${result} = scf.for %s = %c0 to ${steps} step %c1 iter_args(%acc = ${init}) -> (${acc_type}) {
${ rhs_step(rows, rows_type, buffer, row, high, lane, swizzle, "true", t.rhs) }
            %s2 = arith.muli %s, %c2 : index
            %s2_1 = arith.addi %s2, %c1 : index
            %acc0 = vector.extract %acc[0, %s2] : vector<2x2xf32> from ${acc_type}
            %acc1 = vector.extract %acc[0, %s2_1] : vector<2x2xf32> from ${acc_type}
<% if zero is none %>
            %pair0 = arith.constant dense<0.0> : ${t.acc}
<% endif %>
            %pair1 = vector.insert %acc0, ${zero or "%pair0"}[0, 0] : vector<2x2xf32> into ${t.acc}
            %pair = vector.insert %acc1, %pair1[0, 1] : vector<2x2xf32> into ${t.acc}
${ mma("%out", lhs, "%rhs", "%pair", t.contraction, t.kind, lhs_type, t.rhs, t.acc) }
            %out0 = vector.extract %out[0, 0] : vector<2x2xf32> from ${t.acc}
            %out1 = vector.extract %out[0, 1] : vector<2x2xf32> from ${t.acc}
            %next0 = vector.insert %out0, %acc[0, %s2] : vector<2x2xf32> into ${acc_type}
            %next = vector.insert %out1, %next0[0, %s2_1] : vector<2x2xf32> into ${acc_type}
            scf.yield %next : ${acc_type}
          } {unroll_loop}
<% endmacro %>

<# The names of the s = q k^T step's types and contraction map (the `t` of the mma macros above, with the
   kernel's mma kind added). #>
<% set types = {"lhs": "!dqk_lhs_step", "rhs": "!dqk_rhs_step", "acc": "!dqk_scores", "contraction": "#dqk_contraction"} %>

<# q, K and V in global memory, a block's K and V rows as 2-d views (row strides g_d = G D, g_dv = G Dv) and the
   `stages` buffers of K and V rows in workgroup memory. #>
<% macro kv_types(g_d, g_dv, stages) %>
!dqk_q = memref<?x?x${H}x${D}x${E}>
!dqk_k = memref<?x?x${G}x${D}x${E}>
!dqk_v = memref<?x?x${G}x${DV}x${E}>
!dqk_k_block = memref<${BS}x${D}x${E}, strided<[${g_d}, 1], offset: ?>>
!dqk_v_block = memref<${BS}x${DV}x${E}, strided<[${g_dv}, 1], offset: ?>>
// Workgroup K and V rows of the blocks in flight (unpadded rows, 16-byte chunks XOR-swizzled by row:
// nsa_iree/fragments.py, swizzle_mask).
!dqk_k_rows = memref<${stages}x${BS}x${D}x${E}, #gpu.address_space<workgroup>>
!dqk_v_rows = memref<${stages}x${BS}x${DV}x${E}, #gpu.address_space<workgroup>>
<% endmacro %>

<# The per-lane fragments of s = q k^T: one 16-d step's lhs and rhs, the scores, q over all d_steps steps; the
   contraction map of every mma. #>
<% macro fragment_types(d_steps) %>
!dqk_lhs_step = vector<1x1x4x2x${E}>
!dqk_rhs_step = vector<1x2x2x2x${E}>
!dqk_scores = vector<1x2x2x2xf32>
!dqk_q_frags = vector<1x${d_steps}x4x2x${E}>

#dqk_contraction = [affine_map<(i, j, k) -> (i, k)>, affine_map<(i, j, k) -> (k, j)>, affine_map<(i, j, k) -> (i, j)>]
<% endmacro %>

<# The K/V pipeline's stage constants: `steps` iterations (none: the kernel computes %steps) over `stages` buffers,
   `lag` = stages - 1 behind; the
   swizzle masks (k_mask, v_mask) and their high bits (k_high, v_high). #>
<% macro stage_constants(steps, stages, lag, k_mask, v_mask, k_high, v_high) %>
<% if steps is not none %>
      %steps = arith.constant ${steps} : index
<% endif %>
      %stages = arith.constant ${stages} : index
      %lag = arith.constant ${lag} : index
      %k_swizzle_mask = arith.constant ${k_mask} : index
      %v_swizzle_mask = arith.constant ${v_mask} : index
      %k_swizzle_high = arith.constant ${k_high} : index
      %v_swizzle_high = arith.constant ${v_high} : index
<% endmacro %>

<# The K/V copies' constants: `lanes` lanes in subgroups of subgroup_size; K (V) rows of d_chunks (dv_chunks)
   16-byte chunks, k_items (v_items) chunks a block, k_per_lane (v_per_lane) a lane. #>
<% macro copy_constants(lanes, subgroup_size, d_chunks, dv_chunks, k_items, v_items, k_per_lane, v_per_lane) %>
      %lanes = arith.constant ${lanes} : index
      %subgroup_size = arith.constant ${subgroup_size} : index
      %k_chunks = arith.constant ${d_chunks} : index
      %v_chunks = arith.constant ${dv_chunks} : index
      %k_items = arith.constant ${k_items} : index
      %v_items = arith.constant ${v_items} : index
      %k_per_lane = arith.constant ${k_per_lane} : index
      %v_per_lane = arith.constant ${v_per_lane} : index
<% endmacro %>

<# pos(m) = m + N - M (bottom-right alignment; signed, in index arithmetic) and the last block it sees. #>
<% macro positions() %>
      ${ rules.offset() }
      ${ rules.position() }
      ${ rules.last_block("last_visible_block") }
<% endmacro %>

<# %interior (i1, the same in every lane of the subgroup, whose rows are one position's heads): every key of the
   16-key run at %key_base is visible to the rows, key_in_range's `every` form against %`upper` (`predicate` slt: the
   count of visible keys; sle: the last visible offset) and, with a window, %`first`; false with fewer heads per group
   than the tile's 16 (padding rows). A step where it holds can take its products without masks (score_element's
   masked=false). #>
<% macro interior(upper="visible", predicate="slt", first="first_visible") %>
          %step_last_offset = arith.constant 15 : index
          %step_last = arith.addi %key_base, %step_last_offset : index
<% if (HPG | int) % 16 == 0 %>
          ${ rules.key_in_range("interior", "key_base", predicate, upper, first, j_last="step_last", every=true) }
<% else %>
          %interior = arith.constant false
<% endif %>
<% endmacro %>

<# Scores element [0][tile][i][e] (head 8 i + r, key j = key_base + 8 tile + 2 c + e): %j, %live (key j visible
   below %visible, or below the row's own %visible_0 / %visible_1 (by %is_row_1) when `per_row`; head real by
   %head_valid) and its score %sv in %s_acc; without `masked` (a step where %interior holds) %live is true. #>
<% macro score_element(per_row=false, masked=true) %>
<% if not masked %>
                %live = arith.constant true
<% else %>
                %tile8 = arith.muli %tile, %c8 : index
                %j0 = arith.addi %key_base, %tile8 : index
                %j1 = arith.addi %j0, %c2x : index
                %j = arith.addi %j1, %e : index
<% if per_row %>
                %visible_row = arith.select %is_row_1, %visible_1, %visible_0 : index
<% if WINDOW != "0" %>
                %first_row = arith.select %is_row_1, %first_visible_1, %first_visible_0 : index
<% endif %>
                ${ rules.key_in_range("key_visible", "j", "slt", "visible_row", "first_row") }
<% else %>
                ${ rules.key_in_range("key_visible", "j", "slt", "visible", "first_visible") }
<% endif %>
                %live = arith.andi %key_visible, %head_valid : i1
<% endif %>
                %sv = vector.extract %s_acc[0, %tile, %i, %e] : f32 from !dqk_scores
<% endmacro %>

<# The backward's per-kernel terms of p_and_ds, from the push constant %scale and the kernel's %log2e:
   %scale_log2 = scale log2(e), %minus_scale and %minus_log2e. #>
<% macro p_and_ds_constants() %>
      %minus_log2e = arith.negf %log2e : f32
      %scale_log2 = arith.mulf %scale, %log2e : f32
      %minus_scale = arith.negf %scale : f32
<% endmacro %>

<# A row's terms of p_and_ds, from its `lse` and `delta` (f32 values): %`prefix`_lse2 = -lse log2(e) and
   %`prefix`_delta = -scale delta. #>
<% macro p_and_ds_row(prefix, lse, delta) %>
      %${prefix}_lse2 = arith.mulf %${lse}, %minus_log2e : f32
      %${prefix}_delta = arith.mulf %${delta}, %minus_scale : f32
<% endmacro %>

<# One element of the backward's softmax gradient: %`p` = [%`weight` *] exp(scale %`s` - lse) and %ds_scaled =
   scale p (%`dp` - delta), from the row's terms %`lse2` and %`delta` (p_and_ds_row): p = 2^(s scale log2(e) -
   lse log2(e)) by the recipe's `ex2` instruction, each term one fused multiply-add. #>
<% macro p_and_ds(s, dp, lse2, delta, ex2, p, weight=none) %>
                %exponent = math.fma %${s}, %scale_log2, %${lse2} : f32
<% if weight %>
                %ex = ${ex2} %exponent : (f32) -> f32
                %${p} = arith.mulf %${weight}, %ex : f32
<% else %>
                %${p} = ${ex2} %exponent : (f32) -> f32
<% endif %>
                %dp_scaled = math.fma %${dp}, %scale, %${delta} : f32
                %ds_scaled = arith.mulf %${p}, %dp_scaled : f32
<% endmacro %>
