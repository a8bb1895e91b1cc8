// NSA's top-n block selection on CPUs (docs/semantics.md, 'The compression branch and block selection'): one
// hand-written dispatch, one work item per (query row m, kv group g, batch b), writing block_indices[b, m, g, :].
// Here T is S, the output slots, and BS the compression's block size.
//
// Row m at p = pos(m) (bottom-right aligned) owns block own = p // BS. Its ranking: the forced blocks own,
// own - 1 (when >= 0), 0 (each once), then the scored blocks c = 1 .. own - 2 (all complete, so visible to the
// compressed attention) by descending score, equal scores to the lower id, NaN last. The row keeps the first
// count = clamp(counts[b, m, g], 0, S) of them (none when p < 0); every other slot gets -1.
//
// Vectors run along CPU_CANDS candidates (vector<CPU_CANDS x f32>), from kT: k_cmp transposed by the host
// function, with CPU_CANDS zero columns after the last:
//   S[h, :]   = scale * sum_d q[b, m, h, d] * kT[b, g, d, c0 ..]   (each q element a scalar broadcast)
//   score[:]  = sum over h, in order, of exp(S[h, :] - lse[b, h, m])
// The mean's division by HPG is left out: it is monotone, so the ranking is the same, and it could only merge
// two neighbouring sums into a tie. The best keep = count - forced candidates stay sorted by score in a vector of
// S lanes in registers: a candidate enters at the place where fewer kept ones score >= it (one comparison of
// every lane, no branch), so equal scores keep the lower id; a NaN score is kept as -1, below every score, which
// are >= 0. No candidate is scored when keep is 0. f32 throughout; bf16 and f16 inputs are extended as they are
// loaded.
<% import "common/dispatch.mlir" as dispatch %>
<% import "common/host.mlir" as host %>
<% import "cpu/rows.mlir" as rows %>

<% set inputs = ['q', ("kT", "memref<?x" ~ G ~ "x" ~ D ~ "x?x" ~ E ~ ">{%batch, %padded_blocks}", "k_cmp transposed [B, G, D, C + CPU_CANDS], zeros past C"), 'lse', ("counts", "memref<?x?x" ~ G ~ "xi32>{%batch, %m_rows}", "block_counts [B, M, G] i32")] %>
<% set outputs = ['block_indices'] %>
<% set kt = "memref<?x" ~ G ~ "x" ~ D ~ "x?x" ~ E ~ ">" %>
${ dispatch.layout("select_cpu_layout", 4, inputs, outputs) }

<# %sums (vector<CPU_CANDS>): the scores of candidates %c0_block .. + CPU_CANDS - 1 (those past %end included:
   kT's zero columns past C, finite scores that nothing reads), the sum over the group's heads, in head order, of
   exp(scale q[b, m, h] . k_cmp[c] - lse[b, h, m]); CPU_SEL_HEADS heads' score vectors at a time in registers, each q
   element a scalar broadcast over the candidates. #>
