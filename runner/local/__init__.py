"""This machine's LeanVideo installation: the workspace (where ComfyUI, the models and the servers'
state live) and local ComfyUI server processes (start, readiness, stop).

Imports: ``runner.errors``.
"""
