// RapidCheck generators: meshes of 1-3 axes (sizes 1-4, now and then 8), placements, specs,
// shapes with uneven and empty chunks, and whole scenarios. Every draw shrinks toward the
// smallest mesh, the smallest shape and the simplest placement.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include <nlohmann/json.hpp>
#include <rapidcheck.h>

#include "core/layout.h"
#include "core/mesh.h"
#include "core/placement.h"

namespace meshsim {
// How counterexamples print.
std::ostream& operator<<(std::ostream& os, const Placement& p);
std::ostream& operator<<(std::ostream& os, const Mesh& m);
}  // namespace meshsim

namespace meshsim::gen {

rc::Gen<Mesh> mesh();
rc::Gen<Shape> shape(int64_t min_rank, int64_t max_rank);
// Placements with a gradient: S(d) for d < tensor_rank, R, P(sum), P(avg), Rd.
rc::Gen<Placement> differentiable_placement(int64_t tensor_rank);
// Every placement: the above and P(max), P(min).
rc::Gen<Placement> any_placement(int64_t tensor_rank);
// `spec` with some of its shards made strided, SS(d, k) (k = 2, or the size of the inner axes that
// shard d: FSDP2 over TP), where the extents divide evenly (check_strided); a third of the time.
Spec strided_now_and_then(const Mesh& mesh, Spec spec, const Shape& shape);
rc::Gen<Spec> spec(const Mesh& mesh, const rc::Gen<Placement>& placement);

// The JSON of a mesh and of a spec, as scenario files write them.
nlohmann::json mesh_json(const Mesh& mesh);
nlohmann::json spec_json(const Spec& spec);

}  // namespace meshsim::gen
