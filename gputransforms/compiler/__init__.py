"""The compiler: plan a transform chain (``plan``), lower it to DALI (``dali``), run what is left
after the graph (``tail``): batched where it can (``batched``), else per sample."""
from .plan import LOWERINGS, NotLowerable, Plan, Step, explain, flatten, plan

__all__ = ["LOWERINGS", "NotLowerable", "Plan", "Step", "explain", "flatten", "plan"]
