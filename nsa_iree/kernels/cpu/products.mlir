// The backward products the CPU dq, dk/dv, one-pass and dense backward kernels share, as macros: S and dP of one
// selected block for the row's heads, P and DS from them in place, dq's sum over the block's keys and its rows'
// stores, and the sum over heads that adds a register block of dk or dv (the locked add into the accumulator
// whole), dk's scaling, and the whole of one row's backward over its selected blocks (dq.mlir's and the dense
// backward's). They read %kT, %vT, %f (the flat block), %h_first, %b, %m, %key_mask and the tiles.
<% import "common/rules.mlir" as rules %>
<% import "cpu/rows.mlir" as rows %>

<# The steps and constants the products read: %keys_step (`krows`), %vcols_step (`vcols`), %kcols_step (`kcols`),
   %zero_keys, %zero_s [`srows`, BS], and %key_iota (0 .. BS - 1, for the key masks). #>
<% macro constants(krows, vcols, kcols, srows) %>
      %keys_step = arith.constant ${krows} : index
      %vcols_step = arith.constant ${vcols} : index
      %kcols_step = arith.constant ${kcols} : index
      %zero_keys = arith.constant dense<0.0> : vector<${BS}xf32>
      %zero_s = arith.constant dense<0.0> : vector<${srows}x${BS}xf32>
      %key_iota = vector.step : vector<${BS}xindex>
<% endmacro %>

<# %s_tile = S and %dp_tile = dP [HPG, BS], `srows` (CPU_SROWS) heads at a time; qT and doT read at
   [`row`, ...] when `row` (one per row group, memref<?x...>), else as the row's own stack tiles. #>
<% macro scores(row, srows) %>
<% set at = "%" ~ row ~ ", " if row else "" %>
<% set dyn = "?x" if row else "" %>
          scf.for %h0 = %c0 to %heads_per_group step %heads_step {
<% for acc, x, y, blocks, index, dim, tile in [("sa", "qd", "qT", "kT", "d", D, "s_tile"), ("da", "doe", "doT", "vT", "e", DV, "dp_tile")] %>
            %${tile[:-5]}_acc = scf.for %${index} = %c0 to %${ "head_dim" if index == "d" else "value_dim" } step %c1 iter_args(%${acc} = %zero_s) -> (vector<${srows}x${BS}xf32>) {
              %${x} = vector.load %${y}[${at}%${index}, %h0] : memref<${dyn}${dim}x${HPG}xf32>, vector<${srows}xf32>
              %${blocks}_row = vector.load %${blocks}[%f, %${index}, %c0] : memref<?x${dim}x${BS}x${E}>, vector<${BS}x${E}>
              %${blocks}_row32 = ${EXTF} %${blocks}_row : vector<${BS}x${E}> to vector<${BS}xf32>
              %${acc}_new = vector.outerproduct %${x}, %${blocks}_row32, %${acc} : vector<${srows}xf32>, vector<${BS}xf32>
              scf.yield %${acc}_new : vector<${srows}x${BS}xf32>
            }
            vector.transfer_write %${tile[:-5]}_acc, %${tile}[%h0, %c0] {in_bounds = [true, true]}
                : vector<${srows}x${BS}xf32>, memref<${HPG}x${BS}xf32>
<% endfor %>
          }
<% endmacro %>

<# %s_tile = S and %dp_tile = dP [HPG, BS] of row %m's heads over the block's first `keys` keys (default BS),
   `srows` heads at a time, every element of q and do read from the inputs as a scalar broadcast over the keys (no
   transposed copy of either): S[h, :] = scale sum_d q[b, m, h, d] kT[f, d, :] and dP[h, :] = sum_e do[b, m, h, e]
   vT[f, e, :]. The tiles' columns from `keys` on keep what they held. Reads %scale. #>
