// One-pass backward on CPUs: one hand-written dispatch over (query row m, kv group g, batch b) computes dq
// and adds the row's dk/dv contributions, then one small dispatch scales and casts dk/dv. Per selected block,
// with vectors along the block's BS keys (the layout of dkdv_cpu.mlir):
//   S[h, :] = sum_d qT[d, h] * kT[d, :],  P = exp(S - lse[h]),  dP[h, :] = sum_e doT[e, h] * vT[e, :],
//   DS = P * (dP - delta[h])                                  (qT = scale * q and doT: the row's, transposed
//                                                              on the stack once per row)
//   dq[h, :] += sum_j DS[h, j] * k[key j, :]                  (from DS transposed, in registers)
//   dv[key j, :] += sum_h P[h, j] * do[h, :],  dk[key j, :] += sum_h DS[h, j] * q[h, :]
// The dk/dv adds go to an f32 accumulator row of the block, [BS, D + Dv], while the work item holds that
// block's lock (a spin lock per kv block: one compare-and-swap per (row, block), not one atomic per element
// as the GPU one-pass needs). A row that finds the lock taken CPU_LOCK_TRIES times (its holder descheduled by
// the OS) adds with f32 atomics instead, into a second accumulator that only atomics touch; dk and dv are the
// sums of the two. Rows run in any order, so dk/dv vary run to run within rounding, as on GPUs.
// Skipped slots are never read, only keys <= pos(m) are, a block listed twice counts twice.
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/host.mlir" as host %>
<% import "cpu/host.mlir" as cpu %>
<% import "cpu/products.mlir" as products %>
<% import "cpu/rows.mlir" as rows %>
<% import "common/blocks.mlir" as blocks %>

// Push constants: B, M, N (i32), then the bits of scale (f32).
<% set inputs = ['q', ("kT", "memref<?x" ~ D ~ "x" ~ BS ~ "x" ~ E ~ ">{%flat_blocks}", "key_blocks_t [B * G * NB, D, BS] (mlir/cpu_blocks.mlir)"), ("vT", "memref<?x" ~ DV ~ "x" ~ BS ~ "x" ~ E ~ ">{%flat_blocks}", "value_blocks_t [B * G * NB, Dv, BS]"), 'k', 'block_indices', 'lse', 'delta', 'do'] %>
<% set outputs = [("acc", "memref<?x" ~ BS ~ "x" ~ CPU_DKV ~ "xf32>{%acc_rows}", "dk/dv f32 accumulator [B * G * NB, BS, D + Dv] (tied, 0)"), ("locks", "memref<?xi32>{%flat_blocks}", "locks [B * G * NB] i32 (tied, 0: free)"), 'dq'] %>
${ dispatch.layout("onepass_cpu_layout", 4, inputs, outputs) }

<% call dispatch.executable("selection_attention_onepass_cpu_exe", "selection_attention_onepass_cpu_row", "onepass_cpu_layout", ['m_rows', 'kv_heads', 'batch']) %>
<% call rows.function("selection_attention_onepass_cpu_row") %>
      %c2 = arith.constant 2 : index
      %c0_i32 = arith.constant 0 : i32
      %c1_i32 = arith.constant 1 : i32
      %c4_i64 = arith.constant 4 : i64
      %true = arith.constant true
      %zero = arith.constant 0.0 : f32
<% endcall %>
      %heads_step = arith.constant ${CPU_SROWS} : index
      %dcols_step = arith.constant ${CPU_DCOLS} : index
      %cols_step = arith.constant ${CPU_COLS} : index
${ products.constants(CPU_KROWS, CPU_VCOLS, CPU_KCOLS, CPU_SROWS) }

${ dispatch.ids(['m', 'g', 'b']) }
${ dispatch.push_constants("onepass_cpu_layout", ['batch', 'm_rows', 'n', 'scale']) }
      %num_blocks = arith.ceildivui %n, %block_size : index
      %bg_count = arith.muli %batch, %kv_heads : index
      %flat_blocks = arith.muli %bg_count, %num_blocks : index

${ dispatch.bindings("onepass_cpu_layout", inputs, outputs, only=['q', 'kT', 'vT', 'k', 'block_indices', 'lse', 'delta', 'do']) }
      %acc_rows = arith.muli %flat_blocks, %c2 : index
