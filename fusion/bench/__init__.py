"""Phase 4's benchmark harness: plumbing beside the lesson ``fusion/benchmark.py``, no exercise here.

workloads.py  what is measured: the workloads and how each variant is built (lazy imports)
config.py     a run's Config and the workloads' sizes per device (cuda, cpu, their quick sizes, the tests' tiny)
counting.py   FLOPs and bytes of every FX node (ShapeProp), intermediates, minimum bytes
profile.py    the machine's peaks, what the GPU did per call (torch.profiler), the CPU allocation log
harness.py    the run: build, check, count, time (with the lesson's loop), profile; the JSON's schema
rows.py       one variant's row: its record (Variant), median/IQR, speedups, % of the limit
report.py     the tables, the verdicts, the issues' targets, the cost-model check of generated kernels
plot.py       the roofline picture (matplotlib)
suite.py      the model suite (--suite): real models through every backend, pass/accuracy/speed-up/compile/memory
suite_models.py  its models: torchvision and HuggingFace (configs, random weights), tiny and full shapes
accuracy.py   the one accuracy rule, Inductor's (RMSE against float64 within a multiple of eager's), for every caller
results.py    the one JSON saver: every result file with the same meta (device, torch, date, ...)

Dependencies point one way: the lesson imports these; nothing here imports ``fusion.benchmark``.
"""
