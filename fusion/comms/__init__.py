"""Machinery for Phase 10 (``fusion/overlap.py``): overlap scheduling of collectives.

* :mod:`fusion.comms.capture`: data-parallel, FSDP-style and tensor-parallel steps traced with the fake process group.
* :mod:`fusion.comms.cost`: the cost model (roofline compute, region bytes / bandwidth, NCCL-style collectives).
* :mod:`fusion.comms.units`: the graph of atomic units the scheduler orders, the timeline and memory simulation,
  the checks every schedule must pass, and writing an order back into the fx graph.
* :mod:`fusion.comms.bucket`: merging small all_reduces that start together.
* :mod:`fusion.comms.inductor`: Inductor's ``schedule_overlap_bucketing`` on the same graph, with our estimates.
* :mod:`fusion.comms.gloo`: the scheduled graph run for real, gloo on CPU, in 2 processes.
* :mod:`fusion.comms.passes`: ``overlap_pass(gm, note, ...)`` for the torch.compile backend (``set_cost_model``);
  ``all_reduce_in_place``: no funcol copy before an all_reduce of a buffer nothing else reads.
* :mod:`fusion.comms.fit`: the collective model fitted to measured sizes, per collective, in size bands (NCCL's
  protocol switches), each a relative least-squares line; the least time over ranks.
* :mod:`fusion.comms.explain`: a schedule said collective by collective (ours and Inductor's, issue 40).
* :mod:`fusion.comms.profile`: a torch.profiler Chrome trace as compute and network lanes; exposed time per kernel.
* :mod:`fusion.comms.scale`: ring and tree beyond one host, 8 to 1,024 GPUs (simulated, stated assumptions).
* :mod:`fusion.comms.plot`: the schedule as a picture (matplotlib, the optional ``plot`` extra).

Nothing here imports a lesson: the scheduler and the region builder come in as arguments.
"""
