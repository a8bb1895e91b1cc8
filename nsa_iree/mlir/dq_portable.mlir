// dq pass as a portable matrix-unit kernel: one workgroup per (query row m, kv group g, batch b), one text
// for every intrinsic (MFMA 16x16x32 on gfx950, mma.sync 16x8x16 on NVIDIA); only the unit's fragment shapes
// and the placement maps below differ (nsa_iree/fragments.py: Unit, pinned by tests/test_fragments.py).
//
// Per selected block (slot t - 1, while slot t's K and V rows travel from global memory in registers):
//   s  = q k^T    [16 heads x 16 keys] per subgroup: subgroup w owns keys 16 w .. 16 w + 15
//   dp = do v^T   the same keys; q and do are register fragments loaded once
//   ds = scale p (dp - delta), p = exp(scale s - lse), 0 where the key is invisible or the head is padding;
//                 written to a [16 heads, BS keys] tile in workgroup memory
//   dq += ds k    [16 heads x 16 d] units, subgroup w owns d tiles w, w + SUBGROUPS, ...: its dq is
//                 complete in registers at the end and written once (no cross-subgroup sum)
// Every operand is read from workgroup memory with its reduction dimension contiguous: K rows [key][d] for s,
// V rows [key][dv] for dp, the ds tile [head][key] and a transposed K copy [d][key] for dq (written while
// staging, from the same registers: K and V are read from global memory once per workgroup). A lane reads
// its fragment as ${RUNS} contiguous vectors of ${RUN} elements (MFMA: one 16-byte read per fragment).
//
// Visibility (semantics.md): slot t of row m names block i; it is skipped when i < 0 or i * BS > pos(m),
// pos(m) = m + N - M (tested as i <= floor(pos / BS)); key i * BS + j is visible when j < pos - i * BS + 1.
// Keys past that are staged as zeros and their ds is 0, so a NaN in an unread key reaches nothing.

// Push constants: B, M, N (i32), then the bits of scale (f32).
#dq_portable_layout = #hal.pipeline.layout<constants = 4, bindings = [
  #hal.pipeline.binding<storage_buffer, ReadOnly>,  // q [B, M, H, D]
  #hal.pipeline.binding<storage_buffer, ReadOnly>,  // k [B, N, G, D]
  #hal.pipeline.binding<storage_buffer, ReadOnly>,  // v [B, N, G, Dv]
  #hal.pipeline.binding<storage_buffer, ReadOnly>,  // block_indices [B, M, G, T] i32
  #hal.pipeline.binding<storage_buffer, ReadOnly>,  // lse [B, H, M] f32
  #hal.pipeline.binding<storage_buffer, ReadOnly>,  // delta [B, M, H] f32
  #hal.pipeline.binding<storage_buffer, ReadOnly>,  // do [B, M, H, Dv]
  #hal.pipeline.binding<storage_buffer>             // dq [B, M, H, D]
]>

!dqp_q = memref<?x?x${H}x${D}x${E}>
!dqp_k = memref<?x?x${G}x${D}x${E}>
!dqp_v = memref<?x?x${G}x${DV}x${E}>
!dqp_do = memref<?x?x${H}x${DV}x${E}>
!dqp_smem = memref<${DQP_SMEM_BYTES}xi8, #gpu.address_space<workgroup>>
// Workgroup tiles (rows padded by ${PAD} elements): K rows, V rows, K transposed, ds.
!dqp_k_rows = memref<${BS}x${D_PADDED}x${E}, #gpu.address_space<workgroup>>
!dqp_v_rows = memref<${BS}x${DV_PADDED}x${E}, #gpu.address_space<workgroup>>
!dqp_k_cols = memref<${D}x${BS_PADDED}x${E}, #gpu.address_space<workgroup>>
!dqp_ds = memref<16x${BS_PADDED}x${E}, #gpu.address_space<workgroup>>
// One unit's fragments: lhs [16 x K], rhs [K x 16], acc [16 x 16]; the same elements as runs of reads.
!dqp_lhs = vector<${LHS_UNIT}x${E}>
!dqp_rhs = vector<${RHS_UNIT}x${E}>
!dqp_acc = vector<${ACC_UNIT}xf32>
!dqp_runs = vector<${RUNS}x${RUN}x${E}>
!dqp_runs_pair = vector<2x${RUNS}x${RUN}x${E}>
!dqp_acc_flat = vector<${ACC_N}xf32>
!dqp_q_units = vector<${D_UNITS}x${RUNS}x${RUN}x${E}>
!dqp_do_units = vector<${DV_UNITS}x${RUNS}x${RUN}x${E}>
!dqp_dq_units = vector<${DQ_UNITS_PER_SUBGROUP}x${ACC_N}xf32>
!dqp_k_staged = vector<${K_ITEMS_PER_LANE}x8x${E}>
!dqp_v_staged = vector<${V_ITEMS_PER_LANE}x8x${E}>

