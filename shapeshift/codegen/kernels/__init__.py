"""C kernel fragments of the native backend, one module per family (see docs/native-kernels.md)."""