<% macro scores_from_inputs(srows, keys=BS) %>
<% set heads = srows | int %>
<% set kv = "vector<" ~ keys ~ "xf32>" %>
          %scale_v${keys} = vector.broadcast %scale : f32 to ${kv}
          %zero_v${keys} = arith.constant dense<0.0> : ${kv}
          %heads_step${srows} = arith.constant ${srows} : index
          scf.for %h0 = %c0 to %heads_per_group step %heads_step${srows} {
            %head_base = arith.addi %h_first, %h0 : index
<% for tile, x, blocks, index, bound, dim in [("s_tile", "q", "kT", "d", "head_dim", D), ("dp_tile", "do", "vT", "e", "value_dim", DV)] %>
<% set types = ([kv] * heads) | join(", ") %>
            %${tile}_acc:${heads} = scf.for %${index} = %c0 to %${bound} step %c1 iter_args(<% for i in range(heads) %>%a${i} = %zero_v${keys}${ ", " if not loop.last }<% endfor %>) -> (${types}) {
              %keys = vector.load %${blocks}[%f, %${index}, %c0] : memref<?x${dim}x${BS}x${E}>, vector<${keys}x${E}>
              %keys32 = ${EXTF} %keys : vector<${keys}x${E}> to ${kv}
<% for i in range(heads) %>
              %head${i} = affine.apply affine_map<(h) -> (h + ${i})>(%head_base)
              %x${i} = memref.load %${x}[%b, %m, %head${i}, %${index}] : memref<?x?x${H}x${dim}x${E}>
              %x${i}_32 = ${EXTF} %x${i} : ${E} to f32
              %x${i}_keys = vector.broadcast %x${i}_32 : f32 to ${kv}
              %a${i}_new = vector.fma %x${i}_keys, %keys32, %a${i} : ${kv}
<% endfor %>
              scf.yield <% for i in range(heads) %>%a${i}_new${ ", " if not loop.last }<% endfor %> : ${types}
            }
<% for i in range(heads) %>
            %${tile}_h${i} = affine.apply affine_map<(h) -> (h + ${i})>(%h0)
<% if tile == "s_tile" %>
            %${tile}_v${i} = arith.mulf %${tile}_acc#${i}, %scale_v${keys} : ${kv}
<% endif %>
            vector.store %${ tile ~ "_v" ~ i if tile == "s_tile" else tile ~ "_acc#" ~ i }, %${tile}[%${tile}_h${i}, %c0] : memref<${HPG}x${BS}xf32>, ${kv}
<% endfor %>
<% endfor %>
          }
<% endmacro %>

<# scores_from_inputs over the keys of the block row %m sees (%visible of them), rounded up to half a block when
   BS / 2 is a whole number of 16-float vectors (`half_srows` heads at a time then, `srows` over the whole block):
   a row's last tile of compressed keys is often less than half visible. The columns left unscored are past
   %visible: p_ds masks them. #>