// Placement (lane l, read j or element i): row / column and k of read j, row and column of acc element i.
#dqp_run_major = ${RUN_MAJOR_MAP}
#dqp_run_k = ${RUN_K_MAP}
#dqp_acc_row = ${ACC_ROW_MAP}
#dqp_acc_col = ${ACC_COL_MAP}
#dqp_contraction = [affine_map<(i, j, k) -> (i, k)>, affine_map<(i, j, k) -> (k, j)>, affine_map<(i, j, k) -> (i, j)>]

hal.executable.source private @selection_attention_dq_portable_exe {
  hal.executable.export public @selection_attention_dq_row ordinal(0) layout(#dq_portable_layout)
      count(%device: !hal.device, %m_rows: index, %kv_heads: index, %batch: index) -> (index, index, index) {
    hal.return %m_rows, %kv_heads, %batch : index, index, index
  } <workgroup_size = [${LANES} : index, 1 : index, 1 : index]>
  builtin.module {
    func.func @selection_attention_dq_row() attributes {translation_info = #iree_codegen.translation_info<
        pipeline = #iree_codegen.pass_pipeline<"iree-codegen-unroll-annotated-loops,canonicalize,cse,iree-gpu-unroll-to-intrinsics,canonicalize,cse,iree-gpu-lower-ops,canonicalize,cse">
        workgroup_size = [${LANES}, 1, 1] subgroup_size = ${SUBGROUP_SIZE}>} {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c8 = arith.constant 8 : index
      %c16 = arith.constant 16 : index
      %zero = arith.constant 0.0 : f32
      %zero_run = arith.constant dense<0.0> : vector<${RUN}x${E}>
      %zero_chunk = arith.constant dense<0.0> : vector<8x${E}>
      %zero_runs = arith.constant dense<0.0> : !dqp_runs
      %zero_runs2 = arith.constant dense<0.0> : !dqp_runs_pair
      %heads_per_group = arith.constant ${HPG} : index
      %block_size = arith.constant ${BS} : index
      %slots = arith.constant ${T} : index
      %steps = arith.constant ${T_PLUS_1} : index
      %lanes = arith.constant ${LANES} : index
      %subgroup_size = arith.constant ${SUBGROUP_SIZE} : index
      %subgroups = arith.constant ${SUBGROUPS} : index
      %unit_k = arith.constant ${UNIT_K} : index
      %runs = arith.constant ${RUNS} : index
      %acc_n = arith.constant ${ACC_N} : index
      %d_units = arith.constant ${D_UNITS} : index
      %dv_units = arith.constant ${DV_UNITS} : index
      %key_units = arith.constant ${KEY_UNITS} : index
      %d_tiles = arith.constant ${D_TILES16} : index
      %dq_units = arith.constant ${DQ_UNITS_PER_SUBGROUP} : index
      %k_chunks = arith.constant ${K_ITEMS} : index
      %v_chunks = arith.constant ${V_ITEMS} : index
      %k_per_lane = arith.constant ${K_ITEMS_PER_LANE} : index
      %v_per_lane = arith.constant ${V_ITEMS_PER_LANE} : index

      %m = hal.interface.workgroup.id[0] : index
      %g = hal.interface.workgroup.id[1] : index
      %b = hal.interface.workgroup.id[2] : index
      %batch_i32 = hal.interface.constant.load layout(#dq_portable_layout) ordinal(0) : i32
      %m_rows_i32 = hal.interface.constant.load layout(#dq_portable_layout) ordinal(1) : i32
      %n_i32 = hal.interface.constant.load layout(#dq_portable_layout) ordinal(2) : i32
      %scale_bits = hal.interface.constant.load layout(#dq_portable_layout) ordinal(3) : i32
      %batch = arith.index_castui %batch_i32 : i32 to index
      %m_rows = arith.index_castui %m_rows_i32 : i32 to index
      %n = arith.index_castui %n_i32 : i32 to index
      %scale = arith.bitcast %scale_bits : i32 to f32

      %q = hal.interface.binding.subspan layout(#dq_portable_layout) binding(0) alignment(64) offset(%c0) flags(ReadOnly)
          : !dqp_q{%batch, %m_rows}
      %k = hal.interface.binding.subspan layout(#dq_portable_layout) binding(1) alignment(64) offset(%c0) flags(ReadOnly)
          : !dqp_k{%batch, %n}
      %v = hal.interface.binding.subspan layout(#dq_portable_layout) binding(2) alignment(64) offset(%c0) flags(ReadOnly)
          : !dqp_v{%batch, %n}
      %block_indices = hal.interface.binding.subspan layout(#dq_portable_layout) binding(3) alignment(64) offset(%c0) flags(ReadOnly)
          : memref<?x?x${G}x${T}xi32>{%batch, %m_rows}
      %lse = hal.interface.binding.subspan layout(#dq_portable_layout) binding(4) alignment(64) offset(%c0) flags(ReadOnly)
          : memref<?x${H}x?xf32>{%batch, %m_rows}
      %delta = hal.interface.binding.subspan layout(#dq_portable_layout) binding(5) alignment(64) offset(%c0) flags(ReadOnly)
          : memref<?x?x${H}xf32>{%batch, %m_rows}
      %do = hal.interface.binding.subspan layout(#dq_portable_layout) binding(6) alignment(64) offset(%c0) flags(ReadOnly)
          : !dqp_do{%batch, %m_rows}
      %dq = hal.interface.binding.subspan layout(#dq_portable_layout) binding(7) alignment(64) offset(%c0)
          : !dqp_q{%batch, %m_rows}

      %smem = memref.alloc() : !dqp_smem
      %v_offset = arith.constant ${DQP_V_OFFSET} : index
      %kt_offset = arith.constant ${DQP_KT_OFFSET} : index
      %ds_offset = arith.constant ${DQP_DS_OFFSET} : index
      %k_rows = memref.view %smem[%c0][] : !dqp_smem to !dqp_k_rows
      %v_rows = memref.view %smem[%v_offset][] : !dqp_smem to !dqp_v_rows
      %k_cols = memref.view %smem[%kt_offset][] : !dqp_smem to !dqp_k_cols
      %ds_tile = memref.view %smem[%ds_offset][] : !dqp_smem to !dqp_ds

      %tid = gpu.thread_id x
      %subgroup = arith.divui %tid, %subgroup_size : index
      %lane = arith.remui %tid, %subgroup_size : index
      %key_base = arith.muli %subgroup, %c16 : index
      %h0 = arith.muli %g, %heads_per_group : index

      // q and do as lhs fragments over all of D (Dv), loaded once from global memory: read j of unit u is
      // head run_major(l, j), columns u K + run_k(l, j) ...; padding heads (>= HPG) are zeros.
      %q_init = arith.constant dense<0.0> : !dqp_q_units
      %q_units = scf.for %u = %c0 to %d_units step %c1 iter_args(%acc = %q_init) -> (!dqp_q_units) {
        %acc_u = scf.for %j = %c0 to %runs step %c1 iter_args(%acc2 = %acc) -> (!dqp_q_units) {
          %h = affine.apply #dqp_run_major(%lane, %j)
          %kk = affine.apply #dqp_run_k(%lane, %j)
          %u0 = arith.muli %u, %unit_k : index
          %col = arith.addi %u0, %kk : index
          %real = arith.cmpi ult, %h, %heads_per_group : index
          %x = scf.if %real -> (vector<${RUN}x${E}>) {
            %head = arith.addi %h0, %h : index
            %y = vector.load %q[%b, %m, %head, %col] : !dqp_q, vector<${RUN}x${E}>
            scf.yield %y : vector<${RUN}x${E}>
          } else {
            scf.yield %zero_run : vector<${RUN}x${E}>
          }
          %next = vector.insert %x, %acc2[%u, %j] : vector<${RUN}x${E}> into !dqp_q_units
          scf.yield %next : !dqp_q_units
        } {unroll_loop}
        scf.yield %acc_u : !dqp_q_units
      } {unroll_loop}
      %do_init = arith.constant dense<0.0> : !dqp_do_units
      %do_units = scf.for %u = %c0 to %dv_units step %c1 iter_args(%acc = %do_init) -> (!dqp_do_units) {
        %acc_u = scf.for %j = %c0 to %runs step %c1 iter_args(%acc2 = %acc) -> (!dqp_do_units) {
          %h = affine.apply #dqp_run_major(%lane, %j)
          %kk = affine.apply #dqp_run_k(%lane, %j)
          %u0 = arith.muli %u, %unit_k : index
          %col = arith.addi %u0, %kk : index
          %real = arith.cmpi ult, %h, %heads_per_group : index
          %x = scf.if %real -> (vector<${RUN}x${E}>) {
            %head = arith.addi %h0, %h : index
            %y = vector.load %do[%b, %m, %head, %col] : !dqp_do, vector<${RUN}x${E}>
            scf.yield %y : vector<${RUN}x${E}>
          } else {
            scf.yield %zero_run : vector<${RUN}x${E}>
          }
          %next = vector.insert %x, %acc2[%u, %j] : vector<${RUN}x${E}> into !dqp_do_units
          scf.yield %next : !dqp_do_units
        } {unroll_loop}
        scf.yield %acc_u : !dqp_do_units
      } {unroll_loop}

      // lse and delta of the head of each accumulator element (0 for padding heads, whose ds is masked).
      %stats_init = arith.constant dense<0.0> : !dqp_acc_flat
      %lse_e, %delta_e = scf.for %i = %c0 to %acc_n step %c1 iter_args(%l_acc = %stats_init, %d_acc = %stats_init)
          -> (!dqp_acc_flat, !dqp_acc_flat) {
        %h = affine.apply #dqp_acc_row(%lane, %i)
        %real = arith.cmpi ult, %h, %heads_per_group : index
        %head = arith.addi %h0, %h : index
        %l, %dl = scf.if %real -> (f32, f32) {
          %x = memref.load %lse[%b, %head, %m] : memref<?x${H}x?xf32>
          %y = memref.load %delta[%b, %m, %head] : memref<?x?x${H}xf32>
          scf.yield %x, %y : f32, f32
        } else {
          scf.yield %zero, %zero : f32, f32
        }
        %l_next = vector.insert %l, %l_acc[%i] : f32 into !dqp_acc_flat
        %d_next = vector.insert %dl, %d_acc[%i] : f32 into !dqp_acc_flat
        scf.yield %l_next, %d_next : !dqp_acc_flat, !dqp_acc_flat
      } {unroll_loop}

      // pos(m) = m + N - M (bottom-right alignment); signed, in index arithmetic.
      %offset = arith.subi %n, %m_rows : index
      %pos = arith.addi %m, %offset : index
      %last_visible_block = arith.floordivsi %pos, %block_size : index

      // Iteration t loads slot t's K and V rows into registers (zeros for keys past the last visible one),
      // computes slot t - 1 from workgroup memory, then stores the registers there for iteration t + 1.
      %dq_init = arith.constant dense<0.0> : !dqp_dq_units
      %k_none = arith.constant dense<0.0> : !dqp_k_staged
      %v_none = arith.constant dense<0.0> : !dqp_v_staged
      %block_none = arith.constant -1 : index
      %dq_acc, %last_block = scf.for %t = %c0 to %steps step %c1 iter_args(%dq_iter = %dq_init, %previous = %block_none)
          -> (!dqp_dq_units, index) {
        // Slot t: its block, or -1 when skipped (or t = T).
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
        // Chunk c of the K block is (key c mod BS, elements 8 (c / BS) ..): consecutive lanes take
        // consecutive keys, so the transposed copy's 16-bit stores are consecutive.
        %k_staged, %v_staged = scf.if %stage -> (!dqp_k_staged, !dqp_v_staged) {
          %ks = scf.for %i = %c0 to %k_per_lane step %c1 iter_args(%acc = %k_none) -> (!dqp_k_staged) {
            %i_lanes = arith.muli %i, %lanes : index
            %c = arith.addi %tid, %i_lanes : index
            %j = arith.remui %c, %block_size : index
            %chunk = arith.divui %c, %block_size : index
            %d0 = arith.muli %chunk, %c8 : index
            %in_tile = arith.cmpi ult, %c, %k_chunks : index
            %is_visible = arith.cmpi slt, %j, %visible : index
            %read = arith.andi %in_tile, %is_visible : i1
            %x = scf.if %read -> (vector<8x${E}>) {
              %key = arith.addi %key0, %j : index
              %y = vector.load %k[%b, %key, %g, %d0] : !dqp_k, vector<8x${E}>
              scf.yield %y : vector<8x${E}>
            } else {
              scf.yield %zero_chunk : vector<8x${E}>
            }
            %next = vector.insert %x, %acc[%i] : vector<8x${E}> into !dqp_k_staged
            scf.yield %next : !dqp_k_staged
          } {unroll_loop}
          %vs = scf.for %i = %c0 to %v_per_lane step %c1 iter_args(%acc = %v_none) -> (!dqp_v_staged) {
            %i_lanes = arith.muli %i, %lanes : index
            %c = arith.addi %tid, %i_lanes : index
            %j = arith.remui %c, %block_size : index
            %chunk = arith.divui %c, %block_size : index
            %e0 = arith.muli %chunk, %c8 : index
            %in_tile = arith.cmpi ult, %c, %v_chunks : index
            %is_visible = arith.cmpi slt, %j, %visible : index
            %read = arith.andi %in_tile, %is_visible : i1
            %x = scf.if %read -> (vector<8x${E}>) {
              %key = arith.addi %key0, %j : index
              %y = vector.load %v[%b, %key, %g, %e0] : !dqp_v, vector<8x${E}>
              scf.yield %y : vector<8x${E}>
            } else {
              scf.yield %zero_chunk : vector<8x${E}>
            }
            %next = vector.insert %x, %acc[%i] : vector<8x${E}> into !dqp_v_staged
            scf.yield %next : !dqp_v_staged
          } {unroll_loop}
          scf.yield %ks, %vs : !dqp_k_staged, !dqp_v_staged
        } else {
          scf.yield %k_none, %v_none : !dqp_k_staged, !dqp_v_staged
        }

        // Slot t - 1 (its rows are in workgroup memory).
        %compute = arith.cmpi sge, %previous, %c0 : index
        %dq_next = scf.if %compute -> (!dqp_dq_units) {
          %p_key0 = arith.muli %previous, %block_size : index
          %p_to_pos = arith.subi %pos, %p_key0 : index
          %p_visible = arith.addi %p_to_pos, %c1 : index
          %acc_zero = arith.constant dense<0.0> : !dqp_acc
          // s = q k^T and dp = do v^T over this subgroup's 16 keys: rhs read j of a unit is key
          // key_base + run_major(l, j), columns u K + run_k(l, j) ...
          %s_acc = scf.for %u = %c0 to %d_units step %c1 iter_args(%acc = %acc_zero) -> (!dqp_acc) {
            %u0 = arith.muli %u, %unit_k : index
            %rhs_runs = scf.for %j = %c0 to %runs step %c1 iter_args(%r = %zero_runs) -> (!dqp_runs) {
              %kj = affine.apply #dqp_run_major(%lane, %j)
              %kk = affine.apply #dqp_run_k(%lane, %j)
              %row = arith.addi %key_base, %kj : index
              %col = arith.addi %u0, %kk : index
              %x = vector.load %k_rows[%row, %col] : !dqp_k_rows, vector<${RUN}x${E}>
              %next = vector.insert %x, %r[%j] : vector<${RUN}x${E}> into !dqp_runs
              scf.yield %next : !dqp_runs
            } {unroll_loop}
            %rhs = vector.shape_cast %rhs_runs : !dqp_runs to !dqp_rhs
            %lhs_runs = vector.extract %q_units[%u] : !dqp_runs from !dqp_q_units
            %lhs = vector.shape_cast %lhs_runs : !dqp_runs to !dqp_lhs
            %next = iree_codegen.inner_tiled ins(%lhs, %rhs) outs(%acc) <
              indexing_maps = #dqp_contraction,
              iterator_types = [#linalg.iterator_type<parallel>, #linalg.iterator_type<parallel>, #linalg.iterator_type<reduction>],
              kind = #iree_gpu.mma_layout<${MMA_KIND}>,
              semantics = #iree_gpu.mma_semantics<distributed = true, opaque = false>
            > : !dqp_lhs, !dqp_rhs into !dqp_acc
            scf.yield %next : !dqp_acc
          } {unroll_loop}
          %dp_acc = scf.for %u = %c0 to %dv_units step %c1 iter_args(%acc = %acc_zero) -> (!dqp_acc) {
            %u0 = arith.muli %u, %unit_k : index
            %rhs_runs = scf.for %j = %c0 to %runs step %c1 iter_args(%r = %zero_runs) -> (!dqp_runs) {
              %kj = affine.apply #dqp_run_major(%lane, %j)
              %kk = affine.apply #dqp_run_k(%lane, %j)
              %row = arith.addi %key_base, %kj : index
              %col = arith.addi %u0, %kk : index
              %x = vector.load %v_rows[%row, %col] : !dqp_v_rows, vector<${RUN}x${E}>
              %next = vector.insert %x, %r[%j] : vector<${RUN}x${E}> into !dqp_runs
              scf.yield %next : !dqp_runs
            } {unroll_loop}
            %rhs = vector.shape_cast %rhs_runs : !dqp_runs to !dqp_rhs
            %lhs_runs = vector.extract %do_units[%u] : !dqp_runs from !dqp_do_units
            %lhs = vector.shape_cast %lhs_runs : !dqp_runs to !dqp_lhs
            %next = iree_codegen.inner_tiled ins(%lhs, %rhs) outs(%acc) <
              indexing_maps = #dqp_contraction,
              iterator_types = [#linalg.iterator_type<parallel>, #linalg.iterator_type<parallel>, #linalg.iterator_type<reduction>],
              kind = #iree_gpu.mma_layout<${MMA_KIND}>,
              semantics = #iree_gpu.mma_semantics<distributed = true, opaque = false>
            > : !dqp_lhs, !dqp_rhs into !dqp_acc
            scf.yield %next : !dqp_acc
          } {unroll_loop}

          // ds, element by element: element i is head acc_row(l, i), key key_base + acc_col(l, i).
          %s_flat = vector.shape_cast %s_acc : !dqp_acc to !dqp_acc_flat
          %dp_flat = vector.shape_cast %dp_acc : !dqp_acc to !dqp_acc_flat
          scf.for %i = %c0 to %acc_n step %c1 {
            %h = affine.apply #dqp_acc_row(%lane, %i)
            %col = affine.apply #dqp_acc_col(%lane, %i)
            %j = arith.addi %key_base, %col : index
            %key_visible = arith.cmpi slt, %j, %p_visible : index
            %head_real = arith.cmpi ult, %h, %heads_per_group : index
            %live = arith.andi %key_visible, %head_real : i1
            %sv = vector.extract %s_flat[%i] : f32 from !dqp_acc_flat
            %dpv = vector.extract %dp_flat[%i] : f32 from !dqp_acc_flat
            %l = vector.extract %lse_e[%i] : f32 from !dqp_acc_flat
            %dl = vector.extract %delta_e[%i] : f32 from !dqp_acc_flat
            %scaled = arith.mulf %sv, %scale : f32
            %shifted = arith.subf %scaled, %l : f32
            %p = math.exp %shifted : f32
            %dp_minus_delta = arith.subf %dpv, %dl : f32
            %ds_raw = arith.mulf %p, %dp_minus_delta : f32
            %ds_scaled = arith.mulf %ds_raw, %scale : f32
            %ds_live = arith.select %live, %ds_scaled, %zero : f32
            %ds_e = ${TRUNCF} %ds_live : f32 to ${E}
            memref.store %ds_e, %ds_tile[%h, %j] : !dqp_ds
          } {unroll_loop}
          gpu.barrier

          // dq += ds k for this subgroup's d tiles: lhs read j is ds row run_major(l, j), keys
          // u K + run_k(l, j) ...; rhs read j is the transposed K's row (d) 16 tile + run_major(l, j).
          %dq_new = scf.for %x_unit = %c0 to %dq_units step %c1 iter_args(%acc = %dq_iter) -> (!dqp_dq_units) {
            %x_sub = arith.muli %x_unit, %subgroups : index
            %tile = arith.addi %subgroup, %x_sub : index
            %mine = arith.cmpi ult, %tile, %d_tiles : index
            %updated = scf.if %mine -> (!dqp_dq_units) {
              %d_base = arith.muli %tile, %c16 : index
              %old_flat = vector.extract %acc[%x_unit] : !dqp_acc_flat from !dqp_dq_units
              %old = vector.shape_cast %old_flat : !dqp_acc_flat to !dqp_acc
              %sum = scf.for %u = %c0 to %key_units step %c1 iter_args(%a = %old) -> (!dqp_acc) {
                %u0 = arith.muli %u, %unit_k : index
                %pair = scf.for %j = %c0 to %runs step %c1 iter_args(%r = %zero_runs2) -> (!dqp_runs_pair) {
                  %major = affine.apply #dqp_run_major(%lane, %j)
                  %kk = affine.apply #dqp_run_k(%lane, %j)
                  %key = arith.addi %u0, %kk : index
                  %x = vector.load %ds_tile[%major, %key] : !dqp_ds, vector<${RUN}x${E}>
                  %d = arith.addi %d_base, %major : index
                  %y = vector.load %k_cols[%d, %key] : !dqp_k_cols, vector<${RUN}x${E}>
                  %r1 = vector.insert %x, %r[0, %j] : vector<${RUN}x${E}> into !dqp_runs_pair
                  %r2 = vector.insert %y, %r1[1, %j] : vector<${RUN}x${E}> into !dqp_runs_pair
                  scf.yield %r2 : !dqp_runs_pair
                } {unroll_loop}
                %lhs_runs = vector.extract %pair[0] : !dqp_runs from !dqp_runs_pair
                %rhs_runs = vector.extract %pair[1] : !dqp_runs from !dqp_runs_pair
                %lhs = vector.shape_cast %lhs_runs : !dqp_runs to !dqp_lhs
                %rhs = vector.shape_cast %rhs_runs : !dqp_runs to !dqp_rhs
                %next = iree_codegen.inner_tiled ins(%lhs, %rhs) outs(%a) <
                  indexing_maps = #dqp_contraction,
                  iterator_types = [#linalg.iterator_type<parallel>, #linalg.iterator_type<parallel>, #linalg.iterator_type<reduction>],
                  kind = #iree_gpu.mma_layout<${MMA_KIND}>,
                  semantics = #iree_gpu.mma_semantics<distributed = true, opaque = false>
                > : !dqp_lhs, !dqp_rhs into !dqp_acc
                scf.yield %next : !dqp_acc
              } {unroll_loop}
              %sum_flat = vector.shape_cast %sum : !dqp_acc to !dqp_acc_flat
              %next = vector.insert %sum_flat, %acc[%x_unit] : !dqp_acc_flat into !dqp_dq_units
              scf.yield %next : !dqp_dq_units
            } else {
              scf.yield %acc : !dqp_dq_units
            }
            scf.yield %updated : !dqp_dq_units
          } {unroll_loop}
          scf.yield %dq_new : !dqp_dq_units
        } else {
          scf.yield %dq_iter : !dqp_dq_units
        }

        // Slot t's rows into workgroup memory, once every subgroup is done with slot t - 1's.
        gpu.barrier
        scf.if %stage {
          scf.for %i = %c0 to %k_per_lane step %c1 {
            %i_lanes = arith.muli %i, %lanes : index
            %c = arith.addi %tid, %i_lanes : index
            %in_tile = arith.cmpi ult, %c, %k_chunks : index
            scf.if %in_tile {
              %j = arith.remui %c, %block_size : index
              %chunk = arith.divui %c, %block_size : index
              %d0 = arith.muli %chunk, %c8 : index
              %x = vector.extract %k_staged[%i] : vector<8x${E}> from !dqp_k_staged
              vector.store %x, %k_rows[%j, %d0] : !dqp_k_rows, vector<8x${E}>
              scf.for %e = %c0 to %c8 step %c1 {
                %y = vector.extract %x[%e] : ${E} from vector<8x${E}>
                %d = arith.addi %d0, %e : index
                memref.store %y, %k_cols[%d, %j] : !dqp_k_cols
              } {unroll_loop}
            }
          } {unroll_loop}
          scf.for %i = %c0 to %v_per_lane step %c1 {
            %i_lanes = arith.muli %i, %lanes : index
            %c = arith.addi %tid, %i_lanes : index
            %in_tile = arith.cmpi ult, %c, %v_chunks : index
            scf.if %in_tile {
              %j = arith.remui %c, %block_size : index
              %chunk = arith.divui %c, %block_size : index
              %e0 = arith.muli %chunk, %c8 : index
              %x = vector.extract %v_staged[%i] : vector<8x${E}> from !dqp_v_staged
              vector.store %x, %v_rows[%j, %e0] : !dqp_v_rows, vector<8x${E}>
            }
          } {unroll_loop}
        }
        gpu.barrier
        scf.yield %dq_next, %block : !dqp_dq_units, index
      }

      // dq of this subgroup's d tiles: element i of unit x is head acc_row(l, i), d 16 tile + acc_col(l, i).
      scf.for %x_unit = %c0 to %dq_units step %c1 {
        %x_sub = arith.muli %x_unit, %subgroups : index
        %tile = arith.addi %subgroup, %x_sub : index
        %mine = arith.cmpi ult, %tile, %d_tiles : index
        scf.if %mine {
          %d_base = arith.muli %tile, %c16 : index
          scf.for %i = %c0 to %acc_n step %c1 {
            %h = affine.apply #dqp_acc_row(%lane, %i)
            %col = affine.apply #dqp_acc_col(%lane, %i)
            %real = arith.cmpi ult, %h, %heads_per_group : index
            scf.if %real {
              %x = vector.extract %dq_acc[%x_unit, %i] : f32 from !dqp_dq_units
              %x_e = ${TRUNCF} %x : f32 to ${E}
              %head = arith.addi %h0, %h : index
              %d = arith.addi %d_base, %col : index
              memref.store %x_e, %dq[%b, %m, %head, %d] : !dqp_q
            }
          } {unroll_loop}
        }
      } {unroll_loop}
      return
    }
  }
}

// Host side: one dispatch, dq written into the caller's tensor.
func.func @selection_attention_dq(%q: tensor<?x?x${H}x${D}x${E}>, %k: tensor<?x?x${G}x${D}x${E}>,
    %v: tensor<?x?x${G}x${DV}x${E}>, %block_indices: tensor<?x?x${G}x${T}xi32>, %lse: tensor<?x${H}x?xf32>,
    %delta: tensor<?x?x${H}xf32>, %do: tensor<?x?x${H}x${DV}x${E}>, %scale: f32,
    %dq_out: tensor<?x?x${H}x${D}x${E}> {iree.abi.output = 0 : index},
    %transients: !hal.buffer {iree.abi.transients}) -> tensor<?x?x${H}x${D}x${E}> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %kv_heads = arith.constant ${G} : index
  %batch = tensor.dim %q, %c0 : tensor<?x?x${H}x${D}x${E}>
  %m_rows = tensor.dim %q, %c1 : tensor<?x?x${H}x${D}x${E}>
  %n = tensor.dim %k, %c1 : tensor<?x?x${G}x${D}x${E}>
  %batch_i32 = arith.index_cast %batch : index to i32
  %m_rows_i32 = arith.index_cast %m_rows : index to i32
  %n_i32 = arith.index_cast %n : index to i32
  %scale_bits = arith.bitcast %scale : f32 to i32
  %dq = flow.dispatch @selection_attention_dq_portable_exe::@selection_attention_dq_row[%m_rows, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %q, %k, %v, %block_indices, %lse, %delta, %do)
      : (i32, i32, i32, i32, tensor<?x?x${H}x${D}x${E}>{%batch, %m_rows}, tensor<?x?x${G}x${D}x${E}>{%batch, %n},
         tensor<?x?x${G}x${DV}x${E}>{%batch, %n}, tensor<?x?x${G}x${T}xi32>{%batch, %m_rows},
         tensor<?x${H}x?xf32>{%batch, %m_rows}, tensor<?x?x${H}xf32>{%batch, %m_rows},
         tensor<?x?x${H}x${DV}x${E}>{%batch, %m_rows})
      -> tensor<?x?x${H}x${D}x${E}>{%batch, %m_rows}
  return %dq : tensor<?x?x${H}x${D}x${E}>
}
