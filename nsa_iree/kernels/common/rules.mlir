// The rule of which keys a query row sees (docs/semantics.md, 'Which keys a row sees'), as the macros every
// stage and kernel writes it with, so that it is stated once: query row m stands at pos(m), it sees key j iff
// j <= pos(m), so block i is read iff i >= 0 and i <= pos(m) / BS (i * BS <= pos(m), tested without overflow).
// Selection attention (KEY_STRIDE 1): pos(m) = m + N - M, the last M of N positions (bottom-right aligned).
// Compressed attention (KEY_STRIDE S, the compression's block size): the M rows are all the positions and key c
// stands for positions c S .. c S + S - 1, complete from position c S + S - 1 on: pos(m) = floor((m + 1) / S) - 1,
// the last key row m sees. Signed index arithmetic: pos(m) < 0 for a row that sees nothing.
// Sliding window (WINDOW W > 0, key stride 1): row m sees key j iff pos(m) - W < j <= pos(m). The linalg stages take
// the slot's keys as one i32 code (key_code), compared in the regions (key_visible); the hand-written kernels (NVIDIA,
// portable, CPU) compare a key's offset in its block with the block's first visible offset (first_key) and its last
// (key_in_range).

<# %offset = N - M, from %n and %m_rows. #>
<% macro offset() %>%offset = arith.subi %n, %m_rows : index<% endmacro %>

<# %`name` = pos(m) of row %`m` (given %offset, which compressed attention does not use). #>
<% macro position(name="pos", m="m") %>
<% if KEY_STRIDE == "1" %>
%${name} = arith.addi %${m}, %offset : index<% else %>
%${name}_one = arith.constant 1 : index
    %${name}_stride = arith.constant ${KEY_STRIDE} : index
    %${name}_end = arith.addi %${m}, %${name}_one : index
    %${name}_keys = arith.floordivsi %${name}_end, %${name}_stride : index
    %${name} = arith.subi %${name}_keys, %${name}_one : index<% endif %>
<% endmacro %>

<# %`name` = the last block row position %`pos` may read, pos / BS (of %block_size). #>
<% macro last_block(name, pos="pos") %>%${name} = arith.floordivsi %${pos}, %block_size : index<% endmacro %>

<# %`name` = the first key offset of the block at %`key0` that row position %`pos` sees in its window,
   pos - WINDOW + 1 - key0 (index; <= 0: from the block's first key). Rendered only with a window. #>
<% macro first_key(name, pos="pos", key0="key0") %>
<% if WINDOW != "0" %>
%${name}_span = arith.constant ${ (WINDOW | int) - 1 } : index
    %${name}_from = arith.subi %${pos}, %${name}_span : index
    %${name} = arith.subi %${name}_from, %${key0} : index<% endif %>
<% endmacro %>

<# %`name` (i1, or `mask_type`): key offset %`j` of a block is visible, `predicate` (slt: %`upper` counts the visible
   keys; sle: it is the last visible offset) and, with a window, at or after the first_key %`first`. `type`: the
   operands' type (index, or a vector of them). With %`j_last` (>= j), whether some key of the run j .. j_last is
   visible: the visible keys are one range, so the run's first is below the upper bound and its last at or after
   `first` (a kernel's test for skipping the products of a run of keys); with `every` as well, whether every key of
   the run is visible: its last below the upper bound and its first at or after `first` (a kernel's test for a run
   that needs no mask). #>
<% macro key_in_range(name, j, predicate, upper, first, type="index", mask_type="i1", j_last=none, every=false) %>
<% set j_upper, j_lower = (j_last, j) if every else (j, j_last or j) %>
<% if WINDOW != "0" %>
%${name}_below = arith.cmpi ${predicate}, %${j_upper}, %${upper} : ${type}
                %${name}_above = arith.cmpi sge, %${j_lower}, %${first} : ${type}
                %${name} = arith.andi %${name}_below, %${name}_above : ${mask_type}<% else %>
%${name} = arith.cmpi ${predicate}, %${j_upper}, %${upper} : ${type}<% endif %>
<% endmacro %>

<# %`name` (i32): which keys of a slot's block at %`key0` row position %`pos` sees, as the linalg regions compare
   them (key_visible), from %`last` (i32: the last visible offset; nothing visible where not %`used`). With no
   window the code is `last` itself (-1: none); with one, last + 65536 first, first = pos - WINDOW + 1 - key0
   clamped to [0, 32767] (none: first 32767, last 0). #>
<% macro key_code(name, last, used, pos="pos", key0="key0") %>
<% if WINDOW == "0" %>
    %${name}_none = arith.constant -1 : i32
    %${name} = arith.select %${used}, %${last}, %${name}_none : i32
<% else %>
    %${name}_window = arith.constant ${WINDOW} : index
    %${name}_from = arith.subi %${pos}, %${name}_window : index
    %${name}_first_raw = arith.subi %${name}_from, %${key0} : index
    %${name}_one = arith.constant 1 : index
    %${name}_first1 = arith.addi %${name}_first_raw, %${name}_one : index
    %${name}_zero = arith.constant 0 : index
    %${name}_top = arith.constant 32767 : index
    %${name}_first2 = arith.maxsi %${name}_first1, %${name}_zero : index
    %${name}_first3 = arith.minsi %${name}_first2, %${name}_top : index
    %${name}_first = arith.index_cast %${name}_first3 : index to i32
    %${name}_shift = arith.constant 16 : i32
    %${name}_high = arith.shli %${name}_first, %${name}_shift : i32
    %${name}_last_top = arith.constant 32767 : i32
    %${name}_last_cap = arith.minsi %${last}, %${name}_last_top : i32
    %${name}_code = arith.addi %${name}_high, %${name}_last_cap : i32
    %${name}_none = arith.constant 2147418112 : i32
    %${name} = arith.select %${used}, %${name}_code, %${name}_none : i32
<% endif %>
<% endmacro %>

<# %`name` (i1): key offset %`j` (i32) of a slot is visible under its code %`code` (key_code). #>
<% macro key_visible(name, j, code) %>
<% if WINDOW == "0" %>
      %${name} = arith.cmpi sle, %${j}, %${code} : i32
<% else %>
      %${name}_mask = arith.constant 65535 : i32
      %${name}_shift = arith.constant 16 : i32
      %${name}_last = arith.andi %${code}, %${name}_mask : i32
      %${name}_first = arith.shrsi %${code}, %${name}_shift : i32
      %${name}_below = arith.cmpi sle, %${j}, %${name}_last : i32
      %${name}_above = arith.cmpi sge, %${j}, %${name}_first : i32
      %${name} = arith.andi %${name}_below, %${name}_above : i1
<% endif %>
<% endmacro %>
