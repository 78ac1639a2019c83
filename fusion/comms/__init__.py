"""Machinery for Phase 10 (``fusion/overlap.py``): overlap scheduling of collectives.

* :mod:`fusion.comms.capture`: data-parallel, FSDP-style and tensor-parallel steps traced with the fake process group.
* :mod:`fusion.comms.cost`: the cost model (roofline compute, region bytes / bandwidth, NCCL-style collectives).
* :mod:`fusion.comms.units`: the graph of atomic units the scheduler orders, the timeline and memory simulation,
  the checks every schedule must pass, and writing an order back into the fx graph.
* :mod:`fusion.comms.bucket`: merging small all_reduces that start together.
* :mod:`fusion.comms.inductor`: Inductor's ``schedule_overlap_bucketing`` on the same graph, with our estimates.
* :mod:`fusion.comms.gloo`: the scheduled graph run for real, gloo on CPU, in 2 processes.
* :mod:`fusion.comms.passes`: ``overlap_pass(gm, note, ...)`` for the torch.compile backend.

Nothing here imports a lesson: the scheduler and the region builder come in as arguments.
"""
