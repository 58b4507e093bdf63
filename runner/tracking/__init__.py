"""One prompt's life on a server: server messages turned into events and timings, following over the
websocket (reconnects, reconciliation), the prompt result, downloaded outputs and the run record.

Imports: ``runner.transport``, ``runner.graph``, ``runner.install.pin`` (hashing), ``runner.errors``.
"""
