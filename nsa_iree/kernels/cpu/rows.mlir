// The text the CPU row kernels (forward, dq, one-pass: one work item per (m, g, b); the dense backward's rows)
// share, as macros: the constants every CPU kernel (dk/dv's too) starts from, the row's q or do transposed onto the
// stack, its position, and the test and extent of one selected block.
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
        ${ transpose_tile("rows32", "cols", HPG, cols) }
<% if scaled %>
        %scaled = arith.mulf %cols, %scale_tile : vector<${cols}x${HPG}xf32>
<% endif %>
        vector.transfer_write %${ "scaled" if scaled else "cols" }, %${name}[%${index}0, %c0] {in_bounds = [true, true]}
            : vector<${cols}x${HPG}xf32>, memref<${dim}x${HPG}xf32>
      }
<% endmacro %>

<# The inverse of transposed(): %`x` [b, m, %`h0` + heads, :] (type E) = %`name` [`dim`, HPG] f32 times
   %`weight` (vector<HPG>, one factor per head), `cols` elements of `index` at a time (%`step`, up to %`bound`):
   each tile transposed in registers and written as HPG contiguous runs of `cols` elements, with streaming stores
   when `stream` is "true" (CPU_O_STREAM: each run whole 64-byte lines, as products.dq_out's). #>
<% macro transposed_store(name, x, dim, cols, index, bound, step, h0, weight, stream) %>
      %${weight}_tile = vector.broadcast %${weight} : vector<${HPG}xf32> to vector<${cols}x${HPG}xf32>
      scf.for %${index}0 = %c0 to %${bound} step %${step} {
        %cols = vector.transfer_read %${name}[%${index}0, %c0], %zero {in_bounds = [true, true]}
            : memref<${dim}x${HPG}xf32>, vector<${cols}x${HPG}xf32>
        %weighted = arith.mulf %cols, %${weight}_tile : vector<${cols}x${HPG}xf32>
        ${ transpose_tile("weighted", "rows", cols, HPG) }
        %rows_e = ${TRUNCF} %rows : vector<${HPG}x${cols}xf32> to vector<${HPG}x${cols}x${E}>
<% if stream == "true" %>
        // Streaming stores (whole lines, not read into the cache first; the generic form: products.dq_out).
<% for i in range(HPG | int) %>
        %run${i} = vector.extract %rows_e[${i}] : vector<${cols}x${E}> from vector<${HPG}x${cols}x${E}>
        %head${i} = affine.apply affine_map<(h) -> (h + ${i})>(%${h0})
        "vector.store"(%run${i}, %${x}, %b, %m, %head${i}, %${index}0) <{nontemporal = true}>
            : (vector<${cols}x${E}>, memref<?x?x${H}x${dim}x${E}>, index, index, index, index) -> ()
<% endfor %>
<% else %>
        vector.transfer_write %rows_e, %${x}[%b, %m, %${h0}, %${index}0]
            {in_bounds = [true, true], permutation_map = affine_map<(b, m, h, ${index}) -> (h, ${index})>}
            : vector<${HPG}x${cols}x${E}>, memref<?x?x${H}x${dim}x${E}>
<% endif %>
      }
<% endmacro %>

<# %`dst` (vector<`cols` x `rows` x f32>) = %`src` (vector<`rows` x `cols` x f32>) transposed. A 16 x 16 tile (a
   512-bit register a row) goes through four rounds of 16 shuffles of two rows each (interleave single elements, then
   pairs, then exchange 128-bit lanes twice), which LLVM emits as one instruction each on AVX-512 (on AVX2 each row
   is two 256-bit halves: more instructions, the same result): IREE lowers a vector.transpose to one shuffle of all
   256 elements, emitted as many permutes per row. Other shapes: vector.transpose. #>
<% macro transpose_tile(src, dst, rows, cols) %>
<% if (rows | int) == 16 and (cols | int) == 16 %>
<% for i in range(16) %>
        %${dst}_r${i} = vector.extract %${src}[${i}] : vector<16xf32> from vector<16x16xf32>
