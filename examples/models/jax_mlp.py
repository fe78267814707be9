"""A JAX shard_map MLP with data and tensor parallelism on a (dp, tp) mesh, for meshsim import
(docs/import.md):

    meshsim import jax examples/models/jax_mlp.py:build --mesh dp=2,tp=2 -o jax_mlp.json

Megatron's MLP written the JAX way: the batch sharded over dp, w1 column-parallel (its output
dim over tp, with its bias), w2 row-parallel (its input dim over tp), the partial products summed
by `psum` over tp, and the loss's mean over the batch taken by `pmean` over dp. `check_vma=True`
(the default): JAX inserts the `pvary`s itself (the weights meet dp-varying data), so
`jax.grad` outside the shard_map gets the weights' gradients summed over dp by their transposes.

`build(mesh)` returns what one passes to `jax.grad(loss_fn)(*args)`: the loss function and its
example arguments (global shapes with their shardings); `jax.grad`'s default argnums=0
differentiates the parameters.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

BATCH, DIM, HIDDEN = 8, 6, 8

MESHSIM_IMPORTS = [{"system": "jax", "func": "build", "mesh": "dp=2,tp=2", "out": "jax_mlp.json"}]


def mlp_loss(mesh):
    """The loss of the MLP on a batch: mean over the batch of the squared error."""

    @jax.shard_map(mesh=mesh,
                   in_specs=({"w1": P(None, "tp"), "b1": P("tp"), "w2": P("tp", None)}, P("dp", None), P("dp", None)),
                   out_specs=P())
    def local_loss(params, x, y):
        h = jnp.tanh(x @ params["w1"] + params["b1"])  # column-parallel: hidden units over tp
        out = jax.lax.psum(h @ params["w2"], "tp")     # row-parallel: partial sums over tp
        err = out - y
        loss = jnp.mean(jnp.sum(err * err, axis=-1))   # this rank's batch rows
        return jax.lax.pmean(loss, "dp")               # the mean over the whole batch

    return local_loss


def build(mesh):
    def sharded(shape, spec):
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))

    params = {"w1": sharded((DIM, HIDDEN), P(None, "tp")),
              "b1": sharded((HIDDEN,), P("tp")),
              "w2": sharded((HIDDEN, DIM), P("tp", None))}
    x = sharded((BATCH, DIM), P("dp", None))
    y = sharded((BATCH, DIM), P("dp", None))
    loss_fn = jax.jit(mlp_loss(mesh))
    return loss_fn, (params, x, y)


if __name__ == "__main__":
    # One training step, as it runs: the gradients of the parameters.
    from jax.sharding import AxisType
    mesh = jax.make_mesh((2, 2), ("dp", "tp"), axis_types=(AxisType.Explicit,) * 2)
    loss_fn, (params, x, y) = build(mesh)
    key = jax.random.key(0)
    real = jax.tree.map(lambda s: jax.device_put(jax.random.normal(key, s.shape, s.dtype), s.sharding), (params, x, y))
    print(jax.jit(jax.value_and_grad(loss_fn))(*real))
