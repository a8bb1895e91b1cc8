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
   step s) times B (%`b`, b_offsets[s] bytes further): one wgmma m64 n`n` k16 per step with `dtype` inputs and f32
   accumulators, A K-major, B K-major (`b_layout` "col") or MN-major ("row"); issued after a fence, committed and
   waited for. The values then pass an empty asm statement that names them all, so nothing reads them before the
   wait. #>
<% macro chain(result, acc, a, a_offsets, b, b_offsets, n, dtype, b_layout, acc_t) %>
      nvvm.wgmma.fence.aligned
<% for s in range(a_offsets | length) %>
<% set previous = acc if loop.first else "%" ~ result ~ "_" ~ (s - 1) %>
      %${result}_a_step${s} = arith.constant ${ (a_offsets[s] | int) // 16 } : i64
      %${result}_b_step${s} = arith.constant ${ (b_offsets[s] | int) // 16 } : i64
      %${result}_a${s} = arith.addi ${a}, %${result}_a_step${s} : i64
      %${result}_b${s} = arith.addi ${b}, %${result}_b_step${s} : i64
      %${result}_${s} = nvvm.wgmma.mma_async %${result}_a${s}, %${result}_b${s}, ${previous},
          #nvvm.shape<m = 64, n = ${n}, k = 16>,
          D [<f32>, #nvvm.wgmma_scale_out<one>],
          A [<${dtype}>, #nvvm.wgmma_scale_in<one>, <row>],
          B [<${dtype}>, #nvvm.wgmma_scale_in<one>, <${b_layout}>]
          : ${acc_t} -> ${acc_t}
<% endfor %>
      nvvm.wgmma.commit.group.sync.aligned
      nvvm.wgmma.wait.group.sync.aligned 0
<% set count = (n | int) // 2 %>
${ values(result ~ "_f", "%" ~ result ~ "_" ~ ((a_offsets | length) - 1), count, acc_t) }
      %${result} = llvm.inline_asm has_side_effects "", "${ (["=f"] * count + range(count) | map("string") | list) | join(",") }"
          <% for v in range(count) %>%${result}_f_${v}${ ", " if not loop.last }<% endfor %> : (${ (["f32"] * count) | join(", ") }) -> ${acc_t}
<% endmacro %>

<# The values of accumulator `acc` (acc_t, `count` values) as %`name`_<index> (f32). #>
<% macro values(name, acc, count, acc_t) %>
<% for v in range(count | int) %>
      %${name}_${v} = llvm.extractvalue ${acc}[${v}] : ${acc_t}
<% endfor %>
<% endmacro %>