<% endfor %>
        // Round 1: a0 b0 a1 b1 | a2 b2 a3 b3 of rows 2k, 2k + 1 in every 128-bit lane.
<% for k in range(8) %>
        %${dst}_a${2 * k} = vector.shuffle %${dst}_r${2 * k}, %${dst}_r${2 * k + 1} [${ lane_mask([0, 16, 1, 17]) }] : vector<16xf32>, vector<16xf32>
        %${dst}_a${2 * k + 1} = vector.shuffle %${dst}_r${2 * k}, %${dst}_r${2 * k + 1} [${ lane_mask([2, 18, 3, 19]) }] : vector<16xf32>, vector<16xf32>
<% endfor %>
        // Round 2: lane l of %<dst>_b<4a + p> holds element 4 l + p of rows 4a .. 4a + 3.
<% for a in range(4) %>
<% for p in range(4) %>
        %${dst}_b${4 * a + p} = vector.shuffle %${dst}_a${4 * a + p // 2}, %${dst}_a${4 * a + 2 + p // 2} [${ lane_mask([0, 1, 16, 17] if p % 2 == 0 else [2, 3, 18, 19]) }] : vector<16xf32>, vector<16xf32>
<% endfor %>
<% endfor %>
        // Rounds 3 and 4: row 4 l + p of the result is lane l of %<dst>_b<p>, <4 + p>, <8 + p>, <12 + p>.
<% for p in range(4) %>
<% for h in range(2) %>
        %${dst}_x${p}_${h} = vector.shuffle %${dst}_b${p}, %${dst}_b${4 + p} [${ lane_picks([[0, h], [0, h + 2], [1, h], [1, h + 2]]) }] : vector<16xf32>, vector<16xf32>
        %${dst}_y${p}_${h} = vector.shuffle %${dst}_b${8 + p}, %${dst}_b${12 + p} [${ lane_picks([[0, h], [0, h + 2], [1, h], [1, h + 2]]) }] : vector<16xf32>, vector<16xf32>
<% endfor %>
<% for l in range(4) %>
        %${dst}_c${4 * l + p} = vector.shuffle %${dst}_x${p}_${l % 2}, %${dst}_y${p}_${l % 2} [${ lane_picks([[0, l // 2], [0, l // 2 + 2], [1, l // 2], [1, l // 2 + 2]]) }] : vector<16xf32>, vector<16xf32>
<% endfor %>
<% endfor %>
        %${dst}_0 = ub.poison : vector<16x16xf32>
<% for i in range(16) %>
        %${dst}${ "_" ~ (i + 1) if not loop.last else "" } = vector.insert %${dst}_c${i}, %${dst}_${i}[${i}] : vector<16xf32> into vector<16x16xf32>
<% endfor %>
<% else %>
        %${dst} = vector.transpose %${src}, [1, 0] : vector<${rows}x${cols}xf32> to vector<${cols}x${rows}xf32>
<% endif %>
<%- endmacro %>

<# The mask of a shuffle of two 16-element vectors that takes, in each 128-bit lane l, elements 4 l + o for the
   four `offsets` o (o + 16: of the second vector). #>
<% macro lane_mask(offsets) %><% for l in range(4) %><% set last_lane = loop.last %><% for o in offsets %>${ 4 * l + o }${ "" if last_lane and loop.last else ", " }<% endfor %><% endfor %><% endmacro %>

<# The mask of a shuffle of two 16-element vectors whose 128-bit lanes are `picks`: [v, l] is lane l of vector v
   (0: the first, 1: the second). #>
<% macro lane_picks(picks) %><% for v, l in picks %><% set last_pick = loop.last %><% for e in range(4) %>${ 16 * v + 4 * l + e }${ "" if last_pick and loop.last else ", " }<% endfor %><% endfor %><% endmacro %>

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
