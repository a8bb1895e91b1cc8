// One-pass backward: one hand-written dispatch over work items (m, g, b), i.e. one query row and one kv
// group per workgroup. For the HPG heads of the group and each of the T selected blocks it recomputes
// p = exp(scale * s - lse) and ds = p * (dp - delta), accumulates dq on chip and writes it once, and adds
// the row's dk/dv contributions to f32 accumulators with atomics (not bitwise reproducible: the order of
// the adds varies run to run). dk/dv are cast to the input type afterwards.
//
// One body serves every target. The ONEPASS_* placeholders come from the [onepass] table of
// pipelines/<target>.toml:
//   GPU: LANES threads per workgroup (lane = gpu.thread_id), workgroup memory for the tiles shared across
//        lanes, gpu.barrier between the phases;
//   CPU: llvm-cpu cannot lower gpu.thread_id, so one "lane" (0) walks every item of each distributed loop
//        (`scf.for %i = %lane to %count step %lanes` with lanes = 1), tiles live on the stack, no barriers.
// The f32 atomic add is llvm.atomicrmw fadd through a raw pointer: with rocdl.no_fine_grained_memory it
// becomes global_atomic_add_f32 on gfx9 and atom/red.global.add.f32 on NVIDIA; memref.atomic_rmw would
// become a compare-and-swap loop on AMD (../shared/docs/iree-notes.md, "How an f32 atomic add lowers").
//
// Skipped slots (i < 0, i * BS > pos(m), which covers i * BS >= N since pos(m) < N) are never read and
// never written; the test is i <= floor(pos / BS), which cannot overflow. Inside the diagonal block only
// keys <= pos(m) are read. A block listed twice is processed twice (multiplicity). An empty row selects
// nothing, so it never touches lse (-inf there), writes dq = 0 and adds nothing.
<% import "common/contraction.mlir" as contraction %>
<% import "common/host.mlir" as host %>
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/rules.mlir" as rules %>

// Push constants: B, M, N (i32: sequence lengths and batch stay dynamic), then the bits of scale (f32).
<% set inputs = ['q', 'k', 'v', 'block_indices', 'lse', 'delta', 'do'] %>
<% set outputs = ['dkv', 'dq'] %>
${ dispatch.layout("onepass_layout", 4, inputs, outputs) }
// Tiles shared by the lanes of a workgroup: the group's q and do rows (every key of a block reads them),
// p and ds of the current block (computed per (head, key), read per (head, d) and per (key, d)), and the
// dq accumulator (each lane owns the same (head, d) items throughout, so it needs no barrier).
!onepass_q_tile = memref<${HPG}x${D}x${E}${ONEPASS_WORKGROUP_SPACE}>
!onepass_do_tile = memref<${HPG}x${DV}x${E}${ONEPASS_WORKGROUP_SPACE}>
!onepass_score_tile = memref<${HPG}x${BS}xf32${ONEPASS_WORKGROUP_SPACE}>
!onepass_dq_tile = memref<${HPG}x${D}xf32${ONEPASS_WORKGROUP_SPACE}>

