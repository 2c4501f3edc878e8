// PTX wrappers for the warp-level tensor-core path (sm_80 and later): shared-memory fragment
// loads (ldmatrix), asynchronous copies into shared memory (cp.async) and bf16 mma.sync with
// fp32 sums, TF32 mma.sync. Shared by the stem, direct and block-sparse convolutions.
#ifndef TOPIARY_KERNELS_RUNTIME_WARP_MMA_CUH_
#define TOPIARY_KERNELS_RUNTIME_WARP_MMA_CUH_

#include <cstdint>

namespace topiary::kernels {

// 4 bytes of shared memory (p 4-byte aligned) as one register: a fragment's bf16 pair.
__device__ __forceinline__ uint32_t Lds32(const uint16_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// 16 bytes from global to shared memory without passing through registers; valid false
// fills them with zeros and reads nothing.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 bf16 matrices from shared memory: lanes 8i..8i+7 give matrix i's rows (16 bytes
// each, 16-byte aligned); register i holds the lane's pair of matrix i (row lane / 4, columns
// 2 * (lane % 4) and the next).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// The same, transposed: register i holds matrix i's column lane / 4, rows 2 * (lane % 4) and
// the next.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// Two transposed matrices (lanes 0-15 give their rows; the others' addresses are ignored but
// must be valid shared addresses): register i as LdMatrixX4Trans's.
__device__ __forceinline__ void LdMatrixX2Trans(uint32_t (&r)[2], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(s));
}

// d += a b on one m16n8k16 tile: bf16 operands in the PTX fragment layouts, fp32 sums.
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a b on one m16n8k8 tile: TF32 operands (fp32 bits, rounded to TF32 by the caller),
// fp32 sums.
__device__ __forceinline__ void MmaTf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a b on one m16n8k8 tile (a: two registers, b: one), bf16 operands, fp32 sums.
__device__ __forceinline__ void MmaBf16K8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b0));
}

}  // namespace topiary::kernels

#endif  // TOPIARY_KERNELS_RUNTIME_WARP_MMA_CUH_
