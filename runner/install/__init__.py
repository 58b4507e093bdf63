"""The installer's library (``install.py`` is its command line): the ComfyUI pin and placing the pinned
ComfyUI. Standard library only: it runs before anything else is installed.

Imports: nothing outside the standard library and this package.
"""
