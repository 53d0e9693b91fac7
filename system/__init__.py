"""aisrl's Ray-free core: configs, records, correction math, losses, data, learner and rollout cores, report.

Nothing under ``system`` imports ``ray`` or ``actors``; ``system.config`` imports no torch.
``tests/test_import_boundaries.py`` enforces both.
"""
