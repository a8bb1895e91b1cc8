// The rule of which keys a query row sees (docs/semantics.md, 'Which keys a row sees'), as the macros every
// stage and kernel writes it with, so that it is stated once: query row m stands at pos(m), it sees key j iff
// j <= pos(m), so block i is read iff i >= 0 and i <= pos(m) / BS (i * BS <= pos(m), tested without overflow).
// Selection attention (KEY_STRIDE 1): pos(m) = m + N - M, the last M of N positions (bottom-right aligned).
// Compressed attention (KEY_STRIDE S, the compression's block size): the M rows are all the positions and key c
// stands for positions c S .. c S + S - 1, complete from position c S + S - 1 on: pos(m) = floor((m + 1) / S) - 1,
// the last key row m sees. Signed index arithmetic: pos(m) < 0 for a row that sees nothing.

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
