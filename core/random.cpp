#include "core/random.h"

#include <cmath>

namespace meshsim {

namespace {

// splitmix64's finalizer: a bijection of 64-bit words whose output bits each depend on every input bit.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// FNV-1a over the stream's name.
uint64_t name_hash(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

}  // namespace

uint64_t random_stream_key(uint64_t seed, std::string_view stream, int64_t step, int64_t microbatch) {
  uint64_t key = mix(seed + kGolden);
  key = mix(key ^ name_hash(stream));
  key = mix(key ^ (static_cast<uint64_t>(step + 1) * kGolden));
  return mix(key ^ (static_cast<uint64_t>(microbatch + 1) * 0xd1b54a32d192ed03ULL));
}

double uniform_at(uint64_t key, uint64_t index) {
  const uint64_t bits = mix(key ^ mix(index * kGolden + 0x632be59bd9b4e019ULL));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

double normal_at(uint64_t key, uint64_t index) {
  const uint64_t sub = mix(key ^ 0x8bb84b93962eacc9ULL);  // the normal values' own sub-stream
  const double u1 = uniform_at(sub, 2 * index), u2 = uniform_at(sub, 2 * index + 1);
  const double pi = 3.14159265358979323846;
  return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * pi * u2);
}

bool dropout_keeps(uint64_t key, uint64_t index, double p) {
  if (p >= 1.0) return false;
  if (p <= 0.0) return true;
  return uniform_at(key, index) < 1.0 - p;
}

}  // namespace meshsim
