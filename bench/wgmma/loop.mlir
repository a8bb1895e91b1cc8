// probe.mlir's wgmma four times with the accumulator carried through scf.for (ptxas keeps it in the same
// registers, no copies): c = 4 a b^T.
//     iree-compile bench/wgmma/loop.mlir -o loop.vmfb; python3 -m bench.wgmma.check loop.vmfb --scale 4
#wg_target = #hal.executable.target<"cuda", "cuda-nvptx-fb", {iree_codegen.target_info = #iree_gpu.target<arch = "sm_90a", features = "+ptx80", wgp = <compute = fp64|fp32|fp16|int64|int32|int16|int8, storage = b64|b32|b16|b8, subgroup = shuffle|arithmetic, dot = dp4xi8toi32, mma = [<NV_MMA_SYNC_F32_16x8x16_F16>, <NV_MMA_SYNC_F16_16x8x16_F16>, <NV_MMA_SYNC_F32_16x8x16_BF16>, <NV_WMMA_F32_16x16x16_F16>, <NV_WMMA_F16_16x16x16_F16>], subgroup_size_choices = [32], max_workgroup_sizes = [1024, 1024, 1024], max_thread_count_per_workgroup = 1024, max_workgroup_memory_bytes = 232448, max_workgroup_counts = [2147483647, 65535, 65535]>>}>
#layout = #hal.pipeline.layout<bindings = [
  #hal.pipeline.binding<storage_buffer, ReadOnly>,  // a [64, 16] bf16 (M x K, K contiguous)
  #hal.pipeline.binding<storage_buffer, ReadOnly>,  // b [64, 16] bf16 (N x K, K contiguous)
  #hal.pipeline.binding<storage_buffer>             // c [64, 64] f32
]>
!smem = memref<2048xbf16, #gpu.address_space<workgroup>>
module attributes {stream.affinity.default = #hal.device.affinity<@wg_device>} {
util.global private @wg_device = #hal.device.target<"cuda", [#wg_target]> : !hal.device

hal.executable.source private @wgmma_exe {
  hal.executable.export public @wgmma_64x64x16 ordinal(0) layout(#layout)
      count(%device: !hal.device) -> (index, index, index) {
    %c1 = arith.constant 1 : index
    hal.return %c1, %c1, %c1 : index, index, index
  } <workgroup_size = [128 : index, 1 : index, 1 : index]>
  builtin.module {
    func.func @wgmma_64x64x16() attributes {translation_info = #iree_codegen.translation_info<
        pipeline = #iree_codegen.pass_pipeline<"canonicalize,cse">
        workgroup_size = [128, 1, 1] subgroup_size = 32>} {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c2 = arith.constant 2 : index
      %c4 = arith.constant 4 : index
      %c8 = arith.constant 8 : index
      %c16 = arith.constant 16 : index
      %c32 = arith.constant 32 : index
      %c64 = arith.constant 64 : index
      %c128 = arith.constant 128 : index
      %c1024 = arith.constant 1024 : index
      %a = hal.interface.binding.subspan layout(#layout) binding(0) alignment(64) offset(%c0) flags(ReadOnly) : memref<64x16xbf16>
      %b = hal.interface.binding.subspan layout(#layout) binding(1) alignment(64) offset(%c0) flags(ReadOnly) : memref<64x16xbf16>
      %c = hal.interface.binding.subspan layout(#layout) binding(2) alignment(64) offset(%c0) : memref<64x64xf32>
      %smem = memref.alloc() : !smem
      %tid = gpu.thread_id x
      // Stage: lane t copies 16 bytes of row t/2, k chunk t%2 of A and of B into the no-swizzle
      // canonical K-major layout: 8x(8 elements) core matrices of 128 contiguous bytes,
      // LBO (next core matrix along K) = 128 B, SBO (next 8 rows along M/N) = 256 B.
      %row = arith.divui %tid, %c2 : index
      %kc = arith.remui %tid, %c2 : index
      %k0 = arith.muli %kc, %c8 : index
      %rg = arith.divui %row, %c8 : index
      %ri = arith.remui %row, %c8 : index
      %o1 = arith.muli %rg, %c128 : index
      %o2 = arith.muli %kc, %c64 : index
      %o3 = arith.muli %ri, %c8 : index
      %o12 = arith.addi %o1, %o2 : index
      %off = arith.addi %o12, %o3 : index
      %offb = arith.addi %off, %c1024 : index
      %va = vector.load %a[%row, %k0] : memref<64x16xbf16>, vector<8xbf16>
      vector.store %va, %smem[%off] : !smem, vector<8xbf16>
      %vb = vector.load %b[%row, %k0] : memref<64x16xbf16>, vector<8xbf16>
      vector.store %vb, %smem[%offb] : !smem, vector<8xbf16>
      // generic-proxy smem writes -> visible to the async proxy (wgmma operand reads)
      llvm.inline_asm has_side_effects "fence.proxy.async.shared::cta;", "" : () -> ()
      gpu.barrier
      // Matrix descriptors: bits 0-13 addr>>4, 16-29 LBO>>4, 32-45 SBO>>4, 62-63 swizzle (0 = none).
      %base_idx = memref.extract_aligned_pointer_as_index %smem : !smem -> index
      %base = arith.index_cast %base_idx : index to i64
      %c4_i64 = arith.constant 4 : i64
      %mask14 = arith.constant 16383 : i64
      %lbo_sbo = arith.constant 68720001024 : i64  // (16 << 32) | (8 << 16)
      %b_bytes = arith.constant 2048 : i64
      %a_addr4 = arith.shrui %base, %c4_i64 : i64
      %a_lo = arith.andi %a_addr4, %mask14 : i64
      %desc_a = arith.ori %a_lo, %lbo_sbo : i64
      %b_addr = arith.addi %base, %b_bytes : i64
      %b_addr4 = arith.shrui %b_addr, %c4_i64 : i64
      %b_lo = arith.andi %b_addr4, %mask14 : i64
      %desc_b = arith.ori %b_lo, %lbo_sbo : i64

      %zero_acc = llvm.mlir.zero : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      // Accumulator carried through scf.for: 4 wgmma steps (a real kernel advances the descriptors per K step;
      // here the same tile is reused, only the loop-carried accumulator is under test).
      %c2_i64 = arith.constant 2 : i64
      %acc = scf.for %i = %c0 to %c4 step %c1 iter_args(%acc_in = %zero_acc) -> (!llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>) {
        nvvm.wgmma.fence.aligned
        %next = nvvm.wgmma.mma_async %desc_a, %desc_b, %acc_in,
            #nvvm.shape<m = 64, n = 64, k = 16>,
            D [<f32>, #nvvm.wgmma_scale_out<one>],
            A [<bf16>, #nvvm.wgmma_scale_in<one>, <row>],
            B [<bf16>, #nvvm.wgmma_scale_in<one>, <col>]
            : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)> -> !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
        nvvm.wgmma.commit.group.sync.aligned
        nvvm.wgmma.wait.group.sync.aligned 1
        scf.yield %next : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      }
      nvvm.wgmma.wait.group.sync.aligned 0
      %d0 = llvm.extractvalue %acc[0] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d1 = llvm.extractvalue %acc[1] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d2 = llvm.extractvalue %acc[2] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d3 = llvm.extractvalue %acc[3] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d4 = llvm.extractvalue %acc[4] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d5 = llvm.extractvalue %acc[5] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d6 = llvm.extractvalue %acc[6] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d7 = llvm.extractvalue %acc[7] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d8 = llvm.extractvalue %acc[8] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d9 = llvm.extractvalue %acc[9] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d10 = llvm.extractvalue %acc[10] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d11 = llvm.extractvalue %acc[11] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d12 = llvm.extractvalue %acc[12] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d13 = llvm.extractvalue %acc[13] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d14 = llvm.extractvalue %acc[14] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d15 = llvm.extractvalue %acc[15] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d16 = llvm.extractvalue %acc[16] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d17 = llvm.extractvalue %acc[17] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d18 = llvm.extractvalue %acc[18] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d19 = llvm.extractvalue %acc[19] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d20 = llvm.extractvalue %acc[20] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d21 = llvm.extractvalue %acc[21] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d22 = llvm.extractvalue %acc[22] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d23 = llvm.extractvalue %acc[23] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d24 = llvm.extractvalue %acc[24] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d25 = llvm.extractvalue %acc[25] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d26 = llvm.extractvalue %acc[26] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d27 = llvm.extractvalue %acc[27] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d28 = llvm.extractvalue %acc[28] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d29 = llvm.extractvalue %acc[29] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d30 = llvm.extractvalue %acc[30] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %d31 = llvm.extractvalue %acc[31] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
      %warp = arith.divui %tid, %c32 : index
      %lane = arith.remui %tid, %c32 : index
      %wr = arith.muli %warp, %c16 : index
      %lr = arith.divui %lane, %c4 : index
      %r0 = arith.addi %wr, %lr : index
      %r1 = arith.addi %r0, %c8 : index
      %lc = arith.remui %lane, %c4 : index
      %col0 = arith.muli %lc, %c2 : index
      %cb0 = arith.constant 0 : index
      %col0_0 = arith.addi %col0, %cb0 : index
      %col0_1 = arith.addi %col0_0, %c1 : index
      memref.store %d0, %c[%r0, %col0_0] : memref<64x64xf32>
      memref.store %d1, %c[%r0, %col0_1] : memref<64x64xf32>
      memref.store %d2, %c[%r1, %col0_0] : memref<64x64xf32>
      memref.store %d3, %c[%r1, %col0_1] : memref<64x64xf32>
      %cb1 = arith.constant 8 : index
      %col1_0 = arith.addi %col0, %cb1 : index
      %col1_1 = arith.addi %col1_0, %c1 : index
      memref.store %d4, %c[%r0, %col1_0] : memref<64x64xf32>
      memref.store %d5, %c[%r0, %col1_1] : memref<64x64xf32>
      memref.store %d6, %c[%r1, %col1_0] : memref<64x64xf32>
      memref.store %d7, %c[%r1, %col1_1] : memref<64x64xf32>
      %cb2 = arith.constant 16 : index
      %col2_0 = arith.addi %col0, %cb2 : index
      %col2_1 = arith.addi %col2_0, %c1 : index
      memref.store %d8, %c[%r0, %col2_0] : memref<64x64xf32>
      memref.store %d9, %c[%r0, %col2_1] : memref<64x64xf32>
      memref.store %d10, %c[%r1, %col2_0] : memref<64x64xf32>
      memref.store %d11, %c[%r1, %col2_1] : memref<64x64xf32>
      %cb3 = arith.constant 24 : index
      %col3_0 = arith.addi %col0, %cb3 : index
      %col3_1 = arith.addi %col3_0, %c1 : index
      memref.store %d12, %c[%r0, %col3_0] : memref<64x64xf32>
      memref.store %d13, %c[%r0, %col3_1] : memref<64x64xf32>
      memref.store %d14, %c[%r1, %col3_0] : memref<64x64xf32>
      memref.store %d15, %c[%r1, %col3_1] : memref<64x64xf32>
      %cb4 = arith.constant 32 : index
      %col4_0 = arith.addi %col0, %cb4 : index
      %col4_1 = arith.addi %col4_0, %c1 : index
      memref.store %d16, %c[%r0, %col4_0] : memref<64x64xf32>
      memref.store %d17, %c[%r0, %col4_1] : memref<64x64xf32>
      memref.store %d18, %c[%r1, %col4_0] : memref<64x64xf32>
      memref.store %d19, %c[%r1, %col4_1] : memref<64x64xf32>
      %cb5 = arith.constant 40 : index
      %col5_0 = arith.addi %col0, %cb5 : index
      %col5_1 = arith.addi %col5_0, %c1 : index
      memref.store %d20, %c[%r0, %col5_0] : memref<64x64xf32>
      memref.store %d21, %c[%r0, %col5_1] : memref<64x64xf32>
      memref.store %d22, %c[%r1, %col5_0] : memref<64x64xf32>
      memref.store %d23, %c[%r1, %col5_1] : memref<64x64xf32>
      %cb6 = arith.constant 48 : index
      %col6_0 = arith.addi %col0, %cb6 : index
      %col6_1 = arith.addi %col6_0, %c1 : index
      memref.store %d24, %c[%r0, %col6_0] : memref<64x64xf32>
      memref.store %d25, %c[%r0, %col6_1] : memref<64x64xf32>
      memref.store %d26, %c[%r1, %col6_0] : memref<64x64xf32>
      memref.store %d27, %c[%r1, %col6_1] : memref<64x64xf32>
      %cb7 = arith.constant 56 : index
      %col7_0 = arith.addi %col0, %cb7 : index
      %col7_1 = arith.addi %col7_0, %c1 : index
      memref.store %d28, %c[%r0, %col7_0] : memref<64x64xf32>
      memref.store %d29, %c[%r0, %col7_1] : memref<64x64xf32>
      memref.store %d30, %c[%r1, %col7_0] : memref<64x64xf32>
      memref.store %d31, %c[%r1, %col7_1] : memref<64x64xf32>
      return
    }
  }
}

func.func @wgmma_gemm(%a: tensor<64x16xbf16>, %b: tensor<64x16xbf16>) -> tensor<64x64xf32> {
  %c = flow.dispatch @wgmma_exe::@wgmma_64x64x16(%a, %b) : (tensor<64x16xbf16>, tensor<64x16xbf16>) -> tensor<64x64xf32>
  return %c : tensor<64x64xf32>
}
}
