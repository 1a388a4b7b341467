"""Where MaxText's FP8 amax reductions sit in the step: one Llama block under GSPMD, compiled on CPU devices.

Run: ``python bench/maxtext_fp8_hlo.py [DEVICES]`` in an environment with the JAX and Flax of NVIDIA's MaxText
containers of the dgxc-benchmarking series (jax 0.4.38, flax 0.10.2: ``pip install jax==0.4.38 flax==0.10.2``;
neither is a topoplan dependency). docs/steptime.md "MaxText FP8" reads its output.

MaxText's ``quantization=fp8`` (MaxText/layers/quantizations.py ``Fp8Quantization``, AI-Hypercomputer/maxtext
d9a4b64) runs every projection through flax's ``nn.Fp8DotGeneralOp``. The block below has Llama's seven
projections (q, k, v, out; wi_0, wi_1, wo), kernels sharded over an ``fsdp`` axis on their input dimension and
the batch over the same axis, as MaxText's FSDP recipe shards them; ``jax.grad`` of a loss gives the training
step's forward and backward. The script counts the all-reduces of scalars in the partitioned, optimised HLO
(the amaxes: a max over a sharded tensor is a local max and an all-reduce over its shards) and checks whether
any dot of the step depends on one: with delayed scaling the scale of a tensor comes from its stored amax
history (flax/linen/fp8_ops.py ``update_fp8_meta``), and the current amax only enters the new history.
XLA:CPU runs no GPU pass (collective combiners, latency-hiding scheduler): the counts are the partitioner's,
before XLA:GPU may combine them.
"""

from __future__ import annotations

import os
import re
import sys

DEVICES = int(sys.argv[1]) if len(sys.argv) > 1 else 8
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"

import jax  # noqa: E402  (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import flax.linen as nn  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

EMB, MLP, SEQ = 256, 512, 64


def block(fp8: bool):
    class Dense(nn.Module):
        feat: int

        @nn.compact
        def __call__(self, x):
            k = self.param("kernel", nn.with_partitioning(nn.initializers.lecun_normal(), ("fsdp", None)),
                           (x.shape[-1], self.feat))
            dot = nn.Fp8DotGeneralOp(name="fp8") if fp8 else jax.lax.dot_general
            return dot(x, k.astype(jnp.bfloat16), (((x.ndim - 1,), (0,)), ((), ())))

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            q, k, v = (Dense(EMB, name=n)(x) for n in ("q", "k", "v"))
            x = x + Dense(EMB, name="o")(jax.nn.softmax(jnp.einsum("bsd,btd->bst", q, k) / 16.0) @ v)
            return x + Dense(EMB, name="wo")(nn.silu(Dense(MLP, name="wi0")(x)) * Dense(MLP, name="wi1")(x))

    return Block()


def compiled_step(fp8: bool, data: int = 1) -> str:
    """The optimised HLO of one training step on a (data, fsdp) mesh: kernels sharded over fsdp (replicated over
    data), the batch over both, as MaxText's dcn_data x fsdp recipes at 512 GPUs and more."""
    mesh = Mesh(np.array(jax.devices()).reshape(data, DEVICES // data), ("data", "fsdp"))
    m = block(fp8)
    x = jnp.ones((2 * DEVICES, SEQ, EMB), jnp.bfloat16)
    with mesh:
        boxed = m.init(jax.random.PRNGKey(0), x)
        shard = jax.tree_util.tree_map(lambda a: NamedSharding(mesh, P()), boxed)
        shard["params"] = jax.tree_util.tree_map(
            lambda a: NamedSharding(mesh, P("fsdp") if a.ndim == 2 else P()), nn.unbox(boxed["params"]))
        step = jax.jit(jax.grad(lambda v, x: jnp.mean(m.apply(v, x).astype(jnp.float32) ** 2)),
                       in_shardings=(shard, NamedSharding(mesh, P(("data", "fsdp")))))
        return step.lower(nn.unbox(boxed), x).compile().as_text()


def entry_graph(hlo: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (right-hand side, operand names) of the entry computation."""
    entry = hlo[hlo.index("ENTRY"):]
    entry = entry[:entry.index("\n}\n")]
    out = {}
    for line in entry.splitlines()[1:]:
        m = re.match(r"\s*(?:ROOT )?%?(\S+) = (.*)", line)
        if m:
            rhs = m.group(2)
            out[m.group(1)] = (rhs, re.findall(r"%([\w.\-]+)", rhs.split("), ")[0]) if "(" in rhs else [])
    return out


def ancestors(graph, name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        for o in graph.get(todo.pop(), ("", []))[1]:
            if o not in seen:
                seen.add(o)
                todo.append(o)
    return seen


def main() -> None:
    print(f"jax {jax.__version__}, flax {__import__('flax').__version__}, {DEVICES} CPU devices, one Llama block "
          f"(7 projections), kernels and batch sharded over fsdp")
    for fp8 in (False, True):
        g = entry_graph(compiled_step(fp8))
        scalars = {n for n, (rhs, _) in g.items() if re.match(r"f32\[\] all-reduce\(", rhs)}
        dots = [n for n, (rhs, _) in g.items() if " dot(" in rhs]
        gathers = {n for n, (rhs, _) in g.items() if " all-gather(" in rhs}
        on_path = sum(bool(scalars & ancestors(g, d)) for d in dots)
        gathered = sum(bool(gathers & ancestors(g, d)) for d in dots)   # control: the FSDP weight gathers
        print(f"  {'FP8 (Fp8DotGeneralOp)' if fp8 else 'BF16':22s} scalar all-reduces: {len(scalars):2d}   "
              f"dots: {len(dots):2d}, of which depend on a scalar all-reduce: {on_path} "
              f"(on an all-gather: {gathered})")
    # which ranks each amax all-reduce spans when the batch is also split over a data axis of 2
    hlo = compiled_step(True, data=2)
    sizes: dict[int, int] = {}
    for line in hlo.splitlines():
        if re.search(r"= f32\[\] all-reduce\(", line):
            m = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)
            size = int(m.group(2)) if m else DEVICES
            sizes[size] = sizes.get(size, 0) + 1
    print(f"  FP8 on data 2 x fsdp {DEVICES // 2}: scalar all-reduces by group size "
          + ", ".join(f"{n} over {s} ranks" for s, n in sorted(sizes.items()))
          + " (the kernels' amaxes span the fsdp group, the inputs' and output gradients' every rank)")


if __name__ == "__main__":
    main()
