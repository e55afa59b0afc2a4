"""Tensors: Triton's wire both ways, request checks, batch assembly, shared memory, devices."""
