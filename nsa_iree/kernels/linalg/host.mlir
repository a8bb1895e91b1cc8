// The host text the linalg passes share, as macros (linalg/*.mlir import this file): the calls of the helper
// stages every pass starts from.

<# %key_blocks [B * G * NB, BS, D] and %value_blocks [B * G * NB, BS, Dv]: %k and %v in blocks (common/kv_blocks.mlir). #>
<% macro kv_blocks() %>
  %key_blocks, %value_blocks = func.call @kv_blocks(%k, %v)
      : (tensor<?x?x${G}x${D}x${E}>, tensor<?x?x${G}x${DV}x${E}>) -> (tensor<?x${BS}x${D}x${E}>, tensor<?x${BS}x${DV}x${E}>)
<% endmacro %>

<# %block_gather_index and %last_key [B, M, G, T] from %block_indices and %n (common/selected_slots.mlir). #>
<% macro selected_slots() %>
  %block_gather_index, %last_key = func.call @selected_slots(%block_indices, %n)
      : (tensor<?x?x${G}x${T}xi32>, index) -> (tensor<?x?x${G}x${T}xi32>, tensor<?x?x${G}x${T}xi32>)
<% endmacro %>
