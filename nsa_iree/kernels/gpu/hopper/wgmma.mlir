<# Macros of the hopper kernels (imported as wg): Hopper's warpgroup matrix multiply (wgmma, sm_90a) from a
   hand-written dispatch, through the nvvm ops IREE 3.13 lowers (docs/performance.md, 'wgmma from a hand-written
   dispatch'). A warpgroup is the workgroup's 4 subgroups of 32 lanes; its m64 tile's row 16 w + r (+ 8) belongs
   to lane 4 r + c of subgroup w, which holds columns 8 i + 2 c and + 1 of it, as an mma.sync fragment does:
   accumulator value 4 i + 2 h + e is row 16 w + r + 8 h, column 8 i + 2 c + e.
   Operands in workgroup memory are in wgmma's 128-byte swizzled layout: a [rows, width] tile of 16-bit elements
   (`width` contiguous elements a row: K for a K-major operand, N for an MN-major one) is width / 64 column blocks
   of rows x 128 bytes, row r of a block one 128-byte line whose 16-byte chunk c is stored at chunk c ^ (r mod 8)
   (swizzled_offset; tiles 1024-byte aligned). A row's sectors stay whole (16-byte chunks that land apart would
   make each copy read its 32-byte sector alone: twice the L2 reads), 8 lanes copy a row's line without bank
   conflicts, and a wgmma reads 8 rows' chunks from 8 banks.
#>

<# !llvm.struct of `n` f32: a wgmma accumulator, `n` values a lane. #>
<% macro acc_type(n) %>!llvm.struct<(${ (["f32"] * (n | int)) | join(", ") })><% endmacro %>

