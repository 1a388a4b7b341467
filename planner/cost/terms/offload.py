"""CPU activation offloading: the copies of the offloaded layers' activations over the GPU's host link.

With ``Recipe.cpu_offload_layers`` = k of the block's L decoder layers (Megatron's
``--cpu-offloading-num-layers``; megatron-core allows it only with pp 1 and no recompute), Transformer
Engine's default offload schedule (transformer_engine/pytorch/cpu_offload.py,
``DefaultOffloadSynchronizer``, TE 2.10+) moves, per micro-batch, the saved activations of layers
0 .. k-1 to the host in the forward pass and back in the backward pass, on one side stream and so
one copy after another:

* forward: the copy of layer i starts with the forward of layer i+1 and must be done before the
  forward of layer L-k+i, which releases its HBM (the compute stream waits for it there);
* backward: the reload of layer i starts before the backward of layer L-1-k+i and must be done
  before the backward of layer i pops its tensors.

With ``c`` the copy time of one layer (its saved bytes over the link, one direction) and ``f`` the
forward (``b``: backward) compute of one layer, the side stream falls behind the compute stream
only when it is the bottleneck; the compute waits, per pass, for::

    exposed_pass = max(0, k*c - (L-2)*f,  c - (L-k-1)*f)

the first bound when the copies together outrun the forward of the layers they run beside (all k
copies queue behind the first, which starts one layer in and must end one layer before the end),
the second when one copy outruns its own window (L-k-1 layers: no window at all when k = L-1,
which TE warns "prevents overlapping"). The step-time model charges ``exposed_fwd + exposed_bwd``
per micro-batch (``steptime``'s ``offload`` term). Copies run on the copy engines (no SMs); their
HBM traffic beside the compute is not priced. The link is the GPU's ``host_link_gbps_uni``
(topologies/gpus.py: NVLink-C2C 450 GB/s per direction on GB200/GB300, PCIe Gen5 x16 64 GB/s on
HGX) at its nominal rate: no measured offload bandwidth is at hand, so this is the optimistic end.
"""

from __future__ import annotations


def copy_time(nbytes: float, link_gbps: float) -> float:
    """Seconds to move ``nbytes`` one way over a host link of ``link_gbps`` GB/s per direction."""
    if nbytes <= 0.0:
        return 0.0
    return nbytes / (link_gbps * 1e9)


def pass_exposed(k: int, layers: int, t_copy: float, t_layer: float) -> float:
    """Seconds one pass (forward with its copies out, or backward with its reloads) waits for the
    copies of ``k`` offloaded layers of ``t_copy`` seconds each, among ``layers`` layers of
    ``t_layer`` seconds of compute each (module docstring)."""
    if k <= 0 or t_copy <= 0.0:
        return 0.0
    return max(0.0, k * t_copy - (layers - 2) * t_layer, t_copy - (layers - k - 1) * t_layer)


def offload_exposed(k: int, layers: int, layer_bytes: float, link_gbps: float, t_fwd: float, t_bwd: float) -> float:
    """Exposed seconds per micro-batch of offloading ``k`` of ``layers`` decoder layers whose saved
    activations are ``layer_bytes`` each: the forward's copies out and the backward's reloads, against
    one layer's forward ``t_fwd`` and backward ``t_bwd`` compute."""
    c = copy_time(layer_bytes, link_gbps)
    return pass_exposed(k, layers, c, t_fwd) + pass_exposed(k, layers, c, t_bwd)
