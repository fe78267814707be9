"""A JAX bug for meshsim import: data parallelism with the gradient taken inside the shard_map and
then summed over dp by hand, as code written for pmap or `check_vma=False` (check_rep=False) does.

    meshsim import jax examples/models/bugs/jax_dp_grad_psum.py:build --mesh dp=2 -o g.json

Under `check_vma=True` (the default) JAX types `w` as invariant over dp, inserts the `pvary` where
it meets the dp-sharded batch, and the transpose of that `pvary` is a `psum`: `jax.grad` inside
the region already returns the gradient summed over dp. The `psum` written by hand then adds the
dp copies of an invariant value: the gradient comes out dp times too large, and JAX's types let it
through (psum of an invariant value is legal: it means n * x). meshsim's run of the imported
scenario (examples/imported/jax_dp_grad_psum.json) fails with the factor named:

    grad_step: 18 of 18 elements differ (up to 0.0786 allowed); greatest difference 786 at [4, 0]:
    expected -786, actual -1572 (ranks 0, 1); greatest relative difference 1 at [0, 0];
    actual = 2 x expected everywhere: the size of mesh axis dp

(the scenario's reference is the region with its communication removed: the gradient summed
once; its body is what JAX runs, and tools/crosscheck agrees with meshsim on it.)

The JAX counterpart of examples/bugs/missing_pvary_dp_weight.json (a missing reduction) cannot be
written with check_vma=True: JAX inserts the pvary itself. Under check_vma=False the gradient
taken outside the region is right too (the region's transpose psums w's cotangent over the axes
its in_specs leave out); only a gradient taken inside a check_vma=False region misses the
reduction, which is this program with the psum left out and check_vma=False.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

BATCH, DIM, OUT = 8, 6, 3

MESHSIM_IMPORTS = [{"system": "jax", "func": "build", "mesh": "dp=2", "out": "jax_dp_grad_psum.json",
                    "expect": "fail"}]


def build(mesh):
    @jax.shard_map(mesh=mesh, in_specs=(P(), P("dp", None), P("dp", None)), out_specs=P())
    def grad_step(w, x, y):
        def local_loss(w):
            err = x @ w - y
            return jnp.sum(err * err)

        g = jax.grad(local_loss)(w)  # already summed over dp: w is invariant, its pvary's transpose psums
        return jax.lax.psum(g, "dp")  # the bug: a second sum over dp, dp x the gradient

    def sharded(shape, spec):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))

    w = sharded((DIM, OUT), P())
    x = sharded((BATCH, DIM), P("dp", None))
    y = sharded((BATCH, OUT), P("dp", None))
    return jax.jit(grad_step), (w, x, y)


if __name__ == "__main__":
    import numpy as np
    from jax.sharding import AxisType
    mesh = jax.make_mesh((2,), ("dp",), axis_types=(AxisType.Explicit,))
    fn, (w, x, y) = build(mesh)
    real = [jax.device_put(np.random.default_rng(0).integers(-4, 5, s.shape).astype(np.float32), s.sharding)
            for s in (w, x, y)]
    with jax.set_mesh(mesh):
        got = fn(*real)
    w0, x0, y0 = (np.asarray(a) for a in real)
    ref = jax.grad(lambda w: jnp.sum((x0 @ w - y0) ** 2))(w0)
    print("ratio", np.asarray(got) / np.asarray(ref))
