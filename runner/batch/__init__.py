"""Batch jobs over many ComfyUI servers, on a durable DBOS queue.

``jobs_file`` reads and checks a jobs file, ``queue`` puts a batch on the queue and reads its state,
``worker`` runs jobs (a DBOS executor), ``pool`` holds the servers with their health, ``attempt``
runs one job on one server and writes its folder exactly once, ``results`` writes the manifest.
"""
