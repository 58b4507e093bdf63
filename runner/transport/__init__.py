"""The wire to one ComfyUI server: HTTP calls and the websocket
(:class:`~runner.transport.client.ComfyClient`), no orchestration.

Imports: ``runner.errors``.
"""
