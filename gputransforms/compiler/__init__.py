"""The compiler, in the order a chain goes through it:

- ``chain``: what a chain is (its transforms in order, which are tensor-capable, which are a user's own);
- ``registry``: the one table, class -> every lowering it has (``lowerings`` for DALI, ``batched``
  kernels, ``vectorized`` draw-ahead forms);
- ``plan``: Compose -> Plan (the DALI graph's steps, fused, and the tail after it); ``explain``;
- ``dali`` (with ``dali_scalars`` and ``timm_augment``): a Plan -> one DALI pipeline;
- ``stages``, ``tail``, ``handoff``: what runs on the batch after the graph, one sequence for every
  caller; ``graphed``: an in-memory chain as one CUDA graph.
"""
from .chain import NotLowerable, flatten
from .plan import Plan, Step, explain, plan
from .registry import REGISTRY, lookup

__all__ = ["NotLowerable", "Plan", "REGISTRY", "Step", "explain", "flatten", "lookup", "plan"]