<# Copy item `item` (index) of a [rows, width] tile in the swizzled layout, items along the rows (coalesced):
   %`name`_row, %`name`_col (its 8 elements' first column) and %`name`_dest (the element it is stored at). #>
<% macro core_item(name, item, rows, width) %>
            %${name}_chunks = arith.constant ${ (width | int) // 8 } : index
            %${name}_chunk = arith.remui ${item}, %${name}_chunks : index
            %${name}_row = arith.divui ${item}, %${name}_chunks : index
            %${name}_col = arith.muli %${name}_chunk, %c8 : index
            %${name}_block = arith.divui %${name}_chunk, %c8 : index
            %${name}_block_elements = arith.constant ${ (rows | int) * 64 } : index
            %${name}_block_at = arith.muli %${name}_block, %${name}_block_elements : index
            %${name}_line_at = arith.muli %${name}_row, %c64 : index
            %${name}_in_line = arith.remui %${name}_chunk, %c8 : index
            %${name}_row8 = arith.remui %${name}_row, %c8 : index
            %${name}_swizzled = arith.xori %${name}_in_line, %${name}_row8 : index
            %${name}_chunk_at = arith.muli %${name}_swizzled, %c8 : index
            %${name}_at0 = arith.addi %${name}_block_at, %${name}_line_at : index
            %${name}_dest = arith.addi %${name}_at0, %${name}_chunk_at : index
<% endmacro %>

<# %`name` (i64): the matrix descriptor of the operand at byte `offset` (an index value) of the workgroup
   allocation at %smem_base (i64), in the 128-byte swizzled layout: stride byte offset `sbo` (the next 8 rows of a
   K-major operand, the next 8 rows along K of an MN-major one) and leading byte offset `lbo` (an MN-major
   operand's next column block; unused by a K-major one). #>
<% macro descriptor(name, offset, lbo, sbo) %>
      %${name}_offset = arith.index_cast ${offset} : index to i64
      %${name}_addr = arith.addi %smem_base, %${name}_offset : i64
      %${name}_addr4 = arith.shrui %${name}_addr, %c4_i64 : i64
      %${name}_low = arith.andi %${name}_addr4, %c16383_i64 : i64
      %${name}_fields = arith.constant ${ 4611686018427387904 + ((sbo | int) // 16) * 4294967296 + ((lbo | int) // 16) * 65536 } : i64
      %${name} = arith.ori %${name}_low, %${name}_fields : i64
<% endmacro %>

<# %`result` (acc_t) = %`acc` + the sum over the k16 steps of A (descriptor %`a`, a_offsets[s] bytes further at
   step s) times B (%`b`, b_offsets[s] bytes further; `acc` none: the product alone): one wgmma m64 n`n` k16 per step with `dtype` inputs and f32
   accumulators, A K-major, B K-major (`b_layout` "col") or MN-major ("row"); issued after a fence, committed and
   waited for. The values then pass an empty asm statement that names them all, so nothing reads them before the
   wait. #>
<% macro chain(result, acc, a, a_offsets, b, b_offsets, n, dtype, b_layout, acc_t, a_layout="row") %>
      nvvm.wgmma.fence.aligned
      ${ steps(result, acc, a, a_offsets, b, b_offsets, n, dtype, b_layout, acc_t, a_layout) | trim }
      nvvm.wgmma.commit.group.sync.aligned
      nvvm.wgmma.wait.group.sync.aligned 0
${ settled(result, (a_offsets | length) - 1, n, acc_t) }
<% endmacro %>

<# chain() with A from registers: %`result` (acc_t) = %`acc` + the sum over the k16 steps s (one per b_offsets[s])
   of A times B (%`b`, b_offsets[s] bytes further; `b_layout` as chain's), A an m64 accumulator's values re-tiled:
   %`a_pairs`<4 i + 2 h> (i32) holds its values 4 i + 2 h and + 1 (row 16 w + r + 8 h, columns 8 i + 2 c and + 1)
   as a pair of `dtype` values, and step s takes pairs 8 s, 8 s + 2, 8 s + 4 and 8 s + 6 as its fragment's 4 words
   (the mma.sync A fragment's layout: rows r, r + 8, r, r + 8, columns 2 c (+ 1) of the step, then 8 further).
   Through inline PTX: IREE 3.13's nvvm.wgmma.mma_async takes A from workgroup memory only. Each accumulator value
   keeps its operand number through the steps (d tied to the step before's); issued after a fence, committed,
   waited for and settled as chain's. #>
<% macro chain_registers(result, acc, a_pairs, b, b_offsets, n, dtype, b_layout, acc_t) %>
<% set count = (n | int) // 2 %>
<% set d_operands = "$" ~ (range(count) | map("string") | join(", $")) %>
<% set constraints = (["=f"] * count + range(count) | map("string") | list + ["r"] * 4 + ["l"]) | join(",") %>
      nvvm.wgmma.fence.aligned
<% for s in range(b_offsets | length) %>
<% set previous = acc if loop.first else "%" ~ result ~ "_" ~ (s - 1) %>
      %${result}_b_step${s} = arith.constant ${ (b_offsets[s] | int) // 16 } : i64
      %${result}_b${s} = arith.addi ${b}, %${result}_b_step${s} : i64
${ values(result ~ "_in" ~ s ~ "_", previous, count, acc_t) }
      %${result}_${s} = llvm.inline_asm has_side_effects "{ .reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n${n}k16.f32.${dtype}.${dtype} {${d_operands}}, {$${2 * count}, $${2 * count + 1}, $${2 * count + 2}, $${2 * count + 3}}, $${2 * count + 4}, p, 1, 1, ${ 1 if b_layout == "row" else 0 }; }", "${constraints}"
          <% for v in range(count) %>%${result}_in${s}__${v}, <% endfor %>${a_pairs}${8 * s}, ${a_pairs}${8 * s + 2}, ${a_pairs}${8 * s + 4}, ${a_pairs}${8 * s + 6}, %${result}_b${s}
          : (${ (["f32"] * count + ["i32"] * 4 + ["i64"]) | join(", ") }) -> ${acc_t}
<% endfor %>
      nvvm.wgmma.commit.group.sync.aligned
      nvvm.wgmma.wait.group.sync.aligned 0
${ settled(result, (b_offsets | length) - 1, n, acc_t) }
<% endmacro %>

<# Several chains (each a tuple of chain's arguments but dtype: result, acc, a, a_offsets, b, b_offsets, n,
   b_layout, acc_t, and optionally a_layout) issued one after the other in one group, committed and waited for once: the tensor cores take
   the second while the first drains. The call block's text, if any, comes between the commit and the wait (the
   lanes' work while the tensor cores multiply). #>
<% macro chains(items, dtype) %>
${ issue(items, dtype) }
<% if caller is defined %>
${ caller() }
<%- endif %>
${ settle(items) }
<% endmacro %>

<# The first half of chains(): the group issued and committed, not waited for (settle() waits). #>
<% macro issue(items, dtype) %>
      nvvm.wgmma.fence.aligned
<% for x in items %>
      ${ steps(x[0], x[1], x[2], x[3], x[4], x[5], x[6], dtype, x[7], x[8], x[9] if x | length > 9 else "row") | trim }
<% endfor %>
      nvvm.wgmma.commit.group.sync.aligned
<%- endmacro %>

<# The second half: the wait for every group issued, then each chain of `items` settled (its %`result`). #>
<% macro settle(items) %>
      nvvm.wgmma.wait.group.sync.aligned 0
<% for x in items %>
${ settled(x[0], (x[3] | length) - 1, x[6], x[8]) }
<% endfor %>
<%- endmacro %>

<# A chain's wgmma steps (chain's arguments): %`result`_<step> after each. `acc` none: the product alone (the first
   step's accumulator not read: no registers zeroed, none shared with a chain in flight). #>
<% macro steps(result, acc, a, a_offsets, b, b_offsets, n, dtype, b_layout, acc_t, a_layout="row") %>
<% if acc is none %>
      %${result}_undef = llvm.mlir.undef : ${acc_t}
<% endif %>
<% for s in range(a_offsets | length) %>
<% set previous = (acc or "%" ~ result ~ "_undef") if loop.first else "%" ~ result ~ "_" ~ (s - 1) %>
      %${result}_a_step${s} = arith.constant ${ (a_offsets[s] | int) // 16 } : i64
      %${result}_b_step${s} = arith.constant ${ (b_offsets[s] | int) // 16 } : i64
      %${result}_a${s} = arith.addi ${a}, %${result}_a_step${s} : i64
      %${result}_b${s} = arith.addi ${b}, %${result}_b_step${s} : i64
      %${result}_${s} = nvvm.wgmma.mma_async %${result}_a${s}, %${result}_b${s}, ${previous},
          #nvvm.shape<m = 64, n = ${n}, k = 16>,
          D [<f32>, #nvvm.wgmma_scale_out<${ "zero" if acc is none and loop.first else "one" }>],
          A [<${dtype}>, #nvvm.wgmma_scale_in<one>, <${a_layout}>],
          B [<${dtype}>, #nvvm.wgmma_scale_in<one>, <${b_layout}>]
          : ${acc_t} -> ${acc_t}
<% endfor %>
<%- endmacro %>

<# %`result` (acc_t): a chain's last step %`result`_`last` after the wait, its values through an empty asm statement
   that names them all (so that nothing reads them before the wait). #>
<% macro settled(result, last, n, acc_t) %>
<% set count = (n | int) // 2 %>
${ values(result ~ "_f", "%" ~ result ~ "_" ~ last, count, acc_t) }
      %${result} = llvm.inline_asm has_side_effects "", "${ (["=f"] * count + range(count) | map("string") | list) | join(",") }"
          <% for v in range(count) %>%${result}_f_${v}${ ", " if not loop.last }<% endfor %> : (${ (["f32"] * count) | join(", ") }) -> ${acc_t}
<%- endmacro %>

<# The values of accumulator `acc` (acc_t, `count` values) as %`name`_<index> (f32). #>
<% macro values(name, acc, count, acc_t) %>
<% for v in range(count | int) %>
      %${name}_${v} = llvm.extractvalue ${acc}[${v}] : ${acc_t}
<% endfor %>
<% endmacro %>


<# Stage rows `row0` .. `row0` + `rows` - 1 (row0 an index value) of kv group %g's query rows of `x` (%`x`, a
   [B, M, H, `width`] memref of type `x_type`; row R is position R / HPG, head %h0 + R mod HPG; zeros past
   %group_rows) into the [rows, width] tile at element `base` (an index value) of %elements (`elements_t`): cp.async
   from the `lanes` lanes (%tid, %lanes), items along the rows, with the recipe's `hint`. `listed`: the rows are a
   dk/dv piece's instead (gpu/piece_rows.mlir's %row_info, !dkv_row_info): row R is the query row of piece row
   `row0` + R / HPG, head %h0 + R mod HPG; zeros for a padding row. #>
<% macro stage_rows(x, x_type, row0, rows, width, base, lanes, elements_t, hint, listed=false) %>
      %${x}_copies = arith.constant ${ (rows | int) * (width | int) // 8 // (lanes | int) } : index
      scf.for %i = %c0 to %${x}_copies step %c1 {
        %i_lanes = arith.muli %i, %lanes : index
        %item = arith.addi %tid, %i_lanes : index
${ core_item(x, "%item", rows, width) }
<% if listed %>
        %${x}_piece_row0 = arith.divui %${x}_row, %heads_per_group : index
        %${x}_piece_row = arith.addi ${row0}, %${x}_piece_row0 : index
        %${x}_m_i32 = memref.load %row_info[%${x}_piece_row, %c0] : !dkv_row_info
        %${x}_real = arith.cmpi sge, %${x}_m_i32, %c0_i32 : i32
        %${x}_m_safe = arith.maxsi %${x}_m_i32, %c0_i32 : i32
        %${x}_m = arith.index_castui %${x}_m_safe : i32 to index
        %${x}_h = arith.remui %${x}_row, %heads_per_group : index
<% else %>
        %${x}_group_row = arith.addi ${row0}, %${x}_row : index
        %${x}_real = arith.cmpi ult, %${x}_group_row, %group_rows : index
        %${x}_read_row = arith.select %${x}_real, %${x}_group_row, %c0 : index
        %${x}_m = arith.divui %${x}_read_row, %heads_per_group : index
        %${x}_h = arith.remui %${x}_read_row, %heads_per_group : index
<% endif %>
        %${x}_head = arith.addi %h0, %${x}_h : index
        %${x}_count = arith.select %${x}_real, %c8, %c0 : index
        %${x}_stored = arith.addi ${base}, %${x}_dest : index
        %${x}_copy = nvgpu.device_async_copy %${x}[%b, %${x}_m, %${x}_head, %${x}_col], %elements[%${x}_stored], 8, %${x}_count ${hint}
            : ${x_type} to ${elements_t}
      } {unroll_loop}
<% endmacro %>

<# Stage keys `key0` .. `key0` + `rows` - 1 (key0 an index value) of `x` (%`x`, a [B, N, G, `width`] memref of type
   `x_type`) of kv group %g into the [rows, width] tile at element `base` of %elements (`elements_t`): the first
   `visible` (an index value) of them, zeros for the others (not read); cp.async from the `lanes` lanes, with `hint`. #>
<% macro stage_keys(x, x_type, key0, visible, rows, width, base, lanes, elements_t, hint) %>
          %${x}_copies = arith.constant ${ (rows | int) * (width | int) // 8 // (lanes | int) } : index
          scf.for %i = %c0 to %${x}_copies step %c1 {
            %i_lanes = arith.muli %i, %lanes : index
            %item = arith.addi %tid, %i_lanes : index
${ core_item(x, "%item", rows, width) }
            %${x}_seen = arith.cmpi slt, %${x}_row, ${visible} : index
            %${x}_count = arith.select %${x}_seen, %c8, %c0 : index
            %${x}_read = arith.select %${x}_seen, %${x}_row, %c0 : index
            %${x}_key = arith.addi ${key0}, %${x}_read : index
            %${x}_stored = arith.addi ${base}, %${x}_dest : index
            %${x}_copy = nvgpu.device_async_copy %${x}[%b, %${x}_key, %g, %${x}_col], %elements[%${x}_stored], 8, %${x}_count ${hint}
                : ${x_type} to ${elements_t}
          } {unroll_loop}
<% endmacro %>

<# Where a lane's pairs of an m64 accumulator go as a K-major operand: the [rows, width] tile of 16-bit values at
   word `region` (an index value) of %words, in the swizzled layout; the lane's accumulator rows are 16 %subgroup +
   8 h + %r of the tile, its pair (values 4 i + 2 h and + 1) columns 8 i + 2 %c and + 1: %`name`_at_<i>_<h> (index),
   the word holding that pair. #>
<% macro pair_words(name, region, rows, width) %>
          %${name}_w16 = arith.muli %subgroup, %c16 : index
          %${name}_lane_row = arith.addi %${name}_w16, %r : index
          %${name}_row_words = arith.muli %${name}_lane_row, %c32 : index
          %${name}_base = arith.addi ${region}, %${name}_row_words : index
          %${name}_lane = arith.addi %${name}_base, %c : index
<% for i in range((width | int) // 8) %>
          %${name}_chunk_${i}_const = arith.constant ${ i % 8 } : index
          %${name}_chunk_${i}_x = arith.xori %${name}_chunk_${i}_const, %r : index
          %${name}_chunk_${i}_words = arith.muli %${name}_chunk_${i}_x, %c4 : index
<% for h in [0, 1] %>
          %${name}_at_${i}_${h}_const = arith.constant ${ (i // 8) * (rows | int) * 32 + h * 8 * 32 } : index
          %${name}_at_${i}_${h}_0 = arith.addi %${name}_lane, %${name}_at_${i}_${h}_const : index
          %${name}_at_${i}_${h} = arith.addi %${name}_at_${i}_${h}_0, %${name}_chunk_${i}_words : index
<% endfor %>
<% endfor %>
<% endmacro %>

<# The workgroup allocation (`smem_t`, with 1024 bytes to spare) and its tiles from its first 1024-byte boundary on
   (the swizzle's period): %smem, %smem_pad (bytes to that boundary), a view %<name> of type <type> there for each
   (name, type) of `views`, and %smem_base (i64: the boundary's address, the descriptors' base). #>
<% macro aligned_allocation(smem_t, views) %>
      // The tiles from the allocation's first 1024-byte boundary on (the swizzle's period; the allocation has
      // 1024 bytes to spare).
      %smem = memref.alloc() : ${smem_t}
      %smem_index = memref.extract_aligned_pointer_as_index %smem : ${smem_t} -> index
      %c1024 = arith.constant 1024 : index
      %smem_misaligned = arith.remui %smem_index, %c1024 : index
      %smem_pad0 = arith.subi %c1024, %smem_misaligned : index
      %smem_pad = arith.remui %smem_pad0, %c1024 : index
<% for name, type in views %>
      %${name} = memref.view %smem[%smem_pad][] : ${smem_t} to ${type}
<% endfor %>
      %smem_aligned = arith.addi %smem_index, %smem_pad : index
      %smem_base = arith.index_cast %smem_aligned : index to i64
<% endmacro %>