${ dispatch.bindings("onepass_cpu_layout", inputs, outputs, only=['acc', 'locks', 'dq']) }
      %locks_address = memref.extract_aligned_pointer_as_index %locks : memref<?xi32> -> index
      %acc_address = memref.extract_aligned_pointer_as_index %acc : memref<?x${BS}x${CPU_DKV}xf32> -> index
      %acc_address_i64 = arith.index_cast %acc_address : index to i64
      %acc_base = llvm.inttoptr %acc_address_i64 : i64 to !llvm.ptr
      %zero_v = arith.constant dense<0.0> : vector<${CPU_KROWS}x${CPU_VCOLS}xf32>
      %zero_k = arith.constant dense<0.0> : vector<${CPU_KROWS}x${CPU_KCOLS}xf32>
      %part_v = memref.alloca() : memref<${CPU_KROWS}x${CPU_VCOLS}xf32>
      %part_k = memref.alloca() : memref<${CPU_KROWS}x${CPU_KCOLS}xf32>
      %locks_address_i64 = arith.index_cast %locks_address : index to i64

      %qT = memref.alloca() : memref<${D}x${HPG}xf32>
      %doT = memref.alloca() : memref<${DV}x${HPG}xf32>
      %s_tile = memref.alloca() : memref<${HPG}x${BS}xf32>
      %dp_tile = memref.alloca() : memref<${HPG}x${BS}xf32>
      %ds_t = memref.alloca() : memref<${BS}x${HPG}xf32>
      %dq_tile = memref.alloca() : memref<${HPG}x${D}xf32>

      %h_first = arith.muli %g, %heads_per_group : index
      %zero_h = arith.constant dense<0.0> : vector<${HPG}xf32>
      %scale_tile = vector.broadcast %scale : f32 to vector<${CPU_DCOLS}x${HPG}xf32>
${ rows.transposed("qT", "q", D, CPU_DCOLS, "d", "head_dim", "dcols_step", "h_first", true) }
${ rows.transposed("doT", "do", DV, CPU_COLS, "e", "value_dim", "cols_step", "h_first", false) }
      %zero_d = arith.constant dense<0.0> : vector<${D}xf32>
      scf.for %h = %c0 to %heads_per_group step %c1 {
        vector.store %zero_d, %dq_tile[%h, %c0] : memref<${HPG}x${D}xf32>, vector<${D}xf32>
      }

