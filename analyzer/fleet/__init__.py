"""Fleets of runs: one task per run on an executor (:mod:`analyzer.fleet.executors`: in
this process, a local process pool or a Dask cluster), results streamed as each folder's
runs finish (:mod:`analyzer.fleet.stream`), and the sweep's summary
(:mod:`analyzer.fleet.summary`).

Modules here import neither dask nor torch at import time: dask only when a ``--scheduler``
is asked for, torch only in a replay.
"""
