// Float element types: the run's (`options.dtype`), an input's or a created value's `dtype`, the
// target of a `to` (cast), and FSDP2's mixed precision policy (`mixed_precision` of an input).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace meshsim {

// In order of decreasing precision of the significand, then range (float16 before bfloat16 in
// precision: 11 bits against 8).
enum class DType { Float64, Float32, BFloat16, Float16 };

// "float64" | "float32" | "bfloat16" | "float16".
const char* dtype_name(DType d);
// The dtype of a name above; nothing for any other text.
std::optional<DType> find_dtype(const std::string& text);

// The unit roundoff of round-to-nearest: 2^-p for a significand of p bits (53, 24, 8, 11): the
// largest relative error of one rounding.
inline double unit_roundoff(DType d) {
  switch (d) {
    case DType::Float64: return 0x1p-53;
    case DType::Float32: return 0x1p-24;
    case DType::BFloat16: return 0x1p-8;
    case DType::Float16: return 0x1p-11;
  }
  return 0x1p-53;
}

inline int64_t dtype_bytes(DType d) { return d == DType::Float64 ? 8 : d == DType::Float32 ? 4 : 2; }

// The less precise of two dtypes (the larger unit roundoff).
inline DType least_precise(DType a, DType b) { return unit_roundoff(a) >= unit_roundoff(b) ? a : b; }

// A half-precision dtype (bfloat16, float16): the oracle computes in float64 and compares within
// the dtype's tolerance.
inline bool is_half(DType d) { return d == DType::BFloat16 || d == DType::Float16; }

}  // namespace meshsim
