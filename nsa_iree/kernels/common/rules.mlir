// The rule of which keys a query row sees (docs/semantics.md, 'Which keys a row sees'), as the macros every
// stage and kernel writes it with, so that it is stated once: query row m stands at position
// pos(m) = m + N - M (the last M of N positions, bottom-right aligned); it sees key j iff j <= pos(m), so block i
// is read iff i >= 0 and i <= pos(m) / BS (i * BS <= pos(m), tested without overflow). Signed index arithmetic:
// pos(m) < 0 for rows before the first key (M > N), which see nothing.

<# %offset = N - M, from %n and %m_rows. #>
<% macro offset() %>%offset = arith.subi %n, %m_rows : index<% endmacro %>

<# %`name` = pos(m) of row %`m` (given %offset). #>
<% macro position(name="pos", m="m") %>%${name} = arith.addi %${m}, %offset : index<% endmacro %>

<# %`name` = the last block row position %`pos` may read, pos / BS (of %block_size). #>
<% macro last_block(name, pos="pos") %>%${name} = arith.floordivsi %${pos}, %block_size : index<% endmacro %>
