// The text the CPU row kernels (forward, dq, one-pass: one work item per (m, g, b)) share, as macros: the
// constants every CPU kernel (dk/dv's too) starts from, the row's q or do transposed onto the stack, its
// position, and the test and extent of one selected block.
<% import "common/rules.mlir" as rules %>

<# The opening of a CPU kernel's function @`name`: %c0, %c1, the kernel's own constants (the call block's
   text), then constants(). #>
<% macro function(name) %>
    func.func @${name}() {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
${ caller() }
${ constants() }
<%- endmacro %>

<# %pad (0 in E) and the configuration's sizes as index constants. #>
<% macro constants() %>
      %pad = arith.constant 0.0 : ${E}
      %heads_per_group = arith.constant ${HPG} : index
      %head_dim = arith.constant ${D} : index
      %value_dim = arith.constant ${DV} : index
      %block_size = arith.constant ${BS} : index
      %slots = arith.constant ${T} : index
      %kv_heads = arith.constant ${G} : index
<% endmacro %>

<# %`name` [`dim`, HPG] f32 on the stack: %`x` [b, m, %`h0` + heads, :] transposed, `cols` elements of `index`
   at a time (%`step`, up to %`bound`), times %scale_tile when `scaled`. #>
<% macro transposed(name, x, dim, cols, index, bound, step, h0, scaled) %>
      scf.for %${index}0 = %c0 to %${bound} step %${step} {
        %rows = vector.transfer_read %${x}[%b, %m, %${h0}, %${index}0], %pad
            {in_bounds = [true, true], permutation_map = affine_map<(b, m, h, ${index}) -> (h, ${index})>}
            : memref<?x?x${H}x${dim}x${E}>, vector<${HPG}x${cols}x${E}>
        %rows32 = ${EXTF} %rows : vector<${HPG}x${cols}x${E}> to vector<${HPG}x${cols}xf32>
        %cols = vector.transpose %rows32, [1, 0] : vector<${HPG}x${cols}xf32> to vector<${cols}x${HPG}xf32>
<% if scaled %>
        %scaled = arith.mulf %cols, %scale_tile : vector<${cols}x${HPG}xf32>
<% endif %>
        vector.transfer_write %${ "scaled" if scaled else "cols" }, %${name}[%${index}0, %c0] {in_bounds = [true, true]}
            : vector<${cols}x${HPG}xf32>, memref<${dim}x${HPG}xf32>
      }
<% endmacro %>

<# The inverse of transposed(): %`x` [b, m, %`h0` + heads, :] (type E) = %`name` [`dim`, HPG] f32 times
   %`weight` (vector<HPG>, one factor per head), `cols` elements of `index` at a time (%`step`, up to %`bound`):
   each tile transposed in registers and written as HPG contiguous runs of `cols` elements. #>
<% macro transposed_store(name, x, dim, cols, index, bound, step, h0, weight) %>
      %${weight}_tile = vector.broadcast %${weight} : vector<${HPG}xf32> to vector<${cols}x${HPG}xf32>
      scf.for %${index}0 = %c0 to %${bound} step %${step} {
        %cols = vector.transfer_read %${name}[%${index}0, %c0], %zero {in_bounds = [true, true]}
            : memref<${dim}x${HPG}xf32>, vector<${cols}x${HPG}xf32>
        %weighted = arith.mulf %cols, %${weight}_tile : vector<${cols}x${HPG}xf32>
        %rows = vector.transpose %weighted, [1, 0] : vector<${cols}x${HPG}xf32> to vector<${HPG}x${cols}xf32>
        %rows_e = ${TRUNCF} %rows : vector<${HPG}x${cols}xf32> to vector<${HPG}x${cols}x${E}>
        vector.transfer_write %rows_e, %${x}[%b, %m, %${h0}, %${index}0]
            {in_bounds = [true, true], permutation_map = affine_map<(b, m, h, ${index}) -> (h, ${index})>}
            : vector<${HPG}x${cols}x${E}>, memref<?x?x${H}x${dim}x${E}>
      }
<% endmacro %>

<# %offset, %pos (row m's position) and %last_visible (the last block it may see), from %n and %m_rows. #>
<% macro position() %>
      // pos(m) = m + N - M (bottom-right alignment); signed, in index arithmetic.
      ${ rules.offset() }
      ${ rules.position() }
      ${ rules.last_block("last_visible") }
<% endmacro %>

<# %block (slot %t's block) and %selected: whether the row reads it (not skipped, not in the future). #>
<% macro slot_block() %>
        %block_i32 = memref.load %block_indices[%b, %m, %g, %t] : memref<?x?x${G}x${T}xi32>
        %block = arith.index_cast %block_i32 : i32 to index
        %not_negative = arith.cmpi sge, %block, %c0 : index
        %not_future = arith.cmpi sle, %block, %last_visible : index
        %selected = arith.andi %not_negative, %not_future : i1
<% endmacro %>

<# Of selected %block: %key0 (its first key), %f (its flat block) and %visible (how many of its keys row m sees:
   those below it; with a window, from %first_visible on). #>