<% macro visible_scores(srows, half_srows) %>
<% if (BS | int) % 32 == 0 %>
          %half_block = arith.constant ${ (BS | int) // 2 } : index
          %whole_block = arith.cmpi sgt, %visible, %half_block : index
          scf.if %whole_block {
${ scores_from_inputs(srows) | indent(2, true) }
          } else {
${ scores_from_inputs(half_srows, (BS | int) // 2) | indent(2, true) }
          }
<% else %>
${ scores_from_inputs(srows) }
<% endif %>
<% endmacro %>

<# %dq_tile [HPG, D] += sum over the keys j = `first` .. %visible - 1 of DS[h, j] k[b, %key0 + j, g, :] (DS in
   %dp_tile), `heads` (CPU_DQ_HEADS) heads times `cols` (CPU_DQ_COLS) elements of d per register block, each DS
   element a scalar broadcast over k's row. Only the row's visible keys are read (a future key's row may be past N,
   or hold an Inf). #>
<% macro dq_add(first, heads, cols) %>
<% set n = heads | int %>
<% set types = (["vector<" ~ cols ~ "xf32>"] * n) | join(", ") %>
          scf.for %h0 = %c0 to %heads_per_group step %dq_heads_step {
            scf.for %d0 = %c0 to %head_dim step %dq_cols_step {
<% for i in range(n) %>
              %dq_h${i} = affine.apply affine_map<(h) -> (h + ${i})>(%h0)
              %dq_old${i} = vector.load %dq_tile[%dq_h${i}, %d0] : memref<${HPG}x${D}xf32>, vector<${cols}xf32>
<% endfor %>
              %dq_new:${n} = scf.for %j = ${first} to %visible step %c1 iter_args(<% for i in range(n) %>%a${i} = %dq_old${i}${ ", " if not loop.last }<% endfor %>) -> (${types}) {
                %key = arith.addi %key0, %j : index
                %k_row = vector.load %k[%b, %key, %g, %d0] : memref<?x?x${G}x${D}x${E}>, vector<${cols}x${E}>
                %k_row32 = ${EXTF} %k_row : vector<${cols}x${E}> to vector<${cols}xf32>
<% for i in range(n) %>
                %ds${i} = memref.load %dp_tile[%dq_h${i}, %j] : memref<${HPG}x${BS}xf32>
                %ds${i}_row = vector.broadcast %ds${i} : f32 to vector<${cols}xf32>
                %a${i}_new = vector.fma %ds${i}_row, %k_row32, %a${i} : vector<${cols}xf32>
<% endfor %>
                scf.yield <% for i in range(n) %>%a${i}_new${ ", " if not loop.last }<% endfor %> : ${types}
              }
<% for i in range(n) %>
              vector.store %dq_new#${i}, %dq_tile[%dq_h${i}, %d0] : memref<${HPG}x${D}xf32>, vector<${cols}xf32>
<% endfor %>
            }
          }
<% endmacro %>

<# dq[b, m, heads of group g, :] = scale * %dq_tile [HPG, D], each head's row contiguous, with streaming stores
   when `stream` is "true" (CPU_DQ_STREAM: each row whole 64-byte lines). Reads %scale, %h_first, %b, %m. #>
<% macro dq_out(stream) %>
      // dq = scale * dq_tile, each head's row contiguous.
      %scale_d = vector.broadcast %scale : f32 to vector<${D}xf32>
      scf.for %h = %c0 to %heads_per_group step %c1 {
        %dq_sum = vector.load %dq_tile[%h, %c0] : memref<${HPG}x${D}xf32>, vector<${D}xf32>
        %out = arith.mulf %dq_sum, %scale_d : vector<${D}xf32>
        %out_e = ${TRUNCF} %out : vector<${D}xf32> to vector<${D}x${E}>
        %head = arith.addi %h_first, %h : index
<% if stream == "true" %>
        // A streaming store (whole 64-byte lines, not read into the cache first): without it the stores of one
        // row's dq, missing the caches, fill the store buffer that the next row's first stores wait on. (In the
        // generic form: IREE 3.13's vector.store does not take the nontemporal property in its custom syntax.)
        "vector.store"(%out_e, %dq, %b, %m, %head, %c0) <{nontemporal = true}>
            : (vector<${D}x${E}>, memref<?x?x${H}x${D}x${E}>, index, index, index, index) -> ()
<% else %>
        vector.store %out_e, %dq[%b, %m, %head, %c0] : memref<?x?x${H}x${D}x${E}>, vector<${D}x${E}>
<% endif %>
      }
<% endmacro %>

<# In place: %s_tile = P = exp(S - lse) on visible keys (0 elsewhere; times %w_v when `weighted`), %dp_tile =
   DS = P * (dP - delta), delta read from the delta stage's [B, M, H] output, or from the row's own %delta_tile
   [HPG] when `row_delta` (delta_of_row() made it). #>
<% macro p_ds(weighted, row_delta=false) %>
          scf.for %h = %c0 to %heads_per_group step %c1 {
            %head = arith.addi %h_first, %h : index
            %l = memref.load %lse[%b, %head, %m] : memref<?x${H}x?xf32>
<% if row_delta %>
            %dl = memref.load %delta_tile[%h] : memref<${HPG}xf32>
<% else %>
            %dl = memref.load %delta[%b, %m, %head] : memref<?x?x${H}xf32>
<% endif %>
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

<# The two parts of a key block's dk/dv register blocks, for the call block (given each part `p`): dv (P times
   do, columns D + e0 of the accumulator, `vcols` (CPU_VCOLS) at a time), then dk (DS times q, columns d0,
   `kcols` (CPU_KCOLS) at a time). #>
<% macro parts(vcols, kcols) %>
<% for p in [dict(index="e", bound="value_dim", step="vcols_step", at="col", tile="s_tile", w="pj", x="do", r="dor", dim=DV, cols=vcols, part="part_v", zero="zero_v"),
             dict(index="d", bound="head_dim", step="kcols_step", at="d0", tile="dp_tile", w="dsj", x="q", r="qr", dim=D, cols=kcols, part="part_k", zero="zero_k")] %>
${ caller(p) }
<% endfor %>
<% endmacro %>

<# The opening of part `p`'s loop over its columns (%col: the accumulator's column of dv's e0). #>
<% macro part_loop(p) %>
              scf.for %${p.index}0 = %c0 to %${p.bound} step %${p.step} {
<% if p.at == "col" %>
                %col = arith.addi %head_dim, %e0 : index
<% endif %>
<% endmacro %>

<# %new [`krows` (CPU_KROWS), p.cols] = %`init` + the sum over heads h of p.tile[h, keys j0..] (as %<p.w>) times
   p.x[b, m, head, <p.index>0 .. + p.cols] (as %<p.r>): part `p`'s register block. #>
<% macro head_sum(init, p, krows) %>
                %new = scf.for %h = %c0 to %heads_per_group step %c1 iter_args(%a = %${init}) -> (vector<${krows}x${p.cols}xf32>) {
                  %head = arith.addi %h_first, %h : index
                  %${p.w} = vector.load %${p.tile}[%h, %j0] : memref<${HPG}x${BS}xf32>, vector<${krows}xf32>
                  %${p.r} = vector.load %${p.x}[%b, %m, %head, %${p.index}0] : memref<?x?x${H}x${p.dim}x${E}>, vector<${p.cols}x${E}>
                  %${p.r}32 = ${EXTF} %${p.r} : vector<${p.cols}x${E}> to vector<${p.cols}xf32>
                  %a_new = vector.outerproduct %${p.w}, %${p.r}32, %a : vector<${krows}xf32>, vector<${p.cols}xf32>
                  scf.yield %a_new : vector<${krows}x${p.cols}xf32>
                }
<% endmacro %>

<# dv and dk of the visible keys of flat block %f added into %acc [%`at`, BS, `dkv` (CPU_DKV)] with plain loads
   and stores, `krows` keys times `vcols` (`kcols`) columns per register block. #>
<% macro add_to_acc(krows, vcols, kcols, dkv, at="f") %>
            scf.for %j0 = %c0 to %visible step %keys_step {
<% call(p) parts(vcols, kcols) %>
${ part_loop(p) }
                %old = vector.transfer_read %acc[%${at}, %j0, %${p.at}], %zero {in_bounds = [true, true]}
                    : memref<?x${BS}x${dkv}xf32>, vector<${krows}x${p.cols}xf32>
${ head_sum("old", p, krows) }
                vector.transfer_write %new, %acc[%${at}, %j0, %${p.at}] {in_bounds = [true, true]}
                    : vector<${krows}x${p.cols}xf32>, memref<?x${BS}x${dkv}xf32>
              }
<% endcall %>
            }
<% endmacro %>

<# dk's columns [0, D) of the partial row block %acc[%`piece`] [BS, `dkv`] times scale (q is unscaled in dk's
   products). #>
<% macro scale_dk(piece, dkv) %>
        %scale_k = vector.broadcast %scale : f32 to vector<${D}xf32>
        scf.for %j = %c0 to %block_size step %c1 {
          %x = vector.load %acc[%${piece}, %j, %c0] : memref<?x${BS}x${dkv}xf32>, vector<${D}xf32>
          %x_scaled = arith.mulf %x, %scale_k : vector<${D}xf32>
          vector.store %x_scaled, %acc[%${piece}, %j, %c0] : memref<?x${BS}x${dkv}xf32>, vector<${D}xf32>
        }
<% endmacro %>

<# %delta_tile [HPG] = delta of row %m's heads: sum_e do[b, m, h, e] o[b, m, h, e] in f32, each head's products
   added `n` (CPU_DELTA_LANES, a divisor of Dv) lanes at a time along Dv (lane l: elements l, l + n, ...), then the
   lanes in order (an ordered reduction: the same bits whatever the vector width). Reads %o, %do, %h_first, %b,
   %m. #>
<% macro delta_of_row(n) %>
<% set lanes = "vector<" ~ n ~ "xf32>" %>
      %delta_lanes_step = arith.constant ${n} : index
      %delta_zero = arith.constant dense<0.0> : ${lanes}
      scf.for %h = %c0 to %heads_per_group step %c1 {
        %head = arith.addi %h_first, %h : index
        %sum = scf.for %e0 = %c0 to %value_dim step %delta_lanes_step iter_args(%delta_acc = %delta_zero) -> (${lanes}) {
          %do_e = vector.load %do[%b, %m, %head, %e0] : memref<?x?x${H}x${DV}x${E}>, vector<${n}x${E}>
          %o_e = vector.load %o[%b, %m, %head, %e0] : memref<?x?x${H}x${DV}x${E}>, vector<${n}x${E}>
          %do_e32 = ${EXTF} %do_e : vector<${n}x${E}> to ${lanes}
          %o_e32 = ${EXTF} %o_e : vector<${n}x${E}> to ${lanes}
          %delta_acc_new = vector.fma %do_e32, %o_e32, %delta_acc : ${lanes}
          scf.yield %delta_acc_new : ${lanes}
        }
        %row_delta = vector.reduction <add>, %sum : ${lanes} into f32
        memref.store %row_delta, %delta_tile[%h] : memref<${HPG}xf32>
      }
<% endmacro %>

<# Row %m's dq: %dq_tile zeroed, then for each selected block of its slots the key mask, S and dP over the visible
   keys (`srows`, `half_srows` heads at a time: visible_scores), P and DS in place and dq_tile += DS k (`dq_heads` x
   `dq_cols` register blocks), then the call block's text, if any (what a kernel adds from the same tiles: the
   dense backward's dk and dv), and last the row's dq written (`stream`: dq_out). `delta_lanes`: when given, the
   row's delta made first (delta_of_row), not read from the delta stage's output. #>
<% macro row_backward(srows, half_srows, dq_heads, dq_cols, stream, delta_lanes=none) %>
<% set row_delta = delta_lanes is not none %>
<% set first = "%first_visible" if WINDOW != "0" else "%c0" %>
      scf.for %h = %c0 to %heads_per_group step %c1 {
        vector.store %zero_d, %dq_tile[%h, %c0] : memref<${HPG}x${D}xf32>, vector<${D}xf32>
      }
<% if row_delta %>
${ delta_of_row(delta_lanes) }
<% endif %>
${ rows.position() }
      scf.for %t = %c0 to %slots step %c1 {
${ rows.slot_block() }
        scf.if %selected {
${ rows.block_extent() }
          %visible_v = vector.broadcast %visible : index to vector<${BS}xindex>
<% if WINDOW != "0" %>
          %first_v = vector.broadcast %first_visible : index to vector<${BS}xindex>
<% endif %>
          ${ rules.key_in_range("key_mask", "key_iota", "slt", "visible_v", "first_v", "vector<" ~ BS ~ "xindex>", "vector<" ~ BS ~ "xi1>") }
${ visible_scores(srows, half_srows) }
${ p_ds(false, row_delta) }
${ dq_add(first, dq_heads, dq_cols) }
<% if caller is defined %>
${ caller() }
<% endif %>
        }
      }
${ dq_out(stream) }
<%- endmacro %>