<% call dispatch.executable("selection_attention_onepass_exe", "selection_attention_onepass_row", "onepass_layout", ['m_rows', 'kv_heads', 'batch'], lanes=ONEPASS_LANES) %>
    func.func @selection_attention_onepass_row() ${ONEPASS_FUNC_ATTRIBUTES} {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %zero = arith.constant 0.0 : f32
      %heads_per_group = arith.constant ${HPG} : index
      %head_dim = arith.constant ${D} : index
      %value_dim = arith.constant ${DV} : index
      %block_size = arith.constant ${BS} : index
      %kv_heads = arith.constant ${G} : index
      %slots = arith.constant ${T} : index
      %q_items = arith.muli %heads_per_group, %head_dim : index
      %do_items = arith.muli %heads_per_group, %value_dim : index
      %score_items = arith.muli %heads_per_group, %block_size : index

      %lane = ${ONEPASS_LANE_ID}
      %lanes = arith.constant ${ONEPASS_LANES} : index
${ dispatch.ids(['m', 'g', 'b']) }
${ dispatch.push_constants("onepass_layout", ['batch', 'm_rows', 'n', 'scale']) }

      // The accumulator is flat: dk [B, N, G, D] then dv [B, N, G, Dv]; the atomics address it by offset.
      %kv_rows = arith.muli %batch, %n : index
      %kv_group_rows = arith.muli %kv_rows, %kv_heads : index
      %dk_size = arith.muli %kv_group_rows, %head_dim : index
      %dv_size = arith.muli %kv_group_rows, %value_dim : index
      %dkv_size = arith.addi %dk_size, %dv_size : index

${ dispatch.bindings("onepass_layout", inputs, outputs) }
      %dkv_address = memref.extract_aligned_pointer_as_index %dkv : memref<?xf32> -> index
      %dkv_address_i64 = arith.index_cast %dkv_address : index to i64
      %dkv_ptr = llvm.inttoptr %dkv_address_i64 : i64 to ${ONEPASS_GLOBAL_PTR}

      %q_tile = ${ONEPASS_WORKGROUP_ALLOC}() : !onepass_q_tile
      %do_tile = ${ONEPASS_WORKGROUP_ALLOC}() : !onepass_do_tile
      %p_tile = ${ONEPASS_WORKGROUP_ALLOC}() : !onepass_score_tile
      %ds_tile = ${ONEPASS_WORKGROUP_ALLOC}() : !onepass_score_tile
      %dq_tile = ${ONEPASS_WORKGROUP_ALLOC}() : !onepass_dq_tile

      %h0 = arith.muli %g, %heads_per_group : index
      scf.for %i = %lane to %q_items step %lanes {
        %h = arith.divui %i, %head_dim : index
        %d = arith.remui %i, %head_dim : index
        %head = arith.addi %h0, %h : index
        %x = memref.load %q[%b, %m, %head, %d] : memref<?x?x${H}x${D}x${E}>
        memref.store %x, %q_tile[%h, %d] : !onepass_q_tile
        memref.store %zero, %dq_tile[%h, %d] : !onepass_dq_tile
      }
      scf.for %i = %lane to %do_items step %lanes {
        %h = arith.divui %i, %value_dim : index
        %e = arith.remui %i, %value_dim : index
        %head = arith.addi %h0, %h : index
        %x = memref.load %do[%b, %m, %head, %e] : memref<?x?x${H}x${DV}x${E}>
        memref.store %x, %do_tile[%h, %e] : !onepass_do_tile
      }
      ${ONEPASS_BARRIER}

      // pos(m) = m + N - M (bottom-right alignment); signed, in index arithmetic.
      ${ rules.offset() }
      ${ rules.position() }
      ${ rules.last_block("last_visible") }
      %dv_base = arith.index_cast %dk_size : index to i64
      scf.for %t = %c0 to %slots step %c1 {
        %block_i32 = memref.load %block_indices[%b, %m, %g, %t] : memref<?x?x${G}x${T}xi32>
        %block = arith.index_cast %block_i32 : i32 to index
        %not_negative = arith.cmpi sge, %block, %c0 : index
        %not_future = arith.cmpi sle, %block, %last_visible : index
        %selected = arith.andi %not_negative, %not_future : i1
        // Uniform across the workgroup, so the barriers inside are reached by every lane or by none.
        scf.if %selected {
          %key0 = arith.muli %block, %block_size : index
          // Keys key0 .. key0 + visible - 1 are visible: the whole block, or up to pos(m) in the diagonal one.
          %to_pos = arith.subi %pos, %key0 : index
          %to_pos_inclusive = arith.addi %to_pos, %c1 : index
          %visible = arith.minsi %to_pos_inclusive, %block_size : index

          // p and ds for every (head, key) of the block; exactly 0 for invisible keys, which are not read.
          scf.for %i = %lane to %score_items step %lanes {
            %h = arith.divui %i, %block_size : index
            %j = arith.remui %i, %block_size : index
<% if WINDOW == "0" %>
            %is_visible = arith.cmpi slt, %j, %visible : index
<% else %>
            // (the sliding window: keys from pos(m) - WINDOW + 1 on)
            %is_below = arith.cmpi slt, %j, %visible : index
            %window_keys = arith.constant ${WINDOW} : index
            %window_key = arith.addi %key0, %j : index
            %window_end = arith.addi %window_key, %window_keys : index
            %is_above = arith.cmpi sgt, %window_end, %pos : index
            %is_visible = arith.andi %is_below, %is_above : i1
<% endif %>
            %p, %ds = scf.if %is_visible -> (f32, f32) {
              %key = arith.addi %key0, %j : index
              %s_raw = scf.for %d = %c0 to %head_dim step %c1 iter_args(%acc = %zero) -> (f32) {
                %x = memref.load %q_tile[%h, %d] : !onepass_q_tile
                %y = memref.load %k[%b, %key, %g, %d] : memref<?x?x${G}x${D}x${E}>
                %x32 = ${EXTF} %x : ${E} to f32
                %y32 = ${EXTF} %y : ${E} to f32
                %xy = arith.mulf %x32, %y32 : f32
                %sum = arith.addf %acc, %xy : f32
                scf.yield %sum : f32
              }
              %dp = scf.for %e = %c0 to %value_dim step %c1 iter_args(%acc = %zero) -> (f32) {
                %x = memref.load %do_tile[%h, %e] : !onepass_do_tile
                %y = memref.load %v[%b, %key, %g, %e] : memref<?x?x${G}x${DV}x${E}>
                %x32 = ${EXTF} %x : ${E} to f32
                %y32 = ${EXTF} %y : ${E} to f32
                %xy = arith.mulf %x32, %y32 : f32
                %sum = arith.addf %acc, %xy : f32
                scf.yield %sum : f32
              }
              %head = arith.addi %h0, %h : index
              %l = memref.load %lse[%b, %head, %m] : memref<?x${H}x?xf32>
              %dl = memref.load %delta[%b, %m, %head] : memref<?x?x${H}xf32>
              %s = arith.mulf %s_raw, %scale : f32
              %shifted = arith.subf %s, %l : f32
              %p_visible = math.exp %shifted : f32
              %dp_minus_delta = arith.subf %dp, %dl : f32
              %ds_visible = arith.mulf %p_visible, %dp_minus_delta : f32
              scf.yield %p_visible, %ds_visible : f32, f32
            } else {
              scf.yield %zero, %zero : f32, f32
            }
            memref.store %p, %p_tile[%h, %j] : !onepass_score_tile
            memref.store %ds, %ds_tile[%h, %j] : !onepass_score_tile
          }
          ${ONEPASS_BARRIER}

          // dq[h, d] += sum_j ds[h, j] k[key0 + j, d]: lanes over (head, d), coalesced reads of the K rows.
          scf.for %i = %lane to %q_items step %lanes {
            %h = arith.divui %i, %head_dim : index
            %d = arith.remui %i, %head_dim : index
            %part = scf.for %j = %c0 to %visible step %c1 iter_args(%acc = %zero) -> (f32) {
              %key = arith.addi %key0, %j : index
              %x = memref.load %ds_tile[%h, %j] : !onepass_score_tile
              %y = memref.load %k[%b, %key, %g, %d] : memref<?x?x${G}x${D}x${E}>
              %y32 = ${EXTF} %y : ${E} to f32
              %xy = arith.mulf %x, %y32 : f32
              %sum = arith.addf %acc, %xy : f32
              scf.yield %sum : f32
            }
            %old = memref.load %dq_tile[%h, %d] : !onepass_dq_tile
            %new = arith.addf %old, %part : f32
            memref.store %new, %dq_tile[%h, %d] : !onepass_dq_tile
          }

          // dk[key, d] += scale * sum_h ds[h, j] q[h, d] and dv[key, e] += sum_h p[h, j] do[h, e]: the heads
          // of the group are summed on chip, so one atomic per (key, d) instead of HPG.
          %kv_row0 = arith.muli %b, %n : index
          %kv_row1 = arith.addi %kv_row0, %key0 : index
          %dk_items = arith.muli %visible, %head_dim : index
          scf.for %i = %lane to %dk_items step %lanes {
            %j = arith.divui %i, %head_dim : index
            %d = arith.remui %i, %head_dim : index
            %ds_q = scf.for %h = %c0 to %heads_per_group step %c1 iter_args(%acc = %zero) -> (f32) {
              %x = memref.load %ds_tile[%h, %j] : !onepass_score_tile
              %y = memref.load %q_tile[%h, %d] : !onepass_q_tile
              %y32 = ${EXTF} %y : ${E} to f32
              %xy = arith.mulf %x, %y32 : f32
              %sum = arith.addf %acc, %xy : f32
              scf.yield %sum : f32
            }
            %contribution = arith.mulf %ds_q, %scale : f32
            %row = arith.addi %kv_row1, %j : index
            %row_group0 = arith.muli %row, %kv_heads : index
            %row_group = arith.addi %row_group0, %g : index
            %at0 = arith.muli %row_group, %head_dim : index
            %at = arith.addi %at0, %d : index
            %at_i64 = arith.index_cast %at : index to i64
            %ptr = llvm.getelementptr %dkv_ptr[%at_i64] : (${ONEPASS_GLOBAL_PTR}, i64) -> ${ONEPASS_GLOBAL_PTR}, f32
            %before = llvm.atomicrmw fadd %ptr, %contribution monotonic ${ONEPASS_ATOMIC_ATTRIBUTES} : ${ONEPASS_GLOBAL_PTR}, f32
          }
          %dv_items = arith.muli %visible, %value_dim : index
          scf.for %i = %lane to %dv_items step %lanes {
            %j = arith.divui %i, %value_dim : index
            %e = arith.remui %i, %value_dim : index
            %contribution = scf.for %h = %c0 to %heads_per_group step %c1 iter_args(%acc = %zero) -> (f32) {
              %x = memref.load %p_tile[%h, %j] : !onepass_score_tile
              %y = memref.load %do_tile[%h, %e] : !onepass_do_tile
              %y32 = ${EXTF} %y : ${E} to f32
              %xy = arith.mulf %x, %y32 : f32
              %sum = arith.addf %acc, %xy : f32
              scf.yield %sum : f32
            }
            %row = arith.addi %kv_row1, %j : index
            %row_group0 = arith.muli %row, %kv_heads : index
            %row_group = arith.addi %row_group0, %g : index
            %at0 = arith.muli %row_group, %value_dim : index
            %at = arith.addi %at0, %e : index
            %at_i64 = arith.index_cast %at : index to i64
            %at_dv = arith.addi %dv_base, %at_i64 : i64
            %ptr = llvm.getelementptr %dkv_ptr[%at_dv] : (${ONEPASS_GLOBAL_PTR}, i64) -> ${ONEPASS_GLOBAL_PTR}, f32
            %before = llvm.atomicrmw fadd %ptr, %contribution monotonic ${ONEPASS_ATOMIC_ATTRIBUTES} : ${ONEPASS_GLOBAL_PTR}, f32
          }
          // The next selected block overwrites p_tile and ds_tile.
          ${ONEPASS_BARRIER}
        }
      }

      scf.for %i = %lane to %q_items step %lanes {
        %h = arith.divui %i, %head_dim : index
        %d = arith.remui %i, %head_dim : index
        %head = arith.addi %h0, %h : index
        %x = memref.load %dq_tile[%h, %d] : !onepass_dq_tile
        %scaled = arith.mulf %x, %scale : f32
        %x_e = ${TRUNCF} %scaled : f32 to ${E}
        memref.store %x_e, %dq[%b, %m, %head, %d] : memref<?x?x${H}x${D}x${E}>
      }
      return
    }
<% endcall %>

// Host side: zero the accumulator, run the dispatch, cast dk and dv to the input type.
// dk and dv share ONE zero-filled accumulator: two separately zero-filled tied operands are CSE'd into one
// value, and both results would then alias one buffer.
${ host.onepass("selection_attention_onepass_exe") }