<% macro score_candidates() %>
<% set n = CPU_SEL_HEADS | int %>
<% set types = (["vector<" ~ CPU_CANDS ~ "xf32>"] * n) | join(", ") %>
          %sums = scf.for %hb = %c0 to %heads_per_group step %sel_heads_step iter_args(%sum_in = %zero_cands)
              -> (vector<${CPU_CANDS}xf32>) {
            %head_base = arith.addi %h_first, %hb : index
            %dots:${n} = scf.for %d = %c0 to %head_dim step %c1 iter_args(<% for i in range(n) %>%a${i} = %zero_cands${ ", " if not loop.last }<% endfor %>) -> (${types}) {
              %keys = vector.load %kT[%b, %g, %d, %c0_block] : ${kt}, vector<${CPU_CANDS}x${E}>
              %keys32 = ${EXTF} %keys : vector<${CPU_CANDS}x${E}> to vector<${CPU_CANDS}xf32>
<% for i in range(n) %>
              %head${i} = affine.apply affine_map<(h) -> (h + ${i})>(%head_base)
              %x${i} = memref.load %q[%b, %m, %head${i}, %d] : memref<?x?x${H}x${D}x${E}>
              %x${i}_32 = ${EXTF} %x${i} : ${E} to f32
              %x${i}_c = vector.broadcast %x${i}_32 : f32 to vector<${CPU_CANDS}xf32>
              %a${i}_new = vector.fma %x${i}_c, %keys32, %a${i} : vector<${CPU_CANDS}xf32>
<% endfor %>
              scf.yield <% for i in range(n) %>%a${i}_new${ ", " if not loop.last }<% endfor %> : ${types}
            }
<% for i in range(n) %>
            %lse_head${i} = affine.apply affine_map<(h) -> (h + ${i})>(%head_base)
            %l${i} = memref.load %lse[%b, %lse_head${i}, %m] : memref<?x${H}x?xf32>
            %l${i}_c = vector.broadcast %l${i} : f32 to vector<${CPU_CANDS}xf32>
            %s${i} = arith.mulf %dots#${i}, %scale_cands : vector<${CPU_CANDS}xf32>
            %shifted${i} = arith.subf %s${i}, %l${i}_c : vector<${CPU_CANDS}xf32>
            %p${i} = math.exp %shifted${i} : vector<${CPU_CANDS}xf32>
            %sum${i} = arith.addf ${ "%sum_in" if i == 0 else "%sum" ~ (i - 1) }, %p${i} : vector<${CPU_CANDS}xf32>
<% endfor %>
            scf.yield %sum${n - 1} : vector<${CPU_CANDS}xf32>
          }
<% endmacro %>

<% call dispatch.executable("select_blocks_cpu_exe", "select_blocks_cpu_row", "select_cpu_layout", ['m_rows', 'kv_heads', 'batch']) %>
<% call rows.function("select_blocks_cpu_row") %>
      %c2 = arith.constant 2 : index
      %c3 = arith.constant 3 : index
      %nan_key = arith.constant -1.0 : f32
      %zero_f32 = arith.constant 0.0 : f32
      %minus_one = arith.constant -1 : i32
<% endcall %>
      %cands_step = arith.constant ${CPU_CANDS} : index
      %sel_heads_step = arith.constant ${CPU_SEL_HEADS} : index
      %zero_cands = arith.constant dense<0.0> : vector<${CPU_CANDS}xf32>

${ dispatch.ids(['m', 'g', 'b']) }
${ dispatch.push_constants("select_cpu_layout", ['batch', 'm_rows', 'n', 'scale']) }
      %num_blocks = arith.ceildivui %n, %block_size : index
      %padded_blocks = arith.addi %num_blocks, %cands_step : index
      %scale_cands = vector.broadcast %scale : f32 to vector<${CPU_CANDS}xf32>
${ dispatch.bindings("select_cpu_layout", inputs, outputs) }