${ rows.position() }
      // Row m starts at slot (m * CPU_SLOT_STRIDE) mod T (T / 2 slots further than row m - 1): neighbouring
      // rows run at the same time on the task system's workers and select mostly the same blocks (block 0 and
      // the local ones, in the same slots of their sorted lists), so in step they would wait for each other's
      // locks; half a row apart they seldom do.
      %slot_stride = arith.constant ${CPU_SLOT_STRIDE} : index
      %first_slot = arith.muli %m, %slot_stride : index
      scf.for %step = %c0 to %slots step %c1 {
        %shifted_slot = arith.addi %step, %first_slot : index
        %t = arith.remui %shifted_slot, %slots : index
${ rows.slot_block() }
        scf.if %selected {
${ rows.block_extent() }
          %visible_v = vector.broadcast %visible : index to vector<${BS}xindex>
          %key_mask = arith.cmpi slt, %key_iota, %visible_v : vector<${BS}xindex>

          // S and dP, CPU_SROWS heads at a time (their key vectors accumulate in registers).
${ products.scores(none, CPU_SROWS) }
          // P = exp(S - lse) on visible keys (0 elsewhere), DS = P * (dP - delta): in place.
${ products.p_ds(false) }
          // DS transposed, CPU_SROWS heads at a time (register shuffles, not one store per element).
          scf.for %h0 = %c0 to %heads_per_group step %heads_step {
            %tile = vector.transfer_read %dp_tile[%h0, %c0], %zero {in_bounds = [true, true]}
                : memref<${HPG}x${BS}xf32>, vector<${CPU_SROWS}x${BS}xf32>
            %tile_t = vector.transpose %tile, [1, 0] : vector<${CPU_SROWS}x${BS}xf32> to vector<${BS}x${CPU_SROWS}xf32>
            vector.transfer_write %tile_t, %ds_t[%c0, %h0] {in_bounds = [true, true]}
                : vector<${BS}x${CPU_SROWS}xf32>, memref<${BS}x${HPG}xf32>
          }
          // dq[h, :] += sum_j DS[h, j] k[key0 + j, :], CPU_SROWS heads times CPU_KCOLS elements per block.
          scf.for %h0 = %c0 to %heads_per_group step %heads_step {
            scf.for %d0 = %c0 to %head_dim step %kcols_step {
              %old = vector.transfer_read %dq_tile[%h0, %d0], %zero {in_bounds = [true, true]}
                  : memref<${HPG}x${D}xf32>, vector<${CPU_SROWS}x${CPU_KCOLS}xf32>
              %new = scf.for %j = %c0 to %visible step %c1 iter_args(%a = %old) -> (vector<${CPU_SROWS}x${CPU_KCOLS}xf32>) {
                %key = arith.addi %key0, %j : index
                %dsj = vector.load %ds_t[%j, %h0] : memref<${BS}x${HPG}xf32>, vector<${CPU_SROWS}xf32>
                %kr = vector.load %k[%b, %key, %g, %d0] : memref<?x?x${G}x${D}x${E}>, vector<${CPU_KCOLS}x${E}>
                %kr32 = ${EXTF} %kr : vector<${CPU_KCOLS}x${E}> to vector<${CPU_KCOLS}xf32>
                %a_new = vector.outerproduct %dsj, %kr32, %a : vector<${CPU_SROWS}xf32>, vector<${CPU_KCOLS}xf32>
                scf.yield %a_new : vector<${CPU_SROWS}x${CPU_KCOLS}xf32>
              }
              vector.transfer_write %new, %dq_tile[%h0, %d0] {in_bounds = [true, true]}
                  : vector<${CPU_SROWS}x${CPU_KCOLS}xf32>, memref<${HPG}x${D}xf32>
            }
          }

          // The block's lock: a compare-and-swap 0 -> 1 (acquire), released by an exchange to 0, tried up to
          // CPU_LOCK_TRIES times. A holder the OS has descheduled (more runnable threads than cores) would keep
          // a spinning worker waiting for its whole time slice, so after that many tries the row adds its
          // dk/dv contribution with per-element f32 atomic adds instead (slower, never waiting).
          %f_i64 = arith.index_cast %f : index to i64
          %lock_offset = arith.muli %f_i64, %c4_i64 : i64
          %lock_address = arith.addi %locks_address_i64, %lock_offset : i64
          %lock = llvm.inttoptr %lock_address : i64 to !llvm.ptr
          %tries_limit = arith.constant ${CPU_LOCK_TRIES} : index
          %tries, %taken = scf.while (%tried = %c0) : (index) -> (index, i1) {
            %swap = llvm.cmpxchg %lock, %c0_i32, %c1_i32 acquire monotonic : !llvm.ptr, i32
            %got = llvm.extractvalue %swap[1] : !llvm.struct<(i32, i1)>
            %busy = arith.xori %got, %true : i1
            %again = arith.cmpi ult, %tried, %tries_limit : index
            %retry = arith.andi %busy, %again : i1
            scf.condition(%retry) %tried, %got : index, i1
          } do {
          ^bb0(%tried: index, %got: i1):
            %next = arith.addi %tried, %c1 : index
            scf.yield %next : index
          }
          // The atomic adds go to the second half of the accumulator, which only atomics touch: never to the
          // block's locked half, whose holder adds with plain loads and stores (an atomic add there could land
          // between its load and its store, and be lost).
          %f_atomic = arith.addi %f, %flat_blocks : index
          scf.if %taken {
${ products.add_to_acc(CPU_KROWS, CPU_VCOLS, CPU_KCOLS, CPU_DKV) }
            %released = llvm.atomicrmw xchg %lock, %c0_i32 release : !llvm.ptr, i32
          } else {
            scf.for %j0 = %c0 to %visible step %keys_step {
<% call(p) products.parts(CPU_VCOLS, CPU_KCOLS) %>
${ products.part_loop(p) }
${ products.head_sum(p.zero, p, CPU_KROWS) }
                vector.transfer_write %new, %${p.part}[%c0, %c0] {in_bounds = [true, true]}
                    : vector<${CPU_KROWS}x${p.cols}xf32>, memref<${CPU_KROWS}x${p.cols}xf32>
                scf.for %r = %c0 to %keys_step step %c1 {
                  scf.for %x = %c0 to %${p.step} step %c1 {
                    %part = memref.load %${p.part}[%r, %x] : memref<${CPU_KROWS}x${p.cols}xf32>
                    %row = arith.addi %j0, %r : index
                    %column = arith.addi %${p.at}, %x : index
                    %ptr = func.call @acc_element(%acc_base, %f_atomic, %row, %column) : (!llvm.ptr, index, index, index) -> !llvm.ptr
                    %before = llvm.atomicrmw fadd %ptr, %part monotonic : !llvm.ptr, f32
                  }
                }
              }
<% endcall %>
            }
          }
        }
      }

      scf.for %h = %c0 to %heads_per_group step %c1 {
        %head = arith.addi %h_first, %h : index
        %row = vector.load %dq_tile[%h, %c0] : memref<${HPG}x${D}xf32>, vector<${D}xf32>
        %scale_d = vector.broadcast %scale : f32 to vector<${D}xf32>
        %out = arith.mulf %row, %scale_d : vector<${D}xf32>
        %out_e = ${TRUNCF} %out : vector<${D}xf32> to vector<${D}x${E}>
        vector.store %out_e, %dq[%b, %m, %head, %c0] : memref<?x?x${H}x${D}x${E}>, vector<${D}x${E}>
      }
      return
    }

    // The address of acc[f, row, column] (f32), for the atomic adds.
    func.func private @acc_element(%base: !llvm.ptr, %f: index, %row: index, %column: index) -> !llvm.ptr {
      %block_size = arith.constant ${BS} : index
      %dkv_dim = arith.constant ${CPU_DKV} : index
      %rows0 = arith.muli %f, %block_size : index
      %rows = arith.addi %rows0, %row : index
      %at0 = arith.muli %rows, %dkv_dim : index
      %at = arith.addi %at0, %column : index
      %at_i64 = arith.index_cast %at : index to i64
      %ptr = llvm.getelementptr %base[%at_i64] : (!llvm.ptr, i64) -> !llvm.ptr, f32
      return %ptr : !llvm.ptr
    }
