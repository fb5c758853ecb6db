"""Seeded training runs that really fail, and the healthy controls they are compared with.

``python -m analyzer.scenarios OUT_DIR [--only NAME ...]`` trains each scenario of
:mod:`analyzer.scenarios.catalog` on the CPU and writes one run folder per scenario. The
models and losses live in :mod:`~analyzer.scenarios.models` and
:mod:`~analyzer.scenarios.losses`, where the captures name them.
``python -m analyzer.scenarios.sweep OUT --runs N`` trains a hyperparameter sweep
(:mod:`~analyzer.scenarios.sweep`) whose diverged trials the sweep summary must tell apart.
"""