${ rows.position() }
      // count = clamp(counts[b, m, g], 0, S), 0 for a row before position 0.
      %count_i32 = memref.load %counts[%b, %m, %g] : memref<?x?x${G}xi32>
      %count_raw = arith.index_cast %count_i32 : i32 to index
      %count_low = arith.maxsi %count_raw, %c0 : index
      %count_s = arith.minsi %count_low, %slots : index
      %seen = arith.cmpi sge, %pos, %c0 : index
      %count = arith.select %seen, %count_s, %c0 : index
      // own = p // BS (%last_visible); the forced blocks are min(own + 1, 3) of [own, own - 1, 0].
      // (0 for a row before position 0, whose last_visible is below -1 when p < -BS: then nothing is kept either)
      %own_next = arith.addi %last_visible, %c1 : index
      %own_blocks = arith.maxsi %own_next, %c0 : index
      %forced_all = arith.minsi %own_blocks, %c3 : index
      %forced = arith.minsi %forced_all, %count : index
      %keep = arith.subi %count, %forced : index
      // The scored candidates: c = 1 .. own - 2, none when nothing is kept.
      %some = arith.cmpi sgt, %keep, %c0 : index
      %last_scored = arith.subi %last_visible, %c1 : index
      %scored_end = arith.maxsi %last_scored, %c1 : index
      %end = arith.select %some, %scored_end, %c1 : index

      %kept_ids = memref.alloca() : memref<${T}xi32>
      %filled = scf.if %some -> (index) {
        %cand_scores = memref.alloca() : memref<${CPU_CANDS}xf32>
        %h_first = arith.muli %g, %heads_per_group : index
        // The kept list in registers: lane i < keep holds entry i (score, id); an empty entry scores -2, below
        // every score and NaN's -1, and lanes from keep on are outside the list.
        %lane = vector.step : vector<${T}xindex>
        %keep_lanes = vector.broadcast %keep : index to vector<${T}xindex>
        %in_list = arith.cmpi slt, %lane, %keep_lanes : vector<${T}xindex>
        %empty_scores = arith.constant dense<-2.0> : vector<${T}xf32>
        %empty_ids = arith.constant dense<-1> : vector<${T}xi32>
        %kept_final:2 = scf.for %c0_block = %c1 to %end step %cands_step
            iter_args(%kept_s = %empty_scores, %kept_i = %empty_ids) -> (vector<${T}xf32>, vector<${T}xi32>) {
          %rest = arith.subi %end, %c0_block : index
          %len = arith.minsi %rest, %cands_step : index
${ score_candidates() }
          vector.store %sums, %cand_scores[%c0] : memref<${CPU_CANDS}xf32>, vector<${CPU_CANDS}xf32>
          // Each candidate of the step, in increasing id, into the list: it enters at place = how many kept entries
          // score >= it (so an equal score stays behind the lower id), the entries from there on move one lane
          // down, and one at place = keep (a list full of better or equal scores) changes only lanes outside it.
          %kept_step:2 = scf.for %j = %c0 to %len step %c1
              iter_args(%ks = %kept_s, %ki = %kept_i) -> (vector<${T}xf32>, vector<${T}xi32>) {
            %sum = memref.load %cand_scores[%j] : memref<${CPU_CANDS}xf32>
            %is_nan = arith.cmpf uno, %sum, %sum : f32
            %score = arith.select %is_nan, %nan_key, %sum : f32
            %cand = arith.addi %c0_block, %j : index
            %cand_i32 = arith.index_cast %cand : index to i32
            %score_lanes = vector.broadcast %score : f32 to vector<${T}xf32>
            %not_below = arith.cmpf oge, %ks, %score_lanes : vector<${T}xf32>
            %ahead = arith.andi %not_below, %in_list : vector<${T}xi1>
            %ahead_ones = arith.extui %ahead : vector<${T}xi1> to vector<${T}xi32>
            %place_i32 = vector.reduction <add>, %ahead_ones : vector<${T}xi32> into i32
            %place = arith.index_cast %place_i32 : i32 to index
            %place_lanes = vector.broadcast %place : index to vector<${T}xindex>
            %before = arith.cmpi slt, %lane, %place_lanes : vector<${T}xindex>
            %at = arith.cmpi eq, %lane, %place_lanes : vector<${T}xindex>
            %ks_down = vector.shuffle %ks, %ks [${ ([0] + range((T | int) - 1) | list) | join(", ") }] : vector<${T}xf32>, vector<${T}xf32>
            %ki_down = vector.shuffle %ki, %ki [${ ([0] + range((T | int) - 1) | list) | join(", ") }] : vector<${T}xi32>, vector<${T}xi32>
            %id_lanes = vector.broadcast %cand_i32 : i32 to vector<${T}xi32>
            %ks_tail = arith.select %at, %score_lanes, %ks_down : vector<${T}xi1>, vector<${T}xf32>
            %ki_tail = arith.select %at, %id_lanes, %ki_down : vector<${T}xi1>, vector<${T}xi32>
            %ks_next = arith.select %before, %ks, %ks_tail : vector<${T}xi1>, vector<${T}xf32>
            %ki_next = arith.select %before, %ki, %ki_tail : vector<${T}xi1>, vector<${T}xi32>
            scf.yield %ks_next, %ki_next : vector<${T}xf32>, vector<${T}xi32>
          }
          scf.yield %kept_step#0, %kept_step#1 : vector<${T}xf32>, vector<${T}xi32>
        }
        vector.store %kept_final#1, %kept_ids[%c0] : memref<${T}xi32>, vector<${T}xi32>
        // The list holds min(candidates, keep) entries: the candidates are c = 1 .. end - 1.
        %candidates = arith.subi %end, %c1 : index
        %kept_count = arith.minsi %candidates, %keep : index
        scf.yield %kept_count : index
      } else {
        scf.yield %c0 : index
      }

      // The slots: the forced blocks (own, own - 1, 0), then the kept ones in order, then -1.
      %own_i32 = arith.index_cast %last_visible : index to i32
      %scored_slots = arith.addi %forced, %filled : index
      scf.for %t = %c0 to %slots step %c1 {
        %is_forced = arith.cmpi slt, %t, %forced : index
        %is_kept = arith.cmpi slt, %t, %scored_slots : index
        %id = scf.if %is_forced -> (i32) {
          %first_two = arith.cmpi slt, %t, %c2 : index
          %t_i32 = arith.index_cast %t : index to i32
          %before = arith.subi %own_i32, %t_i32 : i32
          %zero_i32 = arith.constant 0 : i32
          %f = arith.select %first_two, %before, %zero_i32 : i32
          scf.yield %f : i32
        } else {
          %k = scf.if %is_kept -> (i32) {
            %r = arith.subi %t, %forced : index
            %kept = memref.load %kept_ids[%r] : memref<${T}xi32>
            scf.yield %kept : i32
          } else {
            scf.yield %minus_one : i32
          }
          scf.yield %k : i32
        }
        memref.store %id, %block_indices[%b, %m, %g, %t] : memref<?x?x${G}x${T}xi32>
      }
      return
    }
