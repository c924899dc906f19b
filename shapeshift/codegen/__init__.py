"""Code generation: turns kernels into C source and builds it into a loaded shared library.

``build.py`` compiles C source with the system compiler and caches the result on disk.
"""
