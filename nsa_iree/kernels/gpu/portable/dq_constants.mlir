// Part of dq.mlir and onepass.mlir, first in the kernel function: the constants of the portable dq body.
<# part: takes ACC_N, DQ_UNITS_PER_SUBGROUP, DV_UNITS, D_TILES16, D_UNITS, KEY_UNITS, K_ITEMS, K_ITEMS_PER_LANE, LANES, RUN, RUNS, SUBGROUPS, SUBGROUP_SIZE, T_PLUS_1, UNIT_K, V_ITEMS, V_ITEMS_PER_LANE, units #>
${ units.index_constants({"c0": 0, "c1": 1, "c8": 8, "c16": 16}) }
      %zero = arith.constant 0.0 : f32
      %zero_run = arith.constant dense<0.0> : vector<${RUN}x${E}>
      %zero_chunk = arith.constant dense<0.0> : vector<8x${E}>
      %zero_runs = arith.constant dense<0.0> : !dqp_runs
      %zero_runs2 = arith.constant dense<0.0> : !dqp_runs_pair
${ units.index_constants({"heads_per_group": HPG, "block_size": BS, "slots": T, "steps": T_PLUS_1, "lanes": LANES,
    "subgroup_size": SUBGROUP_SIZE, "subgroups": SUBGROUPS, "unit_k": UNIT_K, "runs": RUNS, "acc_n": ACC_N,
    "d_units": D_UNITS, "dv_units": DV_UNITS, "key_units": KEY_UNITS, "d_tiles": D_TILES16, "dq_units": DQ_UNITS_PER_SUBGROUP,
    "k_chunks": K_ITEMS, "v_chunks": V_ITEMS, "k_per_lane": K_ITEMS_PER_LANE, "v_per_lane": V_ITEMS_PER_LANE}) }