<% endcall %>

// Host side: k_cmp transposed, then one dispatch per (m, g, b).
${ host.select_signature() }
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %kv_heads = arith.constant ${G} : index
  %batch = tensor.dim %q, %c0 : tensor<?x?x${H}x${D}x${E}>
  %m_rows = tensor.dim %q, %c1 : tensor<?x?x${H}x${D}x${E}>
  %num_blocks = tensor.dim %k_cmp, %c1 : tensor<?x?x${G}x${D}x${E}>
  // kT [B, G, D, C + CPU_CANDS]: the candidates of a row innermost, so CPU_CANDS of them are one vector load, and
  // zeros after the last, so that a row's last step of CPU_CANDS candidates reads inside it.
  %zero = arith.constant 0.0 : ${E}
  %cands_step = arith.constant ${CPU_CANDS} : index
  %padded_blocks = arith.addi %num_blocks, %cands_step : index
  %kT_empty = tensor.empty(%batch, %padded_blocks) : tensor<?x${G}x${D}x?x${E}>
  %kT_zeros = linalg.fill ins(%zero : ${E}) outs(%kT_empty : tensor<?x${G}x${D}x?x${E}>) -> tensor<?x${G}x${D}x?x${E}>
  %kT_init = tensor.empty(%batch, %num_blocks) : tensor<?x${G}x${D}x?x${E}>
  %kT_used = linalg.generic {
      indexing_maps = [affine_map<(b, g, d, c) -> (b, c, g, d)>, affine_map<(b, g, d, c) -> (b, g, d, c)>],
      iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%k_cmp : tensor<?x?x${G}x${D}x${E}>) outs(%kT_init : tensor<?x${G}x${D}x?x${E}>) {
  ^bb0(%x: ${E}, %o: ${E}):
    linalg.yield %x : ${E}
  } -> tensor<?x${G}x${D}x?x${E}>
  %kT = tensor.insert_slice %kT_used into %kT_zeros[0, 0, 0, 0] [%batch, ${G}, ${D}, %num_blocks] [1, 1, 1, 1]
      : tensor<?x${G}x${D}x?x${E}> into tensor<?x${G}x${D}x?x${E}>
${ host.push_constants() }
  %block_indices = flow.dispatch @select_blocks_cpu_exe::@select_blocks_cpu_row[%m_rows, %kv_heads, %batch](
      %batch_i32, %m_rows_i32, %n_i32, %scale_bits, %q, %kT, %lse, %counts)
      : (i32, i32, i32, i32, ${ dispatch.tensor_types(inputs) })
      -> (${ dispatch.tensor_types(outputs) })
  return %block_indices : tensor<?x?x${G}x${T}xi32>
}
