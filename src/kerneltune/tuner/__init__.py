"""Tuning: an Optuna search per key over each kernel's configs, in isolated benchmark workers.

    from kerneltune.tuner.job import Job
    from kerneltune.tuner.runner import JobRunner
    report = JobRunner(Job(kernels=["rmsnorm_fwd"], ns=[4096]), database_url, workers=8).run()

The modules are imported on use: `kerneltune.tuner.cli` must stay light, since the `kerneltune`
command registers it on every start.
"""
