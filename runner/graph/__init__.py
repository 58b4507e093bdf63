"""Workflow JSON, no server: load and override API-format workflows, validate them against an
``/object_info`` answer, convert editor (UI) workflows, diff two workflows.

Imports: ``runner.errors`` only.
"""
