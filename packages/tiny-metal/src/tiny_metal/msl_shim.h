// msl_shim.h: enough of the Metal Shading Language for clang (>= 15) to syntax-check tiny's MSL kernels on a machine
// without macOS. Use: clang-16 -x c++ -std=c++17 -fsyntax-only -Werror=unknown-attributes -include msl_shim.h k.metal
// (tiny_metal.syntax blanks the kernel's `#include <metal_stdlib>` line, which this header stands in for).
//
// What it checks: undeclared or misspelled names (only the metal:: functions tiny's renderer uses are declared),
// vector constructors with the wrong number of components, swizzles a vector does not have, unknown attributes,
// bit casts between types of different sizes, arithmetic on bfloat (Metal 3.1's bfloat is modelled as clang's
// storage-only __bf16, so the renderer's "compute bfloat in float" rule is enforced), and C++ type errors.
// What it cannot check: address spaces (device/threadgroup/constant/thread expand to nothing), duplicate
// [[buffer(n)]] indices, use of double, and anything about what the kernel computes. The real check is a Mac.
#pragma once
#pragma clang diagnostic ignored "-Wunused-value"

// *** address spaces and function qualifiers ***
#define device
#define threadgroup
#define constant
#define thread
#define kernel [[clang::annotate("metal_kernel")]]

// *** argument attributes: [[buffer(n)]] and the thread-position attributes become annotations, so an attribute
// spelled any other way is an unknown attribute (an error with -Werror=unknown-attributes) ***
#define buffer(n) clang::annotate("metal_buffer", n)
#define threadgroup_position_in_grid clang::annotate("threadgroup_position_in_grid")
#define thread_position_in_threadgroup clang::annotate("thread_position_in_threadgroup")
#define thread_position_in_grid clang::annotate("thread_position_in_grid")
#define threads_per_threadgroup clang::annotate("threads_per_threadgroup")
#define thread_index_in_simdgroup clang::annotate("thread_index_in_simdgroup")
#define simdgroup_index_in_threadgroup clang::annotate("simdgroup_index_in_threadgroup")

// *** scalar types (Metal: char is signed, long is 64 bits, half is IEEE binary16, bfloat needs MSL 3.1) ***
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;
typedef __bf16 bfloat;
static_assert(sizeof(long) == 8, "Metal's long is 64 bits; the shim needs an LP64 host");

#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")

// *** vector types ***
typedef bool bool2 __attribute__((ext_vector_type(2))); typedef bool bool3 __attribute__((ext_vector_type(3))); typedef bool bool4 __attribute__((ext_vector_type(4)));
typedef char char2 __attribute__((ext_vector_type(2))); typedef char char3 __attribute__((ext_vector_type(3))); typedef char char4 __attribute__((ext_vector_type(4)));
typedef uchar uchar2 __attribute__((ext_vector_type(2))); typedef uchar uchar3 __attribute__((ext_vector_type(3))); typedef uchar uchar4 __attribute__((ext_vector_type(4)));
typedef short short2 __attribute__((ext_vector_type(2))); typedef short short3 __attribute__((ext_vector_type(3))); typedef short short4 __attribute__((ext_vector_type(4)));
typedef ushort ushort2 __attribute__((ext_vector_type(2))); typedef ushort ushort3 __attribute__((ext_vector_type(3))); typedef ushort ushort4 __attribute__((ext_vector_type(4)));
typedef int int2 __attribute__((ext_vector_type(2))); typedef int int3 __attribute__((ext_vector_type(3))); typedef int int4 __attribute__((ext_vector_type(4)));
typedef uint uint2 __attribute__((ext_vector_type(2))); typedef uint uint3 __attribute__((ext_vector_type(3))); typedef uint uint4 __attribute__((ext_vector_type(4)));
typedef long long2 __attribute__((ext_vector_type(2))); typedef long long3 __attribute__((ext_vector_type(3))); typedef long long4 __attribute__((ext_vector_type(4)));
typedef ulong ulong2 __attribute__((ext_vector_type(2))); typedef ulong ulong3 __attribute__((ext_vector_type(3))); typedef ulong ulong4 __attribute__((ext_vector_type(4)));
typedef half half2 __attribute__((ext_vector_type(2))); typedef half half3 __attribute__((ext_vector_type(3))); typedef half half4 __attribute__((ext_vector_type(4)));
typedef float float2 __attribute__((ext_vector_type(2))); typedef float float3 __attribute__((ext_vector_type(3))); typedef float float4 __attribute__((ext_vector_type(4)));
typedef bfloat bfloat2 __attribute__((ext_vector_type(2))); typedef bfloat bfloat3 __attribute__((ext_vector_type(3))); typedef bfloat bfloat4 __attribute__((ext_vector_type(4)));