<% macro block_extent() %>
          %key0 = arith.muli %block, %block_size : index
          %bg = arith.muli %b, %kv_heads : index
          %bg_g = arith.addi %bg, %g : index
          %f0 = arith.muli %bg_g, %num_blocks : index
          %f = arith.addi %f0, %block : index
          // Keys key0 .. key0 + visible - 1 are visible: the whole block, or up to pos(m) in the diagonal one.
          %to_pos = arith.subi %pos, %key0 : index
          %to_pos_inclusive = arith.addi %to_pos, %c1 : index
          %visible = arith.minsi %to_pos_inclusive, %block_size : index
<% if WINDOW != "0" %>
          ${ rules.first_key("window_first") }
          %first_visible = arith.maxsi %window_first, %c0 : index
<% endif %>
<% endmacro %>

<# %full: the keys of the block scored `rows` (CPU_ROWS, %rows_step) at a time (the rest, %full .. %visible - 1,
   one at a time). When BS is a multiple of `rows`, %visible rounded up: the few keys past %visible that the last
   step scores lie inside the block, and nothing reads their scores; one key at a time is a chain of dependent
   FMAs. Else %visible rounded down. #>
<% macro whole_steps(rows) %>
<% if (BS | int) % (rows | int) == 0 %>
          %steps = arith.ceildivui %visible, %rows_step : index
          %full = arith.muli %steps, %rows_step : index
<% else %>
          %ragged = arith.remui %visible, %rows_step : index
          %full = arith.subi %visible, %ragged : index
<% endif %>
<% endmacro %>

<# %acc (vector<`rows` x HPG>) = the scores of `rows` consecutive keys from key %`key` of the transposed keys %kT
   (type `kt`, indexed [`at`, d, key]): sum_d kT[.., d, key + i] * qT[d, :], one vector load of the keys per d. #>
<% macro key_rows_scores(at, key, kt, rows) %>
%acc = scf.for %d = %c0 to %head_dim step %c1 iter_args(%acc = %zero_rows) -> (vector<${rows}x${HPG}xf32>) {
              %keys = vector.load %kT[${at}, %d, %${key}] : ${kt}, vector<${rows}x${E}>
              %keys32 = ${EXTF} %keys : vector<${rows}x${E}> to vector<${rows}xf32>
              %qd = vector.load %qT[%d, %c0] : memref<${D}x${HPG}xf32>, vector<${HPG}xf32>
              %acc_new = vector.outerproduct %keys32, %qd, %acc : vector<${rows}xf32>, vector<${HPG}xf32>
              scf.yield %acc_new : vector<${rows}x${HPG}xf32>
            }
<%- endmacro %>

<# %acc (vector<HPG>) = the scores of key %`key` alone: sum_d kT[`at`, d, key] * qT[d, :] (kT of type `kt`). #>
<% macro key_scores(at, key, kt) %>
%acc = scf.for %d = %c0 to %head_dim step %c1 iter_args(%acc = %zero_h) -> (vector<${HPG}xf32>) {
              %x = memref.load %kT[${at}, %d, %${key}] : ${kt}
              %x32 = ${EXTF} %x : ${E} to f32
              %xs = vector.broadcast %x32 : f32 to vector<${HPG}xf32>
              %qd = vector.load %qT[%d, %c0] : memref<${D}x${HPG}xf32>, vector<${HPG}xf32>
              %acc_new = vector.fma %xs, %qd, %acc : vector<${HPG}xf32>
              scf.yield %acc_new : vector<${HPG}xf32>
            }
<%- endmacro %>
