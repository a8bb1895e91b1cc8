// The block-major backward products the CPU dk/dv and one-pass kernels share, as macros: S and dP of one
// selected block for the row's heads, P and DS from them in place, and the sum over heads that adds a register
// block of dk or dv. They read %kT, %vT, %f (the flat block), %h_first, %b, %m, %key_mask and the tiles.

<# %s_tile = S and %dp_tile = dP [HPG, BS], `srows` (CPU_SROWS) heads at a time; qT and doT read at
   [`row`, ...] when `row` (one per row group, memref<?x...>), else as the row's own stack tiles. #>
<% macro scores(row, srows) %>
<% set at = "%" ~ row ~ ", " if row else "" %>
<% set dyn = "?x" if row else "" %>
          scf.for %h0 = %c0 to %heads_per_group step %heads_step {
            %s_acc = scf.for %d = %c0 to %head_dim step %c1 iter_args(%sa = %zero_s) -> (vector<${srows}x${BS}xf32>) {
              %qd = vector.load %qT[${at}%d, %h0] : memref<${dyn}${D}x${HPG}xf32>, vector<${srows}xf32>
              %keys = vector.load %kT[%f, %d, %c0] : memref<?x${D}x${BS}x${E}>, vector<${BS}x${E}>
              %keys32 = ${EXTF} %keys : vector<${BS}x${E}> to vector<${BS}xf32>
              %sa_new = vector.outerproduct %qd, %keys32, %sa : vector<${srows}xf32>, vector<${BS}xf32>
              scf.yield %sa_new : vector<${srows}x${BS}xf32>
            }
            vector.transfer_write %s_acc, %s_tile[%h0, %c0] {in_bounds = [true, true]}
                : vector<${srows}x${BS}xf32>, memref<${HPG}x${BS}xf32>
            %dp_acc = scf.for %e = %c0 to %value_dim step %c1 iter_args(%da = %zero_s) -> (vector<${srows}x${BS}xf32>) {
              %doe = vector.load %doT[${at}%e, %h0] : memref<${dyn}${DV}x${HPG}xf32>, vector<${srows}xf32>
              %vals = vector.load %vT[%f, %e, %c0] : memref<?x${DV}x${BS}x${E}>, vector<${BS}x${E}>
              %vals32 = ${EXTF} %vals : vector<${BS}x${E}> to vector<${BS}xf32>
              %da_new = vector.outerproduct %doe, %vals32, %da : vector<${srows}xf32>, vector<${BS}xf32>
              scf.yield %da_new : vector<${srows}x${BS}xf32>
            }
            vector.transfer_write %dp_acc, %dp_tile[%h0, %c0] {in_bounds = [true, true]}
                : vector<${srows}x${BS}xf32>, memref<${HPG}x${BS}xf32>
          }
<% endmacro %>

<# In place: %s_tile = P = exp(S - lse) on visible keys (0 elsewhere; times %w_v when `weighted`), %dp_tile =
   DS = P * (dP - delta). #>
<% macro p_ds(weighted) %>
          scf.for %h = %c0 to %heads_per_group step %c1 {
            %head = arith.addi %h_first, %h : index
            %l = memref.load %lse[%b, %head, %m] : memref<?x${H}x?xf32>
            %dl = memref.load %delta[%b, %m, %head] : memref<?x?x${H}xf32>
            %l_v = vector.broadcast %l : f32 to vector<${BS}xf32>
            %dl_v = vector.broadcast %dl : f32 to vector<${BS}xf32>
            %s = vector.load %s_tile[%h, %c0] : memref<${HPG}x${BS}xf32>, vector<${BS}xf32>
            %shifted = arith.subf %s, %l_v : vector<${BS}xf32>
            %e_s = math.exp %shifted : vector<${BS}xf32>
<% if weighted %>
            %weighted = arith.mulf %w_v, %e_s : vector<${BS}xf32>
<% endif %>
            %p = arith.select %key_mask, %${ "weighted" if weighted else "e_s" }, %zero_keys : vector<${BS}xi1>, vector<${BS}xf32>
            %dp = vector.load %dp_tile[%h, %c0] : memref<${HPG}x${BS}xf32>, vector<${BS}xf32>
            %dp_minus_delta = arith.subf %dp, %dl_v : vector<${BS}xf32>
            // Masked keys get exactly 0 (not 0 * dP: a future key's V row may hold an Inf or NaN).
            %ds_all = arith.mulf %p, %dp_minus_delta : vector<${BS}xf32>
            %ds = arith.select %key_mask, %ds_all, %zero_keys : vector<${BS}xi1>, vector<${BS}xf32>
            vector.store %p, %s_tile[%h, %c0] : memref<${HPG}x${BS}xf32>, vector<${BS}xf32>
            vector.store %ds, %dp_tile[%h, %c0] : memref<${HPG}x${BS}xf32>, vector<${BS}xf32>
          }
<% endmacro %>

<# %new [`krows` (CPU_KROWS), `cols`] = %`init` + the sum over heads h of `tile`[h, keys j0..] (as %`w`)
   times %`x`[b, m, head, `index`0 .. + `cols`] (as %`r`; `dim` wide): a register block of dv (P, do) or
   dk (DS, q). #>
<% macro head_sum(init, tile, w, x, r, dim, cols, index, krows) %>
                %new = scf.for %h = %c0 to %heads_per_group step %c1 iter_args(%a = %${init}) -> (vector<${krows}x${cols}xf32>) {
                  %head = arith.addi %h_first, %h : index
                  %${w} = vector.load %${tile}[%h, %j0] : memref<${HPG}x${BS}xf32>, vector<${krows}xf32>
                  %${r} = vector.load %${x}[%b, %m, %head, %${index}0] : memref<?x?x${H}x${dim}x${E}>, vector<${cols}x${E}>
                  %${r}32 = ${EXTF} %${r} : vector<${cols}x${E}> to vector<${cols}xf32>
                  %a_new = vector.outerproduct %${w}, %${r}32, %a : vector<${krows}xf32>, vector<${cols}xf32>
                  scf.yield %a_new : vector<${krows}x${cols}xf32>
                }
<% endmacro %>