#define bool2(...) ::metal::__shim::make<bool, 2>(__VA_ARGS__)
#define bool3(...) ::metal::__shim::make<bool, 3>(__VA_ARGS__)
#define bool4(...) ::metal::__shim::make<bool, 4>(__VA_ARGS__)
#define char2(...) ::metal::__shim::make<char, 2>(__VA_ARGS__)
#define char3(...) ::metal::__shim::make<char, 3>(__VA_ARGS__)
#define char4(...) ::metal::__shim::make<char, 4>(__VA_ARGS__)
#define uchar2(...) ::metal::__shim::make<uchar, 2>(__VA_ARGS__)
#define uchar3(...) ::metal::__shim::make<uchar, 3>(__VA_ARGS__)
#define uchar4(...) ::metal::__shim::make<uchar, 4>(__VA_ARGS__)
#define short2(...) ::metal::__shim::make<short, 2>(__VA_ARGS__)
#define short3(...) ::metal::__shim::make<short, 3>(__VA_ARGS__)
#define short4(...) ::metal::__shim::make<short, 4>(__VA_ARGS__)
#define ushort2(...) ::metal::__shim::make<ushort, 2>(__VA_ARGS__)
#define ushort3(...) ::metal::__shim::make<ushort, 3>(__VA_ARGS__)
#define ushort4(...) ::metal::__shim::make<ushort, 4>(__VA_ARGS__)
#define int2(...) ::metal::__shim::make<int, 2>(__VA_ARGS__)
#define int3(...) ::metal::__shim::make<int, 3>(__VA_ARGS__)
#define int4(...) ::metal::__shim::make<int, 4>(__VA_ARGS__)
#define uint2(...) ::metal::__shim::make<uint, 2>(__VA_ARGS__)
#define uint3(...) ::metal::__shim::make<uint, 3>(__VA_ARGS__)
#define uint4(...) ::metal::__shim::make<uint, 4>(__VA_ARGS__)
#define long2(...) ::metal::__shim::make<long, 2>(__VA_ARGS__)
#define long3(...) ::metal::__shim::make<long, 3>(__VA_ARGS__)
#define long4(...) ::metal::__shim::make<long, 4>(__VA_ARGS__)
#define ulong2(...) ::metal::__shim::make<ulong, 2>(__VA_ARGS__)
#define ulong3(...) ::metal::__shim::make<ulong, 3>(__VA_ARGS__)
#define ulong4(...) ::metal::__shim::make<ulong, 4>(__VA_ARGS__)
#define half2(...) ::metal::__shim::make<half, 2>(__VA_ARGS__)
#define half3(...) ::metal::__shim::make<half, 3>(__VA_ARGS__)
#define half4(...) ::metal::__shim::make<half, 4>(__VA_ARGS__)
#define float2(...) ::metal::__shim::make<float, 2>(__VA_ARGS__)
#define float3(...) ::metal::__shim::make<float, 3>(__VA_ARGS__)
#define float4(...) ::metal::__shim::make<float, 4>(__VA_ARGS__)
#define bfloat2(...) ::metal::__shim::make<bfloat, 2>(__VA_ARGS__)
#define bfloat3(...) ::metal::__shim::make<bfloat, 3>(__VA_ARGS__)
#define bfloat4(...) ::metal::__shim::make<bfloat, 4>(__VA_ARGS__)