<% endcall %>

// Host side: the transposed K/V blocks, the row dispatch (zeroed accumulators and locks, tied), then dk and dv:
// scale * (locked + atomic)[:, :, :D] and (locked + atomic)[:, :, D:] for the keys below N, in the input type.
${ host.onepass_signature() }
<% call host.sizes() %>
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %c0_i32 = arith.constant 0 : i32
  %kv_heads = arith.constant ${G} : index
  %block_size = arith.constant ${BS} : index
  %head_dim = arith.constant ${D} : index
<% endcall %>
${ cpu.flat_blocks() }

${ cpu.blocks_t() }
  // The dk/dv accumulator: per flat block, [BS, D + Dv] added under the block's lock, then (second half) the
  // same again for the rows that added with atomics; dk and dv are the sums of the two.
  %acc_rows = arith.muli %flat_blocks, %c2 : index
  %acc_init = tensor.empty(%acc_rows) : tensor<?x${BS}x${CPU_DKV}xf32>
  %acc_zero = linalg.fill ins(%zero : f32) outs(%acc_init : tensor<?x${BS}x${CPU_DKV}xf32>) -> tensor<?x${BS}x${CPU_DKV}xf32>
  %locks_init = tensor.empty(%flat_blocks) : tensor<?xi32>
  %locks_free = linalg.fill ins(%c0_i32 : i32) outs(%locks_init : tensor<?xi32>) -> tensor<?xi32>
${ host.push_constants() }
  %acc, %locks, %dq = flow.dispatch @selection_attention_onepass_cpu_exe::@selection_attention_onepass_cpu_row[%m_rows, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %q, %key_blocks_t, %value_blocks_t, %k, %block_indices, %lse,
      %delta, %do, %acc_zero, %locks_free)
      : (i32, i32, i32, i32, ${ dispatch.tensor_types(inputs + outputs[:2]) })
      -> (%acc_zero{%acc_rows}, %locks_free{%flat_blocks}, tensor<?x?x${H}x${D}x${E}>{%batch, %m_rows})

<# `name` [B, N, G, `dim`] in DKV_E (index `index`): the locked plus the atomic accumulator at column `col`
   (an SSA name, or none for the index itself), times scale when `scaled`. #>
<% macro accumulated(name, dim, index, col, scaled) %>
<% set at = col or index %>
  %${name}_init = tensor.empty(%batch, %n) : tensor<?x?x${G}x${dim}x${DKV_E}>
  %${name} = linalg.generic {
      indexing_maps = [affine_map<(b, n, g, ${index}) -> (b, n, g, ${index})>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      outs(%${name}_init : tensor<?x?x${G}x${dim}x${DKV_E}>) {
  ^bb0(%out: ${DKV_E}):
    %b = linalg.index 0 : index
    %key = linalg.index 1 : index
    %g = linalg.index 2 : index
    %${index} = linalg.index 3 : index
${ blocks.flat_block("i", "f", "    ") }
<% if col %>
    %${col} = arith.addi %head_dim, %${index} : index
<% endif %>
    %f_atomic = arith.addi %f, %flat_blocks : index
    %locked = tensor.extract %acc[%f, %j, %${at}] : tensor<?x${BS}x${CPU_DKV}xf32>
    %atomic = tensor.extract %acc[%f_atomic, %j, %${at}] : tensor<?x${BS}x${CPU_DKV}xf32>
    %x = arith.addf %locked, %atomic : f32
<% if scaled %>
    %scaled = arith.mulf %x, %scale : f32
    %x_e = ${DKV_TRUNCF} %scaled : f32 to ${DKV_E}
<% else %>
    %x_e = ${DKV_TRUNCF} %x : f32 to ${DKV_E}
<% endif %>
    linalg.yield %x_e : ${DKV_E}
  } -> tensor<?x?x${G}x${dim}x${DKV_E}>
<% endmacro %>
${ accumulated("dk", D, "d", none, true) }
${ accumulated("dv", DV, "e", "col", false) }
  return %dq, %dk, %dv : tensor<?x?x${H}x${D}x${E}>, tensor<?x?x${G}x${D}x${DKV_E}>, tensor<?x?x${G}x${DV}x${DKV_E}>
}
