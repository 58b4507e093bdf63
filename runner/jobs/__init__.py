"""Orchestration: a whole job from a workflow file to a folder of outputs and a run record
(``leanvideo run``), and the demo job. Later: batch jobs. The benchmark harness (``benchmarks/``) is
orchestration of the same kind, outside the installed package.

Imports: ``runner.tracking``, ``runner.transport``, ``runner.graph``, ``runner.local``,
``runner.fixtures``, ``runner.errors``.
"""