namespace metal {
namespace __shim {
template <typename T> struct components { static constexpr int value = 1; };
template <typename T, int N> struct components<T __attribute__((ext_vector_type(N)))> { static constexpr int value = N; };
template <typename T, int N> struct vec { typedef T type __attribute__((ext_vector_type(N))); };

// T<N>(x): a scalar is broadcast, a vector of N components is converted element by element
template <typename T, int N, typename A> typename vec<T, N>::type make(A a) {
  typedef typename vec<T, N>::type V;
  if constexpr (components<A>::value == 1) {
    V r = (T)a;
    return r;
  } else {
    static_assert(components<A>::value == N, "vector conversion between types with different numbers of components");
    return __builtin_convertvector(a, V);
  }
}

// T<N>(x0, x1, ...): one scalar per component (tiny never builds a vector from smaller vectors)
template <typename T, int N, typename A0, typename A1, typename... A> typename vec<T, N>::type make(A0 a0, A1 a1, A... a) {
  static_assert(2 + sizeof...(A) == N, "wrong number of components for this vector type");
  static_assert(components<A0>::value == 1 && components<A1>::value == 1 && ((components<A>::value == 1) && ...),
                "the shim only models vector constructors from scalars");
  return typename vec<T, N>::type{(T)a0, (T)a1, (T)a...};
}
}  // namespace __shim

// *** the functions tiny's renderer calls, and nothing else, so a misspelled or unexpected one is an error ***
#define __SHIM_FLOAT_FN(name) \
  float name(float); float2 name(float2); float3 name(float3); float4 name(float4); \
  half name(half); half2 name(half2); half3 name(half3); half4 name(half4);
__SHIM_FLOAT_FN(exp2) __SHIM_FLOAT_FN(log2) __SHIM_FLOAT_FN(sin) __SHIM_FLOAT_FN(sqrt)
namespace precise {
float exp2(float); float log2(float); float sin(float); float sqrt(float);
float2 sin(float2); float3 sin(float3); float4 sin(float4);
}
#undef __SHIM_FLOAT_FN

#define __SHIM_INT_MAX(T) T max(T, T); T##2 max(T##2, T##2); T##3 max(T##3, T##3); T##4 max(T##4, T##4);
__SHIM_INT_MAX(char) __SHIM_INT_MAX(uchar) __SHIM_INT_MAX(short) __SHIM_INT_MAX(ushort) __SHIM_INT_MAX(int) __SHIM_INT_MAX(uint)
__SHIM_INT_MAX(long) __SHIM_INT_MAX(ulong)
#undef __SHIM_INT_MAX

// as_type<T>(x): reinterpret the bits; Metal requires equal sizes
template <typename T, typename U> T as_type(U x) {
  static_assert(sizeof(T) == sizeof(U), "as_type between types of different sizes");
  return __builtin_bit_cast(T, x);
}

// *** synchronisation ***
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
void threadgroup_barrier(mem_flags);
void simdgroup_barrier(mem_flags);

// *** simdgroup matrices (Apple7+): 8x8 tiles shared by the 32 threads of a simdgroup, two elements per thread ***
template <typename T, int Rows, int Cols> struct simdgroup_matrix {
  static_assert(Rows == 8 && Cols == 8, "tiny uses 8x8 simdgroup matrices only");
  typedef T elements __attribute__((ext_vector_type(2)));
  thread elements& thread_elements();
  simdgroup_matrix();
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;
template <typename D, typename A, typename B, typename C>
void simdgroup_multiply_accumulate(thread simdgroup_matrix<D, 8, 8>& d, const thread simdgroup_matrix<A, 8, 8>& a,
                                   const thread simdgroup_matrix<B, 8, 8>& b, const thread simdgroup_matrix<C, 8, 8>& c);
template <typename T> void simdgroup_load(thread simdgroup_matrix<T, 8, 8>& m, const T* src, ulong elements_per_row = 8);
template <typename T> void simdgroup_store(const thread simdgroup_matrix<T, 8, 8>& m, T* dst, ulong elements_per_row = 8);
}  // namespace metal
