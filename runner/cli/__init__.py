"""The ``leanvideo`` command line: the only layer that knows argparse and rich. Each module parses
its sub-command's arguments, calls the library and renders the answer.

Imports: anything in ``runner``, the node pack's pure INT8 core (``leanvideo.int8``) and, for
``leanvideo bench``, the ``benchmarks`` package of a source checkout.
"""
